"""Half-precision rows asked into L2 ahead of their loads (emit.l2_prefetched): where the prefetches
go in the source, and that only half-precision builds get them (compiled for sm_90 without a GPU).
The numbers are checked on the GPU by test_mixed_precision (bf16 / fp16 against float64)."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

from problems import wide_channelwise_problem

from equikernels.codegen import emit
from equikernels.codegen.emit import Group, generate, l2_prefetched
from equikernels.codegen.plan_types import KernelChoice
from equikernels.ops import plan_of, spec_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _backward_source(ahead):
    plan = plan_of(spec_of(wide_channelwise_problem(), "ir_mul"))
    groups = [Group(plan.grad_tables[n], "g" + n) for n in "xyw"]
    choice = KernelChoice(row_operands=frozenset("xywg"), in1_major=True, partial=True, prefetch=4, l2=ahead)
    return generate("k", groups, "ir_mul", choice)[0]


_LOAD = re.compile(r"tl\.load\((\w+)_ptr \+ \1_r1 \+ (\d+)(?: \+ (\d+) \* i(\d+)_\d+)?")
_PF = re.compile(r"\[(\w+)_ptr \+ \1__pfr \+ tl\.minimum\((\d+) \+ pfi")


@pytest.mark.parametrize("ahead,chunk", [(0, 1024), (3, 1024), (3, 128)])
def test_every_chunk_prefetched_once_before_its_first_load(ahead, chunk, monkeypatch):
    monkeypatch.setattr(emit, "L2_CHUNK", chunk)  # 128: many chunks, most first read well after the top
    L2_CHUNK = chunk
    src = _backward_source(ahead)
    assert src == "\n".join(l2_prefetched(_backward_source(None).split("\n"), ahead))
    lines = src.splitlines()
    loads, first, seen = [], {}, {}
    for n, ln in enumerate(lines):
        m = _LOAD.search(ln)
        if m:
            off = int(m.group(2))
            last = off + (int(m.group(3)) * (int(m.group(4)) - 1) if m.group(3) else 0)
            for c in range(off // L2_CHUNK, last // L2_CHUNK + 1):
                first.setdefault((m.group(1), c), len(loads))
            loads.append(n)
        m = _PF.search(ln)
        if m:
            key = (m.group(1), int(m.group(2)) // L2_CHUNK)
            assert key not in seen, f"chunk {key} prefetched twice"
            assert lines[n - 1].strip() == f"if {key[0]}_ptr.dtype.element_ty.primitive_bitwidth <= 16:"
            seen[key] = sum(1 for i in loads if i < n)  # loads issued before this prefetch
    assert set(seen) == set(first) and {k[0] for k in seen} == {"x", "y", "w", "g"}
    assert chunk == 1024 or sum(k > ahead + 1 for k in first.values()) > 5  # placement is tested
    for key, k in first.items():
        want = 0 if ahead == 0 else max(0, k - ahead)
        assert seen[key] == want, f"chunk {key}: prefetched after {seen[key]} loads, wanted {want}"


def test_only_half_precision_builds_prefetch(tmp_path):
    """Compile the kernel for sm_90 (Triton's ptxas, no GPU needed) with bf16 and fp32 operands."""
    path = tmp_path / "k.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + _backward_source(2))
    script = textwrap.dedent(f"""
        import importlib.util, triton, triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        spec = importlib.util.spec_from_file_location("k", {str(path)!r})
        mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
        fn = mod.k
        for fp in ("bf16", "fp16", "fp32"):
            sig, const, attrs = {{}}, {{}}, {{}}
            for i, name in enumerate(fn.arg_names):
                if name.endswith("_ptr"):
                    sig[name] = "*" + fp; attrs[(i,)] = [["tt.divisibility", 16]]
                elif name in ("N", "NBLK"):
                    sig[name] = "i32"
                else:
                    sig[name] = "constexpr"; const[(i,)] = {{"ROWS": 1, "DT": tl.float32, "PREC": "ieee"}}[name]
            k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                               options={{"num_warps": 1, "num_stages": 1}})
            print(fp, k.asm["ptx"].count("prefetch.global.L2"))
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
    if res.returncode and "ptxas" in res.stderr.lower() and "not found" in res.stderr.lower():
        pytest.skip("Triton's ptxas is not available")
    assert res.returncode == 0, res.stderr[-2000:]
    counts = dict(line.split() for line in res.stdout.split("\n") if line.strip())
    n = _backward_source(2).count("prefetch.global.L2")
    assert int(counts["bf16"]) >= n > 0 and int(counts["fp16"]) >= n
    assert int(counts["fp32"]) == 0
