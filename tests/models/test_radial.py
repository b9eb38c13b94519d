"""equikernels.models.radial: the radial MLP's SiLU runs the one-pass second derivative."""
import pytest
import torch
from e3nn import nn as e3nn_nn

from equikernels.models.radial import RadialMLP
from problems import double_grads, silu_second_order_calls


def test_radial_mlp_second_derivative_matches_e3nn_in_one_pass_per_layer(monkeypatch):
    seen = silu_second_order_calls(monkeypatch)
    torch.manual_seed(0)
    ref = e3nn_nn.FullyConnectedNet([10, 16, 16, 24], torch.nn.functional.silu).double()
    ours = RadialMLP([10, 16, 16, 24]).double()
    with torch.no_grad():
        for a, b in zip(ours.layers, ref):
            a.weight.copy_(b.weight)
    x = torch.randn(7, 10, dtype=torch.float64, requires_grad=True)
    for a, b in zip(double_grads(ours, x), double_grads(ref, x)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert seen == [(7, 16), (7, 16)]


@pytest.mark.parametrize("paired", [False, True])
@pytest.mark.parametrize("hs, act", [([6, 16, 16, 24], "silu"), ([6, 16, 24], "tanh"), ([6, 24], "silu")])
def test_row_scale_equals_scaling_the_output(paired, hs, act):
    """``row_scale`` (the cutoff of models that apply it to the weights) scales the last layer's
    input; values and derivatives to second order equal scaling the output."""
    torch.manual_seed(1)
    mlp = RadialMLP(hs, act).double()
    x = torch.randn(5, hs[0], dtype=torch.float64, requires_grad=True)
    c = torch.rand(5, 1, dtype=torch.float64, requires_grad=True)

    def scaled(x, c):
        return mlp(x, paired=paired, row_scale=c)

    def reference(x, c):
        out = mlp(x) * c
        return torch.cat((out, out)) if paired else out

    torch.testing.assert_close(scaled(x, c), reference(x, c), rtol=1e-12, atol=1e-12)

    def second_order(f):  # a force-training-like second order, in (x, c, parameters)
        (gx,) = torch.autograd.grad(f(x, c).sin().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), [x, c] + list(mlp.parameters()))

    for a, b in zip(second_order(scaled), second_order(reference)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradgradcheck(scaled, (x, c))
