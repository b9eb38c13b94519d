"""``equikernels md``: molecular dynamics of a structure file (anything ASE reads) or a built-in
example, with the bundled default model or ``--model``."""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

from ..calculators.md import BUILTIN_STRUCTURES, ENSEMBLES, MDSettings
from ..calculators.threads import DEFAULT_MAX_THREADS

# default steps: a GPU run long enough to measure; a CPU run that ends well within a minute
DEFAULT_STEPS = {"cuda": 1000, "cpu": 20}


def register(subparsers) -> None:
    examples = "; ".join(f"{name}: {what}" for name, what in BUILTIN_STRUCTURES.items())
    p = subparsers.add_parser(
        "md", help="run molecular dynamics with a MACE model (ASE)",
        description="Run MD with ASE and a MACE model. Writes md.traj, md.log (energies to 1e-6 eV) and "
                    "summary.json to --out; summary.json is also written when the run is interrupted "
                    f"(Ctrl-C, SIGTERM) or fails. Built-in structures: {examples}.")
    p.add_argument("structure", nargs="?", default=None,
                   help=f"structure file (any format ASE reads; the last frame is used; FILE@INDEX picks another) or a "
                        f"built-in example "
                        f"({', '.join(BUILTIN_STRUCTURES)}); default: cu-fcc")
    p.add_argument("--steps", type=int, default=None,
                   help=f"number of MD steps (default {DEFAULT_STEPS['cuda']} on a GPU, "
                        f"{DEFAULT_STEPS['cpu']} on a CPU)")
    p.add_argument("--timestep", "--dt", type=float, default=1.0, help="timestep in fs (default 1.0)")
    p.add_argument("--temperature", type=float, default=None,
                   help=f"temperature in K: initial velocities and thermostat (default {MDSettings.temperature_K:g})")
    p.add_argument("--ensemble", choices=ENSEMBLES, default="nvt-langevin", help="default nvt-langevin")
    p.add_argument("--pressure", type=float, default=None,
                   help=f"npt pressure in bar (default {MDSettings.pressure_bar:g})")
    p.add_argument("--friction", type=float, default=None,
                   help=f"nvt-langevin friction in 1/ps (default {MDSettings.friction_per_ps:g})")
    p.add_argument("--tdamp", type=float, default=None,
                   help="thermostat time constant in fs of nvt-nose-hoover, nvt-bussi and npt (default 100 timesteps)")
    p.add_argument("--pdamp", type=float, default=None,
                   help="npt barostat time constant in fs (default 1000 timesteps)")
    p.add_argument("--supercell", type=int, nargs=3, metavar=("NA", "NB", "NC"), default=None,
                   help="repeat the structure NA x NB x NC times")
    p.add_argument("--model", default=None,
                   help="model file or directory (ours, as `equikernels convert` writes, or a mace-torch .model), "
                        "or a foundation-model name (medium, small_off, ...; needs mace-torch); "
                        "default: the bundled default model")
    p.add_argument("--head", default=None, help="head of a multi-head model")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--dtype", choices=("float64", "float32"), default=None,
                   help="model precision (default: the model's own)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: OMP_NUM_THREADS if set, else "
                        f"{DEFAULT_MAX_THREADS}: more threads rarely help small systems)")
    p.add_argument("--skin", type=float, default=None, help="neighbour-list skin in Angstrom (default 0.5)")
    p.add_argument("--out", default="md_out", help="output directory (default md_out)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier run's md.traj, md.log and summary.json in --out (refused otherwise)")
    p.add_argument("--keep-velocities", action="store_true",
                   help="start from the velocities stored in the structure file (e.g. the last frame of an "
                        "earlier run's md.traj) instead of drawing them at --temperature")
    p.add_argument("--log-interval", type=int, default=10, help="steps between log lines (0: no log; default 10)")
    p.add_argument("--traj-interval", type=int, default=10,
                   help="steps between trajectory frames (0: none; default 10); the last step is always written")
    p.add_argument("--seed", type=int, default=None,
                   help=f"random seed for velocities and the thermostat (default {MDSettings.seed})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _not_an_output(spec, out_dir: str) -> None:
    """A structure file that is one of the files the run writes into ``out_dir`` is refused: even
    ``--overwrite`` must not replace the run's own input (an earlier run's md.traj, say)."""
    from ..calculators.md import MD_FILES
    from ..training.data import split_selection

    if spec is None or not os.path.isdir(out_dir):
        return
    path = split_selection(spec)[0]
    for name in MD_FILES:
        target = os.path.join(out_dir, name)
        if os.path.isfile(path) and os.path.isfile(target) and os.path.samefile(path, target):
            raise FileExistsError(f"structure {spec!r} is the file this run writes its {name} to in --out "
                                  f"{out_dir!r}; copy it out of {out_dir!r} or choose another --out")


def load_structure(spec):
    """``(atoms, description)`` for a built-in name, an ASE-readable file (its last frame) or one
    frame ``FILE@INDEX`` selects."""
    from ..calculators.md import builtin_structure

    if spec is None:
        spec = "cu-fcc"
    if spec in BUILTIN_STRUCTURES and not os.path.exists(spec):
        return builtin_structure(spec), f"built-in {spec}"
    from ..training.data import read_frames, split_selection

    path, _ = split_selection(spec)
    if not os.path.exists(path):
        raise FileNotFoundError(f"structure {path!r} is neither a file nor a built-in example "
                                f"({', '.join(BUILTIN_STRUCTURES)})")
    frames = read_frames(spec, index=-1)  # only the last frame: a long trajectory is not read whole
    if len(frames) != 1:
        raise ValueError(f"structure {spec!r} selects {len(frames)} frames; MD starts from one (FILE@INDEX)")
    return frames[0], spec


# MDSettings field -> the flag that sets it
MD_FLAGS = {"timestep_fs": "--timestep", "temperature_K": "--temperature", "ensemble": "--ensemble",
            "pressure_bar": "--pressure", "friction_per_ps": "--friction", "steps": "--steps",
            "log_interval": "--log-interval", "traj_interval": "--traj-interval", "seed": "--seed",
            "tdamp_fs": "--tdamp", "pdamp_fs": "--pdamp"}

# MACECalculator argument -> the flag that sets it
CALC_FLAGS = {"device": "--device", "head": "--head", "default_dtype": "--dtype", "skin": "--skin",
              "num_threads": "--threads"}

# flags that only some ensembles read: flag -> (argument, those ensembles)
ENSEMBLE_FLAGS = {"--pressure": ("pressure", ("npt",)), "--pdamp": ("pdamp", ("npt",)),
                  "--friction": ("friction", ("nvt-langevin",)),
                  "--tdamp": ("tdamp", ("nvt-nose-hoover", "nvt-bussi", "npt"))}

# ensembles whose thermostat reads --temperature, and those that draw random numbers (--seed) each step
THERMOSTATS = ("nvt-langevin", "nvt-nose-hoover", "nvt-bussi", "npt")
STOCHASTIC = ("nvt-langevin", "nvt-bussi")


def md_settings(args: argparse.Namespace, steps: int) -> MDSettings:
    """The run's settings from the flags, checked; an error names the flag (``--timestep``), not the field."""
    from . import option_names

    for flag, (name, ensembles) in ENSEMBLE_FLAGS.items():
        if getattr(args, name) is not None and args.ensemble not in ensembles:
            raise ValueError(f"{flag} applies to --ensemble {' or '.join(ensembles)} only, and this run's is "
                             f"{args.ensemble}")
    if args.keep_velocities:  # velocities come from the file: only a thermostat reads these then
        unread = [flag for flag, value, ensembles in (("--temperature", args.temperature, THERMOSTATS),
                                                      ("--seed", args.seed, STOCHASTIC))
                  if value is not None and args.ensemble not in ensembles]
        if unread:
            raise ValueError(f"{' and '.join(unread)}: not read with --keep-velocities and --ensemble "
                             f"{args.ensemble} (the velocities come from the structure); drop "
                             f"{'them' if len(unread) > 1 else 'it'}, or draw new velocities without --keep-velocities")
    given = {"pressure_bar": args.pressure, "friction_per_ps": args.friction, "temperature_K": args.temperature,
             "seed": args.seed}
    settings = MDSettings(steps=steps, timestep_fs=args.timestep,
                          ensemble=args.ensemble, tdamp_fs=args.tdamp, pdamp_fs=args.pdamp,
                          log_interval=args.log_interval, traj_interval=args.traj_interval,
                          **{k: v for k, v in given.items() if v is not None})
    try:
        settings.validate()
    except ValueError as exc:
        raise ValueError(option_names(str(exc), MD_FLAGS)) from None
    return settings


def check_out_dir(out: str) -> None:
    """Raise, naming ``--out``, unless ``out`` is a directory, or one that can be created, that takes
    new files: checked before the model loads, not when the run starts writing."""
    if not out:
        raise ValueError("--out: empty, expected a directory name such as md_out")
    if os.path.exists(out) and not os.path.isdir(out):
        raise NotADirectoryError(f"--out {out!r} is a file; expected a directory (it is created if missing)")
    base = os.path.abspath(out)
    while not os.path.exists(base):  # the nearest existing folder, where the first new one is made
        base = os.path.dirname(base)
    if not os.path.isdir(base):
        raise NotADirectoryError(f"--out {out!r}: {base!r} is a file, not a folder; choose another --out")
    if not os.access(base, os.W_OK | os.X_OK):
        raise PermissionError(f"--out {out!r}: cannot create files in {base!r}; choose another --out")


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


def run(args: argparse.Namespace) -> int:
    from ..calculators.calculator import MACECalculator
    from ..calculators.loading import default_model_path
    from ..calculators.mace_args import class_name
    from ..calculators.md import Interrupted, check_ensemble, earlier_md_run, run_md, time_one_step
    from ..calculators.neighbors import DEFAULT_SKIN
    from ..models.foundations import DownloadError, foundation_checkpoint
    from . import option_names

    atoms, structure = load_structure(args.structure)
    _not_an_output(args.structure, args.out)
    if args.supercell:
        if min(args.supercell) < 1:
            raise ValueError(f"--supercell needs three positive integers, got {args.supercell}")
        flat = [i for i in range(3) if args.supercell[i] > 1 and not atoms.cell[i].any()]
        if flat:
            raise ValueError(f"--supercell {' '.join(map(str, args.supercell))}: {structure} has no lattice vector "
                             f"{', '.join('abc'[i] for i in flat)} to repeat along (its cell lengths are "
                             f"{', '.join(f'{x:g}' for x in atoms.cell.lengths())} Angstrom)")
        atoms = atoms.repeat(tuple(args.supercell))
    if args.steps is not None and args.steps < 0:
        raise ValueError(f"--steps must be >= 0, got {args.steps}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be a positive integer, got {args.threads}")
    if args.skin is not None and not (math.isfinite(args.skin) and args.skin >= 0):
        raise ValueError(f"--skin must be a finite number >= 0 Angstrom, got {args.skin:g}")
    check_ensemble(atoms, md_settings(args, steps=args.steps or 0))  # a bad flag or structure before the model loads
    check_out_dir(args.out)
    earlier = earlier_md_run(args.out)
    if earlier and not args.overwrite:
        raise FileExistsError(f"--out {args.out!r} holds an earlier run ({', '.join(earlier)}); --overwrite "
                              "replaces it, or choose another --out")
    if args.keep_velocities and not atoms.has("momenta"):
        raise ValueError(f"--keep-velocities: {structure} holds no velocities (expected a trajectory or extxyz "
                         "file with momenta, such as an earlier run's md.traj)")
    if args.model is not None:  # a foundation-model name: its file, so the summary records where it is
        try:
            args.model = foundation_checkpoint(args.model) or args.model
        except DownloadError as exc:  # it says which model and why
            raise DownloadError(f"--model {args.model!r}: {exc}") from exc
    try:
        calc = MACECalculator(args.model, device=args.device, default_dtype=args.dtype, head=args.head,
                              skin=DEFAULT_SKIN if args.skin is None else args.skin, num_threads=args.threads)
    except ValueError as exc:  # the flag, not the calculator's argument (--device, not device)
        raise ValueError(option_names(str(exc), CALC_FLAGS)) from exc
    if "forces" not in calc.implemented_properties:
        raise ValueError(f"--model {args.model}: {class_name(calc.model)} predicts dipoles only, no forces to run "
                         "dynamics with")
    device_kind = "cuda" if calc.device.type == "cuda" else "cpu"
    steps_note = ""
    steps = args.steps
    if steps is None:
        steps = DEFAULT_STEPS[device_kind]
        steps_note = f" (the {device_kind.upper()} default; --steps N for more)"
    settings = md_settings(args, steps)
    calc.elements.check(atoms.numbers)
    atoms.calc = calc
    model = args.model if args.model is not None else "the bundled default model"
    dtype = str(calc.dtype).replace("torch.", "")
    threads = f", {calc.num_threads} thread{'s' if calc.num_threads != 1 else ''}" if calc.device.type == "cpu" else ""
    plural = "s" if len(atoms) != 1 else ""
    at = (" from the structure's velocities" if args.keep_velocities and settings.ensemble not in THERMOSTATS
          else f" at {settings.temperature_K:g} K")
    print(f"equikernels md: {len(atoms)} atom{plural} ({atoms.get_chemical_formula()}, {structure}), "
          f"{settings.ensemble}{at}, {steps} steps of {settings.timestep_fs:g} fs"
          f"{steps_note}", flush=True)
    compiles = " (the first evaluation compiles kernels)" if calc.device.type == "cuda" else ""
    heads = list(getattr(calc, "heads", None) or [])
    head = f", head {calc.head}" if len(heads) > 1 else ""  # which head a multi-head model ran, --head or not
    print(f"  model {model}{head} on {calc.device} ({dtype}{threads}){compiles}", flush=True)
    if not args.keep_velocities and atoms.has("momenta") and np.any(atoms.get_momenta()):
        print(f"  the velocities in {structure} are replaced by ones drawn at {settings.temperature_K:g} K "
              "(--keep-velocities starts from them)", flush=True)
    step_s = time_one_step(atoms, settings)  # fails here, before the run, for structures the model cannot run
    print(f"  {step_s:.3g} s per step: estimated {_seconds(step_s * steps)} for {steps} steps; output in {args.out}",
          flush=True)
    info = {"model": os.path.abspath(args.model if args.model else default_model_path()), "structure": structure,
            "velocities": "from the structure" if args.keep_velocities else "drawn at the temperature"}
    if head:
        info["head"] = calc.head
    try:
        summary = run_md(atoms, settings, out_dir=args.out, progress=not args.no_progress, info=info,
                         init_velocities=not args.keep_velocities, overwrite=args.overwrite)
    except Interrupted as exc:
        traj = os.path.join(args.out, "md.traj")
        resume = (f"; continue from its last frame with: equikernels md {traj} --keep-velocities --out NEW_DIR"
                  if settings.traj_interval and os.path.isfile(traj) else "")
        print(f"equikernels md: {exc}; summary written to {os.path.join(args.out, 'summary.json')}{resume}",
              file=sys.stderr)
        return 128 + exc.signum
    rate = f"{summary['ns_per_day']:.4g} ns/day" if summary["ns_per_day"] is not None else "ns/day n/a (< 2 steps)"
    print(f"equikernels md: done, {summary['steps_done']} steps in {summary['wall_s']:.1f} s, {rate}, "
          f"{summary['neighbor_list_builds']} neighbour-list builds, final T {summary['temperature_end_K']:.1f} K")
    wrote = [summary.get("trajectory"), summary.get("log"), os.path.join(args.out, "summary.json")]
    print("  wrote " + ", ".join(w for w in wrote if w))
    return 0
