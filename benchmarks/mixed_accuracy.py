"""Accuracy cost of MACE's mixed-precision modes, device-independent (CPU, reference path).

A ScaleShiftMACE of MACE-MP-0 medium's shape (89 elements, 2 residual interactions, max_ell 3,
correlation 3, r_max 6, radial MLP [64, 64, 64]; ``--channels`` sets the channel count, 128 as
MACE-MP medium) with random weights is built in float64, then evaluated on held-out structures
(rattled Cu, a rattled mixed-element cell, a molecule) in fp64, fp32, bf16-mixed and fp16-mixed
(``MACE.set_precision``). Reported: energy error (meV/atom), force error (max |dF| meV/A and
||dF|| / ||F||) against fp64, and the total-energy drift of a short NVE run (ASE VelocityVerlet
with equikernels' MACECalculator) per precision, measured against the fp64 model's energy of
each trajectory's frames as well as the run's own energy.

    python benchmarks/mixed_accuracy.py                       # ~7 min on 2 CPU cores
    python benchmarks/mixed_accuracy.py --channels 32 --steps 100   # quick look

Writes benchmarks/results/mixed_accuracy.md (and prints the table).
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

from equikernels import settings  # noqa: E402
from equikernels.calculators import MACECalculator  # noqa: E402
from equikernels.models import atoms_to_data  # noqa: E402
from equikernels.models.builder import mace_config, random_model  # noqa: E402

PRECISIONS = ["fp64", "fp32", "bf16-mixed", "fp16-mixed"]
Z = list(range(1, 90))
FORCE_SCALE = 0.5  # eV/A


def build(channels: int, mlp: int):
    cfg = mace_config(r_max=6.0, num_bessel=10, num_polynomial_cutoff=5, max_ell=3,
                      interaction="RealAgnosticResidualInteractionBlock",
                      interaction_first="RealAgnosticResidualInteractionBlock", num_interactions=2, atomic_numbers=Z,
                      hidden_irreps=f"{channels}x0e+{channels}x1o", MLP_irreps="16x0e", avg_num_neighbors=40.0,
                      correlation=3, radial_MLP=[mlp] * 3)
    m64 = random_model(cfg, seed=0, dtype=torch.float64)
    # random weights give tiny forces: the scale is set so that rattled Cu (0.1 A) has a mean |F| of
    # FORCE_SCALE eV/A, as a trained MACE-MP roughly does (relative errors do not depend on it)
    cu = structures()["Cu fcc 32 (rattle 0.1 A)"]
    f = m64(atoms_to_data(cu, 6.0, Z, dtype=torch.float64))["forces"].detach()
    with torch.no_grad():
        m64.scale.mul_(FORCE_SCALE / float(f.norm(dim=1).mean()))
    return {p: copy.deepcopy(m64).set_precision(p) for p in PRECISIONS}


def structures():
    from ase.build import bulk, molecule

    cu = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    cu.rattle(0.1, seed=1)
    mixed = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 1))
    rng = np.random.default_rng(2)
    mixed.numbers = rng.choice([8, 13, 26, 29, 3], size=len(mixed))   # O, Al, Fe, Cu, Li
    mixed.rattle(0.15, seed=3)
    hot = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    hot.rattle(0.3, seed=4)                                           # far from equilibrium
    mol = molecule("C6H6")
    mol.rattle(0.05, seed=5)
    return {"Cu fcc 32 (rattle 0.1 A)": cu, "Cu fcc 32 (rattle 0.3 A)": hot,
            "O/Al/Fe/Cu/Li 16 (rattle 0.15 A)": mixed, "benzene (rattle 0.05 A)": mol}


def evaluate(models, structs):
    rows = []
    for name, atoms in structs.items():
        ref = None
        for p in PRECISIONS:
            dtype = torch.float64 if p == "fp64" else torch.float32
            data = atoms_to_data(atoms, 6.0, Z, dtype=dtype)
            t = time.perf_counter()
            out = models[p](data)
            dt = time.perf_counter() - t
            e, f = float(out["energy"].detach()), out["forces"].detach().double()
            if ref is None:
                ref = (e, f)
                rows.append((name, len(atoms), p, e / len(atoms), float(f.norm(dim=1).mean()), None, None, None, dt))
                continue
            de = abs(e - ref[0]) / len(atoms) * 1e3
            df = f - ref[1]
            rows.append((name, len(atoms), p, e / len(atoms), None, de, float(df.norm(dim=1).max()) * 1e3,
                         float(df.norm() / ref[1].norm()), dt))
            print(f"  {name:34s} {p:11s} dE {de:9.4f} meV/atom  max|dF| {rows[-1][6]:9.4f} meV/A  "
                  f"rel {rows[-1][7]:.2e}  ({dt:.1f} s)", flush=True)
    return rows


def nve(models, steps: int, dt_fs: float, temperature: float):
    """Same start (rattled Cu, Maxwell-Boltzmann velocities) per precision; energy drift and the
    fp64 model's energy along each trajectory (the trajectory's true energy conservation)."""
    from ase import units
    from ase.build import bulk
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
    from ase.md.verlet import VelocityVerlet

    start = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 2))
    start.rattle(0.05, seed=7)
    MaxwellBoltzmannDistribution(start, temperature_K=temperature, rng=np.random.default_rng(8))
    ref_calc = MACECalculator(models["fp64"], device="cpu", cuda_graph=False)
    e64_start = _e64_start(ref_calc, start)
    res = []
    for p in PRECISIONS:
        atoms = start.copy()
        atoms.calc = MACECalculator(models[p], device="cpu", cuda_graph=False)
        etot = []
        t = time.perf_counter()
        dyn = VelocityVerlet(atoms, timestep=dt_fs * units.fs)
        dyn.attach(lambda: etot.append(atoms.get_potential_energy() + atoms.get_kinetic_energy()), interval=1)
        dyn.run(steps)
        wall = time.perf_counter() - t
        etot = np.array(etot)
        n = len(atoms)
        tt = np.arange(len(etot)) * dt_fs / 1000.0  # ps
        slope = np.polyfit(tt, etot / n, 1)[0] * 1e3  # meV/atom/ps
        snap = atoms.copy()
        snap.calc = ref_calc
        e64_end = snap.get_potential_energy() + snap.get_kinetic_energy()
        res.append({"precision": p, "drift": slope, "fluct": float(np.std(etot / n) * 1e3),
                    "end_minus_start": float((etot[-1] - etot[0]) / n * 1e3),
                    "fp64_end_minus_start": float((e64_end - e64_start) / n * 1e3), "wall": wall,
                    "temperature_end": float(atoms.get_temperature())})
        r = res[-1]
        print(f"  NVE {p:11s} drift {r['drift']:+.3f} meV/atom/ps  std {r['fluct']:.3f} meV/atom  "
              f"E_end-E_0 {r['end_minus_start']:+.3f} (fp64 model on the end frame: "
              f"{r['fp64_end_minus_start']:+.3f}) meV/atom  ({wall:.0f} s)", flush=True)
    return res


def _e64_start(calc, start) -> float:
    a = start.copy()
    a.calc = calc
    return a.get_potential_energy() + a.get_kinetic_energy()


def write(path, args, rows, md_rows, info, wall):
    lines = [f"# MACE mixed precision: accuracy against fp64 ({info['date_utc']})", "",
             f"`python benchmarks/mixed_accuracy.py {' '.join(sys.argv[1:])}` on CPU "
             f"({info.get('cpu')}, {info.get('cpu_threads')} threads), reference path (no Triton), "
             f"{wall / 60:.1f} min. torch {info['torch']}, e3nn {info['e3nn']}, equikernels "
             f"{info['equikernels']}.", "",
             f"Model: ScaleShiftMACE, MACE-MP-0-medium shape (89 elements, `{args.channels}x0e+{args.channels}x1o`, "
             f"2 residual interactions, max_ell 3, correlation 3, r_max 6 A, 10 Bessel, radial MLP "
             f"{[args.mlp] * 3}), random weights (seed 0), built in float64; the other precisions are copies "
             f"(`set_precision`); the readout scale is set so that rattled Cu (0.1 A) has a mean |F| of {FORCE_SCALE} eV/A. {'MACE-MP medium has 128 channels and a [64, 64, 64] MLP; this run is smaller for CPU time. ' if args.channels != 128 or args.mlp != 64 else ''}"
             "Mixed modes: float32 parameters, positions, edge vectors, radial features, spherical "
             "harmonics, readouts, energies and forces; node features, conv node operand, per-edge "
             "weights (radial MLP), symmetric contraction input/output and linear/skip layers in "
             "bf16/fp16 (sums accumulated in float32). Errors: |E - E64| per atom, max over atoms "
             "of |F - F64|, ||F - F64|| / ||F64||.", "",
             "| structure | atoms | precision | dE (meV/atom) | max dF (meV/A) | rel. dF |",
             "|---|---:|---|---:|---:|---:|"]
    for name, n, p, e, fmean, de, dfmax, dfrel, _ in rows:
        if p == "fp64":
            lines.append(f"| {name} | {n} | fp64 (reference: E {e:.3f} eV/atom, mean \\|F\\| {fmean:.3f} eV/A) | "
                         f"- | - | - |")
        else:
            lines.append(f"| {name} | {n} | {p} | {de:.4f} | {dfmax:.3f} | {dfrel:.2e} |")
    lines += ["", "Summary (worst over the structures):", "",
              "| precision | dE (meV/atom) | max dF (meV/A) | rel. dF |", "|---|---:|---:|---:|"]
    for p in PRECISIONS[1:]:
        sel = [r for r in rows if r[2] == p]
        lines.append(f"| {p} | {max(r[5] for r in sel):.4f} | {max(r[6] for r in sel):.3f} | "
                     f"{max(r[7] for r in sel):.2e} |")
    lines += ["", f"NVE: Cu fcc 32 atoms (rattle 0.05 A), Maxwell-Boltzmann {args.temperature:.0f} K, "
              f"VelocityVerlet {args.dt} fs x {args.steps} steps ({args.steps * args.dt / 1000:.2f} ps), "
              "MACECalculator(precision=...) on CPU. Drift: slope of a linear fit of the total energy; "
              "std: its fluctuation; last column: the fp64 model's total energy on the final frame minus on "
              "the start (the trajectory's conservation judged by the exact model).", "",
              "| precision | drift (meV/atom/ps) | std E_tot (meV/atom) | E_end - E_0 (meV/atom) | "
              "fp64 model: E_end - E_0 (meV/atom) | T_end (K) | wall (s) |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for r in md_rows:
        lines.append(f"| {r['precision']} | {r['drift']:+.3f} | {r['fluct']:.3f} | {r['end_minus_start']:+.3f} | "
                     f"{r['fp64_end_minus_start']:+.3f} | {r['temperature_end']:.0f} | {r['wall']:.0f} |")
    lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--channels", type=int, default=128, help="channels (MACE-MP medium: 128)")
    ap.add_argument("--mlp", type=int, default=64, help="radial MLP width (MACE-MP: 64)")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--dt", type=float, default=1.0, help="time step, fs")
    ap.add_argument("--temperature", type=float, default=300.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.environ.setdefault("EQUIKERNELS_BACKEND", "reference")
    settings.reload()  # the package read the environment at import
    t0 = time.perf_counter()
    models = build(args.channels, args.mlp)
    print("held-out structures:", flush=True)
    rows = evaluate(models, structures())
    print("NVE:", flush=True)
    md_rows = nve(models, args.steps, args.dt, args.temperature) if args.steps > 0 else []
    wall = time.perf_counter() - t0
    info = C.env_info(torch.device("cpu"))
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   "mixed_accuracy.md")
    write(out, args, rows, md_rows, info, wall)


if __name__ == "__main__":
    main()
