"""``equikernels tune``: tune named problems or a model ahead of time, on the GPU they will run on.

Tuning is off by default: every op runs a heuristic launch configuration, with no timing and
without reading the tuning cache. With ``EQUIKERNELS_AUTOTUNE=1`` set, an op times its candidate
configurations on its first launch for each shape bucket on a GPU (seconds per kernel set), stores
the fastest in the tuning cache (``equikernels.tune``) and reuses it in later runs. This command
does that timing now, for the directions a training step uses (forward, backward, double
backward), and prints the choices and their speed-ups; later runs use them only when they also
set ``EQUIKERNELS_AUTOTUNE=1`` (same GPU, torch, Triton and equikernels versions)."""
from __future__ import annotations

import argparse
import time

import torch

from .. import settings


def register(sub) -> None:
    p = sub.add_parser("tune", help="autotune kernels for named problems or a model, ahead of time",
                       description=__doc__.replace("``", "'"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problems", default="", help="comma-separated names from equikernels.catalog "
                   "(e.g. mace-mp-medium-L2,nequip-water; 'all' for every standard problem)")
    p.add_argument("--rows", type=int, default=None, help="rows for the named problems (default 50000)")
    p.add_argument("--model", default=None, help="a model file (ours or mace-torch): tunes one training step")
    p.add_argument("--structure", default=None,
                   help="structure for --model: a file ASE reads (its last frame, as equikernels md reads it) or the "
                        "frames ASE's FILE@INDEX selects (FILE@-1, FILE@:10, FILE@::2), one training step each; "
                        "default: Cu fcc (its sites take the model's elements when it has no Cu)")
    p.add_argument("--atoms", type=int, default=None,
                   help="Cu fcc size for --model without --structure: this many atoms, or the fewest above it "
                        "that the cubic cell allows (default 1008)")
    p.add_argument("--dtype", choices=("float32", "float64"), default=None,
                   help="math dtype (default: float32 for --problems; for --model the model's own, the dtype "
                        "equikernels md and eval run it in)")
    p.add_argument("--layout", choices=("ir_mul", "mul_ir"), default=None,
                   help="operand layout of the named problems (default ir_mul)")
    p.add_argument("--device", default="cuda", help="the CUDA device to tune on (default cuda)")
    p.set_defaults(func=run)


def _problem_step(name: str, rows: int, dtype, layout: str, device) -> None:
    from ..catalog import problem
    from ..ops import tensor_product
    p = problem(name)
    x = torch.randn(rows, p.dim_in1, dtype=dtype, device=device, requires_grad=True)
    y = torch.randn(rows, p.dim_in2, dtype=dtype, device=device, requires_grad=True)
    w = torch.randn(*((p.weight_numel,) if p.shared_weights else (rows, p.weight_numel)), dtype=dtype,
                    device=device, requires_grad=True)
    out = tensor_product(p, x, y, w, layout=layout)
    grads = torch.autograd.grad(out, (x, y, w), torch.randn_like(out), create_graph=True)
    torch.autograd.grad(sum((g * torch.randn_like(g)).sum() for g in grads), (x, y, w))


def _structures(spec, atoms: int) -> list:
    """The structures a model is tuned on: the last frame of file ``spec``, or the frames its
    ``FILE@INDEX`` selects (as ``equikernels eval`` reads them), else a rattled Cu fcc crystal of
    ``atoms`` atoms, or the fewest above it that the cubic cell allows."""
    import ase.build

    from ..training.data import read_frames

    if spec:
        try:
            return read_frames(spec, index=-1)  # only the last frame: a long trajectory is not read whole
        except (FileNotFoundError, IsADirectoryError, ValueError) as exc:
            raise type(exc)(f"--structure: {exc}") from None
    at = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True).repeat(_repeats(atoms))
    at.rattle(0.05, seed=0)
    return [at]


def _repeats(atoms: int) -> tuple:
    """The repeats (n1 <= n2 <= n3 <= 2 n1) of the 4-atom cubic fcc cell that hold the fewest atoms >= ``atoms``:
    tunings are kept per power-of-two size bucket, and a crystal rounded down could fall into a smaller one."""
    cells = max(1, -(-atoms // 4))
    best = None
    for n1 in range(1, round(cells ** (1 / 3)) + 2):
        for n2 in range(n1, 2 * n1 + 1):
            n3 = max(n2, -(-cells // (n1 * n2)))
            if n3 <= 2 * n1 and (best is None or n1 * n2 * n3 < best[0] * best[1] * best[2]):
                best = (n1, n2, n3)
    return best


def _fit_elements(structures: list, spec, elements) -> list:
    """``structures`` for a model with element table ``elements``: the frames of ``--structure`` must
    hold only those (else ValueError naming the option); the default crystal's sites take the model's
    elements in turn when copper is not among them (a MACE-OFF model: the same graph)."""
    elements = [int(z) for z in elements]
    if spec:
        for i, at in enumerate(structures):
            unknown = sorted(set(at.numbers.tolist()) - set(elements))
            if unknown:
                raise ValueError(f"--structure {spec}: frame {i} holds atomic numbers {unknown}, which are not in "
                                 f"the model's table {elements}")
        return structures
    at = structures[0]
    if set(at.numbers.tolist()) - set(elements):
        at = at.copy()
        at.numbers = [elements[i % len(elements)] for i in range(len(at))]
    return [at]


def _model_step(model, at, dtype, device) -> None:
    from ..models import atoms_to_data
    model = model.to(device=device, dtype=dtype)
    data = atoms_to_data(at, float(model.r_max), model.atomic_numbers.tolist(), device=device, dtype=dtype)
    out = model(data, training=True, compute_force=True, compute_stress=bool(at.pbc.all()))
    loss = out["energy"].sum() + out["forces"].pow(2).sum()  # a force loss: needs the double backward
    loss.backward()


def _own_dtype(model) -> torch.dtype:
    """The dtype ``model``'s floating-point parameters hold (float32 where that is no tuned dtype)."""
    dtype = next((t.dtype for t in model.parameters() if t.is_floating_point()), torch.float32)
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _device(value: str) -> torch.device:
    """``--device`` as a CUDA device that exists here; the arguments are checked before this."""
    try:
        device = torch.device(value)
    except RuntimeError:
        raise ValueError(f"--device: {value!r} is not a device name; expected cuda or cuda:N") from None
    if device.type != "cuda":
        raise ValueError(f"--device {value}: tuning needs a CUDA device (it times real GPU launches)")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {value}: no CUDA device is visible here, and tuning times real GPU launches")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ValueError(f"--device {value}: this machine has {count} CUDA device(s) (cuda:0 to cuda:{count - 1})")
    return device


def run(args) -> int:
    from tqdm import tqdm

    from .. import tune
    from ..catalog import standard_problems
    from ..tune.cache import check_persistent, configured_path, variable
    from .show_settings import warn_unknown
    warn_unknown("tune")  # the EQUIKERNELS_TUNE_* settings shape the run: a misspelt one is named
    # the arguments first: a mistyped one is named even where no GPU is visible
    names = (list(standard_problems()) if args.problems.strip() == "all"
             else [n.strip() for n in args.problems.split(",") if n.strip()])  # "a, b" as "a,b"
    unknown = [n for n in names if n not in standard_problems()]
    if unknown:
        raise ValueError(f"--problems: unknown {unknown}; known: {', '.join(standard_problems())}")
    if not names and not args.model:
        raise ValueError("give --problems and/or --model" if not args.problems.strip() else
                         f"--problems {args.problems!r}: no problem name; expected names such as mace-mp-medium-L2")
    # an option that does not apply to what is tuned is named, not ignored
    for option, value, why in (("--rows", args.rows, "a model is tuned on --structure or the --atoms crystal"),
                               ("--layout", args.layout, "a model is tuned in its own layout")):
        if value is not None and not names:
            raise ValueError(f"{option}: only with --problems ({why})")
    if args.atoms is not None and (not args.model or args.structure is not None):
        raise ValueError("--atoms: only with --model and without --structure (the size of the default Cu crystal)")
    rows, atoms = (50000 if args.rows is None else args.rows), (1008 if args.atoms is None else args.atoms)
    layout = "ir_mul" if args.layout is None else args.layout
    if names and rows < 1:
        raise ValueError(f"--rows: expected a positive number of rows, got {rows}")
    if args.model and args.structure is None and atoms < 1:
        raise ValueError(f"--atoms: expected a positive number of atoms, got {atoms}")
    if args.structure is not None:
        if not args.model:
            raise ValueError("--structure: only with --model (the named problems take --rows)")
    model, structures = None, []
    if args.model:  # read here, on the CPU: a bad file or structure is named before the GPU is looked for
        from ..models import load
        structures = _structures(args.structure, atoms)  # before the model: reading a large one takes a while
        model = load(args.model, device="cpu")
        structures = _fit_elements(structures, args.structure, model.atomic_numbers.tolist())
    target = configured_path()
    check_persistent(target)  # tunings kept only until exit would be work thrown away
    device = _device(args.device)
    dtype = torch.float32 if args.dtype is None else getattr(torch, args.dtype)
    # the model's own dtype by default: tunings of another dtype would go unused by the runs that load it
    model_dtype = dtype if args.dtype is not None or model is None else _own_dtype(model)
    before = set(tune.cache()._read())
    jobs = [("problem", n) for n in names] + [("model", at) for at in structures]
    t0 = time.perf_counter()
    with settings.override(autotune=True):  # this run tunes; later runs read the cache when enabled
        for kind, what in tqdm(jobs, desc="tuning", unit="job"):
            if kind == "problem":
                _problem_step(what, rows, dtype, layout, device)
            else:
                _model_step(model, what, model_dtype, device)
    torch.cuda.synchronize()
    if tune.cache().path != target:  # a write failed during the run and went to the private fallback
        raise OSError(f"{variable()}: the tunings could not be written to {target} (see the warning "
                      "above); expected a writable location")
    entries = tune.cache()._read()
    new = {k: v for k, v in entries.items() if k not in before}
    print(f"tuned {len(new)} kernel configurations in {time.perf_counter() - t0:.1f} s "
          f"({len(entries) - len(new)} were cached already) -> {tune.cache().path}")
    print(f"{'what':70s} {'choice':34s} {'ms':>8s} {'default ms':>10s} {'speed-up':>8s}")
    for k, v in sorted(new.items()):
        what = "|".join(k.split("|")[4:])
        ms, d = _ms(v.get("ms")), _ms(v.get("default_ms"))  # entries of other writers may lack either
        sp = f"{d / ms:.2f}x" if d and ms else "-"
        print(f"{what[:70]:70s} {str(v['config'])[:34]:34s} {_shown(ms):>8s} {_shown(d):>10s} {sp:>8s}")
    if not settings.get().autotune:  # the cache is read only with tuning on: without it the work is unused
        print("later runs use these tunings only with EQUIKERNELS_AUTOTUNE=1 set (same GPU and versions)")
    return 0


def _ms(value):
    """``value`` as a time in ms, or None where it is not a number."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _shown(ms) -> str:
    return "-" if ms is None else f"{ms:.3f}"
