"""Session 15 diagnostic: one bench_tp double-backward call (nequip-water by default) of one
implementation between cudaProfilerStart/Stop, for `ncu --profile-from-start off`."""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import bench_tp as B  # noqa: E402

from equikernels.catalog import standard_problems  # noqa: E402

impl, problem, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
args = B.argparse.Namespace(backend="triton", rotate_factor=4.0, max_sets=1, seed=1)
spec = B.Spec.create(problem, standard_problems()[problem])
built = B.build(impl, spec, torch.float32, torch.device("cuda"), args)
call, _, _ = B.make_call(spec, built, "dbwd", rows, torch.float32, torch.device("cuda"), args)
for i in range(5):
    call(i)
torch.cuda.synchronize()
torch.cuda.profiler.start()
call(0)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print("done", impl, problem, rows)
