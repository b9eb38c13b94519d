"""Kernel-only times of the fused radial conv (fwd, gx, edge, gw) on the 10,192-atom Cu graph, for
the launch config in the environment (EQUIKERNELS_RCONV_*). usage: python devtools/s7/rconv_sweep.py TAG"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import common as C  # noqa: E402
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
calls = {"fwd": lambda i: ks.forward(x, y, h, W, graph),
         "gx": lambda i: ks.backward(x, y, h, W, go, graph, True, False, False, False),
         "edge": lambda i: ks.backward(x, y, h, W, go, graph, False, True, True, False),
         "gw": lambda i: ks.backward(x, y, h, W, go, graph, False, False, False, True)}
row = [sys.argv[1]]
for k, f in calls.items():
    t0 = time.perf_counter()
    f(0)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    t = C.time_calls(f, dev, target_ms=150.0, min_reps=5, warmup=1)
    row.append(f"{k} {t['ms_median']:.2f} ms (first {first:.0f} s)")
print(" | ".join(row), flush=True)
