"""Per-row weights larger than the output (DiffDock-shaped uvw): the weight gradient runs in a
kernel of its own, in the backward and in the double backward (codegen.tp._weights_dominate).
Both splits must give the reference's numbers, and the same numbers as one kernel. These are the
emit.py kernels (EQUIKERNELS_UVW_ROWS=0); the default for such problems, uvw_rows.py, is tested in
test_uvw_rows.py."""
import pytest
import torch

from equikernels._compat import o3
from equikernels.ops import plan_of, spec_of, tensor_product
from equikernels.problem import TPProblem

from tp_checks import _double_backward, _inputs, _rel, check_against_reference


def _problem():
    i1, i2, io = "3x1o+5x0e", "1x0e+1x1o", "3x1o+5x0e"
    I1, I2, IO = o3.Irreps(i1), o3.Irreps(i2), o3.Irreps(io)
    ins = [(a, b, c, "uvw", True) for a, (_, r1) in enumerate(I1) for b, (_, r2) in enumerate(I2)
           for c, (_, r) in enumerate(IO) if r in r1 * r2]
    return TPProblem.create(i1, i2, io, ins, shared_weights=False, internal_weights=False)


@pytest.mark.parametrize("split", ["1", "0"])
def test_weight_gradient_kernel_split(split, monkeypatch, tmp_path):
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EQUIKERNELS_SPLIT_GW", split)
    monkeypatch.setenv("EQUIKERNELS_UVW_ROWS", "0")
    p = _problem()
    assert p.weight_numel > 4 * p.dim_out
    plan_of.cache_clear()
    try:
        ks = plan_of(spec_of(p, "ir_mul")).kernels
        assert ks.planner.split_weight_grad() == (split == "1")
        check_against_reference(p, rows=5, dtype=torch.float64, layout="ir_mul")
        x, y, w = (t.requires_grad_() for t in _inputs(p, 3, torch.float64, "cpu"))
        ours = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, layout="ir_mul", backend="triton"),
                                x, y, w)
        ref = _double_backward(lambda a, b, c: tensor_product(p, a, b, c, layout="ir_mul", backend="reference"),
                               x, y, w)
        for name, a, b in zip("xyw", ours, ref):
            assert _rel(a, b) <= 1e-10, f"d/d{name}: {_rel(a, b):.2e}"
        # the weight gradient came from a kernel of its own exactly when split
        built = {k[:2] for k in ks.built_steps()}
        assert (("bwd", 4) in built) == (split == "1")
    finally:
        plan_of.cache_clear()
