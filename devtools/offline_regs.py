"""Registers and spills of generated kernels without a GPU: compile the Triton source for sm_90
(Triton's own ptxas) and read ptxas -v. Useful to compare generator variants before spending
device time; the numbers match what the driver reports for the same num_warps.

    python devtools/offline_regs.py KERNEL.py [KERNEL.py ...]   (files from EQUIKERNELS_CACHE_DIR)
    env: ROWS (default 4), WARPS (default 4), DT (fp32 | fp64 | bf16 | fp16: storage of every operand)
"""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

INDEX = ("perm", "nptr", "ptr", "src", "dst")


def compile_sm90(fn, consts: dict, warps: int, stages: int = 1, fp: str = "fp32", ints=("N", "NBLK"),
                 int_type: str = "i32"):
    """Compile a JITFunction for sm_90 as a launch would specialise it: ``*_ptr`` arguments 16-byte
    aligned (index arrays int64, the rest ``fp``), ``ints`` runtime integers, the rest constexprs
    from ``consts``."""
    sig, const, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name.endswith("_ptr"):
            sig[name] = "*i64" if name[:-4] in INDEX else f"*{fp}"
            attrs[(i,)] = [["tt.divisibility", 16]]  # torch allocations are 16-byte aligned, as at launch
        elif name in ints:
            sig[name] = int_type
        else:
            sig[name] = "constexpr"
            const[(i,)] = consts[name]
    return triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages})


def jit_of(path: str):
    """The JITFunction defined in a generated kernel file."""
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return next(v for v in vars(mod).values() if isinstance(v, triton.runtime.jit.JITFunction))


def stats(path: str, rows: int, warps: int, dt: str):
    # DT is the math dtype (float32 for half storage); ``dt`` the storage type of every pointer
    consts = {"ROWS": rows, "DT": tl.float64 if dt == "fp64" else tl.float32, "PREC": "ieee"}
    regs, spill, _ = ptxas_report(compile_sm90(jit_of(path), consts, warps, fp=dt))
    return regs, spill


def sass_of(kernel) -> str:
    """SASS listing of a compiled kernel (Triton's bundled cuobjdump)."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout


def ptxas_report(kernel):
    """(registers, spill-store bytes, ptxas -v text) of a kernel compiled for sm_90."""
    from triton.backends.nvidia.compiler import get_ptxas  # noqa: PLC0415
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(kernel.asm["ptx"])
    out = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                         capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores", out)
    return int(regs.group(1)) if regs else None, int(spill.group(1)) if spill else 0, out


if __name__ == "__main__":
    rows, warps, dt = int(os.environ.get("ROWS", 4)), int(os.environ.get("WARPS", 4)), os.environ.get("DT", "fp32")
    for p in sys.argv[1:]:
        r, s = stats(p, rows, warps, dt)
        print(f"{os.path.basename(p)[:70]:72s} regs {r} spill-bytes {s}")
