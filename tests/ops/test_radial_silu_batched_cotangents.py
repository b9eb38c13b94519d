"""Autograd's batched cotangents (``is_grads_batched=True``, ``vectorize=True``: a force Hessian)
through the fused radial basis and the one-pass SiLU second derivative on the "triton" backend: the
kernels cannot read such cotangents, so those passes run the torch formulas and give the per-row
loop's numbers."""
import pytest
import torch

from equikernels import settings
from equikernels.ops import radial_basis as RB
from equikernels.ops.silu import silu


def _hessian_rows(f, x, create_graph_first=True):
    """(batched, looped) rows of d(grad f)/dx for cotangents the identity's rows."""
    (g1,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    eye = torch.eye(g1.numel(), dtype=x.dtype, device=x.device).reshape(-1, *g1.shape)
    (batched,) = torch.autograd.grad(g1, x, eye, is_grads_batched=True, retain_graph=True)
    looped = torch.stack([torch.autograd.grad(g1, x, v, retain_graph=True)[0] for v in eye])
    return batched, looped


def test_radial_basis(device):
    r = (torch.rand(6, 1, dtype=torch.float64) * 4 + 0.5).to(device).requires_grad_()
    w = torch.arange(1, 9, dtype=torch.float64, device=device) * torch.pi / 5.0
    consts = torch.tensor([0.6, 5.0], dtype=torch.float64, device=device)
    g = torch.randn(6, 8, dtype=torch.float64, device=device)
    with settings.override(backend="triton"):
        if not RB.fused_available(r):
            pytest.skip("the fused radial basis does not run here")
        batched, looped = _hessian_rows(lambda x: RB.bessel_envelope(x, w, consts, 5) * g, r)
    torch.testing.assert_close(batched, looped, rtol=1e-12, atol=1e-12)


def test_silu(device):
    z = torch.randn(5, 3, dtype=torch.float64, device=device, requires_grad=True)
    with settings.override(backend="triton"):
        batched, looped = _hessian_rows(lambda x: silu(x) * x, z)
    torch.testing.assert_close(batched, looped, rtol=1e-12, atol=1e-12)
