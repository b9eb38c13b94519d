#!/usr/bin/env python
"""MACE step benchmark: equikernels.models vs mace-torch (e3nn), mace-torch + cuEquivariance and
mace-torch + OpenEquivariance, side by side in one process.

Model: a MACE-MP-0-medium-shaped ScaleShiftMACE with random weights (128x0e+128x1o, max_ell 3,
correlation 3, 2 RealAgnosticResidual interactions, r_max 6, 10 Bessel, p = 5, radial MLP
[64, 64, 64], 16x0e readout MLP, 89 elements), built with mace-torch and converted once per dtype
(``equikernels.models.from_mace``, ``mace.cli.convert_e3nn_cueq`` / ``convert_e3nn_oeq``).
Systems: periodic, rattled Cu fcc (a = 3.6 A, cubic cell repeated 6x6x7 = 1,008 atoms and
13x14x14 = 10,192 atoms) and a 1,008-atom cell with mixed elements. Steps: energy + forces
(``compute_stress=False``) and energy + forces + stress; each step is one model call on the same
graph, as in MD. Timing: CUDA events around every call, warm-up, median (``equikernels.bench.timing``);
peak memory = ``torch.cuda.max_memory_allocated`` over the timed calls. Correctness: energy and
forces of every implementation against mace-torch (e3nn) on each system. Implementations that are
missing or fail are reported with their error; nothing is skipped silently.

Usage (GPU):  python benchmarks/bench_mace.py --out results/mace.json [--dtypes float32,float64] [--scan]
Debug (CPU):  python benchmarks/bench_mace.py --device cpu --tiny --out /tmp/mace.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
for _p in (str(HERE), str(HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import common as C  # noqa: E402

from equikernels.bench import mace as MC  # noqa: E402
from equikernels.bench import tp as TP  # noqa: E402

IMPLS = MC.IMPLS
SYSTEMS = {  # name: (cubic-cell repeats, mixed elements)
    "cu-1008": ((6, 6, 7), False),
    "cu-10192": ((13, 14, 14), False),
    "mixed-1008": ((6, 6, 7), True),
}
MIXED_ELEMENTS = (29, 28, 46, 47, 79, 13, 26)  # Cu Ni Pd Ag Au Al Fe
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def make_atoms(repeats, mixed: bool, seed: int = 0):
    import ase.build

    atoms = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True).repeat(repeats)
    atoms.rattle(0.05, seed=seed)
    if mixed:
        atoms.numbers = np.random.default_rng(seed).choice(MIXED_ELEMENTS, size=len(atoms))
    return atoms


def make_mace_model(dtype: torch.dtype, tiny: bool, avg_num_neighbors: float):
    """mace-torch ScaleShiftMACE of MACE-MP-0 medium's shape (``tiny``: 8 channels), random weights."""
    return MC.mace_model(avg_num_neighbors, dtype, **(MC.TINY if tiny else {}))


def build_impls(mace_model, dtype: torch.dtype, device: torch.device, wanted) -> Dict[str, Dict]:
    """name -> {"model": callable model or None, "status": ok/absent/error, "error": ...}."""
    out: Dict[str, Dict] = {}
    for name in IMPLS:
        if name not in wanted:
            continue
        try:
            out[name] = {"model": MC.build(name, mace_model, dtype, device), "status": "ok"}
        except (TP.Absent, ImportError) as exc:
            out[name] = {"model": None, "status": "absent", "error": C.describe_exception(exc)}
        except Exception as exc:  # report, never stop the run
            out[name] = {"model": None, "status": "error", "error": C.describe_exception(exc)}
    return out


def graph_data(atoms, dtype, device):
    return MC.graph(atoms, MC.MP0_MEDIUM["r_max"], MC.Z_ALL, dtype, device)


def step(model, data, stress: bool):
    return model(dict(data), compute_force=True, compute_stress=stress)


def check(results: Dict[str, Dict], data, device) -> Dict[str, Dict]:
    """Energy/forces of each implementation against mace-torch (e3nn)."""
    ref_impl = results.get("mace-e3nn", {}).get("model")
    if ref_impl is None:
        return {}
    try:
        ref = step(ref_impl, data, True)
    except Exception as exc:  # e.g. e3nn out of memory: report it, keep the timings
        C.free_memory(device)
        return {"reference": {"error": C.describe_exception(exc)}}
    errs = {}
    for name, r in results.items():
        if r["model"] is None or name == "mace-e3nn":
            continue
        try:
            out = step(r["model"], data, True)
            errs[name] = {k: C.rel_err(out[k], ref[k]) for k in ("energy", "forces", "stress")}
        except Exception as exc:
            errs[name] = {"error": C.describe_exception(exc)}
        C.free_memory(device)
    return errs


def time_one(model, data, stress: bool, device, target_ms: float) -> Dict[str, object]:
    C.free_memory(device)
    C.reset_peak(device)
    try:
        t = C.time_calls(lambda i: step(model, data, stress), device, target_ms=target_ms, min_reps=5, warmup=3)
        t["peak_gib"] = C.peak_gib(device)
        t["status"] = "ok"
        t.pop("times_ms", None) if len(t.get("times_ms", [])) > 200 else None
        return t
    except Exception as exc:
        return {"status": "oom" if C.is_oom(exc) else "error", "error": C.describe_exception(exc)}
    finally:
        C.free_memory(device)


def scan_largest(model, dtype, device, target_ms: float, start: int, stop: int = 80, step: int = 4
                 ) -> Dict[str, object]:
    """Largest n (n x n x n cubic cells, 4 n^3 atoms) whose E+F step runs, n = start, start + step, ..."""
    best = None
    for n in range(start, stop + 1, step):
        atoms = make_atoms((n, n, n), False)
        try:
            data = graph_data(atoms, dtype, device)
            r = time_one(model, data, False, device, target_ms)
        except Exception as exc:
            r = {"status": "oom" if C.is_oom(exc) else "error", "error": C.describe_exception(exc)}
        print(f"  scan {len(atoms):>7} atoms: {r['status']} {C.fmt_ms(r.get('ms_median'))} ms", flush=True)
        if r["status"] != "ok":
            break
        best = {"atoms": len(atoms), "ms_median": r["ms_median"], "peak_gib": r["peak_gib"]}
        del data
        C.free_memory(device)
    return {"largest": best}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--target-ms", type=float, default=300.0, help="timed work per measurement")
    ap.add_argument("--scan", action="store_true", help="also find the largest Cu system equikernels runs (E+F)")
    ap.add_argument("--scan-start", type=int, default=20, help="first n of the scan (4 n^3 atoms; 20 -> 32,000)")
    ap.add_argument("--scan-step", type=int, default=4, help="step of n in the scan")
    ap.add_argument("--mem-cap-gib", type=float, default=None,
                    help="limit this process's GPU memory (e.g. 80 on a 141 GB H200, to compare with 80 GB cards)")
    ap.add_argument("--tiny", action="store_true", help="8-channel model and 32-atom systems (debugging)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_mace: CUDA is not available (use --device cpu --tiny for a debug run)", file=sys.stderr)
        return 2
    if args.mem_cap_gib and device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.mem_cap_gib * 2**30 / total), torch.cuda.current_device())
    wanted = [s for s in args.impls.split(",") if s]
    bad = [s for s in wanted if s not in IMPLS]
    if bad:
        ap.error(f"--impls: unknown {bad}; expected some of {IMPLS}")
    systems = {}
    for name in args.systems.split(","):
        if name not in SYSTEMS:
            ap.error(f"--systems: unknown {name!r}; expected some of {tuple(SYSTEMS)}")
        reps, mixed = SYSTEMS[name]
        systems[name] = make_atoms((2, 2, 2) if args.tiny else reps, mixed)
    report = {"env": C.env_info(device), "model": "MACE-MP-0 medium shape, random weights" if not args.tiny else "tiny",
              "results": [], "checks": {}, "scan": {}, "mem_cap_gib": args.mem_cap_gib}
    rows = []
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        first = next(iter(systems.values()))
        nl = graph_data(first, torch.float64, "cpu")
        avg = nl["edge_index"].shape[1] / len(first)
        print(f"[{dname}] building models (avg_num_neighbors {avg:.1f})", flush=True)
        impls = build_impls(make_mace_model(dtype, args.tiny, avg), dtype, device, wanted)
        for name, r in impls.items():
            if r["status"] != "ok":
                print(f"[{dname}] {name}: {r['status']} ({r.get('error')})", flush=True)
                report["results"].append({"impl": name, "dtype": dname, "status": r["status"], "error": r.get("error")})
        for sname, atoms in systems.items():
            data = graph_data(atoms, dtype, device)
            report["checks"][f"{dname}/{sname}"] = check(impls, data, device)
            for name, r in impls.items():
                if r["model"] is None:
                    continue
                for mode, stress in (("E+F", False), ("E+F+S", True)):
                    t = time_one(r["model"], data, stress, device, args.target_ms)
                    entry = {"impl": name, "dtype": dname, "system": sname, "atoms": len(atoms),
                             "edges": int(data["edge_index"].shape[1]), "mode": mode, **t}
                    report["results"].append(entry)
                    rows.append(entry)
                    print(f"[{dname}] {sname:<11} {name:<12} {mode:<6} {t['status']:<5} "
                          f"{C.fmt_ms(t.get('ms_median')):>9} ms  peak {t.get('peak_gib') or 0:.2f} GiB"
                          + (f"  {t.get('error')}" if t["status"] != "ok" else ""), flush=True)
            del data
            C.free_memory(device)
        if args.scan and impls.get("equikernels", {}).get("model") is not None:
            report["scan"][dname] = scan_largest(impls["equikernels"]["model"], dtype, device, args.target_ms,
                                                 args.scan_start, step=args.scan_step)
        del impls
        C.free_memory(device)
    _print_table(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


def _print_table(rows: List[Dict]) -> None:
    keys = sorted({(r["dtype"], r["system"], r["mode"]) for r in rows})
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    print("\n" + f"{'dtype':<8}{'system':<12}{'mode':<7}" + "".join(f"{i:>22}" for i in impls))
    for k in keys:
        cells = []
        for i in impls:
            r = next((r for r in rows if (r["dtype"], r["system"], r["mode"]) == k and r["impl"] == i), None)
            if r is None or r["status"] != "ok":
                cells.append(f"{(r or {}).get('status', '—'):>22}")
            else:
                cells.append(f"{C.fmt_ms(r['ms_median']) + ' ms / ' + format(r['peak_gib'] or 0, '.1f') + ' GiB':>22}")
        print(f"{k[0]:<8}{k[1]:<12}{k[2]:<7}" + "".join(cells))


if __name__ == "__main__":
    sys.exit(main())
