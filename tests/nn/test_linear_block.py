"""``Linear`` with frozen weights in the ir_mul layout as strided batched products
(``nn.linear.BLOCK_DEVICES``; CUDA by default, forced onto the CPU here): e3nn's numbers, the
derivatives with respect to the features to second order, features given as a strided view, inputs
no instruction reads, and what stays on the per-block path."""
import io

import pytest
import torch

from equikernels.nn import _block_linear as B
from equikernels.nn import linear as L
from linear_checks import linear_pair, run_both

CASES = [("3x0e+2x1o+1x2e+2x0e", "4x0e+3x1o+2x2e"), ("8x0e+4x1o+3x2e+2x1o", "5x0e+6x1o+2x2e"),
         ("2x0e+2x1e+3x3o", "3x0e+1x1e+2x3o"), ("2x0e+3x1o+2x1o+2x2e", "4x0e+2x1o")]  # the last: 2x2e unread


@pytest.fixture
def blocks(monkeypatch):
    """The block path on the CPU (the dense path off), and the number of block_linear calls."""
    monkeypatch.setattr(L, "DENSE_DEVICES", ())
    monkeypatch.setattr(L, "BLOCK_DEVICES", ("cpu",))
    calls = []
    real = L.block_linear
    monkeypatch.setattr(L, "block_linear", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("irreps", CASES)
def test_matches_e3nn_to_second_order(blocks, irreps):
    ref, ours = linear_pair(*irreps, "ir_mul")
    ours.requires_grad_(False)
    ref.requires_grad_(False)
    x = torch.randn(5, ref.irreps_in.dim, dtype=torch.float64, requires_grad=True)
    out, out_ref = run_both(ref, ours, "ir_mul", x)
    assert blocks
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    cot = torch.randn_like(out_ref, requires_grad=True)
    (g,) = torch.autograd.grad(out, x, cot, create_graph=True)
    (g_ref,) = torch.autograd.grad(out_ref, x, cot, create_graph=True)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)
    r = torch.randn_like(g)
    torch.testing.assert_close(torch.autograd.grad((g * r).sum(), cot)[0],
                               torch.autograd.grad((g_ref * r).sum(), cot)[0], rtol=1e-12, atol=1e-12)


def test_gradcheck_and_gradgradcheck(blocks):
    _, ours = linear_pair("2x0e+3x1o+1x2e", "3x0e+2x1o+2x2e", "ir_mul")
    ours.requires_grad_(False)
    x = torch.randn(3, ours.irreps_in.dim, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ours, (x,))
    assert torch.autograd.gradgradcheck(ours, (x,))
    assert blocks


def test_strided_features_and_leading_dims(blocks):
    ref, ours = linear_pair("3x0e+2x1o+1x2e", "2x0e+3x1o", "ir_mul")
    ours.requires_grad_(False)
    wide = torch.randn(2, 4, ref.irreps_in.dim + 5, dtype=torch.float64)
    x = wide[..., 2:2 + ref.irreps_in.dim]  # a strided view, two leading dims
    out = ours(x)
    flat = run_both(ref, ours, "ir_mul", _mul_ir(ref, x.reshape(-1, x.shape[-1])))[1]
    from equikernels.nn.spherical_harmonics import ir_mul_permutation
    want = flat[:, ir_mul_permutation(ref.irreps_out)].reshape(2, 4, -1)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    assert blocks


def _mul_ir(ref, x_ir_mul):
    from equikernels.nn.spherical_harmonics import ir_mul_permutation
    return x_ir_mul[:, torch.argsort(ir_mul_permutation(ref.irreps_in))]


def test_outputs_poisoned_first_are_overwritten(blocks, monkeypatch):
    """Every output column is written (or zeroed where no instruction writes it): an output buffer
    full of NaN must not leak."""
    real_empty = torch.Tensor.new_empty
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **k: real_empty(self, *a, **k).fill_(float("nan")))
    ref, ours = linear_pair("2x0e+3x1o+2x1o+2x2e", "4x0e+2x1o", "ir_mul")
    ours.requires_grad_(False)
    ref.requires_grad_(False)
    x = torch.randn(4, ref.irreps_in.dim, dtype=torch.float64, requires_grad=True)
    out, out_ref = run_both(ref, ours, "ir_mul", x)
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    g, = torch.autograd.grad(out.sum(), x)  # 2x2e is read by no instruction: its gradient is zero
    g_ref, = torch.autograd.grad(out_ref.sum(), x)
    assert torch.isfinite(g).all()
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)


def test_trained_weights_and_mul_ir_stay_on_the_per_block_path(blocks):
    _, ours = linear_pair("3x0e+2x1o", "2x0e+3x1o", "ir_mul")
    ours(torch.randn(4, ours.irreps_in.dim, dtype=torch.float64))  # weights take gradients
    _, mul_ir = linear_pair("3x0e+2x1o", "2x0e+3x1o", "mul_ir")
    mul_ir.requires_grad_(False)
    mul_ir(torch.randn(4, mul_ir.irreps_in.dim, dtype=torch.float64))
    assert not blocks
    with pytest.raises(ValueError, match="constants"):
        B.block_linear(torch.randn(2, 3), [torch.randn(3, 3, requires_grad=True)], [(0, 3, 1, 0, 3, 0)], 3)


def test_terms_are_not_saved(blocks):
    _, ours = linear_pair("3x0e+2x1o+1x2e", "2x0e+3x1o", "ir_mul")
    ours.requires_grad_(False)
    x = torch.randn(4, ours.irreps_in.dim, dtype=torch.float64)
    want = ours(x)
    assert "_terms" in ours.__dict__
    buf = io.BytesIO()
    torch.save(ours, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert "_terms" not in loaded.__dict__
    torch.testing.assert_close(loaded(x), want, rtol=0, atol=0)
