"""accelerate keeps a user subclass of e3nn's FullyConnectedNet that overrides forward (and says why)."""
import copy

import torch

import equikernels
from e3nn import nn as enn


class _ShiftedNet(enn.FullyConnectedNet):
    def forward(self, x):
        return super().forward(x) * 2 + 1


class _PlainSubclass(enn.FullyConnectedNet):
    pass


def test_subclass_overriding_forward_is_not_fused():
    torch.manual_seed(0)
    model = torch.nn.Sequential(_ShiftedNet([3, 4, 2], torch.tanh))
    ref = copy.deepcopy(model)
    report = equikernels.accelerate(model)
    assert report.fused_names == []
    assert [(n, why) for n, _, why in report.not_fused] == [("0", "_ShiftedNet overrides forward(); its semantics are unknown")]
    assert type(model[0]) is _ShiftedNet
    x = torch.randn(5, 3, dtype=torch.float64)
    model.double(), ref.double()
    torch.testing.assert_close(model(x), ref(x), rtol=1e-12, atol=1e-12)


def test_subclass_keeping_forward_is_fused():
    torch.manual_seed(0)
    model = torch.nn.Sequential(_PlainSubclass([3, 4, 2], torch.tanh)).double()
    ref = copy.deepcopy(model)
    report = equikernels.accelerate(model)
    assert report.fused_names == ["0"]
    x = torch.randn(5, 3, dtype=torch.float64)
    torch.testing.assert_close(model(x), ref(x), rtol=1e-12, atol=1e-12)
