"""Compile generated conv kernels (files from EQUIKERNELS_CACHE_DIR) for sm_90 offline and summarise
their SASS: registers, spills, instruction mix, and per edge loop the global loads/stores and their
widths. usage: python devtools/s8/conv_sass.py KERNEL.py [...]  (env ROWS=1 WARPS=1 STAGES=1;
SASS_DIR=dir writes each full SASS listing there)"""
import collections
import os
import re
import sys
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
import triton.language as tl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from offline_regs import compile_sm90, jit_of, ptxas_report, sass_of  # noqa: E402


def compile_file(path: str, rows: int, warps: int, stages: int):
    return compile_sm90(jit_of(path), {"ROWS": rows, "DT": tl.float32, "PREC": "ieee"}, warps, stages)


def summary(sass: str):
    ins = re.findall(r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P\w+\s+)?[A-Z][A-Z0-9_.]+)", sass)
    ops = collections.Counter(i.split()[-1].split(".")[0] for _, i in ins)
    mem = collections.Counter(i.split()[-1] for _, i in ins if re.match(r"(LDG|STG|LDL|STL|LDS|STS|RED|ATOM)", i.split()[-1]))
    return len(ins), ops, mem


if __name__ == "__main__":
    rows, warps, stages = (int(os.environ.get(k, d)) for k, d in (("ROWS", 1), ("WARPS", 1), ("STAGES", 1)))
    for p in sys.argv[1:]:
        k = compile_file(p, rows, warps, stages)
        regs, spill, _ = ptxas_report(k)
        sass = sass_of(k)
        if os.environ.get("SASS_DIR"):
            Path(os.environ["SASS_DIR"], Path(p).stem[:60] + ".sass").write_text(sass)
        n, ops, mem = summary(sass)
        print(f"{Path(p).name[:64]} rows {rows} warps {warps}: regs {regs} spill {spill} instructions {n}")
        print("  " + ", ".join(f"{o} {c}" for o, c in ops.most_common(16)))
        print("  mem: " + ", ".join(f"{o} {c}" for o, c in sorted(mem.items())))
