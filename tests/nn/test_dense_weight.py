"""nn._dense_weight: a trained Linear weight spread into its dense matrix as one op whose backward
is its adjoint, differentiable to any order; Linear's weights under torch.func transforms."""
import pytest
import torch
from torch.func import functional_call, vmap

from equikernels.nn import linear as L
from equikernels.nn._dense_weight import _Collect, spread
from linear_checks import linear_pair


def _places(numel=7, shape=(4, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    place = torch.randint(0, numel + 1, (shape[0] * shape[1],), generator=g)  # numel: a zero
    scale = torch.rand(shape[0] * shape[1], generator=g, dtype=torch.float64) + 0.5
    return place, scale


def test_values_and_adjoint():
    place, scale = _places()
    w = torch.randn(7, dtype=torch.float64)
    dense = spread(w, place, scale, (4, 5))
    want = torch.cat([w, w.new_zeros(1)])[place] * scale
    torch.testing.assert_close(dense.reshape(-1), want, rtol=0, atol=0)
    m = torch.randn(4, 5, dtype=torch.float64)
    collected = _Collect.apply(m, place, scale, 7)
    torch.testing.assert_close((dense * m).sum(), (w * collected).sum(), rtol=1e-13, atol=1e-13)


def test_derivatives_to_third_order():
    place, scale = _places(seed=1)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    f = lambda w_: spread(w_, place, scale, (4, 5)).pow(3)  # noqa: E731 (nonlinear: higher orders are not zero)
    assert torch.autograd.gradcheck(f, (w,))
    assert torch.autograd.gradgradcheck(f, (w,))
    g1 = lambda w_: torch.autograd.grad(f(w_).sum(), w_, create_graph=True)[0]  # noqa: E731
    assert torch.autograd.gradgradcheck(g1, (w,))


def test_a_trained_linear_records_one_node_for_its_weight(monkeypatch):
    monkeypatch.setattr(L, "DENSE_DEVICES", ("cpu",))
    _, ours = linear_pair("3x0e+2x1o+1x2e", "2x0e+3x1o+1x2e", "ir_mul")
    out = ours(torch.randn(4, ours.irreps_in.dim, dtype=torch.float64))
    nodes, stack = [], [out.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is not None:
            nodes.append(fn)
            stack.extend(e[0] for e in fn.next_functions)
    (spread_fn,) = [fn for fn in nodes if "Spread" in type(fn).__name__]
    assert [type(e[0]).__name__ for e in spread_fn.next_functions[:1]] == ["AccumulateGrad"]
    assert len(nodes) <= 5  # view, mm, spread, the weight's accumulator (and the input's view)


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("layout", ["ir_mul", "mul_ir"])
def test_weights_under_torch_func_transforms(monkeypatch, dense, layout):
    # model ensembles (vmap over weights), per-sample grads and forward mode reach the weight paths
    monkeypatch.setattr(L, "DENSE_DEVICES", ("cpu",) if dense else ())
    _, ours = linear_pair("3x0e+2x1o+1x2e", "2x0e+3x1o+1x2e", layout)
    x = torch.randn(4, ours.irreps_in.dim, dtype=torch.float64)
    ws = torch.randn(3, ours.weight.numel(), dtype=torch.float64)
    call = lambda w: functional_call(ours, {"weight": w}, (x,))  # noqa: E731
    torch.testing.assert_close(vmap(call)(ws), torch.stack([call(w) for w in ws]), rtol=1e-13, atol=1e-13)
    w = ws[0].clone().requires_grad_()
    (want,) = torch.autograd.grad(call(w).pow(2).sum(), w)
    torch.testing.assert_close(torch.func.grad(lambda w_: call(w_).pow(2).sum())(ws[0]), want, rtol=1e-12, atol=1e-12)
    _, tangent = torch.func.jvp(call, (ws[0],), (ws[1],))
    torch.testing.assert_close(tangent, call(ws[1]), rtol=1e-12, atol=1e-12)  # linear in the weights
