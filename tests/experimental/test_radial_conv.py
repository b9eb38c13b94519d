"""Convolution with the radial MLP's last layer fused in (experimental.radial_conv).

The fused kernels (Triton interpreter on CPU) against e3nn: per-edge weights h @ W formed in
float64, e3nn's TP on gathered rows, index_add onto dst. Outputs NaN-poisoned before each kernel
runs; graphs with duplicate edges, self-loops, isolated nodes and a busy node.
"""
import pytest
import torch

from equikernels import ConvGraph
from equikernels.experimental.radial_conv import fusable, radial_conv
from equikernels.problem import TPProblem
from problems import e3nn_tp, rel_err, ir_mul_to_mul_ir, mul_ir_to_ir_mul
from conv_checks import awkward_graph, channelwise

# 16 channels (tl.dot's minimum), every l up to 2 on the edge: 7 uvu paths
KW = channelwise("16x0e+16x1o", "0e+1o+2e", "0e+1o+2e")
H = 16


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")


def _inputs(p: TPProblem, n: int, e: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return mk(n, p.dim_in1), mk(e, p.dim_in2), mk(e, H), mk(H, p.weight_numel) / 4


def _oracle(p, kw, x, y, h, W, src, dst, n):
    tp = e3nn_tp(kw)
    msgs = tp(x.index_select(0, src), y, h @ W)
    return msgs.new_zeros(n, msgs.shape[1]).index_add(0, dst, msgs)


@pytest.mark.parametrize("dtype,layout", [(torch.float64, "mul_ir"), (torch.float32, "ir_mul")])
def test_fused_matches_e3nn(dtype, layout):
    p = TPProblem.create(**KW)
    n, e = 9, 70
    src, dst = awkward_graph(n, e)
    graph = ConvGraph.build(src, dst, n)
    x, y, h, W = _inputs(p, n, e)
    ref_in = [t.clone().requires_grad_() for t in (x, y, h, W)]
    ref = _oracle(p, KW, *ref_in, src, dst, n)
    gout = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ref_grads = torch.autograd.grad(ref, ref_in, gout)

    conv_in = lambda t, irreps: mul_ir_to_ir_mul(t, irreps) if layout == "ir_mul" else t  # noqa: E731
    xs = conv_in(x, KW['irreps_in1']).to(dtype).requires_grad_()
    ys = conv_in(y, KW['irreps_in2']).to(dtype).requires_grad_()
    hs, Ws = h.to(dtype).requires_grad_(), W.to(dtype).requires_grad_()
    out = radial_conv(p, xs, ys, hs, Ws, graph, layout=layout, backend="triton", fused=True)
    g = conv_in(gout, KW['irreps_out']).to(dtype)
    gx, gy, gh, gW = torch.autograd.grad(out, (xs, ys, hs, Ws), g)
    back = lambda t, irreps: ir_mul_to_mul_ir(t, irreps) if layout == "ir_mul" else t  # noqa: E731
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert rel_err(back(out, KW['irreps_out']), ref) < tol
    assert rel_err(back(gx, KW['irreps_in1']), ref_grads[0]) < tol
    assert rel_err(back(gy, KW['irreps_in2']), ref_grads[1]) < tol
    assert rel_err(gh, ref_grads[2]) < tol
    assert rel_err(gW, ref_grads[3]) < tol
    # nodes without incoming / outgoing edges get exact zeros, not stale memory
    assert not out[n - 2:].any()
    lonely = torch.ones(n, dtype=torch.bool)
    lonely[src] = False
    assert not gx[lonely].any()


def test_gradcheck_and_higher_orders():
    """First derivatives through the fused backward kernels, second through the composed
    (unfused, differentiable) backward: fp64 gradcheck / gradgradcheck."""
    kw = channelwise("16x0e", "0e+1o", "0e+1o")
    p = TPProblem.create(**kw)
    n, e = 4, 9
    src, dst = awkward_graph(n, e, seed=1)
    graph = ConvGraph.build(src, dst, n)
    ts = [t.requires_grad_() for t in _inputs(p, n, e, seed=2)]
    f = lambda *a: radial_conv(p, *a, graph, backend="triton", fused=True)  # noqa: E731
    assert torch.autograd.gradcheck(f, ts, fast_mode=True)
    assert torch.autograd.gradgradcheck(f, ts, fast_mode=True)


def test_force_training_matches_unfused():
    """A force-like loss: d/d(y, h) with create_graph, then differentiated to W (training)."""
    p = TPProblem.create(**KW)
    n, e = 6, 30
    src, dst = awkward_graph(n, e, seed=3)
    graph = ConvGraph.build(src, dst, n)
    base = _inputs(p, n, e, seed=4)
    R = torch.randn(n, p.dim_out, generator=torch.Generator().manual_seed(6), dtype=torch.float64)

    def loss(fused):
        x, y, h, W = (t.clone().requires_grad_() for t in base)
        out = radial_conv(p, x, y, h, W, graph, backend="triton" if fused else "reference", fused=fused)
        gy, gh = torch.autograd.grad((out * R).sum(), (y, h), create_graph=True)
        return torch.autograd.grad((gy ** 2).sum() + (gh ** 2).sum(), (x, W))

    for a, b in zip(loss(True), loss(False)):
        assert rel_err(a, b) < 1e-10


def test_deterministic_and_empty():
    p = TPProblem.create(**KW)
    n, e = 8, 50
    src, dst = awkward_graph(n, e, seed=7)
    graph = ConvGraph.build(src, dst, n)
    x, y, h, W = (t.float().requires_grad_() for t in _inputs(p, n, e, seed=8))

    def run():
        out = radial_conv(p, x, y, h, W, graph, backend="triton", fused=True)
        return [out] + list(torch.autograd.grad(out.square().sum(), (x, y, h, W)))
    for a, b in zip(run(), run()):
        assert torch.equal(a, b)
    empty = ConvGraph.build(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 3)
    xe = torch.randn(3, p.dim_in1, requires_grad=True)
    ye, he = torch.zeros(0, p.dim_in2, requires_grad=True), torch.zeros(0, H, requires_grad=True)
    We = torch.randn(H, p.weight_numel, requires_grad=True)
    out = radial_conv(p, xe, ye, he, We, empty, backend="triton", fused=True)
    assert out.shape == (3, p.dim_out) and not out.any()
    gx, gW = torch.autograd.grad(out.sum(), (xe, We))
    assert not gx.any() and not gW.any()


def test_errors():
    p = TPProblem.create(**KW)
    n, e = 5, 12
    src, dst = awkward_graph(n, e)
    graph = ConvGraph.build(src, dst, n)
    x, y, h, W = (t.float() for t in _inputs(p, n, e))
    with pytest.raises(ValueError, match="weight: expected shape"):
        radial_conv(p, x, y, h, W[:, :-1], graph)
    with pytest.raises(ValueError, match="h: expected one row per edge"):
        radial_conv(p, x, y, h[:-1], W, graph)
    with pytest.raises(TypeError, match="graph: expected a ConvGraph"):
        radial_conv(p, x, y, h, W, (src, dst))
    small = TPProblem.create(**channelwise("3x0e+2x1o", "0e+1o", "0e+1o"))
    assert "power of two" in fusable(small, H)
    xs, ys = torch.randn(n, small.dim_in1), torch.randn(e, small.dim_in2)
    Wsm = torch.randn(H, small.weight_numel)
    with pytest.raises(ValueError, match="fused=True"):
        radial_conv(small, xs, ys, h, Wsm, graph, backend="triton", fused=True)
    # fused=None falls back to the unfused path with the same value
    out = radial_conv(small, xs, ys, h, Wsm, graph, backend="triton")
    ref = radial_conv(small, xs, ys, h, Wsm, graph, backend="reference")
    assert rel_err(out, ref) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", [("mace-mp-medium-L2", torch.float32), ("mace-large", torch.float64)])
def test_standard_problems_gpu(name, dtype):
    from equikernels.catalog import problem as catalog_problem
    p = catalog_problem(name)
    n, e, hidden = 300, 6000, 64
    src, dst = awkward_graph(n, e, device="cuda")
    graph = ConvGraph.build(src, dst, n)
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *s: torch.randn(*s, generator=g, device="cuda", dtype=torch.float64)  # noqa: E731
    base = [mk(n, p.dim_in1), mk(e, p.dim_in2), mk(e, hidden) / 4, mk(hidden, p.weight_numel) / 8]
    ref_in = [t.clone().requires_grad_() for t in base]
    ins = [t.to(dtype).requires_grad_() for t in base]
    ref = radial_conv(p, *ref_in, graph, layout="ir_mul", backend="reference")
    out = radial_conv(p, *ins, graph, layout="ir_mul", backend="triton", fused=True)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert rel_err(out, ref) < tol
    gout = mk(n, p.dim_out)
    for a, b in zip(torch.autograd.grad(out, ins, gout.to(dtype)), torch.autograd.grad(ref, ref_in, gout)):
        assert rel_err(a, b) < tol


def test_weight_gradient_only_when_asked(monkeypatch):
    """autograd.grad to (x, y, h) alone (forces) skips the weight-gradient kernel; .backward()
    and autograd.grad to W still get it."""
    from equikernels.experimental import codegen_radial_conv as codegen
    p = TPProblem.create(**KW)
    n, e = 5, 20
    src, dst = awkward_graph(n, e, seed=9)
    graph = ConvGraph.build(src, dst, n)
    asked = []
    real = codegen.RadialConvKernels.backward

    def spy(self, *a):
        asked.append(a[-4:])
        return real(self, *a)
    monkeypatch.setattr(codegen.RadialConvKernels, "backward", spy)
    x0, y0, h0 = (t.float().requires_grad_() for t in _inputs(p, n, e, seed=10)[:3])
    W = torch.nn.Parameter(_inputs(p, n, e, seed=10)[3].float())
    # derived operands, as in a model (a leaf under autograd.grad cannot be asked: kept)
    x, y, h, Ws = x0 * 1, y0 * 1, h0 * 1, W / 2
    out = radial_conv(p, x, y, h, Ws, graph, backend="triton", fused=True)
    torch.autograd.grad(out.sum(), (y0, h0), retain_graph=True)
    torch.autograd.grad(out.sum(), (W,), retain_graph=True)
    out.sum().backward()
    assert asked == [(False, True, True, False), (False, False, False, True), (True, True, True, True)]
    assert W.grad is not None and W.grad.abs().sum() > 0
