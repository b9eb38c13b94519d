"""Where a small-system MACE step spends its time: wall time per E+F call, GPU kernel time and launch
count (torch.profiler), and the host functions that dominate (cProfile). Diagnostics, not a benchmark.

    python devtools/profile_mace.py [atoms-repeats e.g. 6,6,7] [float32]
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


def main():
    reps = tuple(int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "6,6,7").split(","))
    dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "float32")
    dev = torch.device("cuda")
    atoms = B.make_atoms(reps, False)
    mace_model = B.make_mace_model(dtype, False, 40.0)
    model = B.build_impls(mace_model, dtype, dev, {"equikernels"})["equikernels"]["model"]
    data = B.graph_data(atoms, dtype, dev)
    step = lambda: B.step(model, data, False)  # noqa: E731
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        t.append((time.perf_counter() - t0) * 1e3)
    t.sort()
    print(f"{len(atoms)} atoms {dtype}: E+F wall median {t[len(t) // 2]:.2f} ms (min {t[0]:.2f})")
    # host time alone: enqueue without waiting (GPU may lag behind)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        step()
    host = (time.perf_counter() - t0) / 10 * 1e3
    torch.cuda.synchronize()
    print(f"host enqueue per call ~{host:.2f} ms (upper bound: includes any host syncs)")
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
