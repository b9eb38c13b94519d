"""``equikernels bench``: the side-by-side benchmark suite on a GPU, and the regression guard.

Runs the batched tensor product (fwd / bwd / dbwd on the standard problems), the graph convolution,
MACE (E+F and E+F+S at ~1k and ~10k atoms, float32 and float64), MD through ASE (ms per step at
~1k and ~10k atoms) and the MACE training step with equikernels next to e3nn, cuEquivariance and
OpenEquivariance (whichever are installed; absent ones are reported as absent), checks every
result against e3nn in float64 and writes ``<gpu-kind>.json``, ``<gpu-kind>.md`` and two plots to
``--out``.

``--check BASELINE.json`` compares the run with a stored run of the same GPU kind and exits with
status 1 when a cell is slower than ``baseline x (1 + margin) + slack`` (default margin 10 %, slack
0.05 ms; see ``equikernels.bench.compare``), or when no cell could be compared; a MACE, MD or
training cell over its limit is first timed again (``--confirm-rounds``, all its implementations
taking turns), as host work slows whole rounds on some machines; a run of some
groups, problems or ``--atoms`` sizes, or a ``--quick`` run, is compared on the cells it measured.
``--results RUN.json --check BASELINE.json`` compares two stored runs without measuring (no GPU
needed). ``--merge RUN.json ...`` joins runs of one GPU kind (the suite measured group by group) into
one result in ``--out``, e.g. a new baseline; it names the measured cells a later run's failure
replaced. Stopped by Ctrl-C or SIGTERM (``timeout``), a run still writes the cells it finished
(marked ``interrupted``) and exits with status 130. An earlier run's ``<gpu-kind>.json`` or ``.md`` in
``--out`` is kept unless ``--overwrite`` is given.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Optional

GROUPS = ("conv", "mace", "md", "tp", "train")
SIZED = ("mace", "md", "train")  # the groups whose system sizes --atoms picks
OUT = "bench-results"
IMPLS = "equikernels,e3nn,cuequivariance,openequivariance"
TARGET_MS = 200.0
CONFIRM_ROUNDS = 3
# options that only shape a measurement, with their defaults: with --results or --merge they would do nothing
MEASURING = (("--quick", "quick", False), ("--problems", "problems", None), ("--groups", "groups", ",".join(GROUPS)),
             ("--impls", "impls", IMPLS), ("--atoms", "atoms", None), ("--model", "model", None),
             ("--target-ms", "target_ms", TARGET_MS), ("--time-budget-s", "time_budget_s", None),
             ("--confirm-rounds", "confirm_rounds", CONFIRM_ROUNDS))


def register(sub) -> None:
    from ..bench.compare import DEFAULT_MARGIN, DEFAULT_SLACK_MS
    p = sub.add_parser("bench", help="benchmark suite side by side with e3nn / cuEquivariance / OpenEquivariance",
                       description=__doc__.replace("``", "'"), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=OUT, help="folder for the JSON, markdown and plots "
                   f"(default ./{OUT})")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier run's <gpu-kind>.json and .md in --out (kept otherwise)")
    p.add_argument("--quick", action="store_true", help="a small subset (3 problems at 20k rows, the "
                   "convolution at 1,008 atoms, float32 MACE E+F, MD and the E+F training step at 1,008 atoms)")
    p.add_argument("--problems", default=None, help="comma-separated standard problems for the batched "
                   "product (the tp group), or 'all' (default: all but nequip-revmd17-benzene)")
    p.add_argument("--groups", default=",".join(GROUPS), help=f"which groups to run, of {','.join(GROUPS)} "
                   "(default all)")
    p.add_argument("--impls", default=IMPLS,
                   help="implementations to run (default: all; absent ones are reported as absent)")
    p.add_argument("--atoms", default=None, help="comma-separated system sizes of the mace, md and train "
                   "groups, of 1008,10192 (default both; 1008 with --quick)")
    p.add_argument("--model", default=None, help="also time this model: a file or directory (mace-torch .model or "
                   "ours) or a foundation-model name (medium, small_off, ...; needs mace-torch)")
    p.add_argument("--target-ms", type=float, default=TARGET_MS,
                   help="timed work per cell (default 200 ms; an MD cell times ten times as much)")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="start no new cell after this many seconds; the rest are reported as skipped")
    p.add_argument("--check", metavar="BASELINE.json", default=None,
                   help="compare with a stored run of the same GPU kind; exit 1 on a regression")
    p.add_argument("--results", metavar="RUN.json", default=None,
                   help="with --check: compare this stored run instead of measuring")
    p.add_argument("--merge", metavar="RUN.json", nargs="+", default=None,
                   help="join stored runs of one GPU kind into one result in --out (no GPU needed)")
    p.add_argument("--confirm-rounds", type=int, default=CONFIRM_ROUNDS,
                   help="with --check: time a MACE, MD or training cell over its limit up to this many more "
                   f"rounds before judging it (default {CONFIRM_ROUNDS}; 0: judge the first rounds)")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help=f"relative noise margin of --check (default {DEFAULT_MARGIN})")
    p.add_argument("--slack-ms", type=float, default=DEFAULT_SLACK_MS,
                   help=f"absolute noise margin of --check in ms (default {DEFAULT_SLACK_MS})")
    p.set_defaults(func=run)


def _list(value: str, allowed, what: str):
    items = [s.strip() for s in value.split(",") if s.strip()]
    bad = [s for s in items if s not in allowed]
    if bad or not items:
        raise ValueError(f"{what}: unknown {bad or value!r}; expected some of {', '.join(allowed)}")
    return list(dict.fromkeys(items))  # a repeated name would time its cells twice: a file --merge and --check refuse


def _number(flag: str, value: float, positive: bool = False) -> None:
    """A finite number >= 0 (> 0 with ``positive``) for ``flag``; NaN would silently pass every check."""
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{flag}: expected a finite number {'>' if positive else '>='} 0, got {value}")


def _out_folder(out: str) -> Path:
    """``--out`` as a folder that can be created and written; checked before anything is measured or
    written (a run that could not write its results would lose them)."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"--out: {out!r} is a file, expected a folder for the JSON, markdown and plots")
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(f"--out: {str(existing)!r} is a file, so {out!r} cannot be a folder")
    try:  # a probe file, removed at once: the folder's permissions alone do not say (root, read-only mounts)
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".equikernels-bench-probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise PermissionError(f"--out {out!r}: cannot write in {str(existing)!r} ({exc.strerror or exc}); expected "
                              "a folder that can be written") from None
    return path


def _keep_earlier(out: Path, kind: str, overwrite: bool) -> None:
    """Refuse to replace the results of an earlier run of GPU kind ``kind`` in ``out`` without --overwrite."""
    for name in (f"{kind}.json", f"{kind}.md"):
        if (out / name).is_dir():  # no --overwrite replaces a folder: the results would be lost after measuring
            raise IsADirectoryError(f"--out {str(out)!r} holds a folder named {name}; expected room for the results "
                                    "file of that name")
    earlier = [name for name in (f"{kind}.json", f"{kind}.md") if (out / name).exists()]
    if earlier and not overwrite:
        raise FileExistsError(f"--out {str(out)!r} holds an earlier run's {' and '.join(earlier)}; give another "
                              "--out, or --overwrite to replace it (--merge joins runs)")


def _model(value: str) -> str:
    """``--model`` as every other command takes it: a model file, a model directory (as ``equikernels
    convert`` writes) or a foundation-model name (fetched by ``_fetch`` once a GPU is found). A file or
    directory is loaded here, on the CPU: one that is no model is named before the suite runs."""
    if os.path.exists(value):
        from ..models import load
        try:
            load(value, device="cpu")
        except (ValueError, OSError, ImportError, RuntimeError, KeyError, TypeError) as exc:
            text = str(exc).strip().splitlines()
            kind = type(exc) if type(exc) in (FileNotFoundError, IsADirectoryError, ImportError) else ValueError
            raise kind(f"--model: {text[0] if text else type(exc).__name__}") from None
        return os.path.normpath(value)  # a directory's trailing separator would leave its cells unnamed
    from ..models.foundations import is_foundation_name
    if not is_foundation_name(value):
        raise FileNotFoundError(f"--model: {value!r} is neither a model file or directory nor a foundation-model "
                                "name (medium, small_off, ...; those need mace-torch)")
    return value


def _fetch(value: str) -> None:
    """Download the foundation model ``value`` names, if it does, before anything is measured."""
    from ..models.foundations import DownloadError, foundation_checkpoint
    try:
        foundation_checkpoint(value)
    except DownloadError as exc:
        raise DownloadError(f"--model {value!r}: {exc}") from exc


def _baseline(args, gpu_kind: Optional[str] = None) -> dict:
    """The ``--check`` baseline, refused when ``gpu_kind`` is given and the baseline was measured on another."""
    from ..bench.compare import load_run
    base = load_run(args.check, "--check")
    if gpu_kind is not None:
        _same_kind(args, base, gpu_kind)
    return base


def _same_kind(args, base: dict, gpu_kind: str) -> None:
    from ..bench.compare import GPUKindMismatch
    if base["gpu_kind"] != gpu_kind:
        raise GPUKindMismatch(f"--check: {args.check} was measured on {base['gpu_kind']!r}, this "
                              f"{'run' if args.results or args.merge else 'GPU'} on {gpu_kind!r}; timings of "
                              "different GPU kinds are not comparable")


def _check(args, current: dict, base: dict) -> int:
    from ..bench.compare import compare
    res = compare(base, current, margin=args.margin, slack_ms=args.slack_ms)
    print(res.summary())
    return 0 if res.ok else 1


def _write(data: dict, out: Path) -> list:
    from .._files import atomic_write
    from ..bench.report import markdown, plots
    md = markdown(data)  # before any file: a result the report cannot show leaves none half-written
    out.mkdir(parents=True, exist_ok=True)
    stem = data["gpu_kind"]
    for name, text in ((f"{stem}.json", json.dumps(data, indent=1, default=str)), (f"{stem}.md", md)):
        # renamed into place: an interrupted write leaves the earlier file, never a truncated one
        atomic_write(out / name, lambda tmp, text=text: Path(tmp).write_text(text))
    print("\n" + md)
    return [out / f"{stem}.json", out / f"{stem}.md"] + plots(data, out, stem)


def _merge_notes(paths, runs) -> None:
    """Say which measured cells a later run replaced with a failure, and which versions the runs differ in:
    the merged file keeps only the later cell and the first run's environment."""
    from ..bench.compare import VERSION_KEYS, replacements
    swapped = replacements(runs)
    lost = [r for r in swapped if r[2] == "ok" and r[3] != "ok"]
    if swapped:
        print(f"{len(swapped)} cell(s) of earlier runs replaced by a later run's")
    for cid, impl, before, after in lost:
        print(f"  {cid} [{impl}]: measured ({before}) in an earlier run, now {after} from a later one")
    for key in VERSION_KEYS:
        seen = {}
        for path, r in zip(paths, runs):
            value = (r.get("env") or {}).get(key)
            if value is not None:
                seen.setdefault(value, []).append(path)
        if len(seen) > 1:
            print(f"note: the runs were measured with different {key}: "
                  + "; ".join(f"{v} ({', '.join(ps)})" for v, ps in seen.items()))


def _no_empty_paths(args) -> None:
    """An empty path (``--check "$BASELINE"`` with the variable unset) would turn its option off
    silently: the guard would not run, a stored run would be measured again, --out would be the
    working folder."""
    for flag, value in (("--check", args.check), ("--results", args.results), ("--model", args.model),
                        ("--out", args.out), *(("--merge", m) for m in args.merge or ())):
        if value is not None and not value.strip():
            raise ValueError(f"{flag}: an empty path; expected a file or folder name")


def run(args) -> int:
    from ..bench.compare import DEFAULT_MARGIN, DEFAULT_SLACK_MS, GPUKindMismatch, load_run, merge
    from ..bench.compare import limits as guard_limits
    _no_empty_paths(args)
    _number("--margin", args.margin)
    _number("--slack-ms", args.slack_ms)
    if not args.check:  # the margins shape only the comparison
        for flag, value, default in (("--margin", args.margin, DEFAULT_MARGIN),
                                     ("--slack-ms", args.slack_ms, DEFAULT_SLACK_MS)):
            if value != default:
                raise ValueError(f"{flag}: only with --check BASELINE.json (a noise margin of the comparison)")
    if args.merge or args.results:
        given = [flag for flag, name, default in MEASURING if getattr(args, name, default) != default]
        if given:
            raise ValueError(f"{given[0]}: not with {'--merge' if args.merge else '--results'}, which "
                             f"{'joins' if args.merge else 'compares'} stored runs without measuring (a stored "
                             "run keeps the groups, problems and sizes it was measured with)")
    if args.merge:
        if args.results:
            raise ValueError("--merge: not with --results (merge the runs, then --results MERGED --check BASE)")
        out = _out_folder(args.out)
        runs = [load_run(p, "--merge") for p in args.merge]
        kinds = {r["gpu_kind"] for r in runs}
        if len(kinds) > 1:
            raise GPUKindMismatch("--merge: runs of different GPU kinds cannot be one result ("
                                  + ", ".join(f"{p!r} on {r['gpu_kind']!r}" for p, r in zip(args.merge, runs)) + ")")
        data = merge(runs)
        base = _baseline(args, data["gpu_kind"]) if args.check else None  # refused before anything is written
        _keep_earlier(out, data["gpu_kind"], args.overwrite)
        written = _write(data, out)
        print(f"merged {len(args.merge)} runs ({len(data['cells'])} cells); wrote " + ", ".join(map(str, written)))
        _merge_notes(args.merge, runs)
        return _check(args, data, base) if base is not None else 0
    if args.results:
        if not args.check:
            raise ValueError("--results: only with --check BASELINE.json (it compares two stored runs)")
        for flag, given in (("--out", args.out != OUT), ("--overwrite", args.overwrite)):
            if given:
                raise ValueError(f"{flag}: not with --results, which compares two stored runs and writes nothing")
        current = load_run(args.results, "--results")
        return _check(args, current, _baseline(args, current["gpu_kind"]))

    import torch
    from ..bench import suite
    from ..bench.environment import gpu_kind
    from ..catalog import standard_problems

    # the arguments first: a mistyped one is named even where no GPU is visible
    names = list(standard_problems())
    if args.problems in (None, ""):
        problems = list(suite.QUICK_PROBLEMS if args.quick else suite.FULL_PROBLEMS)
    elif args.problems == "all":
        problems = names
    else:
        problems = _list(args.problems, names, "--problems")
    impls, groups = _list(args.impls, suite.ALL_IMPLS, "--impls"), _list(args.groups, GROUPS, "--groups")
    sizes = [str(a) for a in suite.SYSTEMS]
    systems = None if args.atoms in (None, "") else [int(a) for a in _list(args.atoms, sizes, "--atoms")]
    # an option of groups this run leaves out would do nothing
    if args.problems not in (None, "") and "tp" not in groups:
        raise ValueError(f"--problems: only with the tp group (the batched product), which --groups "
                         f"{','.join(groups)} leaves out")
    if systems is not None and not set(groups) & set(SIZED):
        raise ValueError(f"--atoms: only with the {', '.join(SIZED)} groups, which --groups {','.join(groups)} "
                         "leaves out")
    if args.check and "equikernels" not in impls:  # every guarded cell would be missing: a certain failure
        raise ValueError(f"--check: guards the equikernels cells, which --impls {','.join(impls)} leaves out")
    if args.model:
        args.model = _model(args.model)
    _number("--target-ms", args.target_ms, positive=True)
    if args.confirm_rounds < 0:
        raise ValueError(f"--confirm-rounds: expected a whole number >= 0, got {args.confirm_rounds}")
    if args.confirm_rounds != CONFIRM_ROUNDS and not args.check:
        raise ValueError("--confirm-rounds: only with --check BASELINE.json (it re-times cells over the baseline's "
                         "limits)")
    if args.time_budget_s is not None:
        _number("--time-budget-s", args.time_budget_s)
    out = _out_folder(args.out)
    base = _baseline(args) if args.check else None
    if not torch.cuda.is_available():
        raise RuntimeError("needs a CUDA GPU and none is visible (compare stored runs without one: "
                           "--results RUN.json --check BASELINE.json)")
    device = torch.device("cuda")
    if base is not None:  # fail before measuring when the baseline cannot be used
        _same_kind(args, base, gpu_kind(device))
    _keep_earlier(out, gpu_kind(device), args.overwrite)  # before tens of minutes of measuring
    if args.model:  # a foundation model is downloaded only where it can be measured
        _fetch(args.model)
    limits = None if base is None else guard_limits(base, margin=args.margin, slack_ms=args.slack_ms)
    opts = suite.Options(quick=args.quick, problems=problems, model=args.model, target_ms=args.target_ms,
                         impls=impls, groups=groups, time_budget_s=args.time_budget_s, systems=systems,
                         limits=limits, confirm_rounds=args.confirm_rounds, log=lambda s: print(s, flush=True))
    with interrupt_on_sigterm():
        data = suite.run_suite(opts, device)
    written = _write(data, out)
    print("wrote " + ", ".join(str(p) for p in written), f"({data['wall_s']} s)")
    status = _check(args, data, base) if base is not None else 0
    if data.get("interrupted"):
        print(f"interrupted after {data['interrupted']['after_s']} s: the files hold the cells measured before it "
              "(merge them with --merge; a later run's measured cells replace them)", file=sys.stderr)
        return 130
    return status


@contextlib.contextmanager
def interrupt_on_sigterm():
    """SIGTERM (``timeout``, a scheduler) raises KeyboardInterrupt within the block, as Ctrl-C does, so
    the suite stops between operations and its finished cells are written."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: signals stay as they are
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


