"""GPU diagnostics for kernel work: per-kernel registers/spills and kernel-only timings of launch
variants, plus the host-side cost of one call. Not a benchmark (see benchmarks/bench_tp.py).

usage: python devtools/gpu_diag.py ITEM [ITEM...]  with ITEM = problem:kind[:rows[:warps]]
       (kind: fwd | bwd | dbwd), or "host:problem" for the per-call host overhead.
"""
import json
import os
import sys
import time

import torch
import triton

from equikernels.catalog import fully_connected_problem, problem
from equikernels.codegen.tp import LaunchConfig
from equikernels.ops import plan_of, spec_of, tensor_product
from equikernels.problem import TPProblem

N = int(os.environ.get("ROWS_N", 50000))
dev = "cuda"


def get_problem(name):
    if name == "fctp-nequip":  # NequIP-style self-interaction: shared-weight uvw (tl.dot path)
        return TPProblem.create(**fully_connected_problem("64x0e+64x1o+64x2e", "4x0e", "64x0e+64x1o+64x2e", True))
    return problem(name)


def kernel_stats(k):
    parts = getattr(k, "parts", [k])
    regs, spills = [], []
    for part in parts:
        for cache in part.fn.device_caches.values():
            for ck in cache[0].values():
                ck._init_handles()
                regs.append(ck.n_regs)
                spills.append(ck.n_spills)
    return regs, spills


def inputs(p, dtype=torch.float32, sets=2):
    mk = lambda *s: torch.randn(*s, device=dev, dtype=dtype)  # noqa: E731
    return [dict(x=mk(N, p.dim_in1), y=mk(N, p.dim_in2), g=mk(N, p.dim_out),
                 w=mk(p.weight_numel) if p.shared_weights else mk(N, p.weight_numel)) for _ in range(sets)]


def item(spec):
    parts = spec.split(":")
    if parts[0] == "host":
        return host(parts[1])
    if parts[0] == "hostbwd":
        return host_bwd(parts[1])
    name, kind = parts[0], parts[1]
    p = get_problem(name)
    plan = plan_of(spec_of(p, os.environ.get("LAYOUT", "ir_mul")))
    ks = plan.kernels
    cfg = ks._cfg(kind, torch.float32)
    if len(parts) > 2:
        cfg = LaunchConfig(int(parts[2]), int(parts[3]) if len(parts) > 3 else cfg.num_warps, 1, cfg.tf32)
    data = inputs(p)
    i = [0]

    def run():
        i[0] ^= 1
        d, e = data[i[0]], data[1 - i[0]]
        if kind == "fwd":
            return ks.forward(d["x"], d["y"], d["w"], cfg)
        if kind == "bwd":
            return ks.backward(d["x"], d["y"], d["w"], d["g"], 7, cfg)
        return ks.double_backward(d["x"], d["y"], d["w"], d["g"], e["x"], e["y"], e["w"], 15, cfg)

    t0 = time.time()
    run()
    torch.cuda.synchronize()
    compile_s = time.time() - t0
    ms = triton.testing.do_bench(run, return_mode="median")
    # every kernel of this plan that was compiled (a direction may launch several)
    stats = [kernel_stats(kk) for kk in ks._cache.values() if kk is not None]
    stats = [s_ for s_ in stats if s_[0]]
    return dict(item=spec, rows=cfg.rows, warps=cfg.num_warps, ms=round(ms, 4), compile_s=round(compile_s, 1),
                regs=[s[0] for s in stats], spills=[s[1] for s in stats])


def host(name):
    """Wall time per call with tiny inputs (GPU idle), i.e. the host-side cost of one call."""
    p = get_problem(name)
    n = 64
    x = torch.randn(n, p.dim_in1, device=dev)
    y = torch.randn(n, p.dim_in2, device=dev)
    w = torch.randn(n, p.weight_numel, device=dev) if not p.shared_weights else torch.randn(p.weight_numel, device=dev)
    ks = plan_of(spec_of(p, "ir_mul")).kernels
    k = ks.kernel("fwd")
    out = torch.empty(n, p.dim_out, device=dev)
    cfg = ks._cfg("fwd", torch.float32)
    res = {label: per_call_us(fn) for label, fn in (
        ("tensor_product", lambda: tensor_product(p, x, y, w, layout="ir_mul")),
        ("kernels.forward", lambda: ks.forward(x, y, w)),
        ("raw launch", lambda: k.launch({"x": x, "y": y, "w": w}, {"out": out}, n, cfg, torch.float32)),
        ("torch.empty", lambda: torch.empty(n, p.dim_out, device=dev)),
    )}
    return dict(item=f"host:{name}", us_per_call=res)


def per_call_us(fn, reps=300):
    """Host wall time per call, GPU work left queued (inputs are tiny, so the host is the limit)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return round((t1 - t0) / reps * 1e6, 1)


def host_bwd(name):
    """Wall time per backward call (tiny inputs): autograd through equikernels vs the kernel call
    alone vs autograd through a plain torch op (the engine's own cost)."""
    p = get_problem(name)
    n = 64
    x = torch.randn(n, p.dim_in1, device=dev, requires_grad=True)
    y = torch.randn(n, p.dim_in2, device=dev, requires_grad=True)
    w = torch.randn(n, p.weight_numel, device=dev, requires_grad=True)
    out = tensor_product(p, x, y, w, layout="ir_mul")
    g = torch.randn_like(out)
    plain = (x * 2.0)
    ks = plan_of(spec_of(p, "ir_mul")).kernels
    res = {label: per_call_us(fn) for label, fn in (
        ("autograd.grad(tp)", lambda: torch.autograd.grad(out, (x, y, w), g, retain_graph=True)),
        ("kernels.backward", lambda: ks.backward(x.detach(), y.detach(), w.detach(), g, 7)),
        ("autograd.grad(x*2)", lambda: torch.autograd.grad(plain, (x,), plain, retain_graph=True)),
    )}
    return dict(item=f"hostbwd:{name}", us_per_call=res)


if __name__ == "__main__":
    out = os.environ.get("OUT", "/tmp")
    results = []
    for spec in sys.argv[1:]:
        try:
            r = item(spec)
        except Exception as exc:  # keep going: one failing variant must not cost the whole call
            r = dict(item=spec, error=f"{type(exc).__name__}: {exc}"[:300])
        results.append(r)
        print(json.dumps(r), flush=True)
        json.dump(results, open(os.path.join(out, "gpu_diag.json"), "w"), indent=1)
