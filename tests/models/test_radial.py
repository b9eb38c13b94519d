"""equikernels.models.radial: the radial MLP's SiLU runs the one-pass second derivative."""
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
