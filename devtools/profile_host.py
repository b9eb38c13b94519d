"""Profile the host-side (Python) cost of one autograd backward through equikernels on the GPU
(tiny inputs, so the GPU is idle and every microsecond is host time)."""
import cProfile
import pstats
import sys

import torch

from equikernels.catalog import problem
from equikernels.ops import tensor_product

p = problem(sys.argv[1] if len(sys.argv) > 1 else "nequip-water")
n = 64
x = torch.randn(n, p.dim_in1, device="cuda", requires_grad=True)
y = torch.randn(n, p.dim_in2, device="cuda", requires_grad=True)
w = torch.randn(n, p.weight_numel, device="cuda", requires_grad=True)
out = tensor_product(p, x, y, w, layout="ir_mul")
g = torch.randn_like(out)
for _ in range(30):
    torch.autograd.grad(out, (x, y, w), g, retain_graph=True)
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(300):
    torch.autograd.grad(out, (x, y, w), g, retain_graph=True)
prof.disable()
torch.cuda.synchronize()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
