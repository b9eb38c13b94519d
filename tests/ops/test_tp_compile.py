"""torch.compile(fullgraph=True) and torch.export over equikernels ops (reference path on CPU)."""
import torch

from equikernels.catalog import problem
from equikernels.ops import tensor_product


def _inputs(p, n, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, p.dim_in1, generator=g, requires_grad=requires_grad)
    y = torch.randn(n, p.dim_in2, generator=g)
    w = torch.randn(n, p.weight_numel, generator=g)
    return x, y, w


def test_compile_fullgraph_forward_backward():
    p = problem("nequip-water")
    torch._dynamo.reset()

    x, y, w = _inputs(p, 5, requires_grad=True)
    compiled = torch.compile(lambda x, y, w: tensor_product(p, x, y, w).pow(2).sum(), fullgraph=True)
    e_c = compiled(x, y, w)
    e = tensor_product(p, x, y, w).pow(2).sum()
    torch.testing.assert_close(e_c, e)
    torch.testing.assert_close(torch.autograd.grad(e_c, x)[0], torch.autograd.grad(e, x)[0])
    # (double backward through a compiled graph is a PyTorch limitation: aot_autograd refuses it)


def test_no_graph_breaks():
    p = problem("tetris-poly-1")
    torch._dynamo.reset()
    x = torch.randn(3, p.dim_in1)
    y = torch.randn(3, p.dim_in2)
    w = torch.randn(p.weight_numel)
    explanation = torch._dynamo.explain(lambda a, b, c: tensor_product(p, a, b, c))(x, y, w)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


def test_export_dynamic_batch():
    p = problem("nequip-water")

    class M(torch.nn.Module):
        def forward(self, x, y, w):
            return tensor_product(p, x, y, w)

    x, y, w = _inputs(p, 4)
    n = torch.export.Dim("n")
    ep = torch.export.export(M(), (x, y, w), dynamic_shapes=({0: n}, {0: n}, {0: n}))
    x2, y2, w2 = _inputs(p, 9)
    torch.testing.assert_close(ep.module()(x2, y2, w2), tensor_product(p, x2, y2, w2))
