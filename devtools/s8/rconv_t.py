"""Kernel-only times of the fused radial conv's fwd and gx kernels (and optionally edge, gw) on the
10,192-atom Cu graph, for each launch config given as B:WARPS:GROUP[:EDGE_SPLIT], plus the error of fwd / gx
against the float64 unfused reference on the same graph. usage: python devtools/s8/rconv_t.py KINDS CFG...
(KINDS e.g. fwd,gx). ``rconv_t.py once KIND`` runs one kernel twice and nothing else (for ncu, which
captures the second launch)."""
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import common as C  # noqa: E402
from bench_conv import cu_graph  # noqa: E402

from equikernels.catalog import problem as catalog_problem  # noqa: E402
from equikernels.codegen.radial_conv import kernels_for  # noqa: E402
from equikernels.ops import ConvGraph, tensor_product_conv  # noqa: E402
from equikernels.ops.tp import plan_of, spec_of  # noqa: E402

dev = torch.device("cuda")
p = catalog_problem("mace-mp-medium-L2")
src, dst, n = cu_graph(10192, 6.0, dev)
graph = ConvGraph.build(src, dst, n, validate=False)
e = len(src)
torch.manual_seed(0)
x, y = torch.randn(n, p.dim_in1, device=dev), torch.randn(e, p.dim_in2, device=dev)
h, W = torch.randn(e, 64, device=dev), torch.randn(64, p.weight_numel, device=dev) / 8
go = torch.randn(n, p.dim_out, device=dev)
ks = kernels_for(plan_of(spec_of(p, "ir_mul")), 64)
calls = {"fwd": lambda: ks.forward(x, y, h, W, graph),
         "gx": lambda: ks.backward(x, y, h, W, go, graph, True, False, False, False)[0],
         "edge": lambda: ks.backward(x, y, h, W, go, graph, False, True, True, False),
         "gw": lambda: ks.backward(x, y, h, W, go, graph, False, False, False, True)}
if sys.argv[1] == "once":
    for _ in range(2):
        calls[sys.argv[2]]()
    torch.cuda.synchronize()
    sys.exit(0)
# float64 reference: unfused conv of h @ W, and its x gradient
xd, yd, hd, Wd = (t.double() for t in (x, y, h, W))
wd = (hd @ Wd).requires_grad_()
for t in (xd, yd):
    t.requires_grad_()
ref = tensor_product_conv(p, xd, yd, wd, src, dst, n, layout="ir_mul")
ref_gx, ref_gy, ref_gw = torch.autograd.grad(ref, (xd, yd, wd), go.double())
ref_gh = ref_gw @ Wd.t()
del ref_gw, wd
rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
kinds = sys.argv[1].split(",")
for cfg in sys.argv[2:]:
    b, w, g, *sp = cfg.split(":")
    os.environ["EQUIKERNELS_RCONV_EDGE_SPLIT"] = sp[0] if sp else "1"
    os.environ.update(EQUIKERNELS_RCONV_BLOCK=b, EQUIKERNELS_RCONV_WARPS=w, EQUIKERNELS_RCONV_GROUP=g,
                      EQUIKERNELS_RCONV_STAGES=os.environ.get("STAGES", "1"))
    row = [f"B{b} w{w} G{g} split{os.environ['EQUIKERNELS_RCONV_EDGE_SPLIT']}"]
    for k in kinds:
        t0 = time.perf_counter()
        out = calls[k]()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        err = (rel(out, ref) if k == "fwd" else rel(out, ref_gx) if k == "gx" else
               max(rel(out[1], ref_gy), rel(out[2], ref_gh)) if k == "edge" else float("nan"))
        t = C.time_calls(lambda i: calls[k](), dev, target_ms=150.0, min_reps=5, warmup=1)
        row.append(f"{k} {t['ms_median']:.3f} ms err {err:.1e} (first {first:.0f} s)")
    print(" | ".join(row), flush=True)
