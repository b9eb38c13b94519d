"""The deterministic conv (MACE-MP medium L2) on the 10,192-atom Cu graph, for a profiler or a variant scan.

    python devtools/s8/conv_once.py [bwd|fwd|dbwd]        run the direction twice (ncu captures the 2nd)
    python devtools/s8/conv_once.py DIR --scan 'A;B;...'  time variants of direction DIR in one process:
        each variant is a space-separated list of EQUIKERNELS_CONV_* settings ('-' = defaults), e.g.
        'PREFETCH=all MAXNREG=168'; prints median ms, per-kernel ms, regs/spills and the largest
        relative difference of the outputs from the first variant's
"""
import os
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_conv import cu_graph  # noqa: E402

from equikernels.catalog import problem as catalog_problem  # noqa: E402
from equikernels.codegen.conv import ConvKernels  # noqa: E402
from equikernels.ops import ConvGraph, plan_of, spec_of  # noqa: E402

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
p = catalog_problem("mace-mp-medium-L2")
if os.environ.get("CONV_ONCE_TINY"):  # smoke test of this script under the Triton interpreter
    n = 6
    src, dst = torch.randint(0, n, (14,)), torch.randint(0, n, (14,))
else:
    src, dst, n = cu_graph(int(os.environ.get("CONV_ONCE_ATOMS", 10192)), 6.0, dev)
graph = ConvGraph.build(src, dst, n, validate=False)
e = graph.num_edges
torch.manual_seed(0)
mk = lambda *s: torch.randn(*s, device=dev)  # noqa: E731
x, y, w, g = mk(n, p.dim_in1), mk(e, p.dim_in2), mk(e, p.weight_numel), mk(n, p.dim_out)
a, b, c = mk(n, p.dim_in1), mk(e, p.dim_in2), mk(e, p.weight_numel)
plan = plan_of(spec_of(p, "ir_mul"))
ks = ConvKernels(plan, os.environ.get("EQUIKERNELS_CONV_FLOW", "deterministic"))  # FLOW=atomic in a variant
direction = sys.argv[1] if len(sys.argv) > 1 else "bwd"
run = {"fwd": lambda: {"out": ks.forward(x, y, w, graph)},
       "bwd": lambda: ks.backward(x, y, w, g, graph, "xyw"),
       "dbwd": lambda: ks.double_backward(x, y, w, g, a, b, c, graph, "xywg")}[direction]


def stats():
    from gpu_diag import kernel_stats  # noqa: PLC0415
    return {str(key[0]) + ("" if not key[6:] else f" pf={key[6]!r} cap={key[7]}"): kernel_stats(k)
            for key, k in ks._cache.items()}


if "--scan" not in sys.argv:
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    print("done", direction, e, "edges")
    sys.exit()

ref = None
for variant in sys.argv[sys.argv.index("--scan") + 1].split(";"):
    for k in [k for k in os.environ if k.startswith("EQUIKERNELS_CONV_")]:
        del os.environ[k]
    for kv in variant.split():
        if kv != "-":
            k, v = kv.split("=")
            os.environ["EQUIKERNELS_CONV_" + k] = v
    ks = ConvKernels(plan, os.environ.get("EQUIKERNELS_CONV_FLOW", "deterministic"))
    try:
        out = run()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    except Exception as err:  # report and go on with the next variant
        print(f"{variant:40s} FAILED {type(err).__name__}: {str(err)[:300]}")
        continue
    if ref is None:
        ref = {k: v.clone() for k, v in out.items()}
    diff = max(((out[k] - ref[k]).norm() / ref[k].norm()).item() for k in ref)
    if dev.type == "cpu":
        print(f"{variant:40s} {direction} rel.diff {diff:.1e}")
        continue
    ms = triton.testing.do_bench(run, warmup=50, rep=400, return_mode="median")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kern = ", ".join(f"{ev.key[:22]} {ev.device_time_total / 1e3:.3f}" for ev in prof.key_averages()
                     if ev.device_time_total > 0)
    print(f"{variant:40s} {direction} {ms:.3f} ms  rel.diff {diff:.1e}  [{kern}]  {stats()}")
