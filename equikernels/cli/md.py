"""``equikernels md``: molecular dynamics of a structure file (anything ASE reads) or a built-in
example, with the bundled default model or ``--model``."""
from __future__ import annotations

import argparse
import os

from ..calculators.md import BUILTIN_STRUCTURES, ENSEMBLES, MDSettings


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "md", help="run molecular dynamics with a MACE model (ASE)",
        description="Run MD with ASE and a MACE model. Writes md.traj, md.log and summary.json to --out.")
    p.add_argument("structure", nargs="?", default=None,
                   help=f"structure file (any format ASE reads; the last frame is used) or a built-in example "
                        f"({', '.join(BUILTIN_STRUCTURES)}); default: cu-fcc, a 108-atom Cu crystal")
    p.add_argument("--steps", type=int, default=1000, help="number of MD steps (default 1000)")
    p.add_argument("--timestep", type=float, default=1.0, help="timestep in fs (default 1.0)")
    p.add_argument("--temperature", type=float, default=300.0,
                   help="temperature in K: initial velocities and thermostat (default 300)")
    p.add_argument("--ensemble", choices=ENSEMBLES, default="nvt-langevin", help="default nvt-langevin")
    p.add_argument("--pressure", type=float, default=1.0, help="npt pressure in bar (default 1.0)")
    p.add_argument("--friction", type=float, default=10.0, help="Langevin friction in 1/ps (default 10)")
    p.add_argument("--supercell", type=int, nargs=3, metavar=("NA", "NB", "NC"), default=None,
                   help="repeat the structure NA x NB x NC times")
    p.add_argument("--model", default=None, help="model file (default: the bundled default model)")
    p.add_argument("--head", default=None, help="head of a multi-head model")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--dtype", choices=("float64", "float32"), default=None,
                   help="model precision (default: the model's own)")
    p.add_argument("--skin", type=float, default=None, help="neighbour-list skin in Angstrom (default 0.5)")
    p.add_argument("--out", default="md_out", help="output directory (default md_out)")
    p.add_argument("--log-interval", type=int, default=10, help="steps between log lines (0: no log)")
    p.add_argument("--traj-interval", type=int, default=10, help="steps between trajectory frames (0: none)")
    p.add_argument("--seed", type=int, default=0, help="random seed for velocities and the thermostat")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def load_structure(spec):
    from ..calculators.md import builtin_structure

    if spec is None:
        return builtin_structure("cu-fcc")
    if spec in BUILTIN_STRUCTURES and not os.path.exists(spec):
        return builtin_structure(spec)
    if not os.path.exists(spec):
        raise SystemExit(f"equikernels md: structure {spec!r} is neither a file nor a built-in example "
                         f"({', '.join(BUILTIN_STRUCTURES)})")
    from ase.io import read
    return read(spec)


def run(args: argparse.Namespace) -> int:
    from ..calculators.calculator import MACECalculator
    from ..calculators.md import run_md
    from ..calculators.neighbors import DEFAULT_SKIN

    atoms = load_structure(args.structure)
    if args.supercell:
        if min(args.supercell) < 1:
            raise SystemExit(f"equikernels md: --supercell needs three positive integers, got {args.supercell}")
        atoms = atoms.repeat(tuple(args.supercell))
    settings = MDSettings(steps=args.steps, timestep_fs=args.timestep, temperature_K=args.temperature,
                          ensemble=args.ensemble, pressure_bar=args.pressure, friction_per_ps=args.friction,
                          seed=args.seed, log_interval=args.log_interval, traj_interval=args.traj_interval)
    try:
        settings.validate()
        atoms.calc = MACECalculator(args.model, device=args.device, default_dtype=args.dtype, head=args.head,
                                    skin=DEFAULT_SKIN if args.skin is None else args.skin)
    except (ValueError, FileNotFoundError, TypeError) as exc:
        raise SystemExit(f"equikernels md: {exc}") from exc
    calc = atoms.calc
    print(f"equikernels md: {len(atoms)} atoms ({atoms.get_chemical_formula()}), {settings.ensemble}, "
          f"{settings.steps} steps of {settings.timestep_fs} fs at {settings.temperature_K} K on "
          f"{calc.device} ({str(calc.dtype).replace('torch.', '')}); output in {args.out}")
    try:
        summary = run_md(atoms, settings, out_dir=args.out, progress=not args.no_progress)
    except ValueError as exc:  # e.g. an element the model does not know, npt without a cell
        raise SystemExit(f"equikernels md: {exc}") from exc
    print(f"equikernels md: done in {summary['wall_s']:.1f} s, {summary['ns_per_day']:.4f} ns/day, "
          f"{summary['neighbor_list_builds']} neighbour-list builds, final T {summary['temperature_end_K']:.1f} K")
    return 0
