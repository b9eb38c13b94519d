"""The fused message passing of accelerated layers on the CPU backend: the original gather ->
product -> scatter-sum (no graph is sorted), with the numbers of the fused path."""
import pytest
import torch

import equikernels
from equikernels.adapters import fused


def _layer_inputs(num_nodes=7, num_edges=19):
    tp = equikernels.TensorProduct("4x0e+2x1o", "0e+1o", "4x0e+2x1o+4x1o+2x1e",
                                   [(0, 0, 0, "uvu", True), (1, 0, 1, "uvu", True), (0, 1, 2, "uvu", True),
                                    (1, 1, 3, "uvu", True)],
                                   shared_weights=False, internal_weights=False).double()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(num_nodes, tp.irreps_in1.dim, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randn(num_edges, tp.irreps_in2.dim, generator=g, dtype=torch.float64)
    w = torch.randn(num_edges, tp.weight_numel, generator=g, dtype=torch.float64, requires_grad=True)
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    dst = torch.randint(0, num_nodes - 1, (num_edges,), generator=g)  # the last node receives nothing
    return tp, x, y, w, src, dst, num_nodes


def _expected(tp, x, y, w, src, dst, n):
    msg = tp(x[src], y, w)
    return torch.zeros(n, msg.shape[1], dtype=msg.dtype).index_add(0, dst, msg)


def test_cpu_backend_gathers_and_scatters_without_a_graph(monkeypatch):
    tp, x, y, w, src, dst, n = _layer_inputs()

    def no_graph(*args, **kwargs):
        raise AssertionError("the CPU backend must not sort a graph")

    monkeypatch.setattr(fused, "shared_graph", no_graph)
    out = fused.message_passing(tp, x, y, w, src, dst, n)
    ref = _expected(tp, x, y, w, src, dst, n)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    gx, gw = torch.autograd.grad(out.square().sum(), (x, w))
    rx, rw = torch.autograd.grad(ref.square().sum(), (x, w))
    torch.testing.assert_close(gx, rx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gw, rw, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_other_backends_use_the_shared_graph(backend, monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_BACKEND", backend)
    tp, x, y, w, src, dst, n = _layer_inputs()
    calls = []
    real = fused.shared_graph
    monkeypatch.setattr(fused, "shared_graph", lambda *a: calls.append(1) or real(*a))
    out = fused.message_passing(tp, x, y, w, src, dst, n)
    assert calls
    torch.testing.assert_close(out, _expected(tp, x, y, w, src, dst, n), rtol=1e-10, atol=1e-10)


def test_shared_graph_rejects_out_of_range_nodes():
    from equikernels.adapters import shared_graph  # noqa: PLC0415

    src, dst = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3], dtype=torch.int32)
    with pytest.raises(IndexError, match=r"dst: node indices must lie in \[0, 3\)"):
        shared_graph(src, dst, 3)
    g = shared_graph(src, dst, 4)
    assert g.num_nodes == 4 and torch.equal(g.dst, dst.long())


def test_clear_shared_forgets_the_graph():
    from equikernels.adapters import shared_graph  # noqa: PLC0415
    from equikernels.adapters.graph_cache import clear_shared  # noqa: PLC0415

    src, dst = torch.tensor([0, 1]), torch.tensor([1, 0])
    g = shared_graph(src, dst, 2)
    assert shared_graph(src, dst, 2) is g
    clear_shared()
    assert shared_graph(src, dst, 2) is not g
