"""Accelerated e3nn layers (FullyConnectedNet, Gate) used as e3nn users use them: any leading batch
dimensions, TorchScript (``torch.jit.script``, ``e3nn.util.jit.compile``), ``torch.compile`` after a
deepcopy, and a second ``accelerate`` call; a fused message-passing layer whose product
``e3nn.util.jit.compile`` scripted in place."""
import copy
import warnings

import pytest
import torch
from e3nn import nn as e3nn_nn
from e3nn.util.jit import compile as e3nn_compile

import equikernels
from message_layers import MessageConv as _Conv


def _accelerated(module):
    model = torch.nn.Sequential(copy.deepcopy(module))
    equikernels.accelerate(model)
    return model[0]


def _mlp():
    torch.manual_seed(0)
    return e3nn_nn.FullyConnectedNet([3, 8, 4], torch.nn.functional.silu)


def _gate():
    return e3nn_nn.Gate("2x0e", [torch.tanh], "1x0e", [torch.sigmoid], "1x1o")


@pytest.mark.parametrize("shape", [(2, 3), (), (2, 0)])
def test_mlp_takes_any_leading_dimensions(shape):
    net = _mlp()
    acc = _accelerated(net)
    x = torch.randn(*shape, 3)
    torch.testing.assert_close(acc(x), net(x))


def test_mlp_scripts_as_e3nn_does():
    net = _mlp()
    acc = _accelerated(net)
    x = torch.randn(5, 3)
    torch.testing.assert_close(torch.jit.script(acc)(x), net(x))
    torch.testing.assert_close(e3nn_compile(copy.deepcopy(acc))(x), net(x))
    torch.testing.assert_close(acc(x), net(x))  # the eager module still runs its own forward


def test_gate_compiles_with_e3nn_compile():
    gate = _gate()
    acc = _accelerated(gate)
    x = torch.randn(5, 6)
    torch.testing.assert_close(e3nn_compile(copy.deepcopy(acc))(x), gate(x))


def test_gate_deepcopy_then_torch_compile():
    gate = _gate()
    acc = copy.deepcopy(_accelerated(gate))
    x = torch.randn(5, 6)
    torch.testing.assert_close(torch.compile(acc, backend="eager")(x), gate(x))


def test_accelerating_twice_does_not_report_fused_layers_as_left_alone():
    model = torch.nn.Sequential(_mlp(), torch.nn.Linear(4, 6), _gate())
    first = equikernels.accelerate(model)
    assert sorted(first.fused_names) == ["0", "2"]
    second = equikernels.accelerate(model)
    assert second.left_alone == [] and second.fused == [], str(second)


def _conv_inputs(conv):
    g = torch.Generator().manual_seed(0)
    src, dst = torch.tensor([0, 1, 2, 2, 3]), torch.tensor([1, 0, 3, 1, 2])
    return (torch.randn(4, 5, generator=g), torch.randn(5, 4, generator=g),
            torch.randn(5, conv.tp.weight_numel, generator=g), src, dst)


@pytest.mark.parametrize("called_first", [False, True])
def test_fused_layer_runs_after_e3nn_compile_scripts_its_product(called_first):
    torch.manual_seed(0)
    conv = _Conv()
    args = _conv_inputs(conv)
    acc = copy.deepcopy(conv)
    report = equikernels.accelerate(acc)
    assert report.fused_names == [""], str(report)
    acc.tp.backend = "triton"  # the fused kernel path, as on a GPU
    acc = copy.deepcopy(acc)  # the fused forward is rebuilt on the next call
    if called_first:
        acc(*args)
    compiled = e3nn_compile(acc)  # scripts the product in place
    assert isinstance(compiled.tp, torch.jit.ScriptModule)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the rebuild, when it comes now, cannot fuse a scripted product
        torch.testing.assert_close(compiled(*args), conv(*args))


class _RadialConv(_Conv):
    def __init__(self):
        super().__init__()
        self.radial = torch.nn.Linear(1, self.tp.weight_numel)  # where the model's parameters are


def test_report_says_how_a_fused_layer_runs_on_the_cpu():
    text = str(equikernels.accelerate(_RadialConv()))
    assert "fused       <root>" in text
    assert "on the CPU, a fused convolution runs its gather, product and scatter-sum as separate steps" in text
    if torch.cuda.is_available():
        assert "on the CPU" not in str(equikernels.accelerate(_RadialConv().cuda()))


def test_report_has_no_cpu_note_where_a_chosen_backend_runs_kernels(monkeypatch):
    from equikernels import settings
    monkeypatch.setenv("EQUIKERNELS_BACKEND", "reference")
    settings.reload()
    try:
        text = str(equikernels.accelerate(_RadialConv()))
    finally:
        monkeypatch.delenv("EQUIKERNELS_BACKEND")
        settings.reload()
    assert "fused       <root>" in text and "on the CPU" not in text
