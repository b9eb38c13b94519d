"""Accelerated e3nn layers as e3nn users drive them: FullyConnectedNet under torch.func (a transform
leaves nothing behind that breaks later calls; frozen weights stacked into an ensemble are read as the
transform gives them), Gate under torch.compile."""
import copy
import io

import pytest
import torch
from e3nn import nn as e3nn_nn
from torch.func import functional_call, grad, stack_module_state, vmap

import equikernels

F64 = dict(dtype=torch.float64)


def _nets():
    torch.manual_seed(0)
    net = e3nn_nn.FullyConnectedNet([3, 8, 4], torch.nn.functional.silu).double()
    acc = copy.deepcopy(net)
    equikernels.accelerate(torch.nn.Sequential(acc))
    return net, acc


def test_calls_after_a_vmap_still_run():
    net, acc = _nets()
    x = torch.randn(5, 3, **F64)
    torch.testing.assert_close(vmap(acc)(x), vmap(net)(x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad(lambda t: acc(t).sum())(x), grad(lambda t: net(t).sum())(x),
                               rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(acc(x), net(x), rtol=1e-12, atol=1e-12)


def test_frozen_ensemble_under_vmap():
    net, acc = _nets()
    x = torch.randn(5, 3, **F64)

    def ensemble(model):
        model.requires_grad_(False)
        params, bufs = stack_module_state([copy.deepcopy(model) for _ in range(2)])
        return vmap(lambda p, b: functional_call(model, (p, b), (x,)))(params, bufs)

    torch.testing.assert_close(ensemble(acc), ensemble(net), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("frozen", [False, True])
def test_gate_under_torch_compile(frozen):
    torch.manual_seed(0)
    gate = e3nn_nn.Gate("3x0e+2x0o", [torch.relu, torch.abs], "2x0e+1x0o", [torch.sigmoid, torch.tanh],
                        "1x1o+1x2e+1x1e")
    acc = copy.deepcopy(gate)
    assert equikernels.accelerate(torch.nn.Sequential(acc)).fused
    acc.requires_grad_(not frozen)
    torch._dynamo.reset()
    compiled = torch.compile(acc, backend="eager", fullgraph=True)
    for rows in (5, 7):
        x = torch.randn(rows, gate.irreps_in.dim, **F64)
        torch.testing.assert_close(compiled(x), gate(x), rtol=1e-12, atol=1e-12)


def test_frozen_mlp_under_torch_compile_fullgraph():
    net, acc = _nets()
    acc.requires_grad_(False)
    torch._dynamo.reset()
    compiled = torch.compile(acc, backend="eager", fullgraph=True)
    x = torch.randn(5, 3, **F64)
    torch.testing.assert_close(compiled(x), net(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("frozen", [False, True])
def test_mlp_under_torch_jit_trace(frozen):
    net, acc = _nets()
    acc.requires_grad_(not frozen)
    x = torch.randn(5, 3, **F64)
    acc(x)
    traced = torch.jit.trace(acc, (x,))  # its check compares two more traces
    buf = io.BytesIO()
    torch.jit.save(traced, buf)  # holds torch's own operations only
    new = e3nn_nn.FullyConnectedNet([3, 8, 4], torch.nn.functional.silu).double().state_dict()
    traced.load_state_dict(new)
    net.load_state_dict(new)
    torch.testing.assert_close(traced(x), net(x), rtol=1e-12, atol=1e-12)
