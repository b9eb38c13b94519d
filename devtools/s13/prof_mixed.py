"""Session 13 diagnostic (issue 10): bench_mixed under torch.profiler, so every kernel's GPU duration
is kept next to the bench's event times. mace-medium's bf16 backward measured 0.164-0.185 ms in
processes running only our kernels and 0.227-0.256 ms in processes that also ran cuEquivariance:
is the kernel slower, or is the GPU waiting on the host? Usage: python devtools/s13/prof_mixed.py
OUT.json [bench_mixed arguments]. Writes every equikernels kernel (name, start us, duration us)."""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_mixed  # noqa: E402

out = sys.argv[1]
sys.argv = ["bench_mixed.py"] + sys.argv[2:]
acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
with torch.profiler.profile(activities=acts) as prof:
    bench_mixed.main()
rows = []
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA and e.name.startswith("tp_"):
        rows.append((e.name, e.time_range.start, e.time_range.end - e.time_range.start))
rows.sort(key=lambda r: r[1])
Path(out).write_text(json.dumps(rows))
print("kernels kept:", len(rows))
