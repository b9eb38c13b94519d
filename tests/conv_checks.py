"""Shared graph-convolution checks: awkward random graphs and every derivative against an e3nn
TP + index_add oracle in float64."""
import torch

import equikernels
from equikernels import ConvGraph
from equikernels.ops import tensor_product_conv
from equikernels.problem import TPProblem
from problems import e3nn_tp, ir_mul_to_mul_ir, mul_ir_to_ir_mul, rel_err


def awkward_graph(n: int, e: int, seed: int = 0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (e,), generator=g)
    dst = torch.randint(0, max(1, n - 2), (e,), generator=g)  # the last two nodes receive nothing
    dst[: e // 4] = 0                                         # one busy node
    src[1], dst[1] = src[0], dst[0]                           # a duplicate edge
    dst[2] = src[2]                                           # a self-loop
    return src.to(device), dst.to(device)


def channelwise(i1="3x0e+2x1o", i2="0e+1o+2e", filt="0e+1o+1e+2e", shared=False) -> dict:
    kw = equikernels.ChannelWiseTensorProduct(i1, i2, filt, shared_weights=shared,
                                              internal_weights=False)
    return dict(irreps_in1=kw.irreps_in1, irreps_in2=kw.irreps_in2, irreps_out=kw.irreps_out,
                instructions=[(i.i_in1, i.i_in2, i.i_out, i.connection_mode, i.has_weight, 1.0)
                              for i in kw.instructions], shared_weights=shared, internal_weights=False)


def _oracle(kw, x, y, w, src, dst, n):
    """e3nn (float64-built) on gathered rows, then index_add onto dst."""
    tp = e3nn_tp(kw)
    msgs = tp(x.index_select(0, src), y, w)
    return msgs.new_zeros(n, msgs.shape[1]).index_add(0, dst, msgs)


def _inputs(p: TPProblem, n, e, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    x, y = mk(n, p.dim_in1), mk(e, p.dim_in2)
    w = mk(p.weight_numel) if p.shared_weights else mk(e, p.weight_numel)
    return x, y, w


def check_conv(kw, flow, dtype, layout, n=7, e=15, seed=0, second_order=True):
    p = TPProblem.create(**kw)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    src, dst = awkward_graph(n, e, seed)
    x, y, w = _inputs(p, n, e, dtype, seed)
    irr1, irr2, irro = (kw["irreps_in1"], kw["irreps_in2"], kw["irreps_out"])
    to_l = (lambda t, irr: mul_ir_to_ir_mul(t, irr)) if layout == "ir_mul" else (lambda t, irr: t)
    from_l = (lambda t, irr: ir_mul_to_mul_ir(t, irr)) if layout == "ir_mul" else (lambda t, irr: t)
    # oracle in float64 from the same (rounded) inputs, e3nn layout
    xr, yr, wr = (t.to(dtype).double().requires_grad_() for t in (x, y, w))
    ref = _oracle(kw, xr, yr, wr, src, dst, n)
    xk, yk, wk = (to_l(x, irr1).to(dtype).requires_grad_(), to_l(y, irr2).to(dtype).requires_grad_(),
                  w.to(dtype).requires_grad_())
    backend = "reference" if flow == "unfused" else "triton"
    out = tensor_product_conv(p, xk, yk, wk, src, dst, layout=layout, backend=backend, dataflow=flow)
    assert not out.isnan().any(), "unwritten output rows"
    assert rel_err(from_l(out, irro), ref) <= tol, f"forward {rel_err(from_l(out, irro), ref):.1e}"
    gen = torch.Generator().manual_seed(seed + 1)
    g = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    grads_ref = torch.autograd.grad(ref, (xr, yr, wr), g, create_graph=True)
    grads = torch.autograd.grad(out, (xk, yk, wk), to_l(g, irro).to(dtype), create_graph=second_order)
    for name, a, b, irr in zip("xyw", grads, grads_ref, (irr1, irr2, None)):
        a = from_l(a, irr) if irr is not None else a
        assert not a.isnan().any(), f"grad {name}: unwritten elements"
        assert rel_err(a, b) <= tol, f"grad {name}: {rel_err(a, b):.1e}"
    if not second_order:
        return
    # double backward: L = <gx, Rx> + <gy, Ry> + <gw, Rw>, differentiated in x, y, w and g
    rs = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in grads_ref]
    gk = to_l(g, irro).to(dtype).requires_grad_()
    g.requires_grad_()
    grads_ref = torch.autograd.grad(ref, (xr, yr, wr), g, create_graph=True)
    grads = torch.autograd.grad(out, (xk, yk, wk), gk, create_graph=True)
    lr = sum((a * r).sum() for a, r in zip(grads_ref, rs))
    lk = sum((a * to_l(r, irr).to(dtype) if irr is not None else a * r.to(dtype)).sum()
             for a, r, irr in zip(grads, rs, (irr1, irr2, None)))
    d_ref = torch.autograd.grad(lr, (xr, yr, wr, g))
    d = torch.autograd.grad(lk, (xk, yk, wk, gk))
    for name, a, b, irr in zip("xywg", d, d_ref, (irr1, irr2, None, irro)):
        a = from_l(a, irr) if irr is not None else a
        assert not a.isnan().any(), f"second-order grad {name}: unwritten elements"
        assert rel_err(a, b) <= tol, f"second-order grad {name}: {rel_err(a, b):.1e}"
