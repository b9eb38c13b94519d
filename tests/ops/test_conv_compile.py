"""torch.compile / torch.export of the fused graph convolution (custom ops equikernels::conv_*).

CPU only: the reference backend ("unfused": tp_fwd + index_add) and the generated Triton kernels in
the interpreter ("deterministic", "atomic": the conv_fwd / conv_bwd / conv_dbwd custom ops). Every
test compares the compiled result with eager on the same inputs.
"""
import pytest
import torch
import torch._dynamo.testing

import equikernels
from equikernels import ConvGraph
from equikernels.ops import conv_bwd, conv_dbwd, conv_fwd, spec_of, tensor_product_conv
from equikernels.problem import TPProblem
from conv_checks import awkward_graph

# (backend, dataflow): the reference path and both fused Triton dataflows (interpreted on CPU)
FLOWS = [("reference", "auto"), ("triton", "deterministic"), ("triton", "atomic")]
IRREPS = ("2x0e+2x1o", "0e+1o", "2x0e+2x1o+2x1e")
INSTR = [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True), (0, 1, 1, "uvu", True), (1, 0, 1, "uvu", True),
         (1, 1, 2, "uvu", True)]


class Net(torch.nn.Module):
    """Edge attributes and per-edge weights from edge vectors, graph built inside, one convolution:
    the shape of a MACE interaction (so forces are derivatives through y and the weights)."""

    def __init__(self, backend, dataflow):
        super().__init__()
        self.conv = equikernels.TensorProductConv(*IRREPS, INSTR, shared_weights=False, internal_weights=False,
                                                  backend=backend, dataflow=dataflow)
        self.radial = torch.nn.Linear(1, self.conv.weight_numel, dtype=torch.float64)

    def forward(self, x, vec, src, dst):
        r = vec.norm(dim=-1, keepdim=True)
        y = torch.cat([torch.ones_like(r), vec / r], dim=-1)   # 0e + 1o
        w = self.radial(r)
        graph = ConvGraph.build(src, dst, x.shape[0])
        return self.conv(x, y, w, graph=graph)


def _data(n, e, seed=0):
    src, dst = awkward_graph(n, e, seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g, dtype=torch.float64)
    vec = torch.randn(e, 3, generator=g, dtype=torch.float64)
    return x, vec, src, dst


def _energy_and_grads(f, net, x, vec, src, dst, second_order):
    x, vec = x.clone().requires_grad_(), vec.clone().requires_grad_()
    out = f(x, vec, src, dst)
    energy = out.pow(2).sum()
    params = tuple(net.parameters())
    grads = torch.autograd.grad(energy, (x, vec) + params, create_graph=second_order)
    res = [out, *grads]
    if second_order:  # force training: d/dparams of |forces|^2
        res += torch.autograd.grad(grads[1].pow(2).sum(), (x,) + params)
    return res


def _close(a, b, exact):
    for u, v in zip(a, b):
        if exact:
            assert torch.equal(u, v)
        else:
            torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend,flow", FLOWS)
def test_fullgraph_dynamic_matches_eager_without_recompiling(backend, flow):
    torch._dynamo.reset()
    net = Net(backend, flow)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(net, fullgraph=True, dynamic=True, backend=counter)
    for n, e in ((6, 14), (9, 23)):  # two node and edge counts
        data = _data(n, e, seed=n)
        got = _energy_and_grads(compiled, net, *data, second_order=False)
        want = _energy_and_grads(net, net, *data, second_order=False)
        # deterministic: the same kernels in the same order, so bitwise equal
        _close(got, want, exact=flow == "deterministic")
    assert counter.frame_count == 1, f"recompiled: {counter.frame_count} frames"
    if backend == "triton":
        graph = str(counter.graphs[0].graph)
        assert "equikernels.conv_fwd" in graph and "index_add" not in graph


@pytest.mark.parametrize("backend,flow", [FLOWS[0], FLOWS[1]])
def test_second_order_through_compiled_graph(backend, flow):
    """Forces inside the loss (second order). aot_autograd refuses double backward of a compiled
    graph, so the graph is captured by dynamo (backend="eager") and differentiated by autograd."""
    torch._dynamo.reset()
    net = Net(backend, flow)
    compiled = torch.compile(net, fullgraph=True, dynamic=True, backend="eager")
    data = _data(7, 16, seed=2)
    got = _energy_and_grads(compiled, net, *data, second_order=True)
    want = _energy_and_grads(net, net, *data, second_order=True)
    _close(got, want, exact=flow == "deterministic")


def test_forces_inside_compiled_graph_and_their_training_gradient():
    """Energy and forces (autograd.grad, create_graph) in one aot_autograd graph; the training
    gradient of |forces|^2 then differentiates the conv_bwd custom op (its double backward)."""
    torch._dynamo.reset()
    net = Net("triton", "deterministic")

    def energy_forces(x, vec, src, dst):
        energy = net(x, vec, src, dst).pow(2).sum()
        (forces,) = torch.autograd.grad(energy, vec, create_graph=True)
        return energy, forces

    with torch._dynamo.config.patch(trace_autograd_ops=True):
        counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(energy_forces, fullgraph=True, backend=counter)
        x, vec, src, dst = _data(6, 14, seed=4)
        results = []
        for f in (compiled, energy_forces):
            v = vec.clone().requires_grad_()
            energy, forces = f(x, v, src, dst)
            results.append([energy, forces, *torch.autograd.grad(forces.pow(2).sum(), tuple(net.parameters()))])
    graph = str(counter.graphs[0].graph)
    assert counter.frame_count == 1 and "equikernels.conv_fwd" in graph and "grad" in graph
    _close(results[0], results[1], exact=True)


def test_no_graph_breaks_explain():
    torch._dynamo.reset()
    net = Net("triton", "deterministic")
    x, vec, src, dst = _data(5, 9)
    explanation = torch._dynamo.explain(net)(x, vec, src, dst)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons


def test_inductor_matches_eager():
    torch._dynamo.reset()
    net = Net("triton", "deterministic")
    compiled = torch.compile(net, fullgraph=True)
    data = _data(6, 12, seed=5)
    _close(_energy_and_grads(compiled, net, *data, second_order=False),
           _energy_and_grads(net, net, *data, second_order=False), exact=False)


@pytest.mark.parametrize("backend,flow", FLOWS)
def test_export_dynamic_nodes_and_edges(backend, flow):
    net = Net(backend, flow)
    n, e = torch.export.Dim("n", min=2), torch.export.Dim("e", min=2)
    ep = torch.export.export(net, _data(6, 14), dynamic_shapes=({0: n}, {0: e}, {0: e}, {0: e}))
    if backend == "triton":
        assert "equikernels.conv_fwd" in str(ep.graph)
    for size in ((6, 14), (11, 27)):
        data = _data(*size, seed=3)
        _close([ep.module()(*data)], [net(*data)], exact=flow == "deterministic")


def test_compiled_bad_indices_raise():
    """Traced, the index check is an asynchronous assert in the graph (no host sync)."""
    torch._dynamo.reset()
    net = Net("reference", "auto")
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    x, vec, src, dst = _data(5, 9)
    compiled(x, vec, src, dst)
    with pytest.raises(RuntimeError, match="dst: node indices must lie in"):
        compiled(x, vec, src, dst + 5)
    with pytest.raises(RuntimeError, match="src: node indices must lie in"):
        compiled(x, vec, src - 6, dst)


def test_graph_build_traces_with_symbolic_sizes():
    """ConvGraph.build gives the same orders traced (symbolic N and E) as in eager."""
    torch._dynamo.reset()
    build = lambda s, d, x: tuple(ConvGraph.build(s, d, x.shape[0]).__dict__[k]  # noqa: E731
                                  for k in ("perm_dst", "ptr_dst", "perm_src", "ptr_src"))
    compiled = torch.compile(build, fullgraph=True, dynamic=True, backend="aot_eager")
    for n, e in ((5, 11), (8, 30)):
        s, d = awkward_graph(n, e, seed=e)
        x = torch.empty(n, 1)
        _close(compiled(s, d, x), build(s, d, x), exact=True)


@pytest.mark.parametrize("backend,flow", [("reference", "deterministic"), ("triton", "deterministic")])
def test_opcheck(backend, flow):
    p = TPProblem.create(*IRREPS, INSTR, shared_weights=False, internal_weights=False)
    spec = spec_of(p, "mul_ir")
    src, dst = awkward_graph(5, 9, 1)
    g = ConvGraph.build(src, dst, 5)
    gt = (g.src, g.dst, g.perm_dst, g.ptr_dst, g.perm_src, g.ptr_src)
    gen = torch.Generator().manual_seed(0)
    mk = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    x, y, w, gout = mk(5, p.dim_in1), mk(9, p.dim_in2), mk(9, p.weight_numel), mk(5, p.dim_out)
    a, b, c = mk(*x.shape), mk(*y.shape), mk(*w.shape)
    req = lambda *ts: [t.clone().requires_grad_() for t in ts]  # noqa: E731
    torch.library.opcheck(conv_fwd, (*req(x, y, w), *gt, spec, backend, flow, None, torch.float64))
    torch.library.opcheck(conv_bwd, (*req(x, y, w, gout), *gt, spec, backend, flow, 7))
    torch.library.opcheck(conv_bwd, (*req(x, y, w, gout), *gt, spec, backend, flow, 2))
    # the fused double backward is not differentiable (used only when nothing records higher orders)
    torch.library.opcheck(conv_dbwd, (x, y, w, gout, a, b, c, *gt, spec, backend, flow, "ac", 15))


def test_ops_match_functional_and_reject_bad_flow():
    p = TPProblem.create(*IRREPS, INSTR, shared_weights=False, internal_weights=False)
    x, vec, src, dst = _data(6, 13)
    y, w = torch.randn(13, p.dim_in2, dtype=torch.float64), torch.randn(13, p.weight_numel, dtype=torch.float64)
    x = torch.randn(6, p.dim_in1, dtype=torch.float64)
    g = ConvGraph.build(src, dst, 6)
    gt = (g.src, g.dst, g.perm_dst, g.ptr_dst, g.perm_src, g.ptr_src)
    out = conv_fwd(x, y, w, *gt, spec_of(p, "mul_ir"), "reference", "deterministic")
    want = tensor_product_conv(p, x, y, w, src, dst, backend="reference")
    torch.testing.assert_close(out, want)
    with pytest.raises(ValueError, match="flow"):
        conv_fwd(x, y, w, *gt, spec_of(p, "mul_ir"), "reference", "unfused")
