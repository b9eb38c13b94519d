"""equikernels.ops.silu: torch's SiLU values with a one-pass second derivative, every order exact."""
import pytest
import torch

from equikernels import settings
from equikernels.ops import silu as S

from problems import second_order


def _inputs(dtype, shape=(37, 5)):
    z = torch.randn(*shape, dtype=torch.float64) * 3
    return z.to(dtype)


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_second_order_matches_torch(backend, dtype, device, monkeypatch):
    calls = []
    if backend == "triton":
        from equikernels.ops import _silu_kernel
        real = _silu_kernel._LAUNCH

        def spy(grid, *args):  # counts launches of the fused kernel
            calls.append(grid)
            return real(grid, *args)
        monkeypatch.setattr(_silu_kernel, "_LAUNCH", spy)
        empty_like = torch.empty_like  # outputs poisoned: every element must be written
        monkeypatch.setattr(S.torch, "empty_like", lambda t, **kw: empty_like(t, **kw).fill_(float("nan")))
    z = _inputs(dtype).to(device)
    with settings.override(backend=backend):
        ours = second_order(S.silu, z)
    ref = second_order(torch.nn.functional.silu, z)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, **tol)
    assert len(calls) == (1 if backend == "triton" else 0)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_gradcheck_to_third_order(backend):
    z = _inputs(torch.float64, (6, 4)).requires_grad_()
    with settings.override(backend=backend):
        assert torch.autograd.gradcheck(S.silu, (z,))
        assert torch.autograd.gradgradcheck(S.silu, (z,))

        def first(t):
            return torch.autograd.grad(S.silu(t).pow(2).sum(), t, create_graph=True)[0]
        assert torch.autograd.gradgradcheck(first, (z,))


@pytest.mark.parametrize("need", [(True, False), (False, True), (True, True)])
def test_second_order_outputs_only_where_needed(need):
    z, g, gg = (_inputs(torch.float32, (300,)) for _ in range(3))
    s = torch.sigmoid(z.double())
    d1 = s * (1 + z.double() * (1 - s))
    d2 = s * (1 - s) * (2 + z.double() * (1 - 2 * s))
    with settings.override(backend="triton"), torch.no_grad():
        gz, gdg = S.second_order(z, g, gg, *need)
    assert (gz is None) == (not need[0]) and (gdg is None) == (not need[1])
    if need[0]:
        torch.testing.assert_close(gz.double(), gg.double() * g.double() * d2, rtol=1e-5, atol=1e-5)
    if need[1]:
        torch.testing.assert_close(gdg.double(), gg.double() * d1, rtol=1e-5, atol=1e-5)


def test_no_graph_without_grad():
    z = _inputs(torch.float32)
    assert S.silu(z).grad_fn is None
    with torch.no_grad():
        assert S.silu(z.requires_grad_()).grad_fn is None


def test_torch_func_transforms_see_torch_silu():
    """torch.func (grad, vmap) works as with torch's silu: transformed calls take torch's op."""
    z = _inputs(torch.float64, (7,))

    def ours(t):
        return S.silu(t).pow(2).sum()

    def ref(t):
        return torch.nn.functional.silu(t).pow(2).sum()
    torch.testing.assert_close(torch.func.grad(ours)(z), torch.func.grad(ref)(z))
    torch.testing.assert_close(torch.func.grad(lambda t: torch.func.grad(ours)(t).sum())(z),
                               torch.func.grad(lambda t: torch.func.grad(ref)(t).sum())(z))
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(ours))(z.view(7, 1)),
                               torch.func.vmap(torch.func.grad(ref))(z.view(7, 1)))


def test_silu_grad_is_the_derivative_to_second_order():
    z = torch.randn(40, dtype=torch.float64, requires_grad=True)
    g = torch.randn(40, dtype=torch.float64, requires_grad=True)
    assert torch.equal(S.silu_grad(z.detach(), g.detach()), torch.ops.aten.silu_backward(g.detach(), z.detach()))
    (ref,) = torch.autograd.grad(torch.nn.functional.silu(z), z, g, create_graph=True)
    torch.testing.assert_close(S.silu_grad(z, g), ref, rtol=1e-14, atol=1e-14)
    torch.autograd.gradcheck(S.silu_grad, (z, g))
    torch.autograd.gradgradcheck(S.silu_grad, (z, g))
