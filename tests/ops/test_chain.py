"""The trilinear autograd chain (ops.chain) on a toy method: T(x, y, w) = s * (x * y * w [+ x * y]),
elementwise, s a non-differentiable extra tensor, the "+ x * y" term (mode "affine") a part that
does not depend on w. The chain must give gradients of every order (eager and traced), a fused
double backward equal to the composed one, custom ops that pass opcheck, and the autocast rule."""
import pytest
import torch
import torch._dynamo.testing  # noqa: F401 (CompileCounterWithBackend)

from equikernels.ops.chain import Chain, Method


def _e(t):
    return t.new_empty(0)


class _Toy(Method):
    name = "test_chain_toy"
    extra = ("s",)
    static = ("mode",)

    @staticmethod
    def args_of(call):
        return call

    @staticmethod
    def call_of(extra, static):
        return extra[0], static[0]

    @staticmethod
    def out_shape(x, extra, static):
        return x.shape

    @staticmethod
    def unweighted(call):
        return call[1] == "affine"

    @staticmethod
    def fwd(call, x, y, w, math, out_dtype):
        s, mode = call
        k = w + 1 if mode == "affine" else w
        return (s * x * y * k).to(out_dtype or x.dtype)

    @staticmethod
    def bwd(call, x, y, w, g, need, math):
        s, mode = call
        gs, k = g * s, (w + 1 if mode == "affine" else w)
        return (gs * y * k if need & 1 else _e(x), gs * x * k if need & 2 else _e(y), gs * x * y if need & 4 else _e(w))

    @staticmethod
    def dbwd(call, x, y, w, g, a, b, c, have, need, math):
        s, mode = call
        gs, k = g * s, (w + 1 if mode == "affine" else w)
        z = torch.zeros_like
        dx = (gs * b * k if b is not None else z(x)) + (gs * y * c if c is not None else z(x))
        dy = (gs * a * k if a is not None else z(y)) + (gs * x * c if c is not None else z(y))
        dw = (gs * a * y if a is not None else z(w)) + (gs * x * b if b is not None else z(w))
        dg = sum((s * t for t in (a * y * k if a is not None else None, x * b * k if b is not None else None,
                                  x * y * c if c is not None else None) if t is not None), z(g))
        return tuple(r if need & bit else _e(r) for r, bit in zip((dx, dy, dw, dg), (1, 2, 4, 8)))


TOY = Chain(_Toy())


def _inputs(dtype=torch.float64, n=4, d=3):
    gen = torch.Generator().manual_seed(0)
    mk = lambda: torch.randn(n, d, generator=gen, dtype=dtype)  # noqa: E731
    return mk()[0].abs() + 0.5, mk().requires_grad_(), mk().requires_grad_(), mk().requires_grad_()


@pytest.mark.parametrize("mode", ["plain", "affine"])
def test_every_order_eager_and_custom_op(mode):
    s, x, y, w = _inputs()
    eager = lambda x, y, w: TOY.fwd((s, mode), x, y, w)  # noqa: E731
    op = lambda x, y, w: TOY.fwd_op(x, y, w, s, mode)  # noqa: E731
    for f in (eager, op):
        assert torch.autograd.gradcheck(f, (x, y, w))
        assert torch.autograd.gradgradcheck(f, (x, y, w))


@pytest.mark.parametrize("mode", ["plain", "affine"])
def test_fused_double_backward_equals_composed(mode):
    """The usual force-training step (nothing records third order) takes the method's dbwd; with
    create_graph the identity is composed from fwd / bwd: both give the same numbers."""
    s, x, y, w = _inputs()

    def second(create_graph):
        out = TOY.fwd((s, mode), x, y, w)
        gx, gy = torch.autograd.grad(out, (x, y), out.detach() + 1, create_graph=True)
        loss = gx.square().sum() + (gy * x.detach()).sum()
        return torch.autograd.grad(loss, (x, y, w), create_graph=create_graph)

    for fused, composed in zip(second(False), second(True)):
        torch.testing.assert_close(fused, composed.detach(), rtol=1e-12, atol=1e-12)


def test_traced_double_backward_matches_eager():
    """Compiled: one graph holding the custom ops; its backward differentiates the bwd op."""
    torch._dynamo.reset()
    s, x, y, w = _inputs()

    def forces(x, y, w):
        out = TOY.fwd((s, "affine"), x, y, w)
        (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        return gx

    with torch._dynamo.config.patch(trace_autograd_ops=True):
        counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(forces, fullgraph=True, backend=counter)
        results = [[gx, *torch.autograd.grad(gx.square().sum(), (y, w))] for gx in (compiled(x, y, w), forces(x, y, w))]
    assert counter.frame_count == 1 and "equikernels.test_chain_toy_fwd" in str(counter.graphs[0].graph)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_opcheck():
    s, x, y, w = _inputs()
    g, a, c = (torch.randn_like(t) for t in (x, x, w))
    torch.library.opcheck(TOY.fwd_op, (x, y, w, s, "affine", None, torch.float32))
    torch.library.opcheck(TOY.bwd_op, (x, y, w, g.requires_grad_(), s, "affine", 5))
    torch.library.opcheck(TOY.dbwd_op, (x.detach(), y.detach(), w.detach(), g.detach(), a, _e(a), c, s, "affine",
                                        "ac", 15))


def test_autocast_sets_the_output_dtype_only():
    s, x, y, w = _inputs(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for out in (TOY.fwd((s, "plain"), x, y, w), TOY.fwd_op(x, y, w, s, "plain")):
            assert out.dtype == torch.bfloat16
            gx, gw = torch.autograd.grad(out.float().sum(), (x, w))
            assert gx.dtype == gw.dtype == torch.float32
