"""MACE's radial MLP and symmetric contraction refuse a misspelt ``backend=`` when built, as the
tensor-product modules do, not at their first call."""
import pytest

from equikernels.ops import BACKENDS


def _radial(**kw):
    from equikernels.models.radial import RadialMLP
    return RadialMLP([4, 8, 2], "silu", **kw)


def _contraction(**kw):
    from equikernels.models.builder import coupled_u_matrices
    from equikernels.models.symmetric_contraction import SymmetricContraction
    us = coupled_u_matrices("2x0e+2x1o", "2x0e", 2)
    return SymmetricContraction(2, [0, 1], [0], [2], 1, us, "ir_mul", **kw)


@pytest.mark.parametrize("build", [_radial, _contraction], ids=["RadialMLP", "SymmetricContraction"])
def test_bad_backend_is_refused_at_construction(build):
    with pytest.raises(ValueError, match=r"^backend: expected None or one of .*'triton'.*, got 'tritn'$"):
        build(backend="tritn")
    for backend in (None, *BACKENDS):
        assert build(backend=backend).backend == backend
