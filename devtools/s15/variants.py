"""Session 15 diagnostic: one variant (direction DIR, default dbwd) (set by EQUIKERNELS_* variables in the
environment) of a standard problem, checked against e3nn float64 (bench_tp.check), then timed as
bench_tp times it: per-call events (host-inclusive) and queued GPU time, at the given rows."""
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import bench_tp as B  # noqa: E402
import common as C  # noqa: E402

from equikernels.catalog import standard_problems  # noqa: E402

problem, rows, warm = sys.argv[1], [int(r) for r in sys.argv[2].split(",")], len(sys.argv) > 3
direction = os.environ.get("DIR", "dbwd")  # the direction timed (fwd, bwd, dbwd)
dev = torch.device("cuda")
args = B.argparse.Namespace(backend="triton", rotate_factor=4.0, max_sets=8, seed=1)
spec = B.Spec.create(problem, standard_problems()[problem])
built = B.build("equikernels_ir_mul", spec, torch.float32, dev, args)
inp, ref = B.reference(spec, 500, dev, 3, 2)
err = B.direction_error(B.check(spec, built, torch.float32, inp, ref, 2), direction)
tag = " ".join(f"{k[12:]}={v}" for k, v in sorted(os.environ.items()) if k.startswith("EQUIKERNELS_")
               and k != "EQUIKERNELS_CACHE_DIR") or "default"
for r in rows:
    call, n_sets, nbytes = B.make_call(spec, built, direction, r, torch.float32, dev, args)
    if warm:
        call(0)
        torch.cuda.synchronize()
        continue
    res = C.time_calls(call, dev, n_sets=n_sets, target_ms=200, min_reps=20)
    res.update(C.queued_gpu_times(call, dev, res["est_ms"]))
    print(f"{problem} {direction} {r:6d} [{tag}] events {res['ms_median']:.4f} ms  gpu {res['gpu_ms_median']:.4f} ms "
          f"(queued {res['gpu_queued']})  err {err:.1e}", flush=True)
