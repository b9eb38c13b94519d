"""Per-row uvw weights (DiffDock-shaped): backward and double backward from codegen/uvw_rows.py,
against the PyTorch reference in float64 (outputs poisoned with NaN), for both layouts, every
subset of outputs / cotangents, the chunk options, and the fused / split weight-gradient kernels."""
import itertools

import pytest
import torch

from equikernels._compat import o3
from equikernels.codegen import uvw_rows
from equikernels.codegen.planner import NEED_W
from equikernels.ops import plan_of, spec_of, tensor_product
from equikernels.problem import TPProblem

from tp_checks import _double_backward, _inputs, _rel, check_against_reference


def _problem(i1="3x1o+5x0e+2x1e", i2="1x0e+1x1o+1x2e", io="3x1o+5x0e+2x1e"):
    I1, I2, IO = o3.Irreps(i1), o3.Irreps(i2), o3.Irreps(io)
    ins = [(a, b, c, "uvw", True) for a, (_, r1) in enumerate(I1) for b, (_, r2) in enumerate(I2)
           for c, (_, r) in enumerate(IO) if r in r1 * r2]
    return TPProblem.create(i1, i2, io, ins, shared_weights=False, internal_weights=False)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    plan_of.cache_clear()
    yield monkeypatch
    plan_of.cache_clear()


def _check_dbwd(p, layout, dtype=torch.float64, rows=3):
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    x, y, w = (t.requires_grad_() for t in _inputs(p, rows, dtype, "cpu"))
    ours = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, layout=layout, backend="triton"), x, y, w)
    ref = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, layout=layout, backend="reference"), x, y, w)
    for name, a, b in zip("xyw", ours, ref):
        assert not a.isnan().any(), f"d/d{name}: unwritten elements"
        assert _rel(a, b) <= tol, f"d/d{name}: {_rel(a, b):.2e}"


def test_diffdock_uses_uvw_rows(fresh):
    from equikernels.catalog import problem
    p = problem("diffdock-L2")
    ks = plan_of(spec_of(p, "ir_mul")).kernels
    assert ks.planner.uvw_rows()
    assert "per-row uvw" in open(ks.kernel("bwd", 3).source_path).read()
    fresh.setenv("EQUIKERNELS_UVW_ROWS", "0")
    plan_of.cache_clear()
    assert not plan_of(spec_of(p, "ir_mul")).kernels.planner.uvw_rows()


@pytest.mark.parametrize("layout", ["ir_mul", "mul_ir"])
@pytest.mark.parametrize("opts", ["16,16,0,0", "8,16,1,0", "4,8,0,1", "16,4,1,1"])
def test_against_reference(fresh, layout, opts):
    ub, wb, exact, lazy = opts.split(",")
    for k, v in (("UB", ub), ("WB", wb), ("EXACT", exact), ("LAZY_H", lazy)):
        fresh.setenv(f"EQUIKERNELS_UVW_{k}", v)
    p = _problem()
    assert uvw_rows.eligible(p, plan_of(spec_of(p, layout)).table)
    check_against_reference(p, rows=5, dtype=torch.float64, layout=layout)
    _check_dbwd(p, layout)


@pytest.mark.parametrize("fuse", ["0", "1"])
def test_fused_and_split_weight_gradient(fresh, fuse):
    fresh.setenv("EQUIKERNELS_UVW_FUSE", fuse)
    p = _problem()
    check_against_reference(p, rows=4, dtype=torch.float64, layout="ir_mul")
    check_against_reference(p, rows=4, dtype=torch.float32, layout="ir_mul")
    _check_dbwd(p, "ir_mul")
    built = {k[:2] for k in plan_of(spec_of(p, "ir_mul")).kernels.built_steps()}
    assert (("bwd", NEED_W) in built) == (fuse == "0")


def test_y_multiplicity_and_uncovered_segments(fresh):
    """v > 1 (weights [u, v, w]) and segments no path reads or writes (zero gradients)."""
    i1, i2, io = "4x0e+3x1o+2x2o", "2x0e+1x1o", "3x0e+2x1o+2x3e"
    ins = [(0, 0, 0, "uvw", True), (1, 1, 0, "uvw", True), (1, 0, 1, "uvw", True), (0, 1, 1, "uvw", True)]
    p = TPProblem.create(i1, i2, io, ins, shared_weights=False, internal_weights=False)
    for layout in ("ir_mul", "mul_ir"):
        assert uvw_rows.eligible(p, plan_of(spec_of(p, layout)).table)
        check_against_reference(p, rows=3, dtype=torch.float64, layout=layout)
        _check_dbwd(p, layout)


@pytest.mark.parametrize("fuse", ["0", "1"])
def test_every_need_and_have(fresh, fuse):
    """Every subset of outputs (backward: of x, y, w; double backward: of x, y, w, g) and of the
    cotangents a, b, c, against the reference evaluation of the same tables."""
    from equikernels.ops.tp import _bwd_impl, _dbwd_impl
    fresh.setenv("EQUIKERNELS_UVW_FUSE", fuse)
    p = _problem("2x1o+3x0e", "1x0e+1x1o", "2x1o+3x0e")
    spec = spec_of(p, "ir_mul")
    x, y, w = _inputs(p, 3, torch.float64, "cpu")
    g, a, b, c = torch.randn(3, p.dim_out), torch.randn_like(x), torch.randn_like(y), torch.randn_like(w)
    g, a, b, c = (t.double() for t in (g, a, b, c))
    for need in range(1, 8):
        ours = _bwd_impl(x, y, w, g, spec, "triton", need)
        ref = _bwd_impl(x, y, w, g, spec, "reference", need)
        for o, r in zip(ours, ref):
            assert o.shape == r.shape and (not o.numel() or _rel(o, r) <= 1e-10), need
    for need in range(1, 16):
        for n in range(1, 4):
            for have in itertools.combinations("abc", n):
                have = "".join(have)
                ours = _dbwd_impl(x, y, w, g, a, b, c, spec, "triton", have, need)
                ref = _dbwd_impl(x, y, w, g, a, b, c, spec, "reference", have, need)
                for name, o, r in zip("xywg", ours, ref):
                    assert o.shape == r.shape, (need, have, name)
                    assert not o.isnan().any(), (need, have, name)
                    assert (not o.numel()) or _rel(o, r) <= 1e-10 or (r.abs().max() == 0 and o.abs().max() == 0), \
                        (need, have, name, _rel(o, r))


def test_gradgradcheck(fresh):
    p = _problem("2x1o+1x0e", "1x0e+1x1o", "1x1o+2x0e")
    x, y, w = (t.requires_grad_() for t in _inputs(p, 2, torch.float64, "cpu"))
    f = lambda a, b, c: tensor_product(p, a, b, c, layout="ir_mul", backend="triton")  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, y, w))
    assert torch.autograd.gradgradcheck(f, (x, y, w))
