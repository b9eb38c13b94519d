"""Convolution with the radial MLP's last layer fused against the unfused path and
cuEquivariance, side by side in one run, on the MACE-MP medium second-layer problem (ir_mul) over
the periodic rattled Cu cells of bench_conv.py.

Every implementation computes out = conv(x, y, h @ W): h [E, 64] the radial MLP's last hidden
activation, W [64, weight_numel] its last layer.
- ``fused``: ``equikernels.experimental.radial_conv`` (w formed in registers, never written);
- ``unfused``: ``h @ W`` (cuBLAS) then ``tensor_product_conv`` (deterministic);
- ``cue``: ``h @ W`` then cuEquivariance's fused channel-wise TP with indices (MACE's cueq path).

Directions: ``fwd`` (no grad); ``ef``: forward + gradients of (x, y, h), the energy + forces
shape (positions reach the convolution through y and h); ``train1``: forward + gradients of
(x, y, h, W). Peak memory above the inputs is reported per cell. Errors: max relative error of
out and the four gradients against the float64 unfused reference on a small graph.

    python benchmarks/bench_radial_conv.py --atoms 10192 2916 --out results.json
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
from equikernels.catalog import problem as catalog_problem  # noqa: E402
from equikernels.catalog import standard_problems  # noqa: E402
from equikernels.ops import ConvGraph, tensor_product_conv  # noqa: E402
from equikernels.experimental.radial_conv import radial_conv  # noqa: E402

HIDDEN = 64


def make(impl, problem, kw, graph, dtype, device):
    if impl == "fused":
        return lambda x, y, h, W: radial_conv(problem, x, y, h, W, graph, layout="ir_mul", fused=True)
    if impl == "unfused":
        return lambda x, y, h, W: radial_conv(problem, x, y, h, W, graph, layout="ir_mul", fused=False)
    if impl == "cue":
        # cue's weight order differs from e3nn's; timing only (its numbers are checked in bench_conv)
        _, raw, _ = CV.build("cuequivariance", TP.Spec.create("conv", kw), graph.src, graph.dst, graph.num_nodes,
                             dtype, device)
        return lambda x, y, h, W: raw(x, y, h @ W)
    raise SystemExit(f"unknown impl {impl}")


def inputs(problem, n, e, dtype, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    mk = lambda *s: torch.randn(*s, device=device, generator=gen, dtype=torch.float64).to(dtype)  # noqa: E731
    return mk(n, problem.dim_in1), mk(e, problem.dim_in2), mk(e, HIDDEN) / 4, mk(HIDDEN, problem.weight_numel) / 8


def check(impl_fn, ref_fn, args):
    def run(f, dt):
        ts = [t.to(dt).detach().requires_grad_() for t in args]
        out = f(*ts)
        g = torch.randn(out.shape, generator=torch.Generator(device=out.device).manual_seed(3),
                        device=out.device, dtype=torch.float64).to(dt)
        return [out.detach(), *torch.autograd.grad(out, ts, g)]
    got, want = run(impl_fn, args[0].dtype), run(ref_fn, torch.float64)
    return max(float((a.double() - b).norm() / b.norm().clamp_min(1e-300)) for a, b in zip(got, want))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problem", default="mace-mp-medium-L2")
    ap.add_argument("--atoms", type=int, nargs="+", default=[10192, 2916])
    ap.add_argument("--r-cut", type=float, default=6.0)
    ap.add_argument("--impls", default="fused,unfused,cue")
    ap.add_argument("--dirs", default="fwd,ef,train1")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--check-atoms", type=int, default=256)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    problem, kw = catalog_problem(args.problem), standard_problems()[args.problem]
    impls, dirs = args.impls.split(","), args.dirs.split(",")
    res = {"env": C.env_info(device), "problem": args.problem, "hidden": HIDDEN, "dtype": args.dtype,
           "date": time.strftime("%Y-%m-%d %H:%M"), "gpu": torch.cuda.get_device_name(), "cells": [], "errors": {}}
    if args.check_atoms:
        src, dst, n = CV.cu_graph(args.check_atoms, device, r_cut=args.r_cut)
        graph = ConvGraph.build(src, dst, n)
        a = inputs(problem, n, len(src), dtype, device, 0)
        ref = lambda x, y, h, W: tensor_product_conv(problem, x, y, h @ W, src, dst, n, graph=graph,  # noqa: E731
                                                     layout="ir_mul", backend="reference")
        for impl in ("fused", "unfused"):
            if impl in impls:
                try:
                    err = check(make(impl, problem, kw, graph, dtype, device), ref, a)
                except Exception as exc:
                    err = f"{type(exc).__name__}: {str(exc)[:200]}"
                res["errors"][impl] = err
                print(f"[check {args.check_atoms} atoms] {impl}: max rel. err {err}", flush=True)
    for atoms in args.atoms:
        src, dst, n = CV.cu_graph(atoms, device, r_cut=args.r_cut)
        e = len(src)
        graph = ConvGraph.build(src, dst, n, validate=False)
        x, y, h, W = inputs(problem, n, e, dtype, device, 1)
        g = torch.randn(n, problem.dim_out, device=device, dtype=dtype)
        print(f"[graph] {atoms} atoms, {e} edges", flush=True)
        for impl in impls:
            try:
                f = make(impl, problem, kw, graph, dtype, device)
            except Exception as exc:
                print(f"[{atoms}] {impl}: unavailable: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                res["cells"].append({"atoms": atoms, "impl": impl, "error": str(exc)[:500]})
                continue
            for d in dirs:
                need = {"fwd": (), "ef": (0, 1, 2), "train1": (0, 1, 2, 3)}[d]
                ts = [t.detach().requires_grad_(k in need) for k, t in enumerate((x, y, h, W))]

                def call(i, ts=ts, need=need):
                    if not need:
                        with torch.no_grad():
                            return f(*ts)
                    out = f(*ts)
                    return torch.autograd.grad(out, [ts[k] for k in need], g)
                try:
                    call(0)
                    torch.cuda.synchronize()
                    base = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    call(0)
                    torch.cuda.synchronize()
                    peak = (torch.cuda.max_memory_allocated() - base) / C.GIB
                    t = C.time_calls(call, device, target_ms=300.0, min_reps=5, warmup=2)
                    cell = {"atoms": atoms, "edges": e, "impl": impl, "dir": d, "ms": t["ms_median"],
                            "p20": t["ms_p20"], "p80": t["ms_p80"], "n": t["n"], "extra_peak_gib": peak}
                except Exception as exc:
                    traceback.print_exc()
                    cell = {"atoms": atoms, "edges": e, "impl": impl, "dir": d, "error": str(exc)[:300]}
                res["cells"].append(cell)
                print(f"[{atoms}] {impl:8s} {d:6s} " + (f"{cell['ms']:8.3f} ms  +{cell['extra_peak_gib']:.2f} GiB"
                                                       if "ms" in cell else cell["error"]), flush=True)
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    print("\n| atoms | impl | " + " | ".join(dirs) + " |\n|---|---|" + "---:|" * len(dirs))
    for atoms in args.atoms:
        for impl in impls:
            row = {c["dir"]: c for c in res["cells"] if c["atoms"] == atoms and c["impl"] == impl and "dir" in c}
            vals = [f"{row[d]['ms']:.3f} ms / {row[d]['extra_peak_gib']:.2f} GiB" if d in row and "ms" in row[d]
                    else "—" for d in dirs]
            print(f"| {atoms} | {impl} | " + " | ".join(vals) + " |")


if __name__ == "__main__":
    main()
