"""e3nn's FullyConnectedNet through accelerate: the same function and derivatives (float64, to
second order) with its activation constants folded into the weights, the same state_dict, no
elementwise pass over the activations besides the activation itself."""
import copy
import pickle

import pytest
import torch
from e3nn import nn as e3nn_nn
from torch.utils._python_dispatch import TorchDispatchMode

import equikernels
from problems import double_grads, silu_second_order_calls

CASES = {
    "silu": dict(hs=[6, 16, 16, 5], act=torch.nn.functional.silu),
    "tanh, variances, out_act": dict(hs=[4, 8, 3], act=torch.tanh, variance_in=2.0, variance_out=0.5, out_act=True),
    "linear": dict(hs=[4, 7, 3], act=None, variance_out=3.0),
}


def _nets(kw):
    torch.manual_seed(0)
    net = e3nn_nn.FullyConnectedNet(**kw).double()
    acc = copy.deepcopy(net)
    report = equikernels.accelerate(acc)
    return net, acc, report


@pytest.mark.parametrize("case", list(CASES))
def test_same_function_to_second_order(case):
    net, acc, report = _nets(CASES[case])
    assert type(acc).__name__ == "FullyConnectedNet"
    assert [n for n, *_ in report.fused] == [""], str(report)
    x = torch.randn(11, net.hs[0], dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(acc(x), net(x), rtol=1e-13, atol=1e-13)
    g = torch.randn(11, net.hs[-1], dtype=torch.float64)
    for params in (False, True):
        acc.requires_grad_(params)
        net.requires_grad_(params)
        ins = [x] + (list(net.parameters()) if params else [])
        ins_acc = [x] + (list(acc.parameters()) if params else [])
        ref = torch.autograd.grad((net(x) * g).sum(), ins, create_graph=True)
        got = torch.autograd.grad((acc(x) * g).sum(), ins_acc, create_graph=True)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        if not ref[0].requires_grad:  # linear in x, weights frozen: no second derivative
            assert not got[0].requires_grad
            continue
        ref2 = torch.autograd.grad(ref[0].square().sum(), x, allow_unused=True)[0]
        got2 = torch.autograd.grad(got[0].square().sum(), x, allow_unused=True)[0]
        if ref2 is None:  # linear in x
            assert got2 is None
        else:
            torch.testing.assert_close(got2, ref2, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(acc, (x,))
    assert torch.autograd.gradgradcheck(acc, (x,))


def test_state_dict_pickle_and_weight_changes():
    net, acc, _ = _nets(CASES["silu"])
    assert list(acc.state_dict()) == list(net.state_dict())
    plain = e3nn_nn.FullyConnectedNet(**CASES["silu"]).double()
    plain.load_state_dict(acc.state_dict())
    x = torch.randn(5, 6, dtype=torch.float64)
    acc.requires_grad_(False)
    acc(x)  # fills the scaled-weight cache
    with torch.no_grad():
        acc.layer1.weight.mul_(2.0)
        net.layer1.weight.mul_(2.0)
    torch.testing.assert_close(acc(x), net(x), rtol=1e-13, atol=1e-13)
    again = pickle.loads(pickle.dumps(acc))
    torch.testing.assert_close(again(x), net(x), rtol=1e-13, atol=1e-13)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((str(func.overloadpacket.__name__), [tuple(a.shape) for a in args if torch.is_tensor(a)]))
        return func(*args, **(kwargs or {}))


def test_no_elementwise_pass_over_the_activations():
    net, acc, _ = _nets(CASES["silu"])
    acc.requires_grad_(False)
    x = torch.randn(13, 6, dtype=torch.float64)
    acc(x)
    with _Ops() as seen:
        acc(x)
    names = [n for n, _ in seen.ops]
    assert names.count("mm") == 3 and names.count("silu") == 2, seen.ops
    assert not [op for op in seen.ops if op[0] in ("mul", "div") and any(s and s[0] == 13 for s in op[1])], seen.ops


def test_trained_weights_are_not_scaled_per_call():
    """Weights that take gradients: each layer is one product whose alpha is the layer's scale."""
    net, acc, _ = _nets(CASES["silu"])
    x = torch.randn(13, 6, dtype=torch.float64)
    acc(x)
    with _Ops() as seen:
        out = acc(x)
    names = [n for n, _ in seen.ops]
    assert names.count("addmm") == 3 and "mul" not in names and "mm" not in names, seen.ops
    torch.testing.assert_close(out, net(x), rtol=1e-13, atol=1e-13)


def test_silu_second_derivative_in_one_pass_per_layer(monkeypatch):
    """Force training differentiates the MLP twice: each SiLU layer's second derivative is the fused
    ``ops.silu`` pass, with e3nn's values."""
    seen = silu_second_order_calls(monkeypatch)
    net, acc, _ = _nets(CASES["silu"])
    x = torch.randn(9, net.hs[0], dtype=torch.float64, requires_grad=True)
    for a, b in zip(double_grads(acc, x), double_grads(net, x)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert seen == [(9, 16), (9, 16)]


def test_a_second_accelerate_reports_the_layers_it_finds_accelerated():
    from e3nn.nn import FullyConnectedNet

    model = torch.nn.Sequential(FullyConnectedNet([4, 8, 2], torch.nn.functional.silu))
    assert equikernels.accelerate(model).fused_names == ["0"]
    again = equikernels.accelerate(model)
    assert again.fused == [] and again.already == [("0", "FullyConnectedNet")]
    assert "1 layer(s) accelerated by an earlier call" in str(again)
