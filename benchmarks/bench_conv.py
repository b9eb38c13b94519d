"""Fused graph convolution benchmark (fused dataflows), side by side in one run:

- ``ek_atomic`` / ``ek_det``: equikernels ``tensor_product_conv`` (ir_mul), atomic and deterministic
  dataflows; ``ek_unfused``: equikernels batched TP + index_add;
- ``cue_fused``: cuEquivariance ``ChannelWiseTensorProduct`` with ``indices_1=src,
  indices_out=dst`` (ir_mul), the path MACE uses for cueq conv fusion;
- ``oeq_atomic`` / ``oeq_det``: OpenEquivariance ``TensorProductConv`` (e3nn layout).

Graph: periodic, rattled (0.05 Å) Cu fcc (a = 3.6 Å), all pairs within r_cut (vesin), edges sorted
by (dst, src) for every implementation. Directions as OpenEquivariance defines them: fwd; bwd = grad of (x, y, w)
given g (forward excluded); dbwd = grad of <gx,Rx>+<gy,Ry>+<gw,Rw> in (x, y, w, g) (forward
and first backward excluded). Errors: each implementation against the float64 reference on a small
graph (fwd, 3 grads, 4 second-order grads; max relative error).

    python benchmarks/bench_conv.py --atoms 10192 2916 --out results.json
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

from equikernels.catalog import problem as catalog_problem  # noqa: E402
from equikernels.catalog import standard_problems  # noqa: E402
from equikernels.ops import ConvGraph, tensor_product_conv  # noqa: E402

REPEATS = {256: (4, 4, 4), 1008: (6, 6, 7), 2916: (9, 9, 9), 10192: (13, 14, 14), 19652: (17, 17, 17)}


def cu_graph(atoms: int, r_cut: float, device, seed: int = 0):
    import ase.build
    from vesin import NeighborList
    if atoms not in REPEATS:
        raise SystemExit(f"--atoms: one of {sorted(REPEATS)}")
    a = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True).repeat(REPEATS[atoms])
    a.rattle(0.05, seed=seed)
    i, j = NeighborList(cutoff=r_cut, full_list=True).compute(a.positions, a.cell[:], True, "ij")
    src, dst = torch.as_tensor(j, dtype=torch.long), torch.as_tensor(i, dtype=torch.long)
    order = torch.argsort(dst * len(a) + src)
    return src[order].to(device), dst[order].to(device), len(a)


def _conv(irreps) -> C.LayoutConverter:
    return C.LayoutConverter([(mul, 2 * l + 1) for mul, l, _ in irreps])


def to_ir_mul(t, irreps):
    return _conv(irreps).to_ir_mul(t)


def from_ir_mul(t, irreps):
    return _conv(irreps).to_mul_ir(t)


# --- implementations: each returns fn(x, y, w) in e3nn layout ---------------------------------------
def build_ek(problem, src, dst, n, flow, graph):
    P = problem

    def fn(x, y, w):
        xi, yi = to_ir_mul(x, P.irreps_in1), to_ir_mul(y, P.irreps_in2)
        out = tensor_product_conv(P, xi, yi, w, src, dst, n, graph=graph, layout="ir_mul", dataflow=flow,
                                  validate=False)
        return from_ir_mul(out, P.irreps_out)

    def raw(x, y, w):  # timed: inputs already in ir_mul
        return tensor_product_conv(P, x, y, w, src, dst, n, graph=graph, layout="ir_mul", dataflow=flow,
                                   validate=False)
    return fn, raw, "ir_mul"


def build_cue(problem, kw, src, dst, n, dtype, device):
    import cuequivariance as cue
    import cuequivariance_torch as cuet
    from cuequivariance.group_theory.experimental.e3nn import O3_e3nn
    from cuequivariance import descriptors
    from bench_tp import Spec, _cue_weight_perm
    irr = lambda s: cue.Irreps(O3_e3nn, s)  # noqa: E731
    i1, i2, io = irr(kw["irreps_in1"]), irr(kw["irreps_in2"]), irr(kw["irreps_out"])
    with C.default_dtype(dtype):
        m = cuet.ChannelWiseTensorProduct(i1, i2, io, layout=cue.ir_mul, shared_weights=False,
                                          internal_weights=False, device=device, dtype=dtype, math_dtype=dtype)
        desc = descriptors.channelwise_tensor_product(i1, i2, io)
    if m.weight_numel != problem.weight_numel:
        raise RuntimeError("cue weight count differs from e3nn's")
    perm = _cue_weight_perm(Spec.create("conv", kw), desc).to(device)  # w_cue = w_e3nn[..., perm]
    P = problem

    def raw(x, y, w):
        return m(x, y, w, indices_1=src, indices_out=dst, size_out=n)

    def fn(x, y, w):
        return from_ir_mul(raw(to_ir_mul(x, P.irreps_in1), to_ir_mul(y, P.irreps_in2), w.index_select(-1, perm)),
                           P.irreps_out)
    return fn, raw, "ir_mul"


def build_oeq(problem, kw, src, dst, n, dtype, deterministic):
    import numpy as np
    import openequivariance as oeq
    npdt = {torch.float32: np.float32, torch.float64: np.float64}[dtype]
    order = sorted(range(len(problem.instructions)), key=lambda k: problem.instructions[k].i_out)
    instr = [tuple(kw["instructions"][k]) for k in order]
    offs, o = [], 0
    for ins in problem.instructions:
        size = 1
        for s in ins.path_shape(problem):
            size *= s
        offs.append((o, size))
        o += size
    perm = torch.cat([torch.arange(offs[k][0], offs[k][0] + offs[k][1]) for k in order]).to(src.device)
    prob = oeq.TPProblem(kw["irreps_in1"], kw["irreps_in2"], kw["irreps_out"], instr, shared_weights=False,
                         internal_weights=False, irrep_dtype=npdt, weight_dtype=npdt)
    conv = oeq.TensorProductConv(prob, deterministic=deterministic)
    # OEQ 0.7 documents int64 indices (this passed int32 before, and segfaulted), out[rows] += f(x[cols]),
    # and, for the deterministic kernel, edges sorted by (row, col) plus the transpose permutation.
    eorder = torch.argsort(dst.long() * n + src.long())
    rows, cols = dst.long()[eorder].contiguous(), src.long()[eorder].contiguous()
    tperm = torch.argsort(cols * n + rows) if deterministic else None

    def wt(w):  # timed inputs are random: only the layout conversion, no edge reordering
        return conv.reorder_weights_from_e3nn(w.index_select(-1, perm).contiguous(), True)

    def raw(x, y, w):
        return conv(x, y, w, rows, cols, tperm) if deterministic else conv(x, y, w, rows, cols)

    def fn(x, y, w):  # e3nn layout, original edge order (the error check)
        return raw(x, y.index_select(0, eorder), wt(w.index_select(0, eorder)))
    return fn, raw, "mul_ir_oeqw", wt


# --- measurement --------------------------------------------------------------------------------------
def directions(raw, x, y, w, g, Rx, Ry, Rw):
    def fwd(i):
        with torch.no_grad():
            return raw(x, y, w)
    xg, yg, wg = (t.detach().requires_grad_() for t in (x, y, w))
    out = raw(xg, yg, wg)

    def bwd(i):
        return torch.autograd.grad(out, (xg, yg, wg), g, retain_graph=True)
    gg = g.detach().requires_grad_()
    gx, gy, gw = torch.autograd.grad(out, (xg, yg, wg), gg, create_graph=True, retain_graph=True)
    L = (gx * Rx).sum() + (gy * Ry).sum() + (gw * Rw).sum()

    def dbwd(i):
        return torch.autograd.grad(L, (xg, yg, wg, gg), retain_graph=True)
    return {"fwd": fwd, "bwd": bwd, "dbwd": dbwd}


def max_error(fn, x, y, w, src_dst_n, ref_fn):
    """max relative error of out, grads and second-order grads against ref_fn (float64)."""
    def orders(f, xx, yy, ww, dt):
        xx, yy, ww = (t.to(dt).detach().requires_grad_() for t in (xx, yy, ww))
        out = f(xx, yy, ww)
        gen = torch.Generator(device=out.device).manual_seed(7)
        g = torch.randn(out.shape, generator=gen, device=out.device, dtype=torch.float64).to(dt).requires_grad_()
        grads = torch.autograd.grad(out, (xx, yy, ww), g, create_graph=True)
        R = [torch.randn(t.shape, generator=gen, device=out.device, dtype=torch.float64).to(dt) for t in grads]
        L = sum((a * r).sum() for a, r in zip(grads, R))
        second = torch.autograd.grad(L, (xx, yy, ww, g))
        return [out.detach(), *[t.detach() for t in grads], *second]
    got = orders(fn, x, y, w, x.dtype)
    want = orders(ref_fn, x, y, w, torch.float64)
    return max(float((a.double() - b).norm() / b.norm().clamp_min(1e-300)) for a, b in zip(got, want))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problem", default="mace-mp-medium-L2")
    ap.add_argument("--atoms", type=int, nargs="+", default=[10192, 2916])
    ap.add_argument("--r-cut", type=float, default=6.0)
    ap.add_argument("--impls", default="ek_det,ek_atomic,cue_fused,oeq_det,oeq_atomic")
    ap.add_argument("--dirs", default="fwd,bwd,dbwd")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--check-atoms", type=int, default=256, help="graph size for the error check (0: skip)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    dtype = getattr(torch, args.dtype)
    problem, kw = catalog_problem(args.problem), standard_problems()[args.problem]
    impls = args.impls.split(",")
    dirs = args.dirs.split(",")
    res = {"env": C.env_info(device), "problem": args.problem,
           "dtype": args.dtype, "date": time.strftime("%Y-%m-%d %H:%M"), "gpu": torch.cuda.get_device_name(),
           "cells": []}

    def make(impl, src, dst, n, graph):
        if impl.startswith("ek_"):
            flow = {"ek_det": "deterministic", "ek_atomic": "atomic", "ek_unfused": "unfused"}[impl]
            return build_ek(problem, src, dst, n, flow, graph) + (None,)
        if impl == "cue_fused":
            return build_cue(problem, kw, src, dst, n, dtype, device) + (None,)
        if impl in ("oeq_det", "oeq_atomic"):
            return build_oeq(problem, kw, src, dst, n, dtype, impl == "oeq_det")
        raise SystemExit(f"unknown impl {impl}")

    # correctness on a small graph, every implementation against the float64 reference
    if args.check_atoms:
        src, dst, n = cu_graph(args.check_atoms, args.r_cut, device)
        graph = ConvGraph.build(src, dst, n)
        gen = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(n, problem.dim_in1, device=device, generator=gen).to(dtype)
        y = torch.randn(len(src), problem.dim_in2, device=device, generator=gen).to(dtype)
        w = torch.randn(len(src), problem.weight_numel, device=device, generator=gen).to(dtype)
        ref = lambda a, b, c: tensor_product_conv(problem, a, b, c, src, dst, n, graph=graph, backend="reference")  # noqa: E731
        for impl in impls:
            try:
                fn = make(impl, src, dst, n, graph)[0]
                err = max_error(fn, x, y, w, (src, dst, n), ref)
            except Exception as exc:  # a baseline that fails must not stop the run
                err = f"{type(exc).__name__}: {str(exc)[:200]}"
            res.setdefault("errors", {})[impl] = err
            print(f"[check {args.check_atoms} atoms] {impl}: max rel. err {err}", flush=True)

    for atoms in args.atoms:
        src, dst, n = cu_graph(atoms, args.r_cut, device)
        e = len(src)
        t0 = time.perf_counter()
        graph = ConvGraph.build(src, dst, n, validate=False)
        torch.cuda.synchronize()
        prep_ms = (time.perf_counter() - t0) * 1e3
        print(f"[graph] {atoms} atoms, {e} edges, ConvGraph.build {prep_ms:.1f} ms", flush=True)
        gen = torch.Generator(device=device).manual_seed(1)
        for impl in impls:
            try:
                built = make(impl, src, dst, n, graph)
                fn, raw, lay, wt = built
                x = torch.randn(n, problem.dim_in1, device=device, generator=gen, dtype=dtype)
                y = torch.randn(e, problem.dim_in2, device=device, generator=gen, dtype=dtype)
                w = torch.randn(e, problem.weight_numel, device=device, generator=gen, dtype=dtype)
                if wt is not None:
                    w = wt(w)
                g = torch.randn(n, problem.dim_out, device=device, generator=gen, dtype=dtype)
                Rx, Ry, Rw = torch.randn_like(x), torch.randn_like(y), torch.randn_like(w)
                fns = directions(raw, x, y, w, g, Rx, Ry, Rw)
            except Exception as exc:
                print(f"[{atoms}] {impl}: unavailable: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                traceback.print_exc()
                res["cells"].append({"atoms": atoms, "edges": e, "impl": impl, "error": str(exc)[:500]})
                continue
            for d in dirs:
                try:
                    torch.cuda.reset_peak_memory_stats()
                    t = C.time_calls(fns[d], device, target_ms=200.0, min_reps=5, warmup=2)
                    peak = torch.cuda.max_memory_allocated() / C.GIB
                    cell = {"atoms": atoms, "edges": e, "impl": impl, "dir": d, "ms": t["ms_median"],
                            "p20": t["ms_p20"], "p80": t["ms_p80"], "n": t["n"], "peak_gib": peak}
                except Exception as exc:
                    cell = {"atoms": atoms, "edges": e, "impl": impl, "dir": d, "error": str(exc)[:300]}
                res["cells"].append(cell)
                print(f"[{atoms}] {impl:10s} {d:5s} " + (f"{cell['ms']:8.3f} ms  peak {cell['peak_gib']:.1f} GiB"
                                                         if "ms" in cell else cell["error"]), flush=True)
            del fns
            torch.cuda.empty_cache()
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
