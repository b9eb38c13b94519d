"""Autograd glue of the fused convolution C(x, y, w)[n] = sum_{e: dst[e]=n} TP(x[src[e]], y[e], w[e]).

C is trilinear in (x, y, w) like the batched product, so its backward and double backward follow
the same identity (DESIGN §3) with convolution kernels in place of batched ones: any order works.
The Triton kernels run when the backend is "triton"; otherwise (or when the generator cannot
express a table) the same math runs as gathered reference products plus index_add.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from torch import Tensor

from .. import reference
from ..ir import double_backward_tables
from .tp import _check_same, autocast_dtype, check_dtypes, plan_of, spec_of

NAMES = "xyw"


@dataclass(eq=False)
class _Conv:
    """Static context of one call: plan, graph, dataflow, backend (not a tensor: autograd skips it)."""
    plan: object
    graph: object
    flow: str
    backend: str
    math: Optional[torch.dtype] = None  # None: float32, or float64 when an operand is float64

    def kernels(self):
        """(ConvKernels, Unsupported) for the Triton backend, else None."""
        if self.backend != "triton":
            return None
        from ..codegen.conv import ConvKernels  # noqa: PLC0415 (Triton imported on demand)
        from ..codegen.emit import Unsupported  # noqa: PLC0415
        cache = self.plan.__dict__.setdefault("_conv_kernels", {})
        if self.flow not in cache:
            cache[self.flow] = ConvKernels(self.plan, self.flow)
        return cache[self.flow], Unsupported


def _fallback(conv: _Conv, what: str, exc: Exception) -> None:
    key = (conv.flow, what)
    done = conv.plan.__dict__.setdefault("_conv_warned", set())
    if key not in done:
        done.add(key)
        warnings.warn(f"equikernels: no generated convolution kernel for {what} of {conv.plan.problem.describe()} "
                      f"({exc}); using the PyTorch reference")


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Sums over edges of half-precision results are taken in float32 and rounded once."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# --- implementations (not differentiable) -------------------------------------------------------
def _fwd_impl(c: _Conv, x: Tensor, y: Tensor, w: Tensor, out_dtype: torch.dtype) -> Tensor:
    ks = c.kernels()
    if ks is not None:
        try:
            return ks[0].forward(x, y, w, c.graph, out_dtype=out_dtype, math=c.math)
        except ks[1] as exc:
            _fallback(c, "fwd", exc)
    g = c.graph
    msgs = reference.evaluate(c.plan.table, {"x": x.index_select(0, g.src), "y": y, "w": w}, c.plan.layout,
                              rows=g.num_edges, math_dtype=c.math, out_dtype=_acc(out_dtype))
    return msgs.new_zeros(g.num_nodes, msgs.shape[1]).index_add_(0, g.dst, msgs).to(out_dtype)


def _bwd_impl(c: _Conv, x, y, w, g, names: str) -> Dict[str, Tensor]:
    ks = c.kernels()
    if ks is not None:
        try:
            return ks[0].backward(x, y, w, g, c.graph, names, math=c.math)
        except ks[1] as exc:
            _fallback(c, "bwd", exc)
    gr = c.graph
    ops = {"x": x.index_select(0, gr.src), "y": y, "w": w, "g": g.index_select(0, gr.dst)}
    like = {"x": x, "y": y, "w": w}
    res = {}
    for n in names:
        shared = n == "w" and w.dim() == 1
        r = reference.evaluate(c.plan.grad_tables[n], ops, c.plan.layout, reduce_rows=shared, rows=gr.num_edges,
                               math_dtype=c.math, out_dtype=_acc(like[n].dtype))
        if n == "x":
            r = r.new_zeros(x.shape).index_add_(0, gr.src, r)
        res["g" + n] = r.to(like[n].dtype)
    return res


def _dbwd_impl(c: _Conv, x, y, w, g, a, b, cc, names: str) -> Dict[str, Tensor]:
    ks = c.kernels()
    if ks is not None:
        try:
            return ks[0].double_backward(x, y, w, g, a, b, cc, c.graph, names, math=c.math)
        except ks[1] as exc:
            _fallback(c, "dbwd", exc)
    gr = c.graph
    have = "".join(k for k, t in zip("abc", (a, b, cc)) if t is not None)
    ops = {"x": x.index_select(0, gr.src), "y": y, "w": w, "g": g.index_select(0, gr.dst),
           "a": a.index_select(0, gr.src) if a is not None else None, "b": b, "c": cc}
    tables = double_backward_tables(c.plan.table, have, names)
    like = {"x": x, "y": y, "w": w, "g": g}
    res = {}
    for n, t in tables.items():
        r = reference.evaluate(t, {k: v for k, v in ops.items() if v is not None}, c.plan.layout,
                               reduce_rows=(n == "w" and w.dim() == 1), rows=gr.num_edges, math_dtype=c.math,
                               out_dtype=_acc(like[n].dtype))
        if n == "x":
            r = r.new_zeros(x.shape).index_add_(0, gr.src, r)
        elif n == "g":
            r = r.new_zeros(g.shape).index_add_(0, gr.dst, r)
        res["d" + n] = r.to(like[n].dtype)
    return res


# --- autograd -----------------------------------------------------------------------------------
def _needed(flags) -> str:
    return "".join(n for n, f in zip(NAMES, flags) if f)


class _ConvFwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, w, c, out_dtype):
        ctx.save_for_backward(x, y, w)
        ctx.c = c
        return _fwd_impl(c, x, y, w, out_dtype)

    @staticmethod
    def backward(ctx, g):
        x, y, w = ctx.saved_tensors
        names = _needed(ctx.needs_input_grad[:3])
        if not names:
            return None, None, None, None, None
        gx, gy, gw = conv_bwd(ctx.c, x, y, w, g.contiguous(), names)
        return (gx if "x" in names else None, gy if "y" in names else None, gw if "w" in names else None, None,
                None)


class _ConvBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, w, g, c, names):
        ctx.save_for_backward(x, y, w, g)
        ctx.c, ctx.names = c, names
        r = _bwd_impl(c, x, y, w, g, names)
        return tuple(r.get("g" + n, t.new_empty(0)) for n, t in zip(NAMES, (x, y, w)))

    @staticmethod
    def backward(ctx, ga, gb, gc):
        x, y, w, g = ctx.saved_tensors
        c = ctx.c
        a, b, cc = (t.contiguous() if n in ctx.names and t is not None and t.shape == like.shape else None
                    for n, t, like in zip(NAMES, (ga, gb, gc), (x, y, w)))
        nx, ny, nw, ng = ctx.needs_input_grad[:4]
        if not torch.is_grad_enabled():  # the usual force-training step: one fused pass
            names = _needed((nx, ny, nw)) + ("g" if ng else "")
            r = _dbwd_impl(c, x, y, w, g, a, b, cc, names) if (a is not None or b is not None or cc is not None) else {}
            out = [r.get("d" + n) if f else None for n, f in zip("xywg", (nx, ny, nw, ng))]
            out = [torch.zeros_like(t) if f and o is None else o for o, f, t in zip(out, (nx, ny, nw, ng), (x, y, w, g))]
            return tuple(out) + (None, None)
        # higher orders are being recorded: compose the identity from differentiable ops
        dx = dy = dw = dg = None

        def acc(old, new):
            return new if old is None else old + new

        if ng:
            for args in ((a, y, w), (x, b, w), (x, y, cc)):
                if all(t is not None for t in args):
                    dg = acc(dg, _ConvFwd.apply(*args, c, g.dtype))  # dg in g's dtype
        for sub, wrt in (((x, b, w), "xw"), ((x, y, cc), "xy"), ((a, y, w), "yw")):
            if any(t is None for t in sub):
                continue
            names = "".join(n for n, f in zip(NAMES, (nx, ny, nw)) if f and n in wrt)
            if not names:
                continue
            rx, ry, rw = conv_bwd(c, *sub, g, names)
            dx = acc(dx, rx) if "x" in names else dx
            dy = acc(dy, ry) if "y" in names else dy
            dw = acc(dw, rw) if "w" in names else dw
        if ng and dg is None:
            dg = torch.zeros_like(g)
        return dx, dy, dw, dg, None, None


def conv_bwd(c: _Conv, x, y, w, g, names: str):
    if torch.is_grad_enabled():
        return _ConvBwd.apply(x, y, w, g, c, names)
    r = _bwd_impl(c, x, y, w, g, names)
    return tuple(r.get("g" + n, t.new_empty(0)) for n, t in zip(NAMES, (x, y, w)))


def fused_conv(problem, x: Tensor, y: Tensor, weight: Optional[Tensor], graph, layout: str, backend: str,
               flow: str, math_dtype: Optional[torch.dtype] = None, output_dtype: Optional[torch.dtype] = None
               ) -> Tensor:
    """Dtypes as ``ops.tensor_product``: float16/bfloat16/float32 operands mixed freely (float64 only
    with float64); output in ``output_dtype`` (default: the autocast dtype under autocast, else
    x's); gradients in their operand's dtype."""
    plan = plan_of(spec_of(problem, layout))
    w = weight.contiguous() if problem.weight_numel else x.new_empty(0)
    check_dtypes(math_dtype, output_dtype)
    for name, t in (("y", y), ("weight", w)):
        _check_same(name, t, x)
    if graph.src.device != x.device:
        raise ValueError(f"src/dst: device {graph.src.device} does not match x ({x.device})")
    out_dtype = output_dtype or autocast_dtype(x) or x.dtype
    return _ConvFwd.apply(x.contiguous(), y.contiguous(), w, _Conv(plan, graph, flow, backend, math_dtype), out_dtype)
