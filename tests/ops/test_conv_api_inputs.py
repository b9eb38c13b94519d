"""Inputs to the convolution's public API that a user of e3nn may pass: an output node count other
than x's rows (fused dataflows, gradients to second order), integer weights, numpy node counts,
meta tensors and indices on another device; plus the catalog's and the module's argument errors."""
import numpy as np
import pytest
import torch

from equikernels import ConvGraph, TensorProductConv
from equikernels.catalog import problem
from equikernels.ops import tensor_product_conv
from equikernels.problem import TPProblem


def _problem(shared=False):
    return TPProblem.create("2x0e+1x1o", "0e+1o", "2x0e+1x1o+1x0e",
                            [(0, 0, 0, "uvu", True), (1, 1, 2, "uvu", True), (1, 0, 1, "uvu", True)],
                            shared_weights=shared, internal_weights=False)


def _inputs(p, nx, n_out, e, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(0, min(nx, n_out), (e,), generator=g)
    dst = torch.randint(0, n_out, (e,), generator=g)
    x = torch.randn(nx, p.dim_in1, generator=g, dtype=dtype)
    y = torch.randn(e, p.dim_in2, generator=g, dtype=dtype)
    w = torch.randn(*((p.weight_numel,) if p.shared_weights else (e, p.weight_numel)), generator=g, dtype=dtype)
    return x, y, w, src, dst


@pytest.mark.parametrize("flow, nx, n_out", [("deterministic", 4, 6), ("deterministic", 6, 4), ("atomic", 4, 6)])
def test_fused_gradients_when_num_nodes_differs_from_x_rows(nx, n_out, flow):
    """num_nodes (output rows) above or below x's rows: x's gradient keeps x's shape, and the
    derivatives to second order match the reference convolution."""
    p = _problem()
    x, y, w, src, dst = _inputs(p, nx, n_out, 7)
    grads = []
    for backend, dataflow in (("reference", "auto"), ("triton", flow)):
        ops = [t.clone().requires_grad_() for t in (x, y, w)]
        out = tensor_product_conv(p, *ops, src, dst, n_out, backend=backend, dataflow=dataflow)
        assert out.shape == (n_out, p.dim_out)
        gs = torch.autograd.grad(out.pow(2).sum(), ops, create_graph=True)
        assert gs[0].shape == x.shape
        dd = torch.autograd.grad(sum(g.pow(2).sum() for g in gs), ops)
        grads.append((out,) + gs + dd)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("backend", ["cpu", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_integer_weight_is_refused(backend, dtype):
    p = _problem()
    x, y, w, src, dst = _inputs(p, 5, 5, 6, dtype)
    for bad in (w.long(), w.int(), w > 0):
        with pytest.raises(TypeError, match="weight: expected a float16, bfloat16, float32 or float64 tensor"):
            tensor_product_conv(p, x, y, bad, src, dst, backend=backend)


def test_numpy_node_count():
    p = _problem()
    x, y, w, src, dst = _inputs(p, 5, 5, 6)
    graph = ConvGraph.build(src, dst, np.int64(7))
    assert graph.num_nodes == 7 and type(graph.num_nodes) is int
    ref = tensor_product_conv(p, x, y, w, src, dst, 7)
    torch.testing.assert_close(tensor_product_conv(p, x, y, w, src, dst, np.int64(7)), ref)
    torch.testing.assert_close(tensor_product_conv(p, x, y, w, src, dst, np.int32(7), graph=graph), ref)
    with pytest.raises(ValueError, match=r"num_nodes: expected a non-negative int, got 7.0 \(float\)"):
        ConvGraph.build(src, dst, 7.0)
    with pytest.raises(ValueError, match="num_nodes: expected a non-negative int"):
        ConvGraph.build(src, dst, torch.tensor(7))


def test_meta_tensors_give_shapes():
    p = _problem()
    x, y, w, src, dst = (t.to("meta") for t in _inputs(p, 5, 5, 6))
    assert tensor_product_conv(p, x, y, w, src, dst).shape == (5, p.dim_out)
    graph = ConvGraph.build(src, dst, 5)
    assert tensor_product_conv(p, x, y, w, src.clone(), dst.clone(), graph=graph).shape == (5, p.dim_out)


def test_indices_on_another_device_than_x():
    p = _problem()
    x, y, w, src, dst = _inputs(p, 5, 5, 6)
    with pytest.raises(ValueError, match=r"src/dst: device meta does not match x \(cpu\)"):
        tensor_product_conv(p, x, y, w, src.to("meta"), dst.to("meta"))
    with pytest.raises(ValueError, match=r"src/dst: device meta does not match x \(cpu\)"):
        tensor_product_conv(p, x, y, w, None, None, graph=ConvGraph.build(src.to("meta"), dst.to("meta"), 5))


def test_unknown_catalog_name_lists_the_names():
    with pytest.raises(KeyError, match="unknown name 'mace'; expected one of .*mace-mp-medium-L2"):
        problem("mace")


def test_module_checks_dataflow_when_built():
    args = ("2x0e", "0e", "2x0e", [(0, 0, 0, "uvu", True)])
    with pytest.raises(ValueError, match="dataflow: expected one of"):
        TensorProductConv(*args, dataflow="fused")
    with pytest.raises(ValueError, match="dataflow='atomic' is not deterministic"):
        TensorProductConv(*args, dataflow="atomic", deterministic=True)
