"""MD throughput (ns/day) through ASE: equikernels' MACECalculator next to mace-torch's MACECalculator
(plain e3nn and with cuEquivariance, ``enable_cueq=True``), on Cu fcc crystals of about 1,000 and
10,000 atoms. Everything a user pays is timed: neighbour lists, host<->device copies, the ASE
Langevin loop, the model's forward and force backward.

All implementations run the same weights: a mace-torch ``ScaleShiftMACE`` with MACE-MP-0 medium
hyperparameters (random weights, 89 elements; or ``--model FILE``), converted to
``equikernels.models`` for our side. Before timing, energy and forces of every implementation are
compared with mace-torch's on the same structure.

    python benchmarks/bench_md.py --out "$OUT"                       # float32, 1k and 10k atoms
    python benchmarks/bench_md.py --sizes 1000 --steps 20 --quick    # smoke run
    python benchmarks/bench_md.py --device cpu --sizes 32 --steps 3 --impls equikernels,mace   # CPU debug
    python benchmarks/bench_md.py --sizes 1000 --impls equikernels,equikernels_graph --steps 100  # eager vs graphs

Per cell (implementation x size): ``--warmup`` MD steps (kernel compilation, tuning, cuEquivariance
set-up), then ``--steps`` timed steps (wall clock; every step ends with the results on the host,
which synchronises the GPU). ns/day = steps x timestep / wall time. Also recorded: ms/step, the
model-only time of one energy+forces call on the same graph (so ms/step minus it is the calculator
and ASE overhead), neighbour-list rebuilds, peak GPU memory.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from equikernels.bench import mace as bench_mace  # noqa: E402

IMPLS = ("equikernels", "equikernels_graph", "mace", "mace_cueq")  # _graph: cuda_graph=True


def cu_crystal(target_atoms: int):
    """Cu fcc (a = 3.61 A) of n x n x m cubic 4-atom cells closest to ``target_atoms``."""
    from ase.build import bulk

    best = None
    for n in range(1, 40):
        for m in (n - 1, n, n + 1):
            if m >= 1 and (best is None or abs(4 * n * n * m - target_atoms) < abs(4 * best[0] ** 2 * best[1] - target_atoms)):
                best = (n, m)
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((best[0], best[0], best[1]))
    atoms.rattle(0.02, seed=0)
    return atoms


def build_mace_model(args, dtype):
    if args.model:
        from equikernels._compat import o3  # noqa: F401  (e3nn safe globals before unpickling)
        return torch.load(args.model, map_location="cpu", weights_only=False).to(dtype)
    # scale: with unit scale these random weights give forces ~1e-4 eV/A, too flat for the parity
    # check to mean much; x1000 gives forces of a few tenths of eV/A, like a real crystal at 300 K
    return bench_mace.mace_model(40.0, dtype, first_interaction="RealAgnosticInteractionBlock",
                                 atomic_inter_scale=1000.0, atomic_inter_shift=0.0)


def make_calculator(impl, mace_model, args, dtype_name):
    device = args.device
    if impl.startswith("equikernels"):
        from equikernels.calculators import MACECalculator
        from equikernels.models import from_mace

        return MACECalculator(from_mace(copy.deepcopy(mace_model)), device=device, default_dtype=dtype_name,
                              skin=args.skin, cuda_graph=impl == "equikernels_graph")
    from mace.calculators import MACECalculator as MaceTorchCalculator

    return MaceTorchCalculator(models=copy.deepcopy(mace_model), device=device, default_dtype=dtype_name,
                               enable_cueq=impl == "mace_cueq")


def model_only_ms(impl, calc, atoms, device, reps=5):
    """Median ms of one model call (energy + forces) on a prepared graph: the floor under ms/step."""
    if impl == "equikernels_graph":
        def call():  # one graph replay per call on the current structure
            calc.calculate(atoms, ["energy", "forces"], [])
            return calc.results["forces"]
    elif impl == "equikernels":
        data = calc.graph(atoms)
        model = calc.model

        def call():
            d = dict(data)
            d["positions"] = data["positions"].detach().clone()
            return model(d, compute_force=True, compute_stress=False, training=False)["forces"]
    else:
        batch = calc._atoms_to_batch(atoms)  # mace-torch's own graph building, outside the timing
        model = calc.models[0]

        def call():
            return model(calc._clone_batch(batch).to_dict(), compute_stress=False, training=False)["forces"]
    times = []
    for k in range(reps + 2):
        common.synchronize(device)
        t = time.perf_counter()
        call()
        common.synchronize(device)
        if k >= 2:
            times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def reference_check(calcs, atoms):
    """Energy/forces of each implementation against mace-torch (plain) on the same structure."""
    results = {}
    for impl, calc in calcs.items():
        a = atoms.copy()
        a.calc = calc
        results[impl] = (a.get_potential_energy(), a.get_forces())
    ref_impl = "mace" if "mace" in results else next(iter(results))
    e_ref, f_ref = results[ref_impl]
    return {impl: {"reference": ref_impl, "energy_abs_diff_eV": abs(e - e_ref),
                   "energy_rel_diff": abs(e - e_ref) / max(abs(e_ref), 1e-12),
                   "forces_max_abs_diff_eV_per_A": float(np.abs(f - f_ref).max()),
                   "forces_rel_diff": float(np.abs(f - f_ref).max() / max(np.abs(f_ref).max(), 1e-12)),
                   "forces_max_abs_eV_per_A": float(np.abs(f_ref).max())}
            for impl, (e, f) in results.items()}


def run_md_cell(impl, calc, atoms, args, device):
    from ase import units
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution

    atoms = atoms.copy()
    atoms.calc = calc
    MaxwellBoltzmannDistribution(atoms, temperature_K=300.0, rng=np.random.default_rng(0))
    dyn = Langevin(atoms, timestep=args.timestep * units.fs, temperature_K=300.0, friction=0.01 / units.fs,
                   fixcm=False, rng=np.random.default_rng(1))
    t0 = time.perf_counter()
    dyn.run(args.warmup)
    warmup_s = time.perf_counter() - t0
    builds_before = getattr(getattr(calc, "neighbors", None), "num_builds", None)
    common.reset_peak(device)
    t0 = time.perf_counter()
    dyn.run(args.steps)
    wall = time.perf_counter() - t0
    builds = getattr(getattr(calc, "neighbors", None), "num_builds", None)
    graphed = getattr(calc, "_graphed", None)
    return {
        "cuda_graph_captures": None if graphed is None else graphed.num_captures,
        "cuda_graph_disabled": None if graphed is None else graphed.disabled_reason,
        "ms_per_step": wall / args.steps * 1e3,
        "ns_per_day": args.steps * args.timestep * 1e-6 / (wall / 86400.0),
        "timed_steps": args.steps, "warmup_steps": args.warmup, "warmup_s": warmup_s,
        "neighbor_list_builds_timed": None if builds is None else builds - builds_before,
        "peak_gib": common.peak_gib(device),
        "temperature_end_K": float(atoms.get_temperature()),
        "model_only_ms": model_only_ms(impl, calc, atoms, device),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="approximate atom counts, comma-separated")
    parser.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated subset of {IMPLS}")
    parser.add_argument("--dtypes", default="float32", help="float32 and/or float64")
    parser.add_argument("--steps", type=int, default=100, help="timed MD steps per cell")
    parser.add_argument("--warmup", type=int, default=10, help="untimed MD steps first")
    parser.add_argument("--timestep", type=float, default=1.0, help="fs")
    parser.add_argument("--skin", type=float, default=0.5, help="equikernels neighbour-list skin, A")
    parser.add_argument("--model", default=None, help="mace-torch .model file (default: random MP-0-medium-sized)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="20 timed steps, 3 warm-up")
    parser.add_argument("--out", default=str(common.REPO_ROOT / "benchmarks" / "results"),
                        help="output directory (or a .json file path)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.warmup = 20, 3
    device = torch.device(args.device)
    impls = [s for s in args.impls.split(",") if s]
    unknown = set(impls) - set(IMPLS)
    if unknown:
        parser.error(f"--impls: unknown {sorted(unknown)}; choose from {IMPLS}")
    sizes = [int(s) for s in args.sizes.split(",") if s]

    out_path = Path(args.out)
    if out_path.suffix != ".json":
        out_path.mkdir(parents=True, exist_ok=True)
        out_path = out_path / f"bench_md_{common.stamp()}.json"
    report = {"benchmark": "md", "args": vars(args), "env": common.env_info(device), "cells": []}

    def save():
        with open(out_path, "w") as fh:
            json.dump(report, fh, indent=1, default=str)

    for dtype_name in args.dtypes.split(","):
        dtype = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
        mace_model = build_mace_model(args, dtype)
        for size in sizes:
            atoms = cu_crystal(size)
            calcs, errors = {}, {}
            for impl in impls:
                try:
                    calcs[impl] = make_calculator(impl, mace_model, args, dtype_name)
                except Exception as exc:  # e.g. cuequivariance not installed: reported, never dropped
                    errors[impl] = common.describe_exception(exc)
            check = reference_check(calcs, atoms) if calcs else {}
            for impl in impls:
                cell = {"impl": impl, "dtype": dtype_name, "num_atoms": len(atoms), "device": str(device)}
                if impl in errors:
                    cell["skipped"] = errors[impl]
                else:
                    cell["check"] = check.get(impl)
                    try:
                        cell.update(run_md_cell(impl, calcs[impl], atoms, args, device))
                    except Exception as exc:
                        cell["error"] = common.describe_exception(exc)
                        cell["oom"] = common.is_oom(exc)
                    common.free_memory(device)
                report["cells"].append(cell)
                save()
                summary = cell.get("skipped") or cell.get("error") or \
                    f"{cell['ns_per_day']:.3f} ns/day, {cell['ms_per_step']:.2f} ms/step (model {cell['model_only_ms']:.2f} ms)"
                print(f"{dtype_name} {len(atoms):6d} atoms {impl:12s} {summary}", flush=True)
            del calcs
            common.free_memory(device)
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
