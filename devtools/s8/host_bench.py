#!/usr/bin/env python
"""Host cost of the batched TP with the fast launch path on and off (open issue 3).

For each problem (50,000 rows, fp32, ir_mul by default) and direction, the per-call time the way
benchmarks/bench_tp.py measures it (its time_cell: CUDA events around each call, rotated input
sets, median), with EQUIKERNELS fast launch on and off in turn in one process (rounds interleave
the two, so drift hits both alike). Then the host time alone: 64-row inputs, so the GPU idles and
wall time per call (one sync at the end) is host time, next to ``autograd.grad`` of ``x * 2`` (the
floor for a backward call), and the cost of one kernel launch through ``_Kernel.launch``.

GPU:  python devtools/s8/host_bench.py --out /tmp/host_bench.json
      (H200: about 3 minutes from a cold Triton cache, 1.5 of them compiling; 4 rounds took 205 s)
CPU logic check (reference backend, nothing toggles):
      python devtools/s8/host_bench.py --device cpu --backend reference --rows 64 --target-ms 5 --out /tmp/h.json
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
for _p in (str(ROOT / "benchmarks"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

import bench_tp as B  # noqa: E402
import common as C  # noqa: E402
from equikernels.catalog import standard_problems  # noqa: E402
from equikernels.codegen import launch  # noqa: E402
from equikernels.ops import tensor_product  # noqa: E402

MODES = {"fast": True, "normal": False}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def per_call_us(call, device, n: int, warmup: int = 20, repeats: int = 5) -> float:
    """Wall time per call in us (best of ``repeats`` loops of ``n`` calls, one sync per loop)."""
    for _ in range(warmup):
        call()
    sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        sync(device)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def host_calls(spec, rows: int, device, backend: str, layout: str):
    """fwd / bwd / dbwd closures on tiny inputs (graphs retained, like bench_tp's cells)."""
    P = spec.P
    mk = lambda *s: torch.randn(*s, device=device)  # noqa: E731
    x, y = mk(rows, P.dim_in1).requires_grad_(), mk(rows, P.dim_in2).requires_grad_()
    w = mk(*((P.weight_numel,) if P.shared_weights else (rows, P.weight_numel))).requires_grad_()
    tp = lambda a, b, c: tensor_product(P, a, b, c, layout=layout, backend=backend)  # noqa: E731
    xd, yd, wd = x.detach(), y.detach(), w.detach()
    out = tp(x, y, w)
    g0 = torch.randn_like(out)
    g = g0.clone().requires_grad_()
    gx, gy, gw = torch.autograd.grad(tp(x, y, w), (x, y, w), g, create_graph=True)
    L = (gx * torch.randn_like(gx)).sum() + (gy * torch.randn_like(gy)).sum() + (gw * torch.randn_like(gw)).sum()
    return {
        "fwd": lambda: tp(xd, yd, wd),
        "bwd": lambda: torch.autograd.grad(out, (x, y, w), g0, retain_graph=True),
        "dbwd": lambda: torch.autograd.grad(L, (x, y, w, g), retain_graph=True),
    }


def launch_us(spec, device, layout: str, n: int) -> dict:
    """us per launch of the forward kernel alone (64 rows), fast vs normal path, and the parts of
    the fast path: the key, the device / stream queries, the launcher (tensors, or their
    addresses, which skips the launcher's data_ptr call and pointer check)."""
    from equikernels.codegen.tp import _DT
    from equikernels.ops.tp import plan_of, spec_of
    P = spec.P
    kernels = plan_of(spec_of(P, layout)).kernels
    k = kernels.kernel("fwd")
    k = getattr(k, "parts", [k])[0]
    rows = 64
    x, y = torch.randn(rows, P.dim_in1, device=device), torch.randn(rows, P.dim_in2, device=device)
    w = torch.randn(*((P.weight_numel,) if P.shared_weights else (rows, P.weight_numel)), device=device)
    out = torch.empty(rows, P.dim_out, device=device)
    cfg = kernels._cfg("fwd", torch.float32)
    call = lambda: k.launch({"x": x, "y": y, "w": w}, {"out": out}, rows, cfg, torch.float32)  # noqa: E731
    res = {}
    for mode, on in MODES.items():
        launch.set_enabled(on)
        res[mode] = per_call_us(call, device, n)
    launch.set_enabled(True)
    call()
    tensors = [{"x": x, "y": y, "w": w, "out": out}[nm] for nm in k.meta.inputs + k.meta.outputs]
    nblk = -(-rows // cfg.rows)
    ints, consts = (rows, nblk), (cfg.rows, _DT[torch.float32], "ieee")
    key = launch.spec_key(tensors, ints, consts, cfg.num_warps, cfg.num_stages)
    run, fn, meta = k.launcher.hits[(launch._device(), launch._RT.debug, launch._CT.instrumentation_mode, key)]
    stream = launch._stream(launch._device())
    ptrs = [t.data_ptr() for t in tensors]
    parts = {
        "FastLaunch": lambda: k.launcher((nblk,), tensors, ints, consts, cfg.num_warps, cfg.num_stages),
        "spec_key": lambda: launch.spec_key(tensors, ints, consts, cfg.num_warps, cfg.num_stages),
        "device+stream": lambda: launch._stream(launch._device()),
        "launcher(tensors)": lambda: run(nblk, 1, 1, stream, fn, meta, None, None, None, *tensors, *ints, *consts),
        "launcher(addresses)": lambda: run(nblk, 1, 1, stream, fn, meta, None, None, None, *ptrs, *ints, *consts),
        "triton fn[grid]": lambda: k.fn[(nblk,)](*tensors, *ints, *consts, num_warps=cfg.num_warps,
                                                 num_stages=cfg.num_stages),
        "torch.empty": lambda: torch.empty(rows, P.dim_out, device=device),
    }
    for name, f in parts.items():
        res[name] = per_call_us(f, device, n)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", default="nequip-water,mace-large,tetris-poly-1")
    ap.add_argument("--rows", type=int, default=50000)
    ap.add_argument("--layout", default="ir_mul")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="triton", choices=("triton", "reference"))
    ap.add_argument("--directions", default="fwd,bwd,dbwd")
    ap.add_argument("--rounds", type=int, default=3, help="fast/normal alternations per cell")
    ap.add_argument("--target-ms", type=float, default=60.0, help="timed work per cell (bench_tp: 250)")
    ap.add_argument("--host-rows", type=int, default=64)
    ap.add_argument("--host-calls", type=int, default=300)
    ap.add_argument("--out", required=True, help="JSON output path")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    names = [s for s in args.problems.split(",") if s]
    dirs = [d for d in args.directions.split(",") if d]
    catalog = standard_problems()
    targs = SimpleNamespace(rotate_factor=4.0, max_sets=8, seed=1234, target_ms=args.target_ms, min_reps=5,
                            max_reps=2000, warmup=3, backend=args.backend)
    t_start = time.perf_counter()
    data = {"schema": "equikernels-host-bench/1", "args": vars(args), "env": C.env_info(device),
            "fast_launch_default": launch.ENABLED, "cells": {}, "host_us": {}, "launch_us": {}}
    was = launch.ENABLED
    try:
        for name in names:
            spec = B.Spec.create(name, catalog[name])
            built = B.build_equikernels(spec, torch.float32, device, targs, args.layout)
            t0 = time.perf_counter()
            for d in dirs:  # first calls compile (normal path), then both modes are warm
                B.time_cell(spec, built, d, min(args.rows, 1024), torch.float32, device,
                            SimpleNamespace(**{**vars(targs), "target_ms": 1.0, "min_reps": 1}))
            print(f"== {name}: {spec.P.describe()}  (compile/warm-up {time.perf_counter() - t0:.1f} s)", flush=True)
            cells = data["cells"][name] = {}
            for d in dirs:
                runs = {m: [] for m in MODES}
                for _ in range(args.rounds):
                    for mode, on in MODES.items():
                        launch.set_enabled(on)
                        runs[mode].append(B.time_cell(spec, built, d, args.rows, torch.float32, device, targs)["ms_median"])
                cells[d] = {m: {"ms_median": statistics.median(v), "ms_rounds": v} for m, v in runs.items()}
            calls = host_calls(spec, args.host_rows, device, args.backend, args.layout)
            host = data["host_us"][name] = {}
            for d in dirs:
                runs = {m: [] for m in MODES}
                for _ in range(args.rounds):
                    for mode, on in MODES.items():
                        launch.set_enabled(on)
                        runs[mode].append(per_call_us(calls[d], device, args.host_calls, repeats=3))
                host[d] = {m: statistics.median(v) for m, v in runs.items()}
                host[d]["rounds"] = runs
            if args.backend == "triton":
                data["launch_us"][name] = launch_us(spec, device, args.layout, 4 * args.host_calls)
        z = torch.randn(args.host_rows, 16, device=device, requires_grad=True)
        zz, gz = z * 2, torch.randn(args.host_rows, 16, device=device)
        data["host_us"]["autograd_grad_x_times_2"] = per_call_us(
            lambda: torch.autograd.grad(zz, (z,), gz, retain_graph=True), device, args.host_calls)
    finally:
        launch.set_enabled(was)
    data["wall_s"] = time.perf_counter() - t_start
    print(render(data, names, dirs))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, indent=1))
    print(f"wrote {args.out} ({data['wall_s']:.0f} s)")
    return 0


def render(data, names, dirs) -> str:
    rows = data["args"]["rows"]
    lines = [f"device {data['env'].get('gpu', data['env']['device'])}, torch {data['env']['torch']}, "
             f"triton {data['env']['triton']}",
             f"per call at {rows} rows (ms, median; bench_tp method)   |  host only, {data['args']['host_rows']} rows (us)",
             f"{'problem':15s} {'dir':5s} {'fast':>8s} {'normal':>8s} {'saved':>7s}  | {'fast':>8s} {'normal':>8s} {'saved':>7s}"]
    for name in names:
        for d in dirs:
            c, h = data["cells"][name][d], data["host_us"][name][d]
            f, n = c["fast"]["ms_median"], c["normal"]["ms_median"]
            lines.append(f"{name:15s} {d:5s} {f:8.3f} {n:8.3f} {n - f:7.3f}  | {h['fast']:8.1f} {h['normal']:8.1f} "
                         f"{h['normal'] - h['fast']:7.1f}")
    lines.append(f"autograd.grad(x * 2): {data['host_us']['autograd_grad_x_times_2']:.1f} us")
    for name, r in data["launch_us"].items():
        lines.append(f"one fwd kernel launch ({name}), us: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
