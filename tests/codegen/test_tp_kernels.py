"""Generated Triton kernels (interpreter on CPU, real GPU with -m gpu) against the reference.

The reference itself is checked against e3nn in ops/test_tp.py; here every mode, layout, weight
sharing and dtype of the generated code is compared with it, outputs NaN-poisoned first.
"""
import os
import random

import pytest
import torch

from equikernels._compat import o3
from equikernels.catalog import problem as catalog_problem
from equikernels.catalog import standard_problems
from equikernels.ops import tensor_product
from equikernels.problem import TPProblem
from tp_checks import _double_backward, _inputs, _rel, check_against_reference

MODES = ["uvw", "uvu", "uvv", "uuw", "uuu", "uvuv", "uvu<v", "u<vw"]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def _poison(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")


def random_problem(seed: int, mode: str) -> TPProblem:
    rng = random.Random(seed)
    tri = mode in ("uvu<v", "u<vw")
    m1 = rng.randint(2 if tri else 1, 5)
    m2 = m1 if mode in ("uuw", "uuu") or tri else rng.randint(1, 4)
    hw = mode in ("uvw", "u<vw") or rng.random() < 0.75
    mo = {"uvu": m1, "uvv": m2, "uuu": m1, "uvuv": m1 * m2, "uvu<v": m1 * (m1 - 1) // 2}.get(
        mode, 1 if (mode == "uuw" and not hw) else rng.randint(1, 4))
    lmax = 3
    i1 = "+".join(f"{m1}x{l}{rng.choice('eo')}" for l in sorted(rng.sample(range(lmax + 1), 2)))
    i2 = "+".join(f"{m2}x{l}{rng.choice('eo')}" for l in sorted(rng.sample(range(lmax + 1), 2)))
    io = "+".join(f"{mo}x{l}{p}" for l in range(2 * lmax + 1) for p in "eo" if rng.random() < 0.6) or f"{mo}x0e"
    I1, I2, IO = o3.Irreps(i1), o3.Irreps(i2), o3.Irreps(io)
    ins = [(a, b, c, mode, hw, rng.uniform(0.5, 2.0))
           for a, (_, r1) in enumerate(I1) for b, (_, r2) in enumerate(I2) for c, (_, r) in enumerate(IO)
           if r in r1 * r2]
    if not ins:  # make sure there is at least one path
        return random_problem(seed + 1000, mode)
    return TPProblem.create(i1, i2, io, ins, shared_weights=rng.random() < 0.5, internal_weights=False,
                            irrep_normalization=rng.choice(["component", "norm", "none"]),
                            path_normalization=rng.choice(["element", "path", "none"]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_problems_cpu(mode, seed):
    p = random_problem(seed * 17 + MODES.index(mode), mode)
    layout = ["mul_ir", "ir_mul"][seed % 2]
    dtype = [torch.float64, torch.float32][(seed + MODES.index(mode)) % 2]
    check_against_reference(p, rows=5, dtype=dtype, layout=layout)


@pytest.mark.parametrize("name", list(standard_problems()))
def test_standard_problems_cpu(name):
    p = catalog_problem(name)
    for layout, dtype in (("mul_ir", torch.float64), ("ir_mul", torch.float32)):
        check_against_reference(p, rows=3, dtype=dtype, layout=layout)


def test_rows_not_multiple_of_block_and_empty():
    p = catalog_problem("nequip-water")
    check_against_reference(p, rows=7, dtype=torch.float64, layout="mul_ir")
    x, y, w = _inputs(p, 0, torch.float64, "cpu")
    assert tensor_product(p, x, y, w, backend="triton").shape == (0, p.dim_out)


def test_high_l():
    """l up to 6 (issue: 'l up to at least 6')."""
    i1, i2, io = o3.Irreps("2x5e+2x6o"), o3.Irreps("1x1o+1x6e"), o3.Irreps("2x4o+2x6e+2x5e+2x0e+2x6o")
    ins = [(a, b, c, "uvu", True) for a, (_, r1) in enumerate(i1) for b, (_, r2) in enumerate(i2)
           for c, (_, r) in enumerate(io) if r in r1 * r2]
    assert len(ins) >= 5
    p = TPProblem.create(i1, i2, io, ins, shared_weights=False, internal_weights=False)
    check_against_reference(p, rows=3, dtype=torch.float64, layout="mul_ir")


def test_gradgradcheck_triton_interpreter():
    p = TPProblem.create("2x0e+2x1o", "1x0e+1x1o", "2x0e+2x1o+2x1e",
                         [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True), (1, 0, 1, "uvu", True),
                          (1, 1, 2, "uvu", True), (0, 1, 1, "uvu", True)], shared_weights=False, internal_weights=False)
    x, y, w = (t.requires_grad_() for t in _inputs(p, 2, torch.float64, "cpu"))
    f = lambda a, b, c: tensor_product(p, a, b, c, backend="triton")  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, y, w))
    assert torch.autograd.gradgradcheck(f, (x, y, w))


def test_generated_source_is_cached_and_corruption_regenerated(tmp_path, monkeypatch):
    from equikernels.codegen.cache import load_module, write_source
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    body = "import triton\nimport triton.language as tl\n\n@triton.jit\ndef k(x_ptr):\n    pass\n"
    path = write_source("probe", body)
    assert path.read_text().endswith(body)
    path.write_text(path.read_text()[:-10])  # truncated write
    path2 = write_source("probe", body)
    assert path2 == path and path.read_text().endswith(body)
    path.write_text("garbage")
    mod = load_module("probe", body)
    assert hasattr(mod, "k") and path.read_text().endswith(body)


def test_concurrent_cache_writers(tmp_path):
    import subprocess
    import sys
    code = ("import sys; sys.path.insert(0, %r); from equikernels.codegen.cache import write_source\n"
            "for i in range(50): write_source('race', 'x = %%d\\n' %% (i %% 3))\n") % os.getcwd()
    env = dict(os.environ, EQUIKERNELS_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(4)]
    assert all(p.wait() == 0 for p in procs)
    files = sorted((tmp_path / "kernels").glob("race_*.py"))
    assert len(files) == 3 and not list((tmp_path / "kernels").glob(".tmp_*"))
    from equikernels.codegen.cache import _body_hash, _content, _valid
    for i in range(3):  # every body's file holds exactly what a single writer would have written
        body = "x = %d\n" % i
        digest = _body_hash(body)
        assert _valid(tmp_path / "kernels" / f"race_{digest[:20]}.py", _content(body, digest))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(standard_problems()))
def test_standard_problems_gpu(name):
    p = catalog_problem(name)
    for layout, dtype in (("mul_ir", torch.float64), ("ir_mul", torch.float32)):
        check_against_reference(p, rows=1000, dtype=dtype, layout=layout, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MODES)
def test_random_problems_gpu(mode):
    p = random_problem(100, mode)
    check_against_reference(p, rows=333, dtype=torch.float64, layout="mul_ir", device="cuda")
    check_against_reference(p, rows=333, dtype=torch.float32, layout="ir_mul", device="cuda")


@pytest.mark.gpu
def test_gradgradcheck_gpu():
    p = catalog_problem("nequip-water")
    x, y, w = (t.requires_grad_() for t in _inputs(p, 4, torch.float64, "cuda"))
    f = lambda a, b, c: tensor_product(p, a, b, c, backend="triton")  # noqa: E731
    assert torch.autograd.gradgradcheck(f, (x, y, w))


@pytest.mark.parametrize("mode", ["uvw", "uvu", "uvv", "uuw", "uuu", "uvuv"])
def test_double_backward_matches_e3nn(mode):
    """The fused double-backward kernel (trilinear identity) against e3nn's autograd, fp64."""
    p = random_problem(7 + MODES.index(mode), mode)
    torch.set_default_dtype(torch.float64)
    e3 = o3.TensorProduct(*(o3.Irreps([(m, (l, par)) for m, l, par in irr])
                            for irr in (p.irreps_in1, p.irreps_in2, p.irreps_out)),
                          [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight, i.path_weight) for i in p.instructions],
                          irrep_normalization=p.irrep_normalization, path_normalization=p.path_normalization,
                          shared_weights=p.shared_weights, internal_weights=False)
    x, y, w = (t.requires_grad_() for t in _inputs(p, 3, torch.float64, "cpu"))
    ours = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, backend="triton"), x, y, w)
    ref = _double_backward(e3, x, y, w)
    for name, a, b in zip("xyw", ours, ref):
        assert _rel(a, b) <= 1e-10, f"d/d{name}: {_rel(a, b):.2e}"


@pytest.mark.parametrize("one,layout,own_outputs", [("0", "mul_ir", False), ("1", "mul_ir", False),
                                                    ("1", "mul_ir", True), ("split", "mul_ir", True),
                                                    ("split", "ir_mul", True)])
def test_channelwise_double_backward_one_or_two_kernels(one, layout, own_outputs, monkeypatch, tmp_path):
    """Channel-wise per-row double backward as one kernel (dx, dy, dw, dg), as one kernel split by
    first-input segment (parts of at most 6 paths: each writes its dx, dw, dg whole and adds into dy;
    the default for narrow products with more than 12 paths, like nequip-lips) or as two (dg; dx, dy,
    dw), against e3nn in fp64 (outputs NaN-poisoned), all cotangents and a subset. ``own_outputs``:
    every path writes an output segment of its own (NequIP's unmerged outputs: paths visited by
    first-input segment), else paths of the same irrep share outputs."""
    from equikernels.ops.tp import plan_of
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    if one != "split":
        monkeypatch.setenv("EQUIKERNELS_DBWD_ONE", one)
        monkeypatch.setenv("EQUIKERNELS_DBWD_PATHS", "0")
    i1, i2 = o3.Irreps("3x0e+3x1o"), o3.Irreps("0e+1o+2e+3o")
    io = o3.Irreps("+".join(f"3x{ir}" for _, r1 in i1 for _, r2 in i2 for ir in r1 * r2))
    if own_outputs:  # 14 paths: 4 from the scalar segment, 10 from the vector one (one part each)
        pairs = [(a, b) for a, (_, r1) in enumerate(i1) for b, (_, r2) in enumerate(i2) for _ in r1 * r2]
        ins = [(a, b, c, "uvu", True) for c, (a, b) in enumerate(pairs)]  # io lists them in this order
    else:
        ins = [(a, b, c, "uvu", True) for a, (_, r1) in enumerate(i1) for b, (_, r2) in enumerate(i2)
               for c, (_, r) in enumerate(io) if r in r1 * r2]
    p = TPProblem.create(i1, i2, io, ins, shared_weights=False, internal_weights=False)
    from equikernels.ops import tp as ops_tp
    # kernels and direct-launch recipes are kept per plan: built again under this test's settings
    plan_of.cache_clear()
    ops_tp._DBWD_DIRECT.clear()
    try:
        _one_or_two_kernels(p, one, layout, i1, i2, io, ins, own_outputs)
    finally:
        plan_of.cache_clear()
        ops_tp._DBWD_DIRECT.clear()


def _one_or_two_kernels(p, one, layout, i1, i2, io, ins, own_outputs):
    from equikernels.codegen.tp import _KernelSet
    from equikernels.ops.tp import plan_of, spec_of
    kernels = plan_of(spec_of(p, layout)).kernels
    assert kernels.planner.in1_major() == own_outputs and len(p.instructions) == (14 if own_outputs else 30)
    assert kernels.dbwd_parts(15) == ((8, 7) if one == "0" else (15,))
    k = kernels.kernel("dbwd", 15, "abc")
    assert isinstance(k, _KernelSet) == (one == "split")
    if one == "split":
        assert len(k.parts) == 2 and "dy" in k.meta.zero_init
    torch.set_default_dtype(torch.float64)
    e3 = o3.TensorProduct(i1, i2, io, ins, shared_weights=False, internal_weights=False)
    x, y, w = (t.requires_grad_() for t in _inputs(p, 6, torch.float64, "cpu"))
    ours = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, backend="triton"), x, y, w)
    ref = _double_backward(e3, x, y, w)
    for name, a, b in zip("xyw", ours, ref):
        assert not a.isnan().any() and _rel(a, b) <= 1e-10, f"d/d{name}: {_rel(a, b):.2e}"
    # only x's cotangent (have = "a"): dy, dw from one substituted backward, dg from one product
    g, r = torch.randn(6, p.dim_out).requires_grad_(), torch.randn(6, p.dim_in1)

    def have_a(fn):  # gx is linear in g, y, w and independent of x: d/dx is zero
        gx, = torch.autograd.grad(fn(x, y, w), x, g, create_graph=True)
        res = torch.autograd.grad((gx * r).sum(), (x, y, w, g), allow_unused=True)
        return [torch.zeros_like(t) if d is None else d for d, t in zip(res, (x, y, w, g))]
    ours = have_a(lambda a, b, c: tensor_product(p, a, b, c, backend="triton"))
    ref = have_a(e3)
    assert ours[0].abs().max() == 0
    for name, a, b in list(zip("xywg", ours, ref))[1:]:
        assert not a.isnan().any() and _rel(a, b) <= 1e-10, f"d/d{name} (have a): {_rel(a, b):.2e}"


@pytest.mark.parametrize("name", ["nequip-water", "tetris-poly-1"])
def test_problem_split_over_several_kernels(name, monkeypatch, tmp_path):
    """Large problems are split into kernels of at most EQUIKERNELS_MAX_PATHS paths (compile time);
    the parts add into one output, so every direction must still match the reference."""
    from equikernels.ops import plan_of, spec_of
    monkeypatch.setenv("EQUIKERNELS_MAX_PATHS", "3")
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    p = catalog_problem(name)
    plan_of.cache_clear()
    try:
        check_against_reference(p, rows=5, dtype=torch.float64, layout="mul_ir")
        assert len(plan_of(spec_of(p, "mul_ir")).kernels.kernel("fwd").parts) > 2
        x, y, w = (t.requires_grad_() for t in _inputs(p, 3, torch.float64, "cpu"))
        ours = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, backend="triton"), x, y, w)
        ref = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, backend="reference"), x, y, w)
        for a, b in zip(ours, ref):
            assert _rel(a, b) <= 1e-10
    finally:
        plan_of.cache_clear()


@pytest.mark.parametrize("mode", ["uvw", "uuw"])
def test_shared_weight_channel_mixing_uses_tl_dot(mode, monkeypatch, tmp_path):
    """Shared-weight uvw/uuw channel mixing goes through tl.dot (forward, every gradient, double
    backward); rows not a multiple of the 16-row dot tile and fewer rows than one tile."""
    from equikernels.ops import plan_of, spec_of
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    m2 = "3x0e+1x1o" if mode == "uvw" else "12x0e+12x1o"
    out = "11x0e+9x1o+2x2e" if mode == "uvw" else "11x0e+10x1o"
    i1 = "12x0e+12x1o+3x2e" if mode == "uvw" else "12x0e+12x1o"
    I1, I2, IO = o3.Irreps(i1), o3.Irreps(m2), o3.Irreps(out)
    ins = [(a, b, c, mode, True) for a, (m, r1) in enumerate(I1) for b, (n, r2) in enumerate(I2)
           for c, (_, r) in enumerate(IO) if r in r1 * r2 and (mode == "uvw" or m == n)]
    p = TPProblem.create(i1, m2, out, ins, shared_weights=True, internal_weights=False)
    kernels = plan_of(spec_of(p, "ir_mul")).kernels
    # (uuw's gx is elementwise in u, so only its forward and weight gradients mix channels)
    wanted = [("fwd", 0, ""), ("bwd", 4, ""), ("dbwd", 8, "abc"), ("dbwd", 4, "abc")]
    wanted += [("bwd", 3, ""), ("dbwd", 3, "abc")] if mode == "uvw" else []
    for kind, need, have in wanted:
        assert "tl.dot(" in open(kernels.kernel(kind, need, have).source_path).read(), (kind, need)
    for rows, layout, dtype in ((19, "ir_mul", torch.float64), (5, "mul_ir", torch.float32)):
        check_against_reference(p, rows=rows, dtype=dtype, layout=layout)
    x, y, w = (t.requires_grad_() for t in _inputs(p, 17, torch.float64, "cpu"))
    ours = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, backend="triton"), x, y, w)
    ref = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, backend="reference"), x, y, w)
    for name, a, b in zip("xyw", ours, ref):
        assert _rel(a, b) <= 1e-10, f"d/d{name}: {_rel(a, b):.2e}"


@pytest.mark.gpu
def test_shared_weight_tl_dot_gpu():
    """NequIP-style shared-weight uvw (tl.dot channel mixing, ieee fp32) on the GPU."""
    from equikernels.catalog import fully_connected_problem
    p = TPProblem.create(**fully_connected_problem("32x0e+32x1o+16x2e", "4x0e", "32x0e+32x1o+16x2e", True))
    check_against_reference(p, rows=1000, dtype=torch.float64, layout="mul_ir", device="cuda")
    check_against_reference(p, rows=1000, dtype=torch.float32, layout="ir_mul", device="cuda")


@pytest.mark.parametrize("mode", ["uvu<v", "u<vw"])
@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_triangular_modes_are_generated(mode, layout, monkeypatch, tmp_path):
    """Per-u sub-paths of the triangular modes write overlapping channel ranges of gy of different
    widths; the generator widens them to one masked block, so no direction falls back."""
    from equikernels.ops import plan_of, spec_of
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    for seed in (3, 4):
        p = random_problem(seed * 31 + MODES.index(mode), mode)
        kernels = plan_of(spec_of(p, layout)).kernels
        for kind, need, have in (("bwd", 7, ""), ("dbwd", 8, "abc"), ("dbwd", 7, "abc"), ("dbwd", 3, "abc")):
            kernels.kernel(kind, need, have)  # raises Unsupported where the generator would fall back
        check_against_reference(p, rows=5, dtype=torch.float64, layout=layout)
        x, y, w = (t.requires_grad_() for t in _inputs(p, 3, torch.float64, "cpu"))
        ours = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, layout=layout, backend="triton"), x, y, w)
        ref = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, layout=layout, backend="reference"), x, y, w)
        for name, a, b in zip("xyw", ours, ref):
            assert _rel(a, b) <= 1e-10, f"d/d{name}: {_rel(a, b):.2e}"


@pytest.mark.parametrize("partial,prefetch", [("1", "3"), ("1", "0"), ("0", "3")])
def test_wide_channelwise_backward_variants(partial, prefetch, monkeypatch, tmp_path):
    """The wide channel-wise (MACE-shaped) forward and backward with per-thread partial channel
    sums and loads issued early (emit.KernelBuilder._partial, emit._prefetched), alone and together,
    against the reference in fp64 and fp32 (outputs NaN-poisoned, 7 rows: with more than one row per
    program the last one runs past the end)."""
    from equikernels.codegen.planner import wide_channelwise
    from equikernels.ops import plan_of, spec_of
    from problems import wide_channelwise_problem
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EQUIKERNELS_PARTIAL_SUM", partial)
    monkeypatch.setenv("EQUIKERNELS_PREFETCH", prefetch)
    monkeypatch.setenv("EQUIKERNELS_ROWS_BWD", "4")
    p = wide_channelwise_problem()
    assert wide_channelwise(p)
    plan_of.cache_clear()
    try:
        for layout, dtype in (("ir_mul", torch.float64), ("mul_ir", torch.float32)):
            check_against_reference(p, rows=7, dtype=dtype, layout=layout)
            src = open(plan_of(spec_of(p, layout)).kernels.kernel("bwd", 7).source_path).read()
            assert ("tl.sum(tl.reshape(" in src) == (partial == "1")
            assert ("__raw = tl.load(" in src) == (prefetch != "0")
    finally:
        plan_of.cache_clear()


def test_channelwise_prefetch_defaults(monkeypatch, tmp_path):
    """Channel-wise per-row double backwards in one kernel issue their loads early by default
    (TPKernels._dbwd_prefetched), and so do the forward and backward of narrow ones (NARROW_PREFETCH),
    here nequip-water's shape at 4 channels, and mace-large's (17 paths, wide: one kernel per channel
    part of 64). The prefetched kernels against the reference with outputs NaN-poisoned, 13 rows (8 per
    program in the double backward: the last program runs past the end): forward and gradients in fp64
    and fp32, second-order gradients in fp64."""
    from equikernels.catalog import uvu_problem
    from equikernels.codegen.planner import DBWD_PREFETCH, NARROW_PREFETCH
    from equikernels.ops import plan_of, spec_of
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")
    for var in ("EQUIKERNELS_PREFETCH", "EQUIKERNELS_PREFETCH_DBWD", "EQUIKERNELS_PREFETCH_FWD", "EQUIKERNELS_PREFETCH_BWD",
                "EQUIKERNELS_DBWD_ONE", "EQUIKERNELS_ROWS_DBWD"):
        monkeypatch.delenv(var, raising=False)
    p = TPProblem.create(**uvu_problem("4x0o+4x0e+4x1o+4x1e", "0e+1o", "4x0o+4x0e+4x1o+4x1e"))
    plan_of.cache_clear()
    try:
        kernels = plan_of(spec_of(p, "ir_mul")).kernels
        assert DBWD_PREFETCH > 0 and kernels.planner.prefetch("dbwd") == DBWD_PREFETCH
        src = open(kernels.kernel("dbwd", 15, "abc").source_path).read()
        assert "__raw = tl.load(" in src
        for kind, need in (("fwd", 0), ("bwd", 7)):
            assert NARROW_PREFETCH > 0 and kernels.planner.prefetch(kind) == NARROW_PREFETCH
            assert "__raw = tl.load(" in open(kernels.kernel(kind, need).source_path).read()
        for dtype in (torch.float64, torch.float32):
            check_against_reference(p, rows=13, dtype=dtype, layout="ir_mul")
        x, y, w = (t.requires_grad_() for t in _inputs(p, 13, torch.float64, "cpu"))
        ours = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, layout="ir_mul", backend="triton"), x, y, w)
        ref = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, layout="ir_mul", backend="reference"), x, y, w)
        for name, a, b in zip("xyw", ours, ref):
            assert _rel(a, b) <= 1e-10, f"d/d{name}: {_rel(a, b):.2e}"
        large = plan_of(spec_of(catalog_problem("mace-large"), "ir_mul")).kernels
        assert large.planner.dbwd_channel_parts() == 2 and large.planner.dbwd_one()
        assert large.planner.prefetch("dbwd") == DBWD_PREFETCH
    finally:
        plan_of.cache_clear()


@pytest.mark.parametrize("parts", [2, 4])
@pytest.mark.parametrize("layout", ["ir_mul", "mul_ir"])
def test_double_backward_in_channel_parts(parts, layout, monkeypatch, tmp_path):
    """The one-kernel channel-wise double backward run as one kernel per channel part (each computes
    dx, dy, dw, dg over its slice of the channels; dy, without channels, zero-filled and added into
    by every part) against the reference in fp64, outputs NaN-poisoned, 13 rows."""
    from equikernels import settings
    from equikernels.bench.tp import all_orders
    from equikernels.catalog import uvu_problem
    from equikernels.ops import plan_of, spec_of
    from equikernels.ops import tp as ops_tp
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")
    p = TPProblem.create(**uvu_problem("4x0e+4x1o+4x2e", "0e+1o+2e", "4x0e+4x1o+4x1e+4x2e"))
    # kernels and direct-launch recipes are kept per plan: built again under this test's settings
    plan_of.cache_clear()
    ops_tp._DBWD_DIRECT.clear()
    try:
        with settings.override(dbwd_channel_parts=parts, autotune=False):
            planner = plan_of(spec_of(p, layout)).kernels.planner
            assert planner.dbwd_channel_parts() == parts and planner.dbwd_one()
            (step,) = planner.plan("dbwd", 15, "abc", torch.float64).steps
            width = 4 // parts
            assert [m.name[m.name.rindex("_c"):] for m in step.members] == [
                f"_c{k * width}_{(k + 1) * width}" for k in range(parts)]
            assert "dy" in step.zero_filled and not {"dx", "dw", "dg"} & set(step.zero_filled)
            rows = 13  # odd: the last program of more than one row runs past the end
            g = torch.Generator().manual_seed(0)
            mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
            x, y, w, gr = mk(rows, p.dim_in1), mk(rows, p.dim_in2), mk(rows, p.weight_numel), mk(rows, p.dim_out)
            rx, ry, rw = mk(rows, p.dim_in1), mk(rows, p.dim_in2), mk(rows, p.weight_numel)

            def orders(backend):
                fn = lambda a, b, c: tensor_product(p, a, b, c, layout=layout, backend=backend)  # noqa: E731
                return all_orders(fn, x, y, w, gr, rx, ry, rw, 2)
            got, ref = orders("triton"), orders("reference")
        for name in ("dx", "dy", "dw", "dg"):
            assert not got[name].isnan().any(), f"{name}: unwritten elements"
            assert _rel(got[name], ref[name]) <= 1e-10, f"{name}: {_rel(got[name], ref[name]):.2e}"
    finally:
        plan_of.cache_clear()
        ops_tp._DBWD_DIRECT.clear()
