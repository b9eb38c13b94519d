"""Fused graph convolution: every dataflow against e3nn TP + index_add (float64 oracle).

Graphs are random and awkward on purpose: not symmetric, duplicate edges, self-loops, isolated
nodes, a node with many more edges than the others. Outputs are NaN-poisoned before each kernel
runs, so unwritten elements show. The Triton kernels run in the interpreter on CPU.
"""
import pytest
import torch

import equikernels
from equikernels import ConvGraph
from equikernels.catalog import problem as catalog_problem
from equikernels.ops import tensor_product_conv
from equikernels.problem import TPProblem
from conv_checks import _inputs, awkward_graph, channelwise, check_conv
from problems import rel_err, second_order

FLOWS = ["atomic", "deterministic", "unfused"]


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")


@pytest.mark.parametrize("flow", FLOWS)
@pytest.mark.parametrize("layout,dtype,second", [("mul_ir", torch.float64, True), ("ir_mul", torch.float32, False)])
def test_channelwise_per_edge_weights(flow, layout, dtype, second):
    check_conv(channelwise(), flow, dtype, layout, second_order=second)


@pytest.mark.parametrize("conv_layout,min_edges,kernels", [("ir_mul", None, "ir_mul"), ("asked", None, "mul_ir"),
                                                              ("auto", 1, "ir_mul"), ("auto", 10 ** 9, "mul_ir")])
def test_mul_ir_in_either_kernel_layout(conv_layout, min_edges, kernels, monkeypatch):
    """mul_ir channel-wise products run ir_mul kernels on permuted node rows (ir_mul; auto from
    IR_MUL_MIN_EDGES edges) or mul_ir kernels (asked; auto below); all to second order against the
    oracle."""
    from equikernels.codegen import conv_planner
    from equikernels.ops import conv_fused
    seen = []
    spec_of = conv_fused.spec_of
    monkeypatch.setattr(conv_fused, "spec_of", lambda p, layout: seen.append(layout) or spec_of(p, layout))
    if min_edges is not None:
        monkeypatch.setattr(conv_planner, "IR_MUL_MIN_EDGES", min_edges)
    with equikernels.settings.override(conv_layout=conv_layout):
        check_conv(channelwise(), "atomic", torch.float64, "mul_ir")
    assert set(seen) == {kernels}


@pytest.mark.parametrize("flow", ["atomic", "deterministic"])
@pytest.mark.parametrize("parts,dtype", [(2, torch.float64), (4, torch.float32)])
def test_gradient_kernels_in_channel_parts(flow, parts, dtype, monkeypatch):
    """Gradient kernels split into channel parts (each a slice of every path's channels, the later
    parts writing into the first one's buffers and adding into gy / dy) match the oracle to second
    order, outputs poisoned."""
    from equikernels.codegen import conv as cc
    from equikernels.dtypes import math_dtype_of
    seen = []
    run = cc.ConvKernels._run

    def spy(self, kind, names, tensors, like, graph, cfg, have="", math=None):
        plan = self.conv_plan(kind, names, have, math_dtype_of(tensors.values(), math), cfg)
        seen.extend(st.channels for st in plan.steps)
        return run(self, kind, names, tensors, like, graph, cfg, have, math)
    monkeypatch.setattr(cc.ConvKernels, "_run", spy)
    with equikernels.settings.override(conv_channel_parts=parts):
        check_conv(channelwise("4x0e+4x1o", "0e+1o+2e", "0e+1o+1e+2e"), flow, dtype, "ir_mul",
                   second_order=dtype == torch.float64)
    assert (0, 4 // parts) in seen and (4 - 4 // parts, 4) in seen


@pytest.mark.parametrize("flow", ["atomic", "deterministic"])
@pytest.mark.parametrize("parts", [1, 2])
def test_double_backward_with_dg_carried(flow, parts, monkeypatch):
    """dg carried per node in the kernel of dx, dy, dw (one part, or two whose second adds into dy)
    matches the oracle in every second-order gradient, dg included, outputs poisoned."""
    from equikernels.codegen import conv as cc
    from equikernels.dtypes import math_dtype_of
    seen = []
    run = cc.ConvKernels._run

    def spy(self, kind, names, tensors, like, graph, cfg, have="", math=None):
        plan = self.conv_plan(kind, names, have, math_dtype_of(tensors.values(), math), cfg)
        seen.extend((kind, st.names, st.channels) for st in plan.steps)
        return run(self, kind, names, tensors, like, graph, cfg, have, math)
    monkeypatch.setattr(cc.ConvKernels, "_run", spy)
    with equikernels.settings.override(conv_dbwd_dg="fused", conv_channel_parts_dbwd=parts):
        check_conv(channelwise("4x0e+4x1o", "0e+1o+2e", "0e+1o+1e+2e"), flow, torch.float64, "ir_mul",
                   second_order=True)
    fused = [ch for kind, names, ch in seen if kind == "dbwd" and {"g", "x"} <= set(names)]
    # the old path (dg in a kernel of its own) would pass the oracle too: the fused kernel must have run
    assert fused and set(fused) == ({(0, 0)} if parts == 1 else {(0, 2), (2, 4)})
    assert not any(kind == "dbwd" and names == ("g",) for kind, names, _ in seen)


@pytest.mark.parametrize("flow", ["atomic", "deterministic"])
def test_ir_mul_double_backward(flow):
    check_conv(channelwise("2x0e+2x1o", "0e+1o", "0e+1o+1e"), flow, torch.float64, "ir_mul")


@pytest.mark.parametrize("flow", ["atomic", "deterministic"])
def test_shared_weights_fully_connected(flow):
    kw = dict(irreps_in1="3x0e+2x1o", irreps_in2="1x0e+1x1o", irreps_out="2x0e+3x1o",
              instructions=[(0, 0, 0, "uvw", True), (1, 1, 0, "uvw", True), (0, 1, 1, "uvw", True),
                            (1, 0, 1, "uvw", True)], shared_weights=True, internal_weights=False)
    check_conv(kw, flow, torch.float64, "mul_ir")


@pytest.mark.parametrize("flow", ["atomic", "deterministic"])
def test_mace_shaped_problem(flow):
    """The MACE-MP medium layer-2 problem (10 paths, l up to 3), shrunk to few channels."""
    check_conv(channelwise("3x0e+2x1o", "0e+1o+2e+3o", "0e+1o+2e+3o+1e+2o+3e"), flow, torch.float64, "ir_mul",
               n=5, e=9, second_order=False)


@pytest.mark.parametrize("flow", ["atomic", "deterministic"])
def test_empty_graph_and_isolated_nodes(flow):
    p = TPProblem.create(**channelwise())
    x, y, w = _inputs(p, 5, 0, torch.float64)
    e = torch.zeros(0, dtype=torch.long)
    out = tensor_product_conv(p, x.requires_grad_(), y, w, e, e, backend="triton", dataflow=flow)
    assert out.shape == (5, p.dim_out) and (out == 0).all()
    out.sum().backward()
    assert (x.grad == 0).all()


def test_deterministic_is_bitwise_reproducible_and_order_independent():
    kw = channelwise()
    p = TPProblem.create(**kw)
    n, e = 6, 16
    src, dst = awkward_graph(n, e, 3)
    # distinct (dst, src) pairs so that any permutation of the input edges sorts to one order
    pairs = sorted(set(zip(dst.tolist(), src.tolist())))
    dst = torch.tensor([d for d, _ in pairs])
    src = torch.tensor([s for _, s in pairs])
    x, y, w = _inputs(p, n, len(pairs), torch.float32, 3)
    x, y, w = (t.float() for t in (x, y, w))

    def run(perm):
        xs, ys, ws = x.clone().requires_grad_(), y[perm].clone().requires_grad_(), w[perm].clone().requires_grad_()
        out = tensor_product_conv(p, xs, ys, ws, src[perm], dst[perm], backend="triton", dataflow="deterministic")
        gx, gy, gw = torch.autograd.grad(out, (xs, ys, ws), torch.ones_like(out))
        inv = torch.argsort(perm)
        return out, gx, gy[inv], gw[inv]

    ident = torch.arange(len(pairs))
    first = run(ident)
    for perm in (ident, torch.randperm(len(pairs), generator=torch.Generator().manual_seed(1))):
        again = run(perm)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


def test_gradcheck_and_gradgradcheck_fused():
    kw = channelwise("2x0e+1x1o", "0e+1o", "0e+1o+1e")
    p = TPProblem.create(**kw)
    src, dst = awkward_graph(4, 5, 1)
    x, y, w = (t.requires_grad_() for t in _inputs(p, 4, 5, torch.float64))
    for flow in ("atomic", "deterministic"):
        f = lambda a, b, c: tensor_product_conv(p, a, b, c, src, dst, backend="triton", dataflow=flow)  # noqa: E731
        # fast mode (random projections): the full Jacobians cost minutes in the interpreter
        assert torch.autograd.gradcheck(f, (x, y, w), fast_mode=True)
        assert torch.autograd.gradgradcheck(f, (x, y, w), fast_mode=True)


def test_third_order_does_not_crash():
    p = TPProblem.create(**channelwise("2x0e+1x1o", "0e+1o", "0e+1o"))
    src, dst = awkward_graph(4, 6, 2)
    x, y, w = (t.requires_grad_() for t in _inputs(p, 4, 6, torch.float64))
    out = tensor_product_conv(p, x, y, w, src, dst, backend="triton", dataflow="deterministic")
    (gx,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
    (gy,) = torch.autograd.grad(gx.pow(2).sum(), y, create_graph=True)
    (gw,) = torch.autograd.grad(gy.pow(2).sum(), w)
    assert gw.abs().sum() > 0


def test_int32_indices_and_graph_reuse():
    p = TPProblem.create(**channelwise())
    src, dst = awkward_graph(9, 20, 4)
    x, y, w = _inputs(p, 9, 20, torch.float64)
    graph = ConvGraph.build(src.int(), dst.int(), 9)
    a = tensor_product_conv(p, x, y, w, src.int(), dst.int(), graph=graph, backend="triton", dataflow="deterministic")
    b = tensor_product_conv(p, x, y, w, src, dst, backend="reference")
    assert rel_err(a, b) < 1e-12


def test_module_matches_functional():
    conv = equikernels.TensorProductConv("3x0e+2x1o", "0e+1o", "3x0e+2x1o+2x0e",
                                         [(0, 0, 0, "uvu", True), (1, 1, 2, "uvu", True), (1, 0, 1, "uvu", True)],
                                         shared_weights=False, internal_weights=False)
    src, dst = awkward_graph(5, 12)
    x, y = torch.randn(5, 9), torch.randn(12, 4)
    w = torch.randn(12, conv.weight_numel)
    ref = tensor_product_conv(conv.problem, x, y, w, src, dst, backend="reference")
    assert rel_err(conv(x, y, w, src, dst), ref) < 1e-6
    assert rel_err(conv(x, y, w, graph=ConvGraph.build(src, dst, 5)), ref) < 1e-6


def test_bad_input():
    p = TPProblem.create(**channelwise())
    x, y, w = _inputs(p, 5, 6, torch.float64)
    src, dst = awkward_graph(5, 6)
    with pytest.raises(IndexError, match="src"):
        tensor_product_conv(p, x, y, w, src + 5, dst)
    with pytest.raises(IndexError, match="dst"):
        tensor_product_conv(p, x, y, w, src, dst - 10)
    with pytest.raises(TypeError, match="int32 or int64"):
        tensor_product_conv(p, x, y, w, src.float(), dst)
    with pytest.raises(ValueError, match="same shape"):
        tensor_product_conv(p, x, y, w, src[:-1], dst)
    with pytest.raises(ValueError, match="one row per edge"):
        tensor_product_conv(p, x, y[:-1], w, src, dst)
    with pytest.raises(ValueError, match="weight"):
        tensor_product_conv(p, x, y, w[:, :-1], src, dst)
    with pytest.raises(ValueError, match="dataflow"):
        tensor_product_conv(p, x, y, w, src, dst, dataflow="magic")
    with pytest.raises(ValueError, match="not deterministic"):
        tensor_product_conv(p, x, y, w, src, dst, dataflow="atomic", deterministic=True)



def test_auto_dataflow(monkeypatch):
    """dataflow="auto": atomic (the faster one) unless determinism is asked for, by argument or by
    torch.use_deterministic_algorithms; the reference backend runs unfused."""
    from equikernels.ops.conv import resolve_dataflow
    monkeypatch.delenv("EQUIKERNELS_CONV_DATAFLOW", raising=False)
    assert resolve_dataflow("auto", None, "triton") == ("atomic", True)
    assert resolve_dataflow("auto", True, "triton") == ("deterministic", False)
    assert resolve_dataflow("auto", False, "reference") == ("unfused", False)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert resolve_dataflow("auto", None, "triton") == ("deterministic", False)
    finally:
        torch.use_deterministic_algorithms(was)

@pytest.mark.gpu
@pytest.mark.parametrize("flow", ["atomic", "deterministic"])
@pytest.mark.parametrize("name", ["mace-mp-medium-L2", "nequip-water"])
def test_standard_problems_gpu(name, flow):
    p = catalog_problem(name)
    n, e = 200, 3000
    src, dst = awkward_graph(n, e, device="cuda")
    x, y, w = (t.cuda() for t in _inputs(p, n, e, torch.float32))
    xr, yr, wr = (t.double().requires_grad_() for t in (x, y, w))
    x, y, w = (t.requires_grad_() for t in (x, y, w))
    ref = tensor_product_conv(p, xr, yr, wr, src, dst, backend="reference", layout="ir_mul")
    out = tensor_product_conv(p, x, y, w, src, dst, backend="triton", dataflow=flow, layout="ir_mul")
    assert rel_err(out, ref) < 1e-5
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (x, y, w), g.float()), torch.autograd.grad(ref, (xr, yr, wr), g)):
        assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize("shared", [False, True])
def test_cpu_convolution_in_edge_chunks(shared, monkeypatch):
    """On the CPU backend the unfused convolution runs a few edges at a time (small temporaries): the
    same sums as all edges at once, to second order."""
    from equikernels.ops import conv as conv_mod
    monkeypatch.setattr(conv_mod, "CPU_CHUNK_BYTES", 1)  # one edge per chunk
    chunks = []
    real = conv_mod.tensor_product
    monkeypatch.setattr(conv_mod, "tensor_product",
                        lambda p, x, *a, **k: chunks.append(x.shape[0]) or real(p, x, *a, **k))
    p = TPProblem.create(**channelwise(shared=shared))
    src, dst = awkward_graph(7, 15, 0)
    x, y, w = _inputs(p, 7, 15, torch.float64, 0)
    got = second_order(lambda a, b, c: tensor_product_conv(p, a, b, c, src, dst, 7, backend="cpu"), x, y, w)
    assert chunks == [1] * 15  # one product per edge
    ref = second_order(lambda a, b, c: tensor_product_conv(p, a, b, c, src, dst, 7, backend="reference"), x, y, w)
    for a, b in zip(got, ref):
        assert rel_err(a, b) < 1e-12
