"""Per-row uvw kernels are generated from a table whose channel labels are split into power-of-
two pieces (ir.split_pow2): same sums, smaller padded blocks. Checked against the reference
(unsplit table) in every direction, and the split itself checked on the table."""
import pytest
import torch

from equikernels.ir import split_pow2, tp_table
from equikernels.ops import plan_of, spec_of, tensor_product
from equikernels.problem import TPProblem
from equikernels import reference

from test_kernels import _double_backward, _inputs, _rel, check_against_reference


def _problem(shared=False):
    i1, i2, io = "10x1o+12x0e", "1x0e+1x1o", "9x1o+12x0e+3x1e"
    from equikernels._compat import o3
    I1, I2, IO = o3.Irreps(i1), o3.Irreps(i2), o3.Irreps(io)
    ins = [(a, b, c, "uvw", True) for a, (_, r1) in enumerate(I1) for b, (_, r2) in enumerate(I2)
           for c, (_, r) in enumerate(IO) if r in r1 * r2]
    return TPProblem.create(i1, i2, io, ins, shared_weights=shared, internal_weights=False)


def test_split_table_evaluates_the_same():
    p = _problem()
    t = tp_table(p)
    s = split_pow2(t)
    assert len(s.paths) > len(t.paths)
    assert all(n & (n - 1) == 0 for q in s.paths for l, n in q.labels if l in ("u", "w") and n >= 2 and n != 3)
    x, y, w = _inputs(p, 4, torch.float64, "cpu")
    for layout in ("mul_ir", "ir_mul"):
        a = reference.evaluate(t, {"x": x, "y": y, "w": w}, layout, rows=4)
        b = reference.evaluate(s, {"x": x, "y": y, "w": w}, layout, rows=4)
        assert _rel(b, a) <= 1e-14


@pytest.mark.parametrize("layout,dtype", [("ir_mul", torch.float64), ("mul_ir", torch.float32)])
def test_split_kernels_match_reference(layout, dtype, monkeypatch, tmp_path):
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    p = _problem()
    plan_of.cache_clear()
    try:
        plan = plan_of(spec_of(p, layout))
        assert plan.kernel_tables[2] > 1, "per-row uvw with 9/10/12 channels should be split"
        check_against_reference(p, rows=5, dtype=dtype, layout=layout)
        x, y, w = (t.requires_grad_() for t in _inputs(p, 3, torch.float64, "cpu"))
        ours = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, layout=layout, backend="triton"), x, y, w)
        ref = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, layout=layout, backend="reference"),
                               x, y, w)
        for name, a, b in zip("xyw", ours, ref):
            assert _rel(a, b) <= 1e-10, f"d/d{name}: {_rel(a, b):.2e}"
    finally:
        plan_of.cache_clear()


def test_split_off_and_shared_weights_keep_the_table(monkeypatch):
    plan_of.cache_clear()
    try:
        assert plan_of(spec_of(_problem(shared=True), "ir_mul")).kernel_tables[2] == 1
        monkeypatch.setenv("EQUIKERNELS_SPLIT_POW2", "0")
        plan_of.cache_clear()
        assert plan_of(spec_of(_problem(), "ir_mul")).kernel_tables[2] == 1
    finally:
        plan_of.cache_clear()
