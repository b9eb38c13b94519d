"""Where the fused radial conv spends its first call on the GPU: compile vs run, per kernel.
usage: python devtools/s7/rconv_diag.py PROBLEM KIND [PREC] (KIND: fwd|gx|edge|gw)"""
import faulthandler
import sys
import time

import torch

faulthandler.dump_traceback_later(45, repeat=True)
from equikernels.catalog import problem as catalog_problem  # noqa: E402
from equikernels.ops import ConvGraph  # noqa: E402
from equikernels.ops.tp import plan_of, spec_of  # noqa: E402
from equikernels.codegen.radial_conv import kernels_for  # noqa: E402

name, kind = sys.argv[1], sys.argv[2]
p = catalog_problem(name)
n, e, H = 2000, 60000, 64
g = torch.Generator(device="cuda").manual_seed(0)
src = torch.randint(0, n, (e,), device="cuda", generator=g)
dst = torch.randint(0, n, (e,), device="cuda", generator=g)
graph = ConvGraph.build(src, dst, n)
x, y = torch.randn(n, p.dim_in1, device="cuda"), torch.randn(e, p.dim_in2, device="cuda")
h, W = torch.randn(e, H, device="cuda"), torch.randn(H, p.weight_numel, device="cuda")
go = torch.randn(n, p.dim_out, device="cuda")
ks = kernels_for(plan_of(spec_of(p, "ir_mul")), H)
t0 = time.perf_counter()
fn = ks.fn(kind)
print(f"{name} {kind}: source loaded {time.perf_counter() - t0:.1f}s", flush=True)


def call():
    if kind == "fwd":
        return ks.forward(x, y, h, W, graph)
    if kind == "gx":
        return ks.backward(x, y, h, W, go, graph, True, False, False, False)
    if kind == "edge":
        return ks.backward(x, y, h, W, go, graph, False, True, True, False)
    return ks.backward(x, y, h, W, go, graph, False, False, False, True)


for i in range(3):
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    print(f"{name} {kind}: call {i} {time.perf_counter() - t0:.2f}s", flush=True)
for k, c in fn.device_caches[0][0].items() if hasattr(fn, "device_caches") else []:
    md = getattr(c, "n_regs", None), getattr(c, "n_spills", None)
    print(f"  regs/spills {md}", flush=True)
