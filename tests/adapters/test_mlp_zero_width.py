"""accelerate on an e3nn FullyConnectedNet with a hidden layer of width 0 gives e3nn's numbers."""
import torch
from e3nn import nn as enn

import equikernels


def test_a_zero_width_hidden_layer_accelerates():
    torch.manual_seed(0)
    net = torch.nn.Sequential(enn.FullyConnectedNet([4, 0, 3], torch.nn.functional.silu)).double()
    x = torch.randn(5, 4, dtype=torch.float64)
    ref = net(x)
    equikernels.accelerate(net)
    assert type(net[0]).__module__.startswith("equikernels")
    torch.testing.assert_close(net(x), ref, rtol=0, atol=0)
