"""Whole-model acceleration side by side: one E+F+S model call on a prebuilt graph, fp32.

Part "sevenn" (needs sevenn, e3nn >= 0.5): SevenNet-0 on CuNi fcc (2,048 atoms), Si diamond
(1,728), Cu fcc (10,976): e3nn, SevenNet + cuEquivariance, SevenNet + OpenEquivariance (SevenNet's
own switches) and SevenNet + ``equikernels.accelerate``.
Part "mace" (needs mace-torch): a MACE-MP-medium-shaped mace-torch model with random weights at
~1k and ~10k atoms: mace-torch (e3nn), mace-torch + ``equikernels.accelerate`` (called through
mace-torch's forward), ``equikernels.models.from_mace`` and mace-torch + cuEquivariance.

Per variant: median of CUDA-event times of the model call, peak memory of one call, and the
largest force / energy-per-atom / stress difference from the e3nn model. Writes JSON to --out.

    python benchmarks/bench_accelerate.py --part sevenn --out results.json
    python benchmarks/bench_accelerate.py --part mace --out results_mace.json
    python benchmarks/bench_accelerate.py --part sevenn --quick        # CPU smoke run, tiny cells
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import traceback

import numpy as np
import torch

GIB = 1024 ** 3


def timed(call, device, reps):
    """(median ms, peak GiB above the start, last output) of ``call()``."""
    out = call()  # warm-up: kernels built, tuned, cached
    out = call()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = call()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            out = call()
            times.append((time.perf_counter() - t0) * 1e3)
    peak = (torch.cuda.max_memory_allocated() - base) / GIB if device.type == "cuda" else float("nan")
    return statistics.median(times), peak, out


def _diff(out, ref, n):
    e, f, s = out
    e0, f0, s0 = ref
    return {"dE_per_atom": abs(float(e) - float(e0)) / n, "max_dF": float((f - f0).abs().max()),
            "max_dS": float((s - s0).abs().max())}


def _row(rows, structure, n, variant, fn, device, reps, ref=None):
    try:
        ms, peak, out = timed(fn, device, reps)
        row = {"structure": structure, "atoms": n, "variant": variant, "ms": ms, "peak_gib": peak}
        if ref is not None:
            row.update(_diff(out, ref, n))
        rows.append(row)
        print(json.dumps(row), flush=True)
        return out
    except Exception as exc:  # noqa: BLE001 (a backend that is not installed or fails: record and go on)
        rows.append({"structure": structure, "atoms": n, "variant": variant, "error": f"{type(exc).__name__}: {exc}"})
        print(f"{structure} {variant}: {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()
        torch.cuda.empty_cache() if device.type == "cuda" else None
        return None


# --- SevenNet -----------------------------------------------------------------------------------
def sevenn_structures(quick):
    import ase.build  # noqa: PLC0415

    rng = np.random.default_rng(0)
    cuni = ase.build.bulk("Cu", "fcc", a=3.58, cubic=True) * ((2, 2, 1) if quick else (8, 8, 8))
    cuni.numbers[rng.permutation(len(cuni))[: len(cuni) // 2]] = 28
    si = ase.build.bulk("Si", "diamond", a=5.43, cubic=True) * ((1, 1, 1) if quick else (6, 6, 6))
    cu = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True) * ((2, 1, 1) if quick else (14, 14, 14))
    out = []
    for name, atoms in (("CuNi fcc", cuni), ("Si diamond", si), ("Cu fcc", cu)):
        atoms.rattle(0.03, seed=1)
        out.append((name, atoms))
    return out


def run_sevenn(device, reps, quick):
    import sevenn.calculator as sc  # noqa: PLC0415
    from sevenn.atom_graph_data import AtomGraphData  # noqa: PLC0415
    from sevenn.train.dataload import unlabeled_atoms_to_graph  # noqa: PLC0415

    import equikernels as ek  # noqa: PLC0415

    dev = "cuda" if device.type == "cuda" else "cpu"
    models = {"e3nn": lambda: sc.SevenNetCalculator("7net-0", device=dev).model,
              "SevenNet + cuEquivariance": lambda: sc.SevenNetCalculator("7net-0", device=dev, enable_cueq=True).model,
              "SevenNet + OpenEquivariance": lambda: sc.SevenNetCalculator("7net-0", device=dev, enable_oeq=True).model}

    def accelerated():
        m = sc.SevenNetCalculator("7net-0", device=dev).model
        print(ek.accelerate(m), flush=True)
        return m
    models["SevenNet + equikernels.accelerate"] = accelerated
    rows = []
    for structure, atoms in sevenn_structures(quick):
        probe = models["e3nn"]()
        cutoff = float(probe.cutoff) if hasattr(probe, "cutoff") else 5.0
        del probe
        data = AtomGraphData.from_numpy_dict(unlabeled_atoms_to_graph(atoms, cutoff)).to(device)
        ref = None
        for variant, make in models.items():
            try:
                model = make()
            except Exception as exc:  # noqa: BLE001
                rows.append({"structure": structure, "atoms": len(atoms), "variant": variant,
                             "error": f"{type(exc).__name__}: {exc}"})
                print(f"{structure} {variant}: {exc}", flush=True)
                continue
            model.eval()

            def call(model=model):
                out = model(data.clone())
                return (out["inferred_total_energy"].detach().sum(), out["inferred_force"].detach(),
                        out["inferred_stress"].detach())
            out = _row(rows, structure, len(atoms), variant, call, device, reps, ref)
            if variant == "e3nn":
                ref = out
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


# --- mace-torch ---------------------------------------------------------------------------------
def mace_medium(num_elements=89):
    from mace import modules  # noqa: PLC0415
    from e3nn import o3  # noqa: PLC0415

    torch.manual_seed(0)
    m = modules.ScaleShiftMACE(
        r_max=6.0, num_bessel=10, num_polynomial_cutoff=5, max_ell=3,
        interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
        interaction_cls_first=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
        num_interactions=2, num_elements=num_elements, hidden_irreps=o3.Irreps("128x0e+128x1o"),
        MLP_irreps=o3.Irreps("16x0e"), atomic_energies=np.zeros(num_elements), avg_num_neighbors=61.0,
        atomic_numbers=list(range(1, num_elements + 1)), correlation=3, gate=torch.nn.functional.silu,
        radial_MLP=[64, 64, 64], atomic_inter_scale=1.0, atomic_inter_shift=0.0)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return m


def run_mace(device, reps, quick):
    import ase.build  # noqa: PLC0415
    from mace import data as mdata  # noqa: PLC0415
    from mace import tools  # noqa: PLC0415
    from mace.tools import torch_geometric  # noqa: PLC0415

    import equikernels as ek  # noqa: PLC0415
    from equikernels.models import from_mace  # noqa: PLC0415

    torch.set_default_dtype(torch.float32)
    base = mace_medium().to(device).eval()
    z_table = tools.AtomicNumberTable(list(range(1, 90)))
    sizes = [(1, 1, 1), (2, 1, 1)] if quick else [(7, 7, 7), (14, 14, 14)]
    rows = []
    for reps_cell in sizes:
        atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True) * reps_cell
        atoms.rattle(0.03, seed=1)
        graph = mdata.AtomicData.from_config(mdata.config_from_atoms(atoms), z_table=z_table, cutoff=6.0)
        batch = next(iter(torch_geometric.dataloader.DataLoader([graph], batch_size=1))).to(device).to_dict()
        structure = f"Cu fcc {len(atoms)}"

        def caller(model):
            def call():
                d = {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in batch.items()}
                out = model(d, training=False, compute_force=True, compute_stress=True)
                return out["energy"].detach().sum(), out["forces"].detach(), out["stress"].detach()
            return call
        ref = _row(rows, structure, len(atoms), "mace-torch (e3nn)", caller(base), device, reps)
        acc = copy.deepcopy(base)
        print(ek.accelerate(acc), flush=True)
        _row(rows, structure, len(atoms), "mace-torch + equikernels.accelerate", caller(acc), device, reps, ref)
        del acc
        _row(rows, structure, len(atoms), "equikernels.models.from_mace", caller(from_mace(base)), device, reps, ref)
        try:
            from mace.cli.convert_e3nn_cueq import run as to_cueq  # noqa: PLC0415
            cueq = to_cueq(copy.deepcopy(base).cpu(), device=str(device)).to(device).eval()
            _row(rows, structure, len(atoms), "mace-torch + cuEquivariance", caller(cueq), device, reps, ref)
        except Exception as exc:  # noqa: BLE001
            rows.append({"structure": structure, "atoms": len(atoms), "variant": "mace-torch + cuEquivariance",
                         "error": f"{type(exc).__name__}: {exc}"})
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def table(rows):
    lines = [f"{'structure':<16} {'variant':<38} {'ms':>9} {'peak GiB':>9} {'max dF':>9} {'dE/atom':>9}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['structure']:<16} {r['variant']:<38} error: {r['error'][:60]}")
            continue
        lines.append(f"{r['structure']:<16} {r['variant']:<38} {r['ms']:9.2f} {r['peak_gib']:9.2f} "
                     f"{r.get('max_dF', float('nan')):9.1e} {r.get('dE_per_atom', float('nan')):9.1e}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("sevenn", "mace"), required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="tiny cells (CPU smoke run)")
    ap.add_argument("--out", default=None, help="JSON file for the rows")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = (run_sevenn if args.part == "sevenn" else run_mace)(device, args.reps, args.quick)
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__}
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(meta)
    print(table(rows))


if __name__ == "__main__":
    main()
