"""Autograd's own batched cotangents (``torch.autograd.grad(is_grads_batched=True)``,
``torch.autograd.functional``'s ``vectorize=True``) through the ops, as e3nn's modules take them: the
same numbers as one cotangent at a time, float64, every backend; path tables refuse them in one line."""
import pytest
import torch
from torch.autograd.functional import hessian

from equikernels.ops.conv import tensor_product_conv
from equikernels.ops.tp import tensor_product
from test_func_transforms import BACKENDS, DST, F64, SRC, _close, _module, _operands


def _batched_against_rows(out, inputs, n=3):
    v = torch.randn(n, *out.shape, **F64)
    got = torch.autograd.grad(out, inputs, v, is_grads_batched=True, retain_graph=True)
    rows = [torch.autograd.grad(out, inputs, r, retain_graph=True) for r in v]
    _close(got, tuple(torch.stack(c) for c in zip(*rows)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_product_with_batched_cotangents(backend):
    p, x, y, w = _operands((4, 4))
    x, w = x.requires_grad_(), w.requires_grad_()
    out = tensor_product(p, x, y, w, backend=backend)
    _batched_against_rows(out, (x, w))
    gx = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)[0]
    _batched_against_rows(gx, (x, w))  # the double backward's cotangents batched


@pytest.mark.parametrize("backend", BACKENDS)
def test_product_hessian_vectorized(backend):
    p, x, y, w = _operands((3, 3))
    f = lambda t: tensor_product(p, t, y, w, backend=backend).pow(2).sum()  # noqa: E731
    _close(hessian(f, x, vectorize=True), hessian(f, x, vectorize=False))


@pytest.mark.parametrize("backend", BACKENDS)
def test_convolution_with_batched_cotangents(backend):
    p, x, y, w = _operands()
    x, y = x.requires_grad_(), y.requires_grad_()
    out = tensor_product_conv(p, x, y, w, SRC, DST, backend=backend)
    _batched_against_rows(out, (x, y))


def test_module_with_batched_cotangents():
    tp = _module(backend="triton")
    x = torch.randn(4, 9, **F64, requires_grad=True)
    _batched_against_rows(tp(x, torch.randn(4, 4, **F64)), (x,))


def test_path_table_refuses_batched_cotangents():
    from equikernels.models.builder import coupled_u_matrices
    from equikernels.models.symmetric_contraction import SymmetricContraction
    torch.manual_seed(0)
    us = [[u.double() for u in per] for per in coupled_u_matrices("2x0e+2x1o", "2x0e+2x1o", 2)]
    sc = SymmetricContraction(2, [0, 1], [0, 1], [2, 2], 2, us, "ir_mul", backend="reference").double()
    x = torch.randn(3, 8, **F64, requires_grad=True)
    out = sc(x, torch.tensor([0, 1, 0]))
    with pytest.raises(RuntimeError, match="cannot pass a path table.*vectorize=False"):
        torch.autograd.grad(out, x, torch.randn(2, *out.shape, **F64), is_grads_batched=True)
