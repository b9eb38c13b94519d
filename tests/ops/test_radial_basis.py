"""equikernels.ops.radial_basis: MACE's Bessel basis times polynomial envelope in one pass, against
the models' torch formula in float64, derivatives of any order exact."""
import pytest
import torch

from equikernels import settings
from equikernels.models.radial import RadialEmbedding
from equikernels.ops import radial_basis as RB


def _lengths(dtype, device, n=203):
    # inside and beyond the 5 A cutoff, and exactly on it
    r = torch.cat([torch.rand(n, dtype=torch.float64) * 5.8 + 0.4, torch.tensor([5.0])])
    return r.unsqueeze(-1).to(device=device, dtype=dtype)


def _embedding(dtype, device, p):
    return RadialEmbedding(r_max=5.0, num_bessel=8, num_polynomial_cutoff=p).to(device=device, dtype=dtype)


def _torch_formula(emb, r):
    return emb.basis(r) * emb.cutoff(r)


@pytest.fixture
def poisoned(monkeypatch):
    """Outputs of the op start as NaN: every element must be written."""
    empty, empty_like = torch.empty, torch.empty_like
    monkeypatch.setattr(RB.torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))
    monkeypatch.setattr(RB.torch, "empty_like", lambda t, **kw: empty_like(t, **kw).fill_(float("nan")))


@pytest.mark.parametrize("p", [5, 6, 1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_values_and_forces_match_the_torch_formula(p, dtype, device, poisoned):
    emb = _embedding(dtype, device, p)
    r = _lengths(dtype, device).requires_grad_()
    g = torch.randn(r.shape[0], 8, dtype=dtype, device=device)
    with settings.override(backend="triton"):
        assert RB.fused_available(r)
        out, cutoff = emb(r, None, None, None)
        assert cutoff is None and out.grad_fn is not None and "BesselEnvelope" in type(out.grad_fn).__name__
        (gr,) = torch.autograd.grad(out, r, g)
    # against the torch formula in float64 (float32 results: within float32 rounding of the scale)
    r64 = r.detach().double().requires_grad_()
    ref = _torch_formula(_embedding(torch.float64, device, p), r64)
    (gref,) = torch.autograd.grad(ref, r64, g.double())
    for ours, exact in ((out, ref), (gr, gref)):
        scale = exact.abs().max().item()
        tol = 1e-12 if dtype == torch.float64 else 2e-6
        torch.testing.assert_close(ours.double(), exact.detach(), rtol=0, atol=tol * scale)
    assert (out[r.squeeze(-1) >= 5.0] == 0).all() and out.abs().max() > 0.1


def test_any_order_is_exact_autograd(device):
    emb = _embedding(torch.float64, device, 5)
    r = _lengths(torch.float64, device, n=20).requires_grad_()
    with settings.override(backend="triton"):
        w = emb.basis.bessel_weights
        consts = torch.stack([emb.basis.prefactor, emb.cutoff.r_max])
        f = lambda x: RB.bessel_envelope(x, w, consts, 5)  # noqa: E731
        assert torch.autograd.gradcheck(f, (r,))
        assert torch.autograd.gradgradcheck(f, (r,))
        (g1,) = torch.autograd.grad(f(r).sum(), r, create_graph=True)
        (h,) = torch.autograd.grad(g1.sum(), r)
    ref = _torch_formula(emb, r)
    (g1r,) = torch.autograd.grad(ref.sum(), r, create_graph=True)
    (hr,) = torch.autograd.grad(g1r.sum(), r)
    torch.testing.assert_close(h, hr, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("p", [5, 2, 1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_force_training_derivatives_match_the_torch_formula(p, dtype, device, poisoned):
    # the force pass records the derivative as one op; its backward (kernel) gives d/dr and d/dg
    emb = _embedding(dtype, device, p)
    r = _lengths(dtype, device).requires_grad_()
    g = torch.randn(r.shape[0], 8, dtype=dtype, device=device, requires_grad=True)
    gg = torch.randn(r.shape[0], 1, dtype=dtype, device=device)
    with settings.override(backend="triton"):
        out, _ = emb(r, None, None, None)
        (gr,) = torch.autograd.grad(out, r, g, create_graph=True)
        assert type(gr.grad_fn).__name__ == "_BesselEnvelopeGradBackward"
        dr, dg = torch.autograd.grad(gr, (r, g), gg)
    r64, g64 = r.detach().double().requires_grad_(), g.detach().double().requires_grad_()
    ref = _torch_formula(_embedding(torch.float64, device, p), r64)
    (gref,) = torch.autograd.grad(ref, r64, g64, create_graph=True)
    dr_ref, dg_ref = torch.autograd.grad(gref, (r64, g64), gg.double())
    for ours, exact in ((dr, dr_ref), (dg, dg_ref)):
        tol = 1e-11 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(ours.double(), exact, rtol=0, atol=tol * exact.abs().max().item())


def test_third_order_is_exact_autograd(device):
    # a differentiated second derivative runs torch formulas: their values, then their gradients
    emb = _embedding(torch.float64, device, 5)
    r = _lengths(torch.float64, device, n=20).requires_grad_()
    w, consts = emb.basis.bessel_weights, torch.stack([emb.basis.prefactor, emb.cutoff.r_max])
    g = torch.randn(r.shape[0], 8, dtype=torch.float64, device=device)

    def second(x, formula):
        (g1,) = torch.autograd.grad(formula(x), x, g, create_graph=True)
        return torch.autograd.grad(g1.sum(), x, create_graph=True)[0]

    with settings.override(backend="triton"):
        ours = lambda x: second(x, lambda y: RB.bessel_envelope(y, w, consts, 5))  # noqa: E731
        torch.testing.assert_close(ours(r), second(r, lambda y: _torch_formula(emb, y)), rtol=1e-10, atol=1e-10)
        assert torch.autograd.gradcheck(ours, (r,))


def test_other_backends_and_features_keep_the_torch_formula(device):
    r = _lengths(torch.float64, device)
    emb = _embedding(torch.float64, device, 5)
    with settings.override(backend="reference"):
        assert not RB.fused_available(r)
        out, _ = emb(r, None, None, None)
    assert "BesselEnvelope" not in type(out.grad_fn or object()).__name__
    soft = RadialEmbedding(5.0, 8, 5, apply_cutoff=False).to(device=device, dtype=torch.float64)
    with settings.override(backend="triton"):
        radial, cutoff = soft(r, None, None, None)
    assert cutoff is not None  # the cutoff stays separate when the model applies it elsewhere


def test_bad_arguments_are_named():
    r = torch.rand(4, 1, dtype=torch.float64) + 1
    with pytest.raises(TypeError, match="must have r's dtype"):
        RB.bessel_envelope(r, torch.ones(8), torch.ones(2, dtype=torch.float64), 5)
    with pytest.raises(ValueError, match="p: expected an integer >= 1"):
        RB.bessel_envelope(r, torch.ones(8, dtype=torch.float64), torch.ones(2, dtype=torch.float64), 0)


def test_torch_func_transforms_take_the_torch_formula():
    # inside a transform (an ensemble vmapped over its weights) the lengths are plain tensors, yet the
    # op's autograd Functions cannot run there
    r = _lengths(torch.float64, "cpu", n=12)
    emb = _embedding(torch.float64, "cpu", 5)
    scales = torch.rand(3, 8, dtype=torch.float64)
    with settings.override(backend="triton"):
        assert RB.fused_available(r)
        got = torch.func.vmap(lambda s: emb(r, None, None, None)[0] * s)(scales)
        want = torch.stack([emb(r, None, None, None)[0] * s for s in scales])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
