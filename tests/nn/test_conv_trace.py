"""``TensorProductConv`` under torch.jit.trace: the saved and loaded trace gives the module's numbers and
gradients on other graphs (other node and edge counts), every layout and weight form, float64."""
import io

import pytest
import torch
from e3nn import o3

from equikernels.nn import TensorProductConv
from equikernels.ops import ConvGraph

F64 = dict(dtype=torch.float64)


def _conv(layout, shared, backend):
    fc = o3.FullyConnectedTensorProduct("3x0e+2x1o", "0e+1o", "2x0e+3x1o")
    ins = [(i.i_in1, i.i_in2, i.i_out, i.connection_mode, i.has_weight) for i in fc.instructions]
    return TensorProductConv("3x0e+2x1o", "0e+1o", "2x0e+3x1o", ins, shared_weights=shared, internal_weights=shared,
                             layout=layout, backend=backend).double()


def _graph(n, e, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)


class _Edges(torch.nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv = conv

    def forward(self, x, y, w, src, dst):
        return self.conv(x, y, w if w.numel() else None, src, dst)


@pytest.mark.parametrize("backend", ["triton", "cpu"])
@pytest.mark.parametrize("layout,shared", [("mul_ir", True), ("ir_mul", False)])
def test_traced_convolution_saved_and_loaded(layout, shared, backend):
    torch.manual_seed(0)
    conv = _conv(layout, shared, backend)
    nw = 0 if shared else conv.weight_numel

    def operands(n, e, seed):
        src, dst = _graph(n, e, seed)
        return torch.randn(n, 9, **F64), torch.randn(e, 4, **F64), torch.randn(e, nw, **F64), src, dst
    buf = io.BytesIO()
    torch.jit.save(torch.jit.trace(_Edges(conv), operands(5, 7, 1)), buf)
    buf.seek(0)
    traced = torch.jit.load(buf)
    x, y, w, src, dst = operands(8, 13, 2)
    xt, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = traced(xt, y, w, src, dst), conv(xr, y, w if nw else None, src, dst)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert want.abs().max() > 1e-3
    g = torch.randn_like(got)
    torch.testing.assert_close(torch.autograd.grad(got, xt, g)[0], torch.autograd.grad(want, xr, g)[0],
                               rtol=1e-12, atol=1e-12)


def test_traced_convolution_takes_a_built_graph():
    conv = _conv("mul_ir", True, "triton")
    src, dst = _graph(5, 9, 3)
    x, y = torch.randn(5, 9, **F64), torch.randn(9, 4, **F64)

    class OnGraph(torch.nn.Module):
        def __init__(self, graph):
            super().__init__()
            self.conv, self.graph = conv, graph

        def forward(self, x, y):
            return self.conv(x, y, graph=self.graph)
    graph = ConvGraph.build(src, dst, 5)
    traced = torch.jit.trace(OnGraph(graph), (x, y))
    torch.testing.assert_close(traced(x, y), conv(x, y, graph=graph), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="graph: built for 6 nodes, but num_nodes is 5"):
        torch.jit.trace(OnGraph(ConvGraph.build(src, dst, 6)), (x, y))  # as the module's own call
