"""Session 14 diagnostic (issue 10): is the backward of a small half-precision product host-bound
when it is slow? Per trial (fresh 50k-row inputs, as devtools/s13/alloc_probe.py), 100 calls of
autograd.grad(out, (x, y, w), g) (bench_mixed's bwd) timed three ways:
  events   back-to-back CUDA events per call, as the benchmarks time it (host time shows when the
           host is slower than the kernel: the GPU waits between calls);
  queued   the same, behind a ~60 ms torch.cuda._sleep, so the host has queued every call before
           the GPU reaches the first: GPU time only;
  host     perf_counter over the 100 calls (no sync inside), us per call."""
import os
import statistics
import sys
import time

import torch

from equikernels.catalog import problem
from equikernels.ops import tensor_product


def timed(call, n, sleep_cycles=0):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    torch.cuda.synchronize()
    if sleep_cycles:
        torch.cuda._sleep(sleep_cycles)
    t0 = time.perf_counter()
    for a, b in ev:
        a.record()
        call()
        b.record()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev), host


for arg in sys.argv[1:]:
    name, dt = arg.split(":")
    p, dtype = problem(name), getattr(torch, dt)
    for trial in range(int(os.environ.get("TRIALS", "12"))):
        mk = lambda *s: torch.randn(*s, device="cuda", dtype=dtype, requires_grad=True)  # noqa: E731
        x, y, w = mk(50000, p.dim_in1), mk(50000, p.dim_in2), mk(50000, p.weight_numel)
        out = tensor_product(p, x, y, w, layout="ir_mul")
        g = torch.randn_like(out)
        call = lambda: torch.autograd.grad(out, (x, y, w), g, retain_graph=True)  # noqa: E731
        for _ in range(5):
            call()
        ev, host = timed(call, 100)
        q, qhost = timed(call, 100, sleep_cycles=120_000_000)
        ev2, host2 = timed(call, 100)
        print(f"{time.time():.1f} {name} {dt} trial {trial}: events {ev:.3f} / {ev2:.3f} ms (host {host:.0f} / "
              f"{host2:.0f} us per call), queued {q:.3f} ms (host {qhost:.0f} us)", flush=True)
        del x, y, w, out, g
