#!/usr/bin/env python
"""CPU-side profile of the eager batched-TP path (open issue 3), no GPU needed.

The generated kernels are built for real (codegen only) but never launched: Triton's
``fn[grid]`` is replaced by a stub that returns a fake CompiledKernel whose launcher does
nothing, and FastLaunch's device / stream queries by constants. So everything on the Python
path of a call (autograd Function, dispatch, checks, dtype logic, allocation of CPU buffers,
FastLaunch's key) runs as in production, minus the C launcher (~6 us on the H200 host) and the
CUDA caching allocator (torch.empty: ~3.8 us there, ~1 us on CPU).

    python devtools/s9/host_profile.py [--problem nequip-water] [--calls 20000] [--cprofile bwd]
Prints us per call for fwd / bwd (autograd.grad on a retained graph, as bench_tp) / dbwd, and
autograd.grad(x * 2) as the floor, with ops.tp's direct backward off ("full": TPKernels.backward),
and on; rounds interleave the modes.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # the stubbed launch path needs real JITFunctions
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from triton.compiler import CompiledKernel  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from equikernels.catalog import standard_problems  # noqa: E402
from equikernels.codegen import launch  # noqa: E402
from equikernels.ops import tensor_product  # noqa: E402
from equikernels.problem import TPProblem  # noqa: E402

LAUNCHES = [0]


def _fake_compiled():
    ck = object.__new__(CompiledKernel)

    def run(*args):  # the C launcher's signature: grid x3, stream, function, metadata, hooks x3, params
        LAUNCHES[0] += 1
    ck._run, ck.function, ck.packed_metadata = run, 0, None
    return ck


def stub_triton() -> None:
    ck = _fake_compiled()
    JITFunction.__getitem__ = lambda self, grid: (lambda *a, **k: ck)
    launch._device, launch._stream = (lambda: 0), (lambda dev: 0)


def per_call_us(call, n: int, repeats: int = 5) -> float:
    for _ in range(200):
        call()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def calls(P, rows: int, layout: str):
    mk = lambda *s: torch.randn(*s)  # noqa: E731
    x, y = mk(rows, P.dim_in1).requires_grad_(), mk(rows, P.dim_in2).requires_grad_()
    w = mk(*((P.weight_numel,) if P.shared_weights else (rows, P.weight_numel))).requires_grad_()
    tp = lambda a, b, c: tensor_product(P, a, b, c, layout=layout, backend="triton")  # noqa: E731
    xd, yd, wd = x.detach(), y.detach(), w.detach()
    out = tp(x, y, w)
    g0 = torch.randn_like(out)
    g = g0.clone().requires_grad_()
    gx, gy, gw = torch.autograd.grad(tp(x, y, w), (x, y, w), g, create_graph=True)
    L = (gx * torch.randn_like(gx)).sum() + (gy * torch.randn_like(gy)).sum() + (gw * torch.randn_like(gw)).sum()
    z = torch.randn(rows, 16, requires_grad=True)
    zz, gz = z * 2, torch.randn(rows, 16)
    return {
        "fwd": lambda: tp(xd, yd, wd),
        "bwd": lambda: torch.autograd.grad(out, (x, y, w), g0, retain_graph=True),
        "dbwd": lambda: torch.autograd.grad(L, (x, y, w, g), retain_graph=True),
        "grad(x*2)": lambda: torch.autograd.grad(zz, (z,), gz, retain_graph=True),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problem", default="nequip-water")
    ap.add_argument("--layout", default="ir_mul")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--directions", default="fwd,bwd,dbwd,grad(x*2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cprofile", help="direction to profile with cProfile (top 25 by tottime)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    stub_triton()
    P = TPProblem.create(**standard_problems()[args.problem])
    fns = calls(P, args.rows, args.layout)
    from equikernels.ops import tp as ops_tp
    modes = {"full": False, "direct": True}
    for d in args.directions.split(","):
        res = {m: [] for m in modes}
        for _ in range(args.rounds):  # interleaved, so drift hits every mode alike
            for m, direct in modes.items():
                ops_tp.FAST_BWD = direct
                res[m].append(per_call_us(fns[d], args.calls, repeats=2))
        print(f"{args.problem:14s} {d:10s} " + "  ".join(f"{m} {min(v):7.2f}" for m, v in res.items())
              + " us/call (best of rounds)", flush=True)
    if args.cprofile:
        pr = cProfile.Profile()
        f = fns[args.cprofile]
        pr.enable()
        for _ in range(args.calls):
            f()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
