"""DiffDock-L2 per-row uvw: kernel-only timings of the uvw_rows.py variants against the emit.py
kernels (same inputs, results compared), registers and spills. GPU only.

usage: python devtools/s9/diffdock_uvw.py OUT.jsonl SPEC [SPEC ...]
SPEC = kind:need:have:ub:wb:exact:lazy:rows:warps[:maxnreg]  (kind bwd|dbwd; need xyw / xywg letters)
       or old:bwd / old:dbwd (the emit.py kernels at their default configuration)
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl

from equikernels.catalog import problem
from equikernels.codegen import uvw_rows
from equikernels.codegen.tp import TPKernels, _Kernel
from equikernels.ops import plan_of, spec_of

N = int(os.environ.get("ROWS_N", 50000))
dev = os.environ.get("DIAG_DEVICE", "cuda")
p = problem("diffdock-L2")
plan = plan_of(spec_of(p, "ir_mul"))
torch.manual_seed(0)
mk = lambda *s: torch.randn(*s, device=dev)  # noqa: E731
T = dict(x=mk(N, p.dim_in1), y=mk(N, p.dim_in2), w=mk(N, p.weight_numel), g=mk(N, p.dim_out),
         a=mk(N, p.dim_in1), b=mk(N, p.dim_in2), c=mk(N, p.weight_numel))
SHAPE = {"x": p.dim_in1, "y": p.dim_in2, "w": p.weight_numel, "g": p.dim_out}
old = TPKernels(plan)
# DIAG_REF=new: compare against the default (uvw_rows) path instead of the emit.py kernels (their
# cold compile is ~40 s)
old._uvw = os.environ.get("DIAG_REF") == "new" and old._uvw_rows()
REF = {}


def ref(kind):
    if kind not in REF:
        if kind == "bwd":
            r = old.backward(T["x"], T["y"], T["w"], T["g"], 7)
            REF[kind] = dict(zip(("gx", "gy", "gw"), r))
        else:
            r = old.double_backward(T["x"], T["y"], T["w"], T["g"], T["a"], T["b"], T["c"], 15)
            REF[kind] = dict(zip(("dx", "dy", "dw", "dg"), r))
    return REF[kind]


def stats(ck):
    try:
        ck._init_handles()
        return ck.n_regs, ck.n_spills
    except Exception:  # noqa: BLE001
        return None, None


def run_old(kind):
    ref(kind)
    if kind == "bwd":
        f = lambda: old.backward(T["x"], T["y"], T["w"], T["g"], 7)  # noqa: E731
    else:
        f = lambda: old.double_backward(T["x"], T["y"], T["w"], T["g"], T["a"], T["b"], T["c"], 15)  # noqa: E731
    ms = triton.testing.do_bench(f, return_mode="median")
    return dict(spec=f"old:{kind}", ms=ms)


def run_new(spec):
    f = spec.split(":")
    kind, need, have, ub, wb, ex, lz, rows, warps = f[:9]
    maxnreg = int(f[9]) if len(f) > 9 else None
    o = uvw_rows.Options(int(ub), int(wb), ex == "1", lz == "1")
    name = f"dd_{kind}{need}{have}_{ub}_{wb}_{ex}{lz}"
    built = uvw_rows.generate(name, plan.table, "ir_mul", kind, need, have, o)
    k = _Kernel(name, (), "ir_mul", (), f"diag {spec}", built=built)
    outs = {o_: torch.empty(N, SHAPE[uvw_rows.ROLE[o_]], device=dev) for o_ in k.meta.outputs}
    args = [T[i] for i in k.meta.inputs] + [outs[o_] for o_ in k.meta.outputs]
    rows, warps = int(rows), int(warps)
    nblk = triton.cdiv(N, rows)
    extra = {"maxnreg": maxnreg} if maxnreg else {}

    def launch():
        return k.fn[(nblk,)](*args, N, nblk, rows, tl.float32, "ieee", num_warps=warps, num_stages=1, **extra)

    ck = launch()
    if dev == "cuda":
        torch.cuda.synchronize()
    r = ref(kind)
    err = {o_: float((outs[o_] - r[o_]).norm() / r[o_].norm()) for o_ in outs}
    ms = triton.testing.do_bench(launch, return_mode="median")
    regs, spills = stats(ck)
    return dict(spec=spec, ms=ms, regs=regs, spills=spills, err=err)


if __name__ == "__main__":
    out = open(sys.argv[1], "a")
    print(f"# {torch.cuda.get_device_name() if dev == 'cuda' else dev} triton {triton.__version__} torch {torch.__version__} N={N}", flush=True)
    for spec in sys.argv[2:]:
        try:
            res = run_old(spec.split(":")[1]) if spec.startswith("old:") else run_new(spec)
        except Exception as e:  # noqa: BLE001
            res = dict(spec=spec, error=f"{type(e).__name__}: {str(e)[:300]}")
        out.write(json.dumps(res) + "\n")
        out.flush()
        err = max(res.get("err", {0: 0}).values()) if "err" in res else 0
        print(f"{spec:40s} {res.get('ms', float('nan')):8.3f} ms regs {res.get('regs')} spills {res.get('spills')} "
              f"maxrel {err:.1e} {res.get('error', '')}", flush=True)
