"""Compile one fused radial-conv kernel for sm_90 offline and summarise its SASS: instruction mix of the
whole kernel and of the hottest loop. usage: python devtools/s8/sass_rconv.py KIND [B] [WARPS] [PREC] [STAGES]
(env SASS_OUT=file writes the full SASS)."""
import collections
import os
import re
import sys
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
import triton.language as tl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from offline_regs import compile_sm90, ptxas_report, sass_of  # noqa: E402

from equikernels.catalog import problem as catalog_problem  # noqa: E402
from equikernels.ops.tp import plan_of, spec_of  # noqa: E402
from equikernels.codegen.radial_conv import kernels_for  # noqa: E402

kind = sys.argv[1]
B = int(sys.argv[2]) if len(sys.argv) > 2 else 16
warps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
prec = sys.argv[4] if len(sys.argv) > 4 else "tf32x3"
stages = int(sys.argv[5]) if len(sys.argv) > 5 else 3
p = catalog_problem(os.environ.get("PROBLEM", "mace-mp-medium-L2"))
ks = kernels_for(plan_of(spec_of(p, "ir_mul")), 64)
fn = ks.fn(kind)
consts = dict(B=B, DT=tl.float32, PREC=prec, **ks.dims, NEED_Y=os.environ.get("NY", "1") == "1",
              NEED_H=os.environ.get("NH", "1") == "1", G=8, SPLIT=(prec == "tf32x3"))
t0 = time.perf_counter()
k = compile_sm90(fn, consts, warps, stages, ints=("E", "CHUNK", "N"), int_type="i64")
dt = time.perf_counter() - t0
R, S, _ = ptxas_report(k)
sass = sass_of(k)
if os.environ.get("SASS_OUT"):
    Path(os.environ["SASS_OUT"]).write_text(sass)
ins = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass)
ops = collections.Counter(i.split(".")[0] for i in ins)
print(f"{kind} B={B} warps={warps} {prec} stages={stages}: compile {dt:.1f}s regs {R} spills {S} "
      f"smem {k.metadata.shared} instructions {len(ins)}")
print("  " + ", ".join(f"{o} {c}" for o, c in ops.most_common(22)))
if os.environ.get("TTGIR_OUT"):
    Path(os.environ["TTGIR_OUT"]).write_text(k.asm["ttgir"])
