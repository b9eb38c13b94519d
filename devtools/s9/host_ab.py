#!/usr/bin/env python
"""A/B of ops.tp's direct eager backward (issue 3) in one process, rounds interleaved.

Modes: "full" (TPKernels.backward on every call, the session-8 code path) and "direct" (the
resolved launch, ops.tp._bwd_direct). (A third mode of call 1, "shared": one buffer for all three
gradients, returned as views; slower than three empty_like calls, dropped.) Per mode: the
bench_tp cell time (its time_cell: CUDA events around autograd.grad, rotated input sets, median) at
--rows, and host time alone (64 rows: wall time per call, one sync per loop, best of 3). Also
checks that the three modes give bit-identical gradients.

GPU:  python devtools/s9/host_ab.py --out $OUT/host_ab.json     (nequip-water, bwd; ~1 min warm)
CPU:  python devtools/s9/host_ab.py --device cpu --backend reference --rows 64 --target-ms 5 --out /tmp/a.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
for _p in (str(ROOT / "benchmarks"), str(ROOT), str(ROOT / "devtools" / "s8")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

import bench_tp as B  # noqa: E402
import common as C  # noqa: E402
import host_bench as H  # noqa: E402
from equikernels.catalog import standard_problems  # noqa: E402
from equikernels.ops import tp as ops_tp  # noqa: E402

MODES = {"full": False, "direct": True}


def set_mode(m: str) -> None:
    ops_tp.FAST_BWD = MODES[m]


def grads_equal(spec, device, backend, layout) -> bool:
    P = spec.P
    gen = torch.Generator().manual_seed(0)
    mk = lambda *s: torch.randn(*s, generator=gen).to(device)  # noqa: E731
    x, y, w = mk(1000, P.dim_in1), mk(1000, P.dim_in2), mk(1000, P.weight_numel)
    g = mk(1000, P.dim_out)
    res = {}
    for m in MODES:
        set_mode(m)
        leaves = [t.clone().requires_grad_() for t in (x, y, w)]
        out = ops_tp.tensor_product(P, *leaves, layout=layout, backend=backend)
        res[m] = torch.autograd.grad(out, leaves, g)
    return all(torch.equal(a, b) for m in MODES for a, b in zip(res[m], res["full"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", default="nequip-water")
    ap.add_argument("--rows", type=int, default=50000)
    ap.add_argument("--layout", default="ir_mul")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="triton", choices=("triton", "reference"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--target-ms", type=float, default=60.0)
    ap.add_argument("--host-calls", type=int, default=300)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    catalog = standard_problems()
    targs = SimpleNamespace(rotate_factor=4.0, max_sets=8, seed=1234, target_ms=args.target_ms, min_reps=5,
                            max_reps=2000, warmup=3, backend=args.backend)
    data = {"schema": "equikernels-host-ab/1", "args": vars(args), "env": C.env_info(device), "cells": {},
            "host_us": {}, "bit_identical": {}}
    t_start = time.perf_counter()
    was = ops_tp.FAST_BWD
    try:
        for name in args.problems.split(","):
            spec = B.Spec.create(name, catalog[name])
            built = B.build_equikernels(spec, torch.float32, device, targs, args.layout)
            for m in MODES:  # warm every mode (compiles happen here)
                set_mode(m)
                B.time_cell(spec, built, "bwd", min(args.rows, 1024), torch.float32, device,
                            SimpleNamespace(**{**vars(targs), "target_ms": 1.0, "min_reps": 1}))
            data["bit_identical"][name] = grads_equal(spec, device, args.backend, args.layout)
            runs = {m: [] for m in MODES}
            for _ in range(args.rounds):
                for m in MODES:
                    set_mode(m)
                    runs[m].append(B.time_cell(spec, built, "bwd", args.rows, torch.float32, device, targs)["ms_median"])
            data["cells"][name] = {m: {"ms_median": statistics.median(v), "ms_rounds": v} for m, v in runs.items()}
            calls = H.host_calls(spec, 64, device, args.backend, args.layout)
            host = {m: [] for m in MODES}
            for _ in range(args.rounds):
                for m in MODES:
                    set_mode(m)
                    host[m].append(H.per_call_us(calls["bwd"], device, args.host_calls, repeats=3))
            data["host_us"][name] = {m: {"median": statistics.median(v), "rounds": v} for m, v in host.items()}
        z = torch.randn(64, 16, device=device, requires_grad=True)
        zz, gz = z * 2, torch.randn(64, 16, device=device)
        data["host_us"]["autograd_grad_x_times_2"] = H.per_call_us(
            lambda: torch.autograd.grad(zz, (z,), gz, retain_graph=True), device, args.host_calls)
    finally:
        ops_tp.FAST_BWD = was
    data["wall_s"] = time.perf_counter() - t_start
    lines = [f"device {data['env'].get('gpu', data['env']['device'])}, torch {data['env']['torch']}, "
             f"triton {data['env']['triton']}; bwd at {args.rows} rows, ms (median of {args.rounds} rounds) | "
             "host only, 64 rows, us"]
    for name in data["cells"]:
        lines.append(f"{name:14s} " + "  ".join(f"{m} {data['cells'][name][m]['ms_median']:.4f}" for m in MODES)
                     + " | " + "  ".join(f"{m} {data['host_us'][name][m]['median']:.1f}" for m in MODES)
                     + f" | bit-identical {data['bit_identical'][name]}")
    lines.append(f"autograd.grad(x * 2): {data['host_us']['autograd_grad_x_times_2']:.1f} us")
    print("\n".join(lines))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
