"""accelerate's report on containers and on a second call, and the accelerated e3nn Gate's input
checks and tracing after a copy."""
import copy
import pickle

import pytest
import torch

import equikernels as ek
from equikernels._compat import e3nn  # noqa: F401  (safe e3nn import first)
from e3nn import nn as e3nn_nn, o3  # noqa: E402


def _gate():
    return e3nn_nn.Gate("4x0e", [torch.nn.functional.silu], "2x0e", [torch.sigmoid], "2x1o")


def _external_tp():
    return o3.TensorProduct("3x0e+2x1o", "0e+1o", "3x0e+2x1o", [(0, 0, 0, "uvw", True), (1, 0, 1, "uvw", True)],
                            shared_weights=False, internal_weights=False)


@pytest.mark.parametrize("container", [lambda m: torch.nn.ModuleDict({"tp": m}), lambda m: torch.nn.ModuleList([m])])
def test_containers_are_not_reported_as_unfused_layers(container):
    report = ek.accelerate(container(_external_tp()))
    assert report.not_fused == [], str(report)
    assert len(report.replaced) == 1


def test_second_call_lists_the_convolutions_fused_before():
    from e3nn.nn.models.v2106.points_convolution import Convolution

    conv = Convolution("4x0e+2x1o", "2x0e", "0e+1o", "4x0e+2x1o", [3, 8], 3.0)
    model = torch.nn.Sequential()
    model.add_module("conv", conv)
    first = ek.accelerate(model)
    assert "conv" in first.fused_names, str(first)
    again = ek.accelerate(model)
    assert again.fused == [] and again.not_fused == [], str(again)
    assert ("conv", "Convolution") in again.already, str(again)


def test_gate_wrong_feature_dimension_names_the_argument():
    gate = _gate()
    ek.accelerate(gate)
    with pytest.raises(ValueError, match=r"features: expected last dimension 12 .* got shape \(5, 13\)"):
        gate(torch.randn(5, 13))


@pytest.mark.parametrize("copier", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))], ids=["deepcopy", "pickle"])
def test_copied_gate_traces(copier):
    torch.manual_seed(0)
    gate = _gate()
    x = torch.randn(5, 12)
    want = gate(x)
    ek.accelerate(gate)
    traced = torch.jit.trace(copier(gate), (x,))  # its first call is the trace (and the trace's check)
    torch.testing.assert_close(traced(x[:3]), want[:3])


def test_call_without_fusing_lists_layers_fused_before_as_already():
    model = torch.nn.Sequential(_gate(), e3nn_nn.FullyConnectedNet([3, 8, 4], torch.nn.functional.silu))
    first = ek.accelerate(model)
    assert {"0", "1"} <= set(first.fused_names), str(first)
    again = ek.accelerate(model, fuse=False)
    assert {n for n, _ in again.already} == {"0", "1"}, str(again)
    assert [n for n, _, _ in again.left_alone if n in ("0", "1")] == [], str(again)
