"""``Linear``'s per-block path keeping its input rather than the regrouped copies its weight gradient
reads (``nn.linear.RECOMPUTE_DEVICES``; CUDA by default, forced onto the CPU here): e3nn's numbers and
derivatives to second order in both layouts, the copies made again only in the backward, and
nothing changed where other saved-tensor hooks are in force or no weight gradient is wanted."""
import pytest
import torch

from equikernels.nn import linear as L
from linear_checks import linear_pair, run_both

CASES = [("3x0e+2x1o+1x2e+2x0e", "4x0e+3x1o+2x2e"), ("2x0e+2x1e+3x3o", "3x0e+1x1e+2x3o")]


@pytest.fixture
def remade(monkeypatch):
    """The per-block path with recomputed copies on the CPU, and the number of copies made again."""
    monkeypatch.setattr(L, "DENSE_DEVICES", ())
    monkeypatch.setattr(L, "RECOMPUTE_DEVICES", ("cpu",))
    made = []
    real = L._Recipes._unpack
    monkeypatch.setattr(L._Recipes, "_unpack",
                        staticmethod(lambda s: (made.append(1) if isinstance(s, L._Recomputed) else None) or real(s)))
    return made


def _copies(ref):
    """Input blocks with l > 0: each feeds one product here, through a copy."""
    return sum(1 for _, ir in ref.irreps_in if ir.l > 0)


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
@pytest.mark.parametrize("irreps", CASES)
def test_matches_e3nn_and_remakes_copies_in_backward(remade, irreps, layout):
    ref, ours = linear_pair(*irreps, layout)
    x = torch.randn(7, ref.irreps_in.dim, dtype=torch.float64, requires_grad=True)
    out, out_ref = run_both(ref, ours, layout, x)
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    assert not remade  # nothing is made again in the forward
    cot = torch.randn_like(out_ref)
    got = torch.autograd.grad(out, [x, ours.weight], cot)
    want = torch.autograd.grad(out_ref, [x, ref.weight], cot)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)
    assert len(remade) == _copies(ref)  # each l > 0 block's copy, once, for the weight gradient


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_second_order(remade, layout):
    _, ours = linear_pair(*CASES[0], layout)
    x = torch.randn(3, ours.irreps_in.dim, dtype=torch.float64, requires_grad=True)
    w = ours.weight
    assert torch.autograd.gradcheck(lambda a, b: ours(a) * b.sum(), (x, w))
    assert torch.autograd.gradgradcheck(lambda a, b: ours(a) * b.sum(), (x, w))
    assert remade


def test_left_alone_under_other_hooks_and_without_weight_gradient(remade):
    ref, ours = linear_pair(*CASES[0], "mul_ir")
    x = torch.randn(5, ref.irreps_in.dim, dtype=torch.float64, requires_grad=True)
    with torch.autograd.graph.save_on_cpu():  # the outer hooks see every saved tensor
        out = ours(x)
    g = torch.autograd.grad(out.square().sum(), [x, ours.weight])
    g_ref = torch.autograd.grad(ref(x).square().sum(), [x, ref.weight])
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    ours.requires_grad_(False)
    torch.autograd.grad(ours(x).square().sum(), x)
    assert not remade


def test_cpu_default_keeps_the_copies(monkeypatch):
    monkeypatch.setattr(L, "DENSE_DEVICES", ())
    _, ours = linear_pair(*CASES[0], "mul_ir")
    assert "cpu" not in L.RECOMPUTE_DEVICES
    assert L._Recipes.for_call(ours.weight, torch.zeros(1, ours.irreps_in.dim, dtype=torch.float64)) is None


def test_torch_func_transforms_run_without_the_hooks(remade):
    """torch.func refuses saved-tensor hooks: under jacrev the copies are kept as before."""
    ref, ours = linear_pair(*CASES[0], "mul_ir")
    x = torch.randn(2, ref.irreps_in.dim, dtype=torch.float64)
    jac = torch.func.jacrev(lambda a: ours(a).square().sum())(x)
    jac_ref = torch.func.jacrev(lambda a: ref(a).square().sum())(x)
    torch.testing.assert_close(jac, jac_ref, rtol=1e-12, atol=1e-12)
