"""Run one fused radial-conv kernel (fwd | gx | edge | gw) twice on the 10,192-atom Cu graph, for a profiler
(ncu captures the second launch). usage: python devtools/s8/rconv_once.py KIND"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_conv import cu_graph  # noqa: E402

from equikernels.catalog import problem as catalog_problem  # noqa: E402
from equikernels.codegen.radial_conv import kernels_for  # noqa: E402
from equikernels.ops import ConvGraph  # noqa: E402
from equikernels.ops.tp import plan_of, spec_of  # noqa: E402

dev = torch.device("cuda")
p = catalog_problem("mace-mp-medium-L2")
src, dst, n = cu_graph(10192, 6.0, dev)
graph = ConvGraph.build(src, dst, n, validate=False)
e = len(src)
x, y = torch.randn(n, p.dim_in1, device=dev), torch.randn(e, p.dim_in2, device=dev)
h, W = torch.randn(e, 64, device=dev), torch.randn(64, p.weight_numel, device=dev)
go = torch.randn(n, p.dim_out, device=dev)
ks = kernels_for(plan_of(spec_of(p, "ir_mul")), 64)
kind = sys.argv[1]
f = {"fwd": lambda: ks.forward(x, y, h, W, graph),
     "gx": lambda: ks.backward(x, y, h, W, go, graph, True, False, False, False),
     "edge": lambda: ks.backward(x, y, h, W, go, graph, False, True, True, False),
     "gw": lambda: ks.backward(x, y, h, W, go, graph, False, False, False, True)}[kind]
for _ in range(2):
    f()
torch.cuda.synchronize()
print("done", kind, e, "edges")
