"""Fused graph convolution benchmark (fused dataflows), side by side in one run:

- ``ek_atomic`` / ``ek_det``: equikernels ``tensor_product_conv`` (ir_mul), atomic and deterministic
  dataflows; ``ek_unfused``: equikernels batched TP + index_add;
- ``cue_fused``: cuEquivariance ``ChannelWiseTensorProduct`` with ``indices_1=src,
  indices_out=dst`` (ir_mul), the path MACE uses for cueq conv fusion;
- ``oeq_atomic`` / ``oeq_det``: OpenEquivariance ``TensorProductConv`` (e3nn layout).

Graph: periodic, rattled (0.05 Å) Cu fcc (a = 3.6 Å), all pairs within r_cut, edges sorted by
(dst, src) for every implementation (``equikernels.bench.conv``, which ``equikernels bench`` uses).
Directions as OpenEquivariance defines them: fwd; bwd = grad of (x, y, w) given g (forward
excluded); dbwd = grad of <gx,Rx>+<gy,Ry>+<gw,Rw> in (x, y, w, g) (forward and first backward
excluded). Errors: each implementation against e3nn in float64 on a small graph
(fwd, 3 grads, 4 second-order grads; max relative error).

    python benchmarks/bench_conv.py --atoms 10192 2916 --out results.json
    python benchmarks/bench_conv.py --device cpu --atoms 256 --impls ek_det,ek_unfused --target-ms 1   # harness check
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

from equikernels.bench import conv as CV  # noqa: E402
from equikernels.bench import tp as TP  # noqa: E402
from equikernels.catalog import standard_problems  # noqa: E402

# this script's implementations: (package implementation, equikernels dataflow, OEQ deterministic)
IMPLS = {"ek_det": ("equikernels", "deterministic", True), "ek_atomic": ("equikernels", "atomic", True),
         "ek_unfused": ("equikernels", "unfused", True), "cue_fused": ("cuequivariance", "auto", True),
         "oeq_det": ("openequivariance", "auto", True), "oeq_atomic": ("openequivariance", "auto", False)}


def gpu_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problem", default="mace-mp-medium-L2")
    ap.add_argument("--atoms", type=int, nargs="+", default=[10192, 2916])
    ap.add_argument("--r-cut", type=float, default=6.0)
    ap.add_argument("--impls", default="ek_det,ek_atomic,cue_fused,oeq_det,oeq_atomic")
    ap.add_argument("--dirs", default="fwd,bwd,dbwd")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--check-atoms", type=int, default=256, help="graph size for the error check (0: skip)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a check of the harness itself")
    ap.add_argument("--target-ms", type=float, default=200.0, help="timed work per cell")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    spec = TP.Spec.create(args.problem, standard_problems()[args.problem])
    impls = args.impls.split(",")
    unknown = [i for i in impls if i not in IMPLS] + [a for a in args.atoms + [args.check_atoms or 256]
                                                      if a not in CV.REPEATS]
    if unknown:
        ap.error(f"unknown --impls/--atoms {unknown}; implementations {list(IMPLS)}, atoms {sorted(CV.REPEATS)}")
    dirs = args.dirs.split(",")
    res = {"env": C.env_info(device), "problem": args.problem,
           "dtype": args.dtype, "date": time.strftime("%Y-%m-%d %H:%M"), "gpu": gpu_name(device),
           "cells": []}

    def make(impl, src, dst, n):
        name, flow, deterministic = IMPLS[impl]
        return CV.build(name, spec, src, dst, n, dtype, device, dataflow=flow, deterministic=deterministic)

    # correctness on a small graph, every implementation against e3nn in float64
    if args.check_atoms:
        src, dst, n = CV.cu_graph(args.check_atoms, device, r_cut=args.r_cut)
        inp, ref = CV.reference(spec, src, dst, n, device)
        for impl in impls:
            try:
                err = max(CV.errors(make(impl, src, dst, n)[0], dtype, inp, ref).values())
            except Exception as exc:  # a baseline that fails must not stop the run
                err = f"{type(exc).__name__}: {str(exc)[:200]}"
            res.setdefault("errors", {})[impl] = err
            print(f"[check {args.check_atoms} atoms] {impl}: max rel. err {err}", flush=True)

    for atoms in args.atoms:
        src, dst, n = CV.cu_graph(atoms, device, r_cut=args.r_cut)
        e = len(src)
        print(f"[graph] {atoms} atoms, {e} edges", flush=True)
        for impl in impls:
            try:
                _, raw, w_from = make(impl, src, dst, n)
                fns = CV.directions(raw, spec, e, n, w_from, dtype, device)
            except Exception as exc:
                print(f"[{atoms}] {impl}: unavailable: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                if not isinstance(exc, TP.Absent):
                    traceback.print_exc()
                res["cells"].append({"atoms": atoms, "edges": e, "impl": impl, "error": str(exc)[:500]})
                continue
            for d in dirs:
                try:
                    C.reset_peak(device)
                    t = C.time_calls(fns[d], device, target_ms=args.target_ms, min_reps=5, warmup=2)
                    peak = C.peak_gib(device)
                    cell = {"atoms": atoms, "edges": e, "impl": impl, "dir": d, "ms": t["ms_median"],
                            "p20": t["ms_p20"], "p80": t["ms_p80"], "n": t["n"], "peak_gib": peak}
                except Exception as exc:
                    cell = {"atoms": atoms, "edges": e, "impl": impl, "dir": d, "error": str(exc)[:300]}
                res["cells"].append(cell)
                peak = "" if cell.get("peak_gib") is None else f"  peak {cell['peak_gib']:.1f} GiB"
                timing = f"{cell['ms']:8.3f} ms{peak}" if "ms" in cell else cell["error"]
                print(f"[{atoms}] {impl:10s} {d:5s} {timing}", flush=True)
            del fns
            C.free_memory(device)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    # short table last
    print("\n| atoms | impl | " + " | ".join(dirs) + " |")
    for atoms in args.atoms:
        for impl in impls:
            cells = {c.get("dir"): c for c in res["cells"] if c["atoms"] == atoms and c["impl"] == impl}
            print(f"| {atoms} | {impl} | " + " | ".join(f"{cells[d]['ms']:.3f}" if d in cells and "ms" in cells[d]
                                                        else "-" for d in dirs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
