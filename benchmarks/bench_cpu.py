"""CPU speed of equikernels next to what it replaces, interleaved in one process.

Cells: every standard tensor-product problem (``equikernels.catalog``) forward + backward against
``e3nn.o3.TensorProduct``, MACE energy + forces on a 108-atom Cu cell and one training step (E+F
loss, backward to the parameters) on a 32-atom one (a random MACE-MP-medium-shaped
``mace.modules.ScaleShiftMACE`` and the equikernels model converted from it), float32 and float64,
1 and 2 torch threads. Each repetition times both implementations back
to back (alternating which goes first); the cell reports the medians of each and, as the speed-up,
the median over repetitions of baseline / equikernels within the repetition (a shared host slowdown
cancels in each pair).

Needs mace-torch (with e3nn 0.4.4) for the MACE cells; without it they are reported as absent.

    python benchmarks/bench_cpu.py [--reps 7] [--rows 2000] [--threads 1,2] [--out benchmarks/results/cpu]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Callable, Dict, List

import torch

from equikernels._compat import default_dtype
from equikernels.bench import mace as MC


def _timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def interleaved(a: Callable[[], None], b: Callable[[], None], reps: int, warmup: int = 2):
    """(median seconds of a, of b, median of the per-repetition ratios a / b), the two run back to back,
    the order alternating per repetition."""
    for _ in range(warmup):
        a()
        b()
    ta, tb = [], []
    for r in range(reps):
        if r % 2:
            tb.append(_timed(b))
            ta.append(_timed(a))
        else:
            ta.append(_timed(a))
            tb.append(_timed(b))
    return statistics.median(ta), statistics.median(tb), statistics.median(x / y for x, y in zip(ta, tb))


# --- tensor products ----------------------------------------------------------------------------
def tp_cells(dtype: torch.dtype, rows: int, reps: int, names: List[str]) -> List[Dict]:
    from e3nn import o3

    from equikernels.catalog import standard_problems
    from equikernels.ops import tensor_product
    from equikernels.problem import TPProblem

    out = []
    for name, kw in standard_problems().items():
        if names and name not in names:
            continue
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            ref = o3.TensorProduct(**kw)
        finally:
            torch.set_default_dtype(old)
        p = TPProblem.create(**kw)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(rows, p.dim_in1, generator=g, dtype=dtype).requires_grad_()
        y = torch.randn(rows, p.dim_in2, generator=g, dtype=dtype).requires_grad_()
        shape = (p.weight_numel,) if p.shared_weights else (rows, p.weight_numel)
        w = torch.randn(shape, generator=g, dtype=dtype).requires_grad_()
        gout = torch.randn(rows, p.dim_out, generator=g, dtype=dtype)

        def run_ref():
            torch.autograd.grad(ref(x, y, w), (x, y, w), gout)

        def run_ek():
            torch.autograd.grad(tensor_product(p, x, y, w), (x, y, w), gout)

        with torch.no_grad():
            err = (tensor_product(p, x, y, w) - ref(x, y, w)).abs().max().item()
        t_ref, t_ek, ratio = interleaved(run_ref, run_ek, reps)
        out.append({"cell": f"TP {name} fwd+bwd ({rows} rows)", "baseline": "e3nn", "t_base": t_ref, "t_ek": t_ek,
                    "speedup": ratio, "max_abs_diff": err})
    return out


# --- MACE ---------------------------------------------------------------------------------------
R_MAX = MC.MP0_MEDIUM["r_max"]


def _mace_model(dtype: torch.dtype):
    return MC.mace_model(40.0, dtype).eval()


def _mace_inputs(atoms, dtype: torch.dtype):
    """(mace-torch's batch dict, equikernels' data) of ``atoms`` for the 89-element model, in ``dtype``."""
    from mace import data as mdata
    from mace.tools import torch_geometric, utils

    from equikernels.models import atoms_to_data

    zs = list(range(1, 90))
    with default_dtype(dtype):  # mace-torch's data takes the default dtype: float64 positions not rounded
        batch = torch_geometric.batch.Batch.from_data_list([mdata.AtomicData.from_config(
            mdata.config_from_atoms(atoms), z_table=utils.AtomicNumberTable(zs), cutoff=R_MAX, heads=["Default"])])
    mdict = {k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v)
             for k, v in batch.to_dict().items()}
    return mdict, atoms_to_data(atoms, R_MAX, zs, dtype=dtype)


def mace_cells(dtype: torch.dtype, reps: int) -> List[Dict]:
    import ase.build

    try:
        import mace  # noqa: F401
    except ImportError as exc:
        return [{"cell": "MACE E+F", "baseline": "mace-torch", "absent": f"{type(exc).__name__}: {exc}"}]
    from equikernels.models import from_mace

    atoms = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True).repeat((3, 3, 3))
    atoms.rattle(0.05, seed=0)
    model = _mace_model(dtype)
    ours = from_mace(model).eval()
    mdict, ours_data = _mace_inputs(atoms, dtype)
    ref_out = model(dict(mdict), compute_force=True)
    ek_out = ours(dict(ours_data), compute_force=True)
    diff = max((ref_out["energy"] - ek_out["energy"]).abs().max().item(),
               (ref_out["forces"] - ek_out["forces"]).abs().max().item())

    def run_ref():
        model(dict(mdict), compute_force=True)

    def run_ek():
        ours(dict(ours_data), compute_force=True)

    t_ref, t_ek, ratio = interleaved(run_ref, run_ek, reps, warmup=1)
    return [{"cell": f"MACE E+F, Cu {len(atoms)} atoms ({ours_data['edge_index'].shape[1]} edges)",
             "baseline": "mace-torch", "t_base": t_ref, "t_ek": t_ek, "speedup": ratio, "max_abs_diff": diff}]


def mace_train_cells(dtype: torch.dtype, reps: int) -> List[Dict]:
    """One fine-tuning step on a 32-atom Cu cell: E+F loss, backward to every parameter (the force
    term differentiates twice), mace-torch's model against the equikernels model converted from it."""
    import ase.build

    try:
        import mace  # noqa: F401
    except ImportError as exc:
        return [{"cell": "MACE training step", "baseline": "mace-torch", "absent": f"{type(exc).__name__}: {exc}"}]
    from equikernels.models import from_mace

    atoms = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 2, 2))
    atoms.rattle(0.05, seed=0)
    model = MC.mace_model(40.0, dtype).train()
    ours = from_mace(model).train()
    mdict, ours_data = _mace_inputs(atoms, dtype)

    def step(m, data):
        out = m(dict(data), training=True, compute_force=True)
        loss = out["energy"].square().sum() + out["forces"].square().sum()
        m.zero_grad(set_to_none=True)
        loss.backward()
        return loss.detach()

    diff = (step(model, mdict) - step(ours, ours_data)).abs().item()
    t_ref, t_ek, ratio = interleaved(lambda: step(model, mdict), lambda: step(ours, ours_data), reps, warmup=1)
    return [{"cell": f"MACE training step (E+F loss, backward), Cu {len(atoms)} atoms", "baseline": "mace-torch",
             "t_base": t_ref, "t_ek": t_ek, "speedup": ratio, "max_abs_diff": diff}]


# --- report -------------------------------------------------------------------------------------
def table(results: List[Dict]) -> str:
    lines = ["| cell | dtype | threads | baseline | baseline ms | equikernels ms | speed-up | max abs diff |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for r in results:
        if "absent" in r:
            lines.append(f"| {r['cell']} | {r['dtype']} | {r['threads']} | {r['baseline']} | absent: {r['absent']} "
                         "| | | |")
            continue
        lines.append(f"| {r['cell']} | {r['dtype']} | {r['threads']} | {r['baseline']} | {r['t_base'] * 1e3:.1f} "
                     f"| {r['t_ek'] * 1e3:.1f} | {r['speedup']:.2f}x | {r['max_abs_diff']:.1e} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--problems", default="", help="comma-separated catalog names (default: all)")
    ap.add_argument("--skip-tp", action="store_true")
    ap.add_argument("--skip-mace", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "cpu"))
    args = ap.parse_args(argv)
    torch.serialization.add_safe_globals([slice])  # e3nn 0.4.4 loads its constants with torch.load (torch >= 2.6)
    names = [n for n in args.problems.split(",") if n]
    results = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for dname in args.dtypes.split(","):
            dtype = getattr(torch, dname)
            cells = ([] if args.skip_tp else tp_cells(dtype, args.rows, args.reps, names)) + \
                ([] if args.skip_mace else mace_cells(dtype, args.reps) + mace_train_cells(dtype, args.reps))
            for c in cells:
                c.update(dtype=dname, threads=threads)
                print(table([c]).splitlines()[-1], flush=True)
            results += cells
    import e3nn

    try:
        import mace
        mace_version = getattr(mace, "__version__", "?")
    except ImportError:
        mace_version = "absent"
    head = (f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}, "
            f"e3nn {e3nn.__version__}, mace-torch {mace_version}; medians of {args.reps} interleaved repetitions.")
    text = head + "\n\n" + table(results) + "\n"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cpu_speed.md"), "w") as f:
        f.write(text)
    print("\n" + text)


if __name__ == "__main__":
    main()
