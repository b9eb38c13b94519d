"""Equivariance under random rotations and parity: TP(D1 x, D2 y) = Dout TP(x, y).

The D matrices come from e3nn (``Irreps.D_from_matrix``), the group elements from
``o3.rand_matrix`` (proper rotations) and its negation (improper: rotation times inversion).
Gradients must transform like the operands they belong to.
"""
import pytest
import torch

from equikernels._compat import o3
from equikernels.catalog import standard_problems
from equikernels.ops import tensor_product
from problems import (default_dtype, ir_mul_to_mul_ir, mul_ir_to_ir_mul, problem_of, random_inputs, random_problem,
                      rel_err)

pytestmark = pytest.mark.usefixtures("single_thread")

TOL = 1e-10


def _group_element(seed: int, improper: bool) -> torch.Tensor:
    torch.manual_seed(seed)
    with default_dtype(torch.float64):
        R = o3.rand_matrix()
    return -R if improper else R


def _D(irreps, R):
    with default_dtype(torch.float64):
        return o3.Irreps(irreps).D_from_matrix(R).to(torch.float64)


def _check(kw, seed, improper, layout="mul_ir", rows=3):
    p = problem_of(kw)
    R = _group_element(seed, improper)
    D1, D2, Do = _D(kw["irreps_in1"], R), _D(kw["irreps_in2"], R), _D(kw["irreps_out"], R)
    x, y, w = random_inputs(p, (rows,), torch.float64, seed=seed)
    g = torch.randn(rows, p.dim_out, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))

    def tp(a, b):
        if layout == "ir_mul":  # rotate in e3nn's layout, evaluate in ir_mul
            out = tensor_product(p, mul_ir_to_ir_mul(a, kw["irreps_in1"]), mul_ir_to_ir_mul(b, kw["irreps_in2"]), w,
                                 layout="ir_mul")
            return ir_mul_to_mul_ir(out, kw["irreps_out"])
        return tensor_product(p, a, b, w)

    out = tp(x, y)
    assert out.abs().max() > 0
    rotated = tp(x @ D1.T, y @ D2.T)
    assert rel_err(rotated, out @ Do.T) <= TOL

    # gradients: dL/dx at the rotated point (cotangent rotated too) is the rotated gradient
    xa, ya = x.clone().requires_grad_(), y.clone().requires_grad_()
    gx, gy = torch.autograd.grad(tp(xa, ya), (xa, ya), g)
    xb, yb = (x @ D1.T).requires_grad_(), (y @ D2.T).requires_grad_()
    rx, ry = torch.autograd.grad(tp(xb, yb), (xb, yb), g @ Do.T)
    assert rel_err(rx, gx @ D1.T) <= TOL
    assert rel_err(ry, gy @ D2.T) <= TOL
    return out, rotated


@pytest.mark.parametrize("improper", [False, True], ids=["rotation", "rotation+inversion"])
@pytest.mark.parametrize("seed", range(16))
def test_random_problem_equivariant(seed, improper):
    _check(random_problem(3000 + seed), seed, improper, layout="ir_mul" if seed % 4 == 3 else "mul_ir")


@pytest.mark.parametrize("name", ["mace-medium", "nequip-water", "tetris-poly-1", "diffdock-L2"])
def test_standard_problem_equivariant(name):
    _check(standard_problems()[name], seed=1, improper=True, rows=2)


def test_equivariance_check_detects_a_broken_product():
    """Guard against a vacuous check: a product with a wrong parity output is caught."""
    kw = dict(irreps_in1="2x1o", irreps_in2="1x0e", irreps_out="2x1o",
              instructions=[(0, 0, 0, "uvu", True)], internal_weights=False)
    p = problem_of(kw)
    R = _group_element(0, improper=True)
    x, y, w = random_inputs(p, (2,), torch.float64)
    D_wrong = _D("2x1e", R)  # pretend the output were even
    out = tensor_product(p, x @ _D("2x1o", R).T, y @ _D("1x0e", R).T, w)
    assert rel_err(out, tensor_product(p, x, y, w) @ D_wrong.T) > 0.1
