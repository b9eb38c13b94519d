"""Whole-model acceleration side by side: one E+F+S model call on a prebuilt graph, fp32.

Part "sevenn" (needs sevenn, e3nn >= 0.5): SevenNet-0 on CuNi fcc (2,048 atoms), Si diamond
(1,728), Cu fcc (10,976): e3nn, SevenNet + cuEquivariance, SevenNet + OpenEquivariance (SevenNet's
own switches) and SevenNet + ``equikernels.accelerate``, and the accelerated model with every
``Linear`` as one product per block (no dense weight matrix) as an in-process comparison.
Part "mace" (needs mace-torch): a MACE-MP-medium-shaped mace-torch model with random weights at
~1k and ~10k atoms: mace-torch (e3nn), mace-torch + ``equikernels.accelerate`` (the model object's
own call), the same object through mace-torch's forward with only its layers accelerated,
``equikernels.models.from_mace`` (also with per-block linears) and mace-torch + cuEquivariance
(``mace.cli.convert_e3nn_cueq``).

Per variant: median of CUDA-event times of the model call (the variants interleaved), peak
memory of one call above what was allocated before it, and the largest force / energy-per-atom /
stress difference from the e3nn model; for mace-torch also float64 parity of accelerate and
from_mace with the unmodified model. The mace-torch call is the one MACECalculator makes (E+F,
training=False, a fresh copy of the batch, parameters frozen). Writes JSON to --out.

    python benchmarks/bench_accelerate.py --part sevenn --out results.json
    python benchmarks/bench_accelerate.py --part mace --out results_mace.json
    python benchmarks/bench_accelerate.py --part sevenn --quick        # CPU smoke run, tiny cells
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import time
import traceback

import numpy as np
import torch

GIB = 1024 ** 3


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_gib(call, device):
    """Peak memory of one call above what was allocated before it (GiB; NaN on CPU); equikernels'
    shared graph cache is emptied first, so a variant's graph is counted in its own peak."""
    if device.type != "cuda":
        return float("nan")
    from equikernels.adapters.graph_cache import clear_shared  # noqa: PLC0415

    clear_shared()  # the graph kept from the last call is built inside this one, and counted
    _sync(device)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = call()
    _sync(device)
    del out
    return (torch.cuda.max_memory_allocated() - base) / GIB


def interleaved(calls, device, reps):
    """Median ms per variant, the variants taking turns within each repetition in a fresh random
    order (seeded), so clock and thermal drift, and the state a heavy call leaves behind, fall on
    every variant alike rather than always on the one after it. CUDA events on GPU."""
    names = list(calls)
    times = {n: [] for n in names}
    rng = random.Random(0)
    for _ in range(reps):
        for n in rng.sample(names, len(names)):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                _sync(device)
                start.record()
                out = calls[n]()
                end.record()
                _sync(device)
                times[n].append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                out = calls[n]()
                times[n].append((time.perf_counter() - t0) * 1e3)
            del out
    return {n: statistics.median(t) for n, t in times.items()}


def _diff(out, ref, n):
    row = {"dE_per_atom": abs(float(out[0]) - float(ref[0])) / n, "max_dF": float((out[1] - ref[1]).abs().max())}
    if len(out) > 2 and out[2] is not None:
        row["max_dS"] = float((out[2] - ref[2]).abs().max())
    return row


def profile(calls, device, path, reps=3):
    """Kernel-time table (torch.profiler, sorted by device time) of each variant's calls, written to ``path``."""
    from torch.profiler import ProfilerActivity, profile as prof  # noqa: PLC0415

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with open(path, "w") as f:
        for name, call in calls.items():
            call()
            _sync(device)
            with prof(activities=acts) as p:
                for _ in range(reps):
                    call()
                _sync(device)
            key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
            f.write(f"== {name} ({reps} calls)\n{p.key_averages().table(sort_by=key, row_limit=25)}\n")
    print(f"profiles written to {path}", flush=True)


def measure(rows, structure, n, calls, device, reps, ref_name):
    """Warm every variant (kernels built, tuned, cached), record its difference from ``ref_name``
    and its peak memory, then time all of them interleaved. A variant that fails is recorded and left out."""
    ok, outs = {}, {}
    for name, call in calls.items():
        try:
            call()
            outs[name] = call()
            ok[name] = call
        except Exception as exc:  # noqa: BLE001 (a backend that is not installed or fails: record and go on)
            rows.append({"structure": structure, "atoms": n, "variant": name, "error": f"{type(exc).__name__}: {exc}"})
            print(f"{structure} {name}: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
    ref = outs.get(ref_name)
    diffs = {name: _diff(o, ref, n) for name, o in outs.items() if ref is not None and name != ref_name}
    del outs
    peaks = {name: peak_gib(call, device) for name, call in ok.items()}
    ms = interleaved(ok, device, reps) if ok else {}
    for name in ok:
        row = {"structure": structure, "atoms": n, "variant": name, "ms": ms[name], "peak_gib": peaks[name]}
        row.update(diffs.get(name, {}))
        rows.append(row)
        print(json.dumps(row), flush=True)


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


def per_block_linears(call):
    """``call`` with every ``Linear`` as one product per block, never the dense weight matrix: the
    accelerate path before small inputs took one product, as an in-process comparison."""
    from equikernels.nn import linear  # noqa: PLC0415

    def run():
        saved, linear.DENSE_DEVICES = linear.DENSE_DEVICES, ()
        try:
            return call()
        finally:
            linear.DENSE_DEVICES = saved
    return run


def layer_path(model):
    """An accelerated mace-torch model called through mace-torch's own forward with its layers
    accelerated (the whole-model path bypassed), as an in-process comparison."""
    from equikernels.adapters.classes import original_class  # noqa: PLC0415

    return lambda *a, **k: original_class(model).forward(model, *a, **k)


def run_sevenn(device, reps, quick, profile_dir=None):
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
    built = {}
    for variant, make in models.items():
        try:
            built[variant] = make().eval()
        except Exception as exc:  # noqa: BLE001
            rows.append({"structure": "-", "atoms": 0, "variant": variant, "error": f"{type(exc).__name__}: {exc}"})
            print(f"{variant}: {exc}", flush=True)
    cutoff = float(getattr(built["e3nn"], "cutoff", 5.0))
    for structure, atoms in sevenn_structures(quick):
        data = AtomGraphData.from_numpy_dict(unlabeled_atoms_to_graph(atoms, cutoff)).to(device)

        def caller(model):
            def call():
                out = model(data.clone())
                return (out["inferred_total_energy"].detach().sum(), out["inferred_force"].detach(),
                        out["inferred_stress"].detach())
            return call
        calls = {v: caller(m) for v, m in built.items()}
        if "SevenNet + equikernels.accelerate" in built:
            calls["accelerate, per-block linears"] = per_block_linears(calls["SevenNet + equikernels.accelerate"])
        measure(rows, structure, len(atoms), calls, device, reps, "e3nn")
        checkpoint(rows)
        if profile_dir and structure == "CuNi fcc":
            profile({v: c for v, c in calls.items() if v != "e3nn"}, device, f"{profile_dir}/profile_sevenn_cuni.txt")
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


def _mace_batch(atoms, device, dtype):
    """The batch dict MACECalculator builds for ``atoms`` (z table of the 89-element model)."""
    from mace import data as mdata  # noqa: PLC0415
    from mace import tools  # noqa: PLC0415
    from mace.tools import torch_geometric  # noqa: PLC0415

    z_table = tools.AtomicNumberTable(list(range(1, 90)))
    graph = mdata.AtomicData.from_config(mdata.config_from_atoms(atoms), z_table=z_table, cutoff=6.0)
    batch = next(iter(torch_geometric.dataloader.DataLoader([graph], batch_size=1))).to(device)
    return {k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in batch.to_dict().items()}


def _mace_caller(model, batch, stress=False):
    """MACECalculator's model call: a fresh copy of the batch, training=False, forces by autograd."""
    def call():
        d = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in batch.items()}
        out = model(d, compute_stress=stress, training=False, compute_edge_forces=False, compute_atomic_stresses=False)
        return (out["energy"].detach().sum(), out["forces"].detach(), out["stress"].detach() if stress else None)
    return call


def _cells(quick):
    import ase.build  # noqa: PLC0415

    for reps_cell in ([(1, 1, 1), (2, 1, 1)] if quick else [(6, 7, 7), (14, 14, 14)]):
        atoms = ase.build.bulk("Cu", "fcc", a=3.61, cubic=True) * reps_cell
        atoms.rattle(0.03, seed=1)
        yield atoms


def mace_parity(base, device, quick):
    """fp64: max |dE| and |dF| of accelerate (and from_mace) against the unmodified mace-torch model
    ``base`` (its weights, in float64)."""
    import equikernels as ek  # noqa: PLC0415
    from equikernels.models import from_mace  # noqa: PLC0415

    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        base = copy.deepcopy(base).double().eval().requires_grad_(False)
        acc = copy.deepcopy(base)
        ek.accelerate(acc)
        variants = {"mace-torch + equikernels.accelerate": acc, "equikernels.models.from_mace": from_mace(base)}
        atoms = next(_cells(quick))
        batch = _mace_batch(atoms, device, torch.float64)
        e0, f0, _ = _mace_caller(base, batch)()
        rows = []
        for name, model in variants.items():
            e, f, _ = _mace_caller(model, batch)()
            rows.append({"structure": f"Cu fcc {len(atoms)} (float64)", "atoms": len(atoms), "variant": name,
                         "parity_max_dE": abs(float(e) - float(e0)), "parity_max_dF": float((f - f0).abs().max()),
                         "parity_rel_F": float((f - f0).norm() / f0.norm())})
            print(json.dumps(rows[-1]), flush=True)
        return rows
    finally:
        torch.set_default_dtype(old)


def run_mace(device, reps, quick, profile_dir=None):
    import equikernels as ek  # noqa: PLC0415
    from equikernels.models import from_mace  # noqa: PLC0415

    torch.set_default_dtype(torch.float32)
    rows = []
    base = mace_medium().to(device).eval()
    acc = copy.deepcopy(base)
    print(ek.accelerate(acc), flush=True)
    models = {"mace-torch (e3nn)": base, "mace-torch + equikernels.accelerate": acc,
              "equikernels.models.from_mace": from_mace(base)}
    try:
        from mace.cli.convert_e3nn_cueq import run as to_cueq  # noqa: PLC0415
        models["mace-torch + cuEquivariance"] = to_cueq(copy.deepcopy(base).cpu(), device=device.type).to(device).eval()
    except Exception as exc:  # noqa: BLE001
        rows.append({"structure": "-", "atoms": 0, "variant": "mace-torch + cuEquivariance",
                     "error": f"{type(exc).__name__}: {exc}"})
    torch.set_default_dtype(torch.float32)
    for m in models.values():  # as MACECalculator does
        m.requires_grad_(False)
    for atoms in _cells(quick):
        batch = _mace_batch(atoms, device, torch.float32)
        calls = {name: _mace_caller(m, batch) for name, m in models.items()}
        calls["accelerate, layer by layer"] = _mace_caller(layer_path(acc), batch)
        calls["from_mace, per-block linears"] = per_block_linears(calls["equikernels.models.from_mace"])
        measure(rows, f"Cu fcc {len(atoms)}", len(atoms), calls, device, reps, "mace-torch (e3nn)")
        if profile_dir:
            profile({v: c for v, c in calls.items() if "e3nn" not in v}, device, f"{profile_dir}/profile_mace_{len(atoms)}.txt")
        checkpoint(rows)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    del models
    rows += mace_parity(base, device, quick)
    return rows


_OUT = {}


def checkpoint(rows):
    """Rows so far to --out (a run cut short still leaves its finished structures)."""
    if _OUT.get("path"):
        with open(_OUT["path"], "w") as f:
            json.dump({"meta": _OUT["meta"], "rows": rows}, f, indent=1)


def table(rows):
    lines = [f"{'structure':<24} {'variant':<38} {'ms':>9} {'peak GiB':>9} {'max dF':>9} {'dE/atom':>9}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['structure']:<24} {r['variant']:<38} error: {r['error'][:60]}")
        elif "parity_max_dF" in r:
            lines.append(f"{r['structure']:<24} {r['variant']:<38} parity: max|dE| {r['parity_max_dE']:.1e} eV, "
                         f"max|dF| {r['parity_max_dF']:.1e} eV/A, rel F {r['parity_rel_F']:.1e}")
        else:
            lines.append(f"{r['structure']:<24} {r['variant']:<38} {r['ms']:9.2f} {r['peak_gib']:9.2f} "
                         f"{r.get('max_dF', float('nan')):9.1e} {r.get('dE_per_atom', float('nan')):9.1e}")
    speed = {}
    for r in rows:
        if "ms" in r:
            speed.setdefault(r["structure"], {})[r["variant"]] = r["ms"]
    for structure, ms in speed.items():
        mine = {v: t for v, t in ms.items() if "accelerate" in v}
        others = {v: t for v, t in ms.items() if "accelerate" not in v}
        for v, t in mine.items():
            lines.append(f"{structure:<24} {v}: " + ", ".join(f"{o / t:.2f}x vs {name}" for name, o in others.items()))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("sevenn", "mace"), required=True)
    ap.add_argument("--reps", type=int, default=30, help="timed calls per variant (host-bound cells need 30 for a stable median)")
    ap.add_argument("--quick", action="store_true", help="tiny cells (CPU smoke run)")
    ap.add_argument("--out", default=None, help="JSON file for the rows")
    ap.add_argument("--profile-dir", default=None, help="write kernel-time tables (torch.profiler) of one size here")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__}
    for mod in ("triton", "e3nn", "mace", "sevenn", "cuequivariance_torch", "openequivariance", "equikernels"):
        try:
            meta[mod] = getattr(__import__(mod), "__version__", "?")
        except Exception:  # noqa: BLE001 (absent: not part of this run)
            pass
    _OUT.update(path=args.out, meta=meta)
    rows = (run_sevenn if args.part == "sevenn" else run_mace)(device, args.reps, args.quick, args.profile_dir)
    checkpoint(rows)
    print(meta)
    print(table(rows))


if __name__ == "__main__":
    main()
