"""Session 13 diagnostic (issue 10): does the half-precision backward's time depend on where its
tensors are allocated? Per trial a pad of random size shifts the caching allocator's addresses,
then fresh 50k-row inputs; the backward (autograd.grad on a retained graph, as bench_mixed times
it) is timed 100 times with CUDA events. Prints the median / min per trial and the operands'
offsets modulo 2 MiB."""
import os
import random
import statistics
import time
import sys

import torch

from equikernels.catalog import problem
from equikernels.ops import tensor_product

rng = random.Random(0)
for name, dtype in [(a.split(":")[0], getattr(torch, a.split(":")[1])) for a in sys.argv[1:]]:
    p = problem(name)
    res = []
    for trial in range(int(os.environ.get("TRIALS", "12"))):
        pad = torch.empty(rng.randrange(0, 64 << 20, 256), dtype=torch.uint8, device="cuda")
        mk = lambda *s: torch.randn(*s, device="cuda", dtype=dtype, requires_grad=True)  # noqa: E731
        x, y, w = mk(50000, p.dim_in1), mk(50000, p.dim_in2), mk(50000, p.weight_numel)
        out = tensor_product(p, x, y, w, layout="ir_mul")
        g = torch.randn_like(out)
        call = lambda: torch.autograd.grad(out, (x, y, w), g, retain_graph=True)  # noqa: E731
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(100)]
        for a, b in ev:
            a.record()
            call()
            b.record()
        torch.cuda.synchronize()
        t = sorted(a.elapsed_time(b) for a, b in ev)
        offs = " ".join(f"{k}={(v.data_ptr() % (2 << 20)) >> 10}K" for k, v in (("x", x), ("y", y), ("w", w), ("g", g)))
        print(f"{time.time():.1f} {name} {str(dtype)[6:]} trial {trial}: median {statistics.median(t):.3f} min {t[0]:.3f}  {offs}", flush=True)
        res.append(statistics.median(t))
        del pad, x, y, w, out, g
    print(f"{name} {str(dtype)[6:]}: medians {min(res):.3f}-{max(res):.3f}", flush=True)
