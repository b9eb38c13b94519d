"""ConvGraph: the (dst, src) and (src, dst) orders and CSR offsets its kernels walk, with sort keys
of either width."""
import pytest
import torch

from equikernels.ops import graph as G


def _expected(key, tie, n):
    order = sorted(range(len(key)), key=lambda e: (int(key[e]), int(tie[e]), e))
    counts = torch.bincount(key, minlength=n)
    return torch.tensor(order, dtype=torch.int64), torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("n,e", [(1, 3), (7, 40), (50, 600)])
def test_orders_and_offsets(monkeypatch, wide, n, e):
    if wide:  # every graph takes the int64 keys
        monkeypatch.setattr(G, "INT32_KEYS_MAX_NODES", 0)
    gen = torch.Generator().manual_seed(n * 1000 + e)
    src = torch.randint(0, n, (e,), generator=gen)
    dst = torch.randint(0, n, (e,), generator=gen)
    src[:5], dst[:5] = src[0], dst[0]  # repeated edges: the stable order keeps them as given
    g = G.ConvGraph.build(src.int(), dst, n)
    for perm, ptr, key, tie in ((g.perm_dst, g.ptr_dst, dst, src), (g.perm_src, g.ptr_src, src, dst)):
        want_perm, want_ptr = _expected(key, tie, n)
        assert perm.dtype == torch.int64 and ptr.dtype == torch.int64
        assert torch.equal(perm, want_perm) and torch.equal(ptr, want_ptr)
    assert g.src.dtype == torch.int64 and torch.equal(g.src, src)


def test_int32_keys_hold_the_largest_graph_they_are_used_for():
    n = G.INT32_KEYS_MAX_NODES
    assert (n - 1) * (n + 1) + (n - 1) <= torch.iinfo(torch.int32).max
    key = torch.tensor([n - 1, 0, n - 1, 5])
    tie = torch.tensor([n - 1, n - 1, 0, 5])
    perm, ptr = G._order(key, tie, n)
    assert perm.tolist() == [1, 3, 2, 0]
    assert ptr[0] == 0 and ptr[1] == 1 and ptr[6] == 2 and ptr[n - 1] == 2 and ptr[n] == 4


@pytest.mark.parametrize("n,h", [(1, 3), (7, 40), (50, 600)])
def test_paired_source_order_from_the_destination_order(n, h):
    """``paired`` (edge H + p = edge p reversed): the source order is the destination order's reverse
    edges; each node's source segment holds the edges leaving it, sorted by destination."""
    gen = torch.Generator().manual_seed(n * 1000 + h)
    a, b = torch.randint(0, n, (h,), generator=gen), torch.randint(0, n, (h,), generator=gen)
    src, dst = torch.cat((a, b)), torch.cat((b, a))
    g = G.ConvGraph.build(src, dst, n, paired=True)
    full = G.ConvGraph.build(src, dst, n)
    assert torch.equal(g.perm_dst, full.perm_dst) and torch.equal(g.ptr_src, full.ptr_src)
    for k in range(n):
        seg = g.perm_src[g.ptr_src[k]:g.ptr_src[k + 1]]
        assert (src[seg] == k).all() and (dst[seg].diff() >= 0).all()
        assert sorted(seg.tolist()) == sorted(full.perm_src[full.ptr_src[k]:full.ptr_src[k + 1]].tolist())
    with pytest.raises(ValueError, match="even"):
        G.ConvGraph.build(src[:-1], dst[:-1], n, paired=True)


def test_graph_to_another_device_moves_every_order():
    src, dst = torch.tensor([0, 2, 1, 2]), torch.tensor([1, 0, 2, 2])
    g = G.ConvGraph.build(src, dst, 3)
    assert g.to("cpu") is g and g.device == torch.device("cpu")
    m = g.to("meta")
    fields = ("src", "dst", "perm_dst", "ptr_dst", "perm_src", "ptr_src")
    assert m.device.type == "meta" and m.num_nodes == 3 and m.num_edges == 4
    for name in fields:
        assert getattr(m, name).device.type == "meta" and getattr(m, name).shape == getattr(g, name).shape, name


@pytest.mark.gpu
def test_graph_built_on_the_host_runs_on_the_gpu():
    from equikernels import ops
    from equikernels.catalog import uvu_problem
    from equikernels.problem import TPProblem

    p = TPProblem.create(**uvu_problem("4x0e+4x1o", "0e+1o", "4x0e+4x1o"))
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 6, (20,), generator=gen), torch.randint(0, 6, (20,), generator=gen)
    dev = torch.device("cuda")
    x, y, w = (torch.randn(n, d, generator=gen).to(dev) for n, d in ((6, p.dim_in1), (20, p.dim_in2),
                                                                    (20, p.weight_numel)))
    moved = G.ConvGraph.build(src, dst, 6).to(dev)
    built = G.ConvGraph.build(src.to(dev), dst.to(dev), 6)
    a = ops.tensor_product_conv(p, x, y, w, None, None, 6, graph=moved)
    b = ops.tensor_product_conv(p, x, y, w, None, None, 6, graph=built)
    assert torch.equal(a, b)
