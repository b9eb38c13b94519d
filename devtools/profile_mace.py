"""Where a small-system MACE step spends its time: wall time per E+F call, GPU kernel time and launch
count (torch.profiler), and the host functions that dominate (cProfile). Diagnostics, not a benchmark.

    python devtools/profile_mace.py [atoms-repeats e.g. 6,6,7] [float32] [--graph] [--stress]
    python devtools/profile_mace.py 2,2,2 float32 --cpu     # op counts per E+F step on CPU

--graph: also time the same step through equikernels.models.GraphedModel (one CUDA graph replay per
call) against eager. --cpu: top-level aten ops, autograd nodes and host time of one step on CPU,
8-channel model of the same structure (op counts do not depend on the device or the channel count;
the contraction/convolution, Triton kernels on CUDA, count as one "kernel region" each).
"""
import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import bench_mace as B  # noqa: E402



def _wall_ms(fn, reps: int, warmup: int = 5):
    """Sorted wall times (ms) of ``fn``, synchronised around each call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t.append((time.perf_counter() - t0) * 1e3)
    return sorted(t)

def graph_timing(model, data, stress):
    from equikernels.models import GraphedModel

    g = GraphedModel(model)
    for name, fn in (("eager", lambda: B.step(model, data, stress)), ("graph", lambda: g(data, compute_stress=stress))):
        t = _wall_ms(fn, 30)
        print(f"{name:5s} E+F{'+S' if stress else ''}: median {t[len(t) // 2]:.2f} ms (min {t[0]:.2f})", flush=True)
    ref = B.step(model, data, stress)
    out = g(data, compute_stress=stress)
    for k in ("energy", "forces") + (("stress",) if stress else ()):
        err = (out[k] - ref[k].detach()).abs().max().item() / max(ref[k].abs().max().item(), 1e-30)
        print(f"graph vs eager {k}: max rel diff {err:.2e}")
    print(f"captures {g.num_captures}, disabled: {g.disabled_reason}")


def cpu_counts(reps, dtype):
    from collections import Counter

    import numpy as np
    from e3nn import o3
    from mace import modules

    import common as C
    from equikernels import reference
    from equikernels.models import symmetric_contraction as sc

    torch.set_num_threads(1)
    residual = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
    with C.default_dtype(dtype):
        torch.manual_seed(0)
        mm = modules.ScaleShiftMACE(
            r_max=6.0, num_bessel=10, num_polynomial_cutoff=5, max_ell=3, interaction_cls=residual,
            interaction_cls_first=residual, num_interactions=2, num_elements=89,
            hidden_irreps=o3.Irreps("8x0e+8x1o"), MLP_irreps=o3.Irreps("16x0e"),
            atomic_energies=-np.random.default_rng(0).uniform(1, 5, 89), avg_num_neighbors=40.0,
            atomic_numbers=list(range(1, 90)), correlation=3, gate=torch.nn.functional.silu,
            radial_MLP=[64, 64, 64], atomic_inter_scale=1.2, atomic_inter_shift=0.1)
    model = B.build_impls(mm, dtype, torch.device("cpu"), {"equikernels"})["equikernels"]["model"]
    data = B.graph_data(B.make_atoms(reps, False), dtype, "cpu")
    inside = [0.0]

    def region(obj, name):  # the contraction and convolution: generated kernels on CUDA
        f = getattr(obj, name)

        def g(*a, **k):
            t0 = time.perf_counter()
            with torch.profiler.record_function("ek::kernel"):
                r = f(*a, **k)
            inside[0] += time.perf_counter() - t0
            return r
        setattr(obj, name, g)
    region(sc.TableOp, "evaluate")
    region(reference, "evaluate")
    for _ in range(3):
        B.step(model, data, False)
    t, k = [], []
    for _ in range(10):
        inside[0] = 0.0
        t0 = time.perf_counter()
        B.step(model, data, False)
        t.append((time.perf_counter() - t0) * 1e3)
        k.append(inside[0] * 1e3)
    print(f"{data['positions'].shape[0]} atoms, {data['edge_index'].shape[1]} edges: CPU step median "
          f"{sorted(t)[5]:.1f} ms, of which outside kernel regions {sorted(a - b for a, b in zip(t, k))[5]:.1f} ms")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        B.step(model, data, False)
    ops, regions = Counter(), [0]

    def walk(e, inside_):
        if e.name == "ek::kernel":
            regions[0] += not inside_
            inside_ = True
        if not inside_ and e.name.startswith("aten::"):
            ops[e.name] += 1
            inside_ = True  # top-level calls only: composite internals differ by device
        for c in e.cpu_children:
            walk(c, inside_)
    for e in prof.events():
        if e.cpu_parent is None:
            walk(e, False)
    nodes = sum(1 for e in prof.events() if e.name.startswith("autograd::engine::evaluate_function"))
    print(f"top-level aten ops outside kernel regions: {sum(ops.values())}, kernel regions {regions[0]}, "
          f"autograd nodes {nodes}")
    for name, c in ops.most_common(25):
        print(f"  {c:5d} {name}")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    reps = tuple(int(v) for v in (args[0] if args else "6,6,7").split(","))
    dtype = getattr(torch, args[1] if len(args) > 1 else "float32")
    if "--cpu" in sys.argv:
        return cpu_counts(reps, dtype)
    dev = torch.device("cuda")
    atoms = B.make_atoms(reps, False)
    mace_model = B.make_mace_model(dtype, False, 40.0)
    model = B.build_impls(mace_model, dtype, dev, {"equikernels"})["equikernels"]["model"]
    data = B.graph_data(atoms, dtype, dev)
    step = lambda: B.step(model, data, False)  # noqa: E731
    t = _wall_ms(step, 20)
    print(f"{len(atoms)} atoms {dtype}: E+F wall median {t[len(t) // 2]:.2f} ms (min {t[0]:.2f})")
    # host time alone: enqueue without waiting (GPU may lag behind)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        step()
    host = (time.perf_counter() - t0) / 10 * 1e3
    torch.cuda.synchronize()
    print(f"host enqueue per call ~{host:.2f} ms (upper bound: includes any host syncs)")
    if "--graph" in sys.argv:
        graph_timing(model, data, "--stress" in sys.argv)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    ka = prof.key_averages()
    gpu = sum(ev.device_time_total for ev in ka) / 3 / 1e3
    launches = sum(ev.count for ev in ka if ev.device_time_total > 0 and ev.device_type == torch.autograd.DeviceType.CUDA) / 3
    print(f"GPU kernel time per call {gpu:.2f} ms, ~{launches:.0f} kernels per call")
    print(ka.table(sort_by="device_time_total", row_limit=25, max_name_column_width=70))
    print(ka.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(35)
    print(s.getvalue()[-9000:])
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
    print(s.getvalue()[-9000:])


if __name__ == "__main__":
    main()
