"""Compile the fused radial-conv kernels for sm_90 without a GPU (Triton's ptxas): time, registers,
spills. usage: python devtools/s7/offline_rconv.py PROBLEM KIND [B] [WARPS] [PREC] [STAGES]"""
import os
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
import triton.language as tl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from offline_regs import compile_sm90, ptxas_report  # noqa: E402

from equikernels.catalog import problem as catalog_problem  # noqa: E402
from equikernels.ops.tp import plan_of, spec_of  # noqa: E402
from equikernels.codegen.radial_conv import kernels_for  # noqa: E402

name, kind = sys.argv[1], sys.argv[2]
B = int(sys.argv[3]) if len(sys.argv) > 3 else 16
warps = int(sys.argv[4]) if len(sys.argv) > 4 else 4
prec = sys.argv[5] if len(sys.argv) > 5 else "tf32x3"
stages = int(sys.argv[6]) if len(sys.argv) > 6 else 3
p = catalog_problem(name)
ks = kernels_for(plan_of(spec_of(p, "ir_mul")), 64)
fn = ks.fn(kind)
consts = dict(B=B, DT=tl.float32, PREC=prec, **ks.dims, NEED_Y=True, NEED_H=True, G=8, SPLIT=(prec == "tf32x3"))
t0 = time.perf_counter()
k = compile_sm90(fn, consts, warps, stages, ints=("E", "CHUNK", "N"), int_type="i64")
dt = time.perf_counter() - t0
regs, spill, out = ptxas_report(k)
smem = k.metadata.shared
if os.environ.get("VERBOSE"):
    print(out)
print(f"{name} {kind} B={B} warps={warps} {prec} stages={stages}: compile {dt:.1f}s regs {regs} "
      f"spill {spill} smem {smem}")
