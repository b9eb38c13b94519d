"""Derivatives of ``equikernels.ops.tensor_product`` to any order.

gradcheck / gradgradcheck compare autograd with finite differences in float64. Beyond the second
order, the same chain of ``autograd.grad`` calls is run through an e3nn module (plain PyTorch, so
exact to any order) and through equikernels; they must agree, and the third derivative must match
finite differences of the (already verified) second derivative.
"""
import itertools

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from equikernels.ops import tensor_product
from problems import (e3nn_tp, ir_mul_to_mul_ir, mul_ir_to_ir_mul, problem_of, random_inputs, rel_err,
                      supported_modes)

pytestmark = pytest.mark.usefixtures("single_thread")


def mode_problem(mode: str, shared: bool, has_weight: bool = True) -> dict:
    """A small problem whose every instruction uses ``mode`` (l <= 2, two irreps per input)."""
    m = 2
    m2 = 1 if mode in ("uvu", "uvv", "uvw", "uvuv") else m  # exercise mul_in1 != mul_in2 where allowed
    in1, in2 = [(m, "0e"), (m, "1o")], [(m2, "1o")]
    mo = {"uvw": 2, "uvu": m, "uvv": m2, "uuw": 2 if has_weight else 1, "uuu": m, "uvuv": m * m2,
          "uvu<v": m * (m - 1) // 2, "u<vw": 2}[mode]
    out, instr = [], []
    for a, (_, ir1) in enumerate(in1):
        for b, (_, ir2) in enumerate(in2):
            for ir in _ir_product(ir1, ir2).split("+"):
                if ir in ("0e", "1o", "1e", "2e"):
                    instr.append((a, b, len(out), mode, has_weight))
                    out.append(f"{mo}x{ir}")
    irr = lambda lst: "+".join(f"{mul}x{ir}" for mul, ir in lst)  # noqa: E731
    return dict(irreps_in1=irr(in1), irreps_in2=irr(in2), irreps_out="+".join(out), instructions=instr,
                shared_weights=shared, internal_weights=False)


def _ir_product(ir1, ir2):
    from equikernels._compat import o3

    return "+".join(str(ir) for ir in o3.Irrep(ir1) * o3.Irrep(ir2))


CASES = [(mode, shared, True) for mode in supported_modes() for shared in (True, False)]
CASES += [(mode, True, False) for mode in ("uvu", "uvv", "uuw", "uuu", "uvuv") + (
    ("uvu<v",) if "uvu<v" in supported_modes() else ())]


def _case_id(c):
    return f"{c[0]}-{'shared' if c[1] else 'per-row'}{'' if c[2] else '-unweighted'}"


def _inputs(kw, rows=None, seed=0):
    """Two rows with shared weights (their gradient reduces over rows), one with per-row weights."""
    p = problem_of(kw)
    rows = rows if rows is not None else (2 if p.shared_weights else 1)
    x, y, w = random_inputs(p, (rows,), torch.float64, seed=seed)
    return p, [t.requires_grad_() for t in (x, y, w)]


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_gradcheck(case):
    kw = mode_problem(*case)
    p, (x, y, w) = _inputs(kw)
    if p.weight_numel == 0:
        assert gradcheck(lambda a, b: tensor_product(p, a, b), (x, y))
    else:
        assert gradcheck(lambda a, b, c: tensor_product(p, a, b, c), (x, y, w))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_gradgradcheck(case):
    kw = mode_problem(*case)
    p, (x, y, w) = _inputs(kw)
    if p.weight_numel == 0:
        assert gradgradcheck(lambda a, b: tensor_product(p, a, b), (x, y))
    else:
        assert gradgradcheck(lambda a, b, c: tensor_product(p, a, b, c), (x, y, w))


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_gradgradcheck_layouts(layout):
    kw = mode_problem("uvw", shared=False)
    p, (x, y, w) = _inputs(kw)
    assert gradgradcheck(lambda a, b, c: tensor_product(p, a, b, c, layout=layout), (x, y, w))


@pytest.mark.parametrize("wrt", [c for r in (1, 2) for c in itertools.combinations("xyw", r)],
                         ids=lambda c: "".join(c))
def test_gradgradcheck_partial(wrt):
    """Only some operands require grad: the op must compute exactly the requested gradients."""
    kw = mode_problem("uvu", shared=True)
    p, ts = _inputs(kw)
    names = "xyw"
    fixed = {n: t.detach() for n, t in zip(names, ts)}
    var = [t for n, t in zip(names, ts) if n in wrt]

    def f(*args):
        d = dict(fixed)
        d.update(zip(wrt, args))
        return tensor_product(p, d["x"], d["y"], d["w"])

    assert gradcheck(f, var)
    assert gradgradcheck(f, var)


# --- higher orders ------------------------------------------------------------------------------
def _chain(fn, x, y, w, g, v, u):
    """S = <g, f(x, y, w)>; H = <v, dS/dx>; K = <u, dH/dy>; returns (dS/dx, dH/dy, dK/dw, dK/dg)."""
    out = fn(x, y, w)
    s = (g * out).sum()
    (gx,) = torch.autograd.grad(s, x, create_graph=True)
    h = (v * gx).sum()
    (hy,) = torch.autograd.grad(h, y, create_graph=True)
    k = (u * hy).sum()
    kw_, kg = torch.autograd.grad(k, (w, g), allow_unused=True)
    zero = lambda d, t: torch.zeros_like(t) if d is None else d  # noqa: E731
    return gx, hy, zero(kw_, w), zero(kg, g)


def _third_order_operands(kw, rows=3, seed=0):
    p = problem_of(kw)
    x, y, w = random_inputs(p, (rows,), torch.float64, seed=seed)
    gen = torch.Generator().manual_seed(seed + 7)
    g = torch.randn(rows, p.dim_out, dtype=torch.float64, generator=gen)
    v = torch.randn(x.shape, dtype=torch.float64, generator=gen)
    u = torch.randn(y.shape, dtype=torch.float64, generator=gen)
    return p, x, y, w, g, v, u


@pytest.mark.parametrize("mode,shared", [("uvw", True), ("uvu", False), ("uuu", False), ("uvv", True)])
def test_third_order_matches_e3nn(mode, shared):
    kw = mode_problem(mode, shared)
    p, x, y, w, g, v, u = _third_order_operands(kw)
    tp = e3nn_tp(kw)

    def leaves():
        return [t.detach().clone().requires_grad_() for t in (x, y, w, g)]

    ours = _chain(lambda a, b, c: tensor_product(p, a, b, c), *leaves(), v, u)
    ref = _chain(lambda a, b, c: tp(a, b, c), *leaves(), v, u)
    for name, a, b in zip(("dS/dx", "dH/dy", "dK/dw", "dK/dg"), ours, ref):
        assert b.abs().max() > 0, f"{name} of the oracle is zero: the test would be vacuous"
        assert rel_err(a, b) <= 1e-10, name


def test_third_order_matches_finite_differences():
    """d/dw of K = <u, d/dy <v, d/dx <g, TP>>> against central differences of K (exact: K is linear in w)."""
    kw = mode_problem("uvw", shared=False)
    p, x, y, w, g, v, u = _third_order_operands(kw)

    def K(wv):
        xl, yl = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
        out = tensor_product(p, xl, yl, wv)
        (gx,) = torch.autograd.grad((g * out).sum(), xl, create_graph=True)
        (hy,) = torch.autograd.grad((v * gx).sum(), yl, create_graph=True)
        return (u * hy).sum()

    wl = w.detach().clone().requires_grad_()
    (dk,) = torch.autograd.grad(K(wl), wl)
    assert dk.abs().max() > 0
    eps = 1e-3
    fd = torch.empty_like(w)
    flat_w, flat_fd = w.detach().reshape(-1), fd.reshape(-1)
    for i in range(flat_w.numel()):
        e = torch.zeros_like(flat_w)
        e[i] = eps
        kp = K((flat_w + e).reshape(w.shape)).detach()
        km = K((flat_w - e).reshape(w.shape)).detach()
        flat_fd[i] = (kp - km) / (2 * eps)
    assert rel_err(dk, fd) <= 1e-8


def test_third_order_autograd_functional():
    """torch.autograd.functional.jacobian of the autograd Hessian-vector product (third order)."""
    kw = mode_problem("uvu", shared=True)
    p, x, y, w, g, v, _ = _third_order_operands(kw, rows=2)
    tp = e3nn_tp(kw)

    def hvp(fn):
        def f(yv, wv):
            xl = x.detach().clone().requires_grad_()
            out = fn(xl, yv, wv)
            (gx,) = torch.autograd.grad((g * out).sum(), xl, create_graph=True)
            (gy,) = torch.autograd.grad((v * gx).sum(), yv, create_graph=True)
            return gy
        return f

    y0, w0 = y.detach(), w.detach()
    ours = torch.autograd.functional.jacobian(hvp(lambda a, b, c: tensor_product(p, a, b, c)), (y0, w0))
    ref = torch.autograd.functional.jacobian(hvp(lambda a, b, c: tp(a, b, c)), (y0, w0))
    # d(gy)/dy is zero (TP is linear in y); d(gy)/dw is the constant CG-weighted contraction
    assert ours[0].abs().max() == 0 and ref[0].abs().max() == 0
    assert ref[1].abs().max() > 0
    assert rel_err(ours[1], ref[1]) <= 1e-10


def test_repeated_derivative_in_one_operand_is_zero():
    """TP is linear in x: d2/dx2 and d3/dx3 vanish (and asking for them must not crash)."""
    kw = mode_problem("uvw", shared=True)
    p, (x, y, w) = _inputs(kw)
    out = tensor_product(p, x, y, w)
    (gx,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)  # quadratic in x through square
    (gxx,) = torch.autograd.grad(gx.sum(), x, create_graph=True)
    (gxxx,) = torch.autograd.grad(gxx.square().sum(), x, create_graph=True, allow_unused=True)
    assert gxx.abs().max() > 0
    # oracle: same chain through e3nn
    tp = e3nn_tp(kw)
    xr = x.detach().clone().requires_grad_()
    o = tp(xr, y.detach(), w.detach())
    (rx,) = torch.autograd.grad(o.square().sum(), xr, create_graph=True)
    (rxx,) = torch.autograd.grad(rx.sum(), xr, create_graph=True)
    (rxxx,) = torch.autograd.grad(rxx.square().sum(), xr, allow_unused=True)
    assert rel_err(gxx, rxx) <= 1e-10
    assert rel_err(gxxx if gxxx is not None else torch.zeros_like(x), rxxx) <= 1e-10


def test_double_backward_ir_mul_matches_mul_ir():
    """Second derivatives in ir_mul equal the permuted mul_ir ones."""
    kw = mode_problem("uvw", shared=False)
    p, x, y, w, g, v, u = _third_order_operands(kw)

    def run(layout):
        conv = (lambda t, irr: mul_ir_to_ir_mul(t, irr)) if layout == "ir_mul" else (lambda t, irr: t)
        back = (lambda t, irr: ir_mul_to_mul_ir(t, irr)) if layout == "ir_mul" else (lambda t, irr: t)
        xl = conv(x.detach(), kw["irreps_in1"]).requires_grad_()
        yl = conv(y.detach(), kw["irreps_in2"]).requires_grad_()
        wl = w.detach().clone().requires_grad_()
        out = tensor_product(p, xl, yl, wl, layout=layout)
        (gx,) = torch.autograd.grad((conv(g, kw["irreps_out"]) * out).sum(), xl, create_graph=True)
        hy, hw = torch.autograd.grad((conv(v, kw["irreps_in1"]) * gx).sum(), (yl, wl))
        return back(hy, kw["irreps_in2"]), hw

    a, b = run("mul_ir"), run("ir_mul")
    assert a[0].abs().max() > 0 and a[1].abs().max() > 0
    assert rel_err(b[0], a[0]) <= 1e-12 and rel_err(b[1], a[1]) <= 1e-12
