"""Compile the fused radial-conv kernels for sm_90 without a GPU (Triton's ptxas): time, registers,
spills. usage: python devtools/s7/offline_rconv.py PROBLEM KIND [B] [WARPS] [PREC] [STAGES]"""
import os
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from offline_regs import ptxas_report  # noqa: E402

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
consts = dict(B=B, DT=tl.float32, PREC=prec, **ks.dims, NEED_Y=True, NEED_H=True)
sig, const, attrs = {}, {}, {}
for i, a in enumerate(fn.arg_names):
    if a.endswith("_ptr"):
        sig[a] = "*i64" if a[:-4] in ("perm", "ptr", "src", "dst") else "*fp32"
        attrs[(i,)] = [["tt.divisibility", 16]]
    elif a in ("E", "CHUNK", "ONE"):
        sig[a] = "i64"
    else:
        sig[a] = "constexpr"
        const[(i,)] = consts[a]
t0 = time.perf_counter()
k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": warps, "num_stages": stages})
dt = time.perf_counter() - t0
regs, spill, out = ptxas_report(k)
smem = k.metadata.shared
if os.environ.get("VERBOSE"):
    print(out)
print(f"{name} {kind} B={B} warps={warps} {prec} stages={stages}: compile {dt:.1f}s regs {regs} "
      f"spill {spill} smem {smem}")
