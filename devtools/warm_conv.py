"""Compile (warm Triton's disk cache for) the convolution kernels of one problem / dataflow /
direction on a tiny graph, so that several can compile in parallel processes before a benchmark.

    python devtools/warm_conv.py mace-mp-medium-L2 deterministic dbwd float32 ir_mul
"""
import sys

import torch

from equikernels.catalog import problem as catalog_problem
from equikernels.ops import tensor_product_conv

name, flow, direction, dtype, layout = sys.argv[1:6]
p = catalog_problem(name)
dt = getattr(torch, dtype)
n, e = 16, 64
src = torch.randint(0, n, (e,), device="cuda")
dst = torch.randint(0, n, (e,), device="cuda")
x = torch.randn(n, p.dim_in1, device="cuda", dtype=dt, requires_grad=True)
y = torch.randn(e, p.dim_in2, device="cuda", dtype=dt, requires_grad=True)
w = torch.randn(e, p.weight_numel, device="cuda", dtype=dt, requires_grad=True)
out = tensor_product_conv(p, x, y, w, src, dst, layout=layout, dataflow=flow)
if direction in ("bwd", "dbwd"):
    grads = torch.autograd.grad(out, (x, y, w), torch.randn_like(out), create_graph=direction == "dbwd")
    if direction == "dbwd":
        torch.autograd.grad(sum((g * torch.randn_like(g)).sum() for g in grads), (x, y, w))
torch.cuda.synchronize()
print("warmed", name, flow, direction, dtype, layout)
