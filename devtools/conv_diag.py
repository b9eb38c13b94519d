"""Convolution kernel diagnostics: registers/spills of every generated conv kernel, kernel-only
times per direction (triton do_bench, median) and a per-kernel breakdown from the profiler.
Not a benchmark (benchmarks/bench_conv.py compares with the baselines).

    python devtools/conv_diag.py [problem] [atoms] [flow]   (env variants apply, e.g. EQUIKERNELS_CONV_ROWS)
"""
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from gpu_diag import kernel_stats  # noqa: E402

from equikernels.bench.conv import cu_graph  # noqa: E402
from equikernels.catalog import problem as catalog_problem  # noqa: E402
from equikernels.codegen.conv import ConvKernels  # noqa: E402
from equikernels.ops import ConvGraph, plan_of, spec_of  # noqa: E402


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "mace-mp-medium-L2"
    atoms = int(sys.argv[2]) if len(sys.argv) > 2 else 10192
    flow = sys.argv[3] if len(sys.argv) > 3 else "deterministic"
    dev = "cuda"
    p = catalog_problem(name)
    src, dst, n = cu_graph(atoms, dev, r_cut=6.0)
    graph = ConvGraph.build(src, dst, n)
    e = graph.num_edges
    ks = ConvKernels(plan_of(spec_of(p, "ir_mul")), flow)
    mk = lambda *s: torch.randn(*s, device=dev)  # noqa: E731
    x, y, w, g = mk(n, p.dim_in1), mk(e, p.dim_in2), mk(e, p.weight_numel), mk(n, p.dim_out)
    a, b, c = mk(n, p.dim_in1), mk(e, p.dim_in2), mk(e, p.weight_numel)
    runs = {"fwd": lambda: ks.forward(x, y, w, graph),
            "bwd": lambda: ks.backward(x, y, w, g, graph, "xyw"),
            "dbwd": lambda: ks.double_backward(x, y, w, g, a, b, c, graph, "xywg")}
    res = {"problem": name, "atoms": n, "edges": e, "flow": flow,
           "env": {k: v for k, v in os.environ.items() if k.startswith("EQUIKERNELS_")}}
    for d, fn in runs.items():
        t0 = time.time()
        fn()
        torch.cuda.synchronize()
        res[d + "_first_s"] = round(time.time() - t0, 1)
        res[d + "_ms"] = round(triton.testing.do_bench(fn, return_mode="median"), 3)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        res[d + "_kernels"] = [(ev.key[:60], round(ev.device_time_total / 1e3, 3))
                               for ev in prof.key_averages() if ev.device_time_total > 0]
    res["kernels"] = {tag: dict(zip(("regs", "spills"), kernel_stats(k))) for tag, k in
                      ((str(key), k) for key, k in ks._cache.items())}
    print(json.dumps(res))
    print(f"{name} {n} atoms {flow} env={res['env']}: fwd {res['fwd_ms']} bwd {res['bwd_ms']} dbwd {res['dbwd_ms']} ms",
          file=sys.stderr)


if __name__ == "__main__":
    main()
