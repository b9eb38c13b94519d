"""Fused radial MLP on the GPU: accuracy and speed against the plain torch chain (cuBLAS).

    python devtools/s5/mlp_gpu.py out.json

MACE-MP-0-medium shapes ([10, 64, 64, 64, 512] layer 1, [10, 64, 64, 64, 1280] layer 2), 795,010
rows (the 10,192-atom Cu fcc system's edges), float32. For each dot precision (ieee, tf32x3,
tf32) of the fused op: max relative error (max|a - ref| / max|ref|) of the forward, the input
gradient and the weight gradients against a float64 torch reference; median times
(triton.testing.do_bench) of the forward, the backward for the input gradient only (frozen
weights: forces) and for input + weight gradients (training), against the torch chain with
default settings (TF32 off). Then, while time is left: a small launch-config sweep of the
default precision and a float64 check of the kernels. Every kernel variant is compiled first, in
parallel worker processes. Prints a table; writes JSON to argv[1].
"""
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from equikernels.codegen.mlp import MLPConfig, default_config, kernels_for  # noqa: E402
from equikernels.ops.mlp import DEFAULT_PRECISION, PRECISIONS, mlp_chain, radial_mlp  # noqa: E402

E = 795_010
SHAPES = {"L1": [10, 64, 64, 64, 512], "L2": [10, 64, 64, 64, 1280]}
SCALE = 1.6791767923989418  # normalize2mom(silu)
R_MAX, P_CUT = 6.0, 5
BUDGET_S = 90  # optional parts (sweep, float64) start only before this much time has passed
# shapes known to run clean on the H200 (8-warp tf32x3 backwards fault in Triton 3.6: codegen/mlp.py)
SWEEP = {"fwd": [MLPConfig(64, 128, 4, 2)],
         "bwd": [MLPConfig(32, 32, 4, 1)]}
T0 = time.time()
dev = "cuda"


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


# --- parallel warm-up: every kernel variant the run launches is compiled first, in worker processes
# (Triton's on-disk cache is shared and written atomically), so compiles overlap instead of adding
# up. Tiny launches with a row count that specialises like E (not a multiple of 16, not 1).
WARM_ROWS = 50
FP64_ROWS = 200_002


def _jobs():
    jobs = []
    for widths in SHAPES.values():
        for prec in PRECISIONS:
            jobs += [(widths, "float32", prec, d, None) for d in ("fwd", "bwd_x", "bwd_xw")]
    for d, cfgs in SWEEP.items():
        jobs += [(SHAPES["L2"], "float32", DEFAULT_PRECISION, d if d == "fwd" else "bwd_x", c) for c in cfgs]
    jobs += [(SHAPES["L2"], "float64", "ieee", d, None) for d in ("fwd", "bwd_x")]
    return jobs


def _warm(job):
    widths, dtype, prec, direction, cfg = job
    t = time.time()
    try:
        dt = getattr(torch, dtype)
        k = kernels_for(tuple(widths))
        x = torch.randn(WARM_ROWS, widths[0], device=dev, dtype=dt)
        ws = [torch.randn(a, b, device=dev, dtype=dt) for a, b in zip(widths, widths[1:])]
        if direction == "fwd":
            k.forward(x, ws, SCALE, prec, cfg)
        else:
            g = torch.randn(WARM_ROWS, widths[-1], device=dev, dtype=dt)
            k.backward(x, ws, g, SCALE, prec, True, direction == "bwd_xw", cfg)
        torch.cuda.synchronize()
        return job, time.time() - t, None
    except Exception as exc:  # reported; the measurement of this variant will fail again and say so
        return job, time.time() - t, f"{type(exc).__name__}: {str(exc)[:300]}"


def precompile():
    import concurrent.futures as cf
    import multiprocessing as mp

    jobs = _jobs()
    workers = max(1, min(len(jobs), (os.cpu_count() or 2) - 1, 16))
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        done = list(pool.map(_warm, jobs))
    slow = max(done, key=lambda r: r[1])
    log(f"compiled {len(jobs)} kernel variants in {workers} processes (slowest {slow[1]:.1f} s: {slow[0][1:4]})")
    for job, _, err in done:
        if err:
            log(f"compile failed {job}: {err}")
    return [dict(job=str(job), seconds=round(sec, 1), error=err) for job, sec, err in done]


def radial_features(n, num_basis, dtype):
    """Bessel basis x polynomial envelope of edge lengths in [0.8, r_max) (what MACE feeds the MLP)."""
    g = torch.Generator(device=dev).manual_seed(0)
    r = 0.8 + (R_MAX - 0.8) * torch.rand(n, 1, device=dev, dtype=torch.float64, generator=g)
    nb = torch.arange(1, num_basis + 1, device=dev, dtype=torch.float64) * math.pi / R_MAX
    x = r / R_MAX
    p = P_CUT
    env = (1 - (p + 1) * (p + 2) / 2 * x ** p + p * (p + 2) * x ** (p + 1) - p * (p + 1) / 2 * x ** (p + 2))
    return (math.sqrt(2 / R_MAX) * torch.sin(nb * r) / r * env).to(dtype)


def max_rel(a, b):
    return float((a.detach().double() - b).abs().max() / b.abs().max())


def bench(fn):
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def run_shape(name, widths):
    torch.manual_seed(0)
    x64 = radial_features(E, widths[0], torch.float64)
    w64 = [torch.randn(a, b, device=dev, dtype=torch.float64) / math.sqrt(a) for a, b in zip(widths, widths[1:])]
    g32 = torch.randn(E, widths[-1], device=dev)
    g64 = g32.double()
    # float64 reference
    xr = x64.clone().requires_grad_()
    wr = [w.clone().requires_grad_() for w in w64]
    out64 = mlp_chain(xr, wr, SCALE)
    ref = [out64.detach()] + list(torch.autograd.grad(out64, [xr] + wr, g64))
    del out64, xr, wr
    x32 = x64.float()
    w32 = [w.float() for w in w64]
    del x64
    rows = []

    def measure(impl, prec, fn):
        xg = x32.clone().requires_grad_()
        wf = [w.clone() for w in w32]                       # frozen weights
        wt = [w.clone().requires_grad_() for w in w32]      # trained weights
        t = time.time()
        out = fn(xg, wf)
        (gx,) = torch.autograd.grad(out, xg, g32, retain_graph=True)
        torch.cuda.synchronize()
        first = time.time() - t
        out_w = fn(xg, wt)
        grads_w = torch.autograd.grad(out_w, [xg] + wt, g32, retain_graph=True)
        torch.cuda.synchronize()
        first_all = time.time() - t
        err = dict(err_fwd=max_rel(out, ref[0]), err_gx=max_rel(gx, ref[1]),
                   err_gx_training=max_rel(grads_w[0], ref[1]),
                   err_gw=max(max_rel(a, b) for a, b in zip(grads_w[1:], ref[2:])))
        del gx, grads_w
        fwd_ms = bench(lambda: fn(xg, wf))
        bwd_x_ms = bench(lambda: torch.autograd.grad(out, xg, g32, retain_graph=True))
        bwd_xw_ms = bench(lambda: torch.autograd.grad(out_w, [xg] + wt, g32, retain_graph=True))
        row = dict(shape=name, widths=widths, impl=impl, precision=prec, fwd_ms=fwd_ms, bwd_x_ms=bwd_x_ms,
                   bwd_xw_ms=bwd_xw_ms, first_call_s=round(first, 2), first_calls_with_w_s=round(first_all, 2), **err)
        log(f"{name} {impl:6s} {prec:7s} fwd {fwd_ms:7.3f} ms  bwd(x) {bwd_x_ms:7.3f}  bwd(x,W) {bwd_xw_ms:7.3f}  "
            f"err fwd {err['err_fwd']:.2e} gx {err['err_gx']:.2e} gW {err['err_gw']:.2e}  "
            f"(first calls {first_all:.1f} s)")
        rows.append(row)
        del out, out_w
        torch.cuda.empty_cache()

    measure("torch", "fp32", lambda x, ws: mlp_chain(x, ws, SCALE))
    for prec in PRECISIONS:
        measure("fused", prec, lambda x, ws, p=prec: radial_mlp(x, ws, SCALE, backend="triton", precision=p))
    return rows, (x32, w32, g32)


def sweep(name, widths, x, ws, g):
    k = kernels_for(tuple(widths))
    out = []
    for direction, cfgs in SWEEP.items():
        for cfg in [default_config(direction, torch.float32, DEFAULT_PRECISION)] + cfgs:
            if time.time() - T0 > BUDGET_S + 15:
                log("sweep: out of time")
                return out
            if direction == "fwd":
                fn = lambda c=cfg: k.forward(x, ws, SCALE, DEFAULT_PRECISION, c)  # noqa: E731
            else:
                fn = lambda c=cfg: k.backward(x, ws, g, SCALE, DEFAULT_PRECISION, True, False, c)  # noqa: E731
            try:
                fn()
                torch.cuda.synchronize()
                ms = bench(fn)
            except Exception as exc:  # a config the compiler refuses (registers / shared memory)
                ms = float("nan")
                log(f"sweep {direction} {cfg}: {type(exc).__name__}: {str(exc)[:200]}")
            out.append(dict(shape=name, direction=direction, precision=DEFAULT_PRECISION, rows=cfg.rows,
                            cols=cfg.cols, num_warps=cfg.num_warps, num_stages=cfg.num_stages, ms=ms))
            log(f"sweep {name} {direction} BE={cfg.rows} BN={cfg.cols} warps={cfg.num_warps} "
                f"stages={cfg.num_stages}: {ms:.3f} ms")
    return out


def fp64_check(widths, n=FP64_ROWS):
    x = radial_features(n, widths[0], torch.float64).requires_grad_()
    ws = [torch.randn(a, b, device=dev, dtype=torch.float64) / math.sqrt(a) for a, b in zip(widths, widths[1:])]
    ref = mlp_chain(x, ws, SCALE)
    g = torch.randn_like(ref)
    (rgx,) = torch.autograd.grad(ref, x, g, retain_graph=True)
    try:
        out = radial_mlp(x, ws, SCALE, backend="triton")
        (gx,) = torch.autograd.grad(out, x, g, retain_graph=True)
        res = dict(rows=n, widths=widths, err_fwd=max_rel(out, ref), err_gx=max_rel(gx, rgx),
                   fused_fwd_ms=bench(lambda: radial_mlp(x, ws, SCALE, backend="triton")),
                   torch_fwd_ms=bench(lambda: mlp_chain(x, ws, SCALE)),
                   fused_bwd_x_ms=bench(lambda: torch.autograd.grad(out, x, g, retain_graph=True)),
                   torch_bwd_x_ms=bench(lambda: torch.autograd.grad(ref, x, g, retain_graph=True)))
    except Exception as exc:
        res = dict(rows=n, widths=widths, error=f"{type(exc).__name__}: {str(exc)[:500]}")
    log(f"float64: {res}")
    return res


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "mlp_gpu.json"
    log(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}  "
        f"allow_tf32={torch.backends.cuda.matmul.allow_tf32}")
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, rows=E,
                  default_precision=DEFAULT_PRECISION, results=[], sweep=[], fp64=None)
    result["compile"] = precompile()
    keep = None
    for name, widths in SHAPES.items():
        rows, keep = run_shape(name, widths)
        result["results"] += rows
        if name != "L2":
            del keep
            torch.cuda.empty_cache()
    if time.time() - T0 < BUDGET_S:
        result["sweep"] = sweep("L2", SHAPES["L2"], *keep)
    del keep
    torch.cuda.empty_cache()
    if time.time() - T0 < BUDGET_S + 20:
        result["fp64"] = fp64_check(SHAPES["L2"])
    result["elapsed_s"] = round(time.time() - T0, 1)
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1)

    print("\nshape impl   precision    fwd ms  bwd(x) ms  bwd(x,W) ms   err fwd   err gx    err gW")
    for r in result["results"]:
        print(f"{r['shape']:5s} {r['impl']:6s} {r['precision']:9s} {r['fwd_ms']:8.3f} {r['bwd_x_ms']:10.3f} "
              f"{r['bwd_xw_ms']:12.3f}  {r['err_fwd']:.1e}  {r['err_gx']:.1e}  {r['err_gw']:.1e}")
    for shape in SHAPES:
        base = next(r for r in result["results"] if r["shape"] == shape and r["impl"] == "torch")
        for r in result["results"]:
            if r["shape"] == shape and r["impl"] == "fused":
                print(f"{shape} {r['precision']:7s} speed-up vs torch: fwd {base['fwd_ms'] / r['fwd_ms']:.2f}x  "
                      f"fwd+bwd(x) {(base['fwd_ms'] + base['bwd_x_ms']) / (r['fwd_ms'] + r['bwd_x_ms']):.2f}x  "
                      f"fwd+bwd(x,W) {(base['fwd_ms'] + base['bwd_xw_ms']) / (r['fwd_ms'] + r['bwd_xw_ms']):.2f}x")
    if result["sweep"]:
        for d in ("fwd", "bwd"):
            best = min((s for s in result["sweep"] if s["direction"] == d and s["ms"] == s["ms"]),
                       key=lambda s: s["ms"], default=None)
            if best:
                print(f"best {d} config ({DEFAULT_PRECISION}, L2): BE={best['rows']} BN={best['cols']} "
                      f"warps={best['num_warps']} stages={best['num_stages']}: {best['ms']:.3f} ms")
    print(f"elapsed {result['elapsed_s']} s; JSON: {out_path}")


if __name__ == "__main__":
    main()
