"""Autograd glue of the fused convolution C(x, y, w)[n] = sum_{e: dst[e]=n} TP(x[src[e]], y[e], w[e]).

C is trilinear in (x, y, w) like the batched product, so its backward and double backward follow
the same trilinearity identity with convolution kernels in place of batched ones: any order works.
The Triton kernels run when the backend is "triton"; otherwise (or when the generator cannot
express a table) the same math runs as gathered reference products plus index_add.

As for the batched product (ops/tp.py), the three directions are ``torch.library`` custom ops
(``equikernels::conv_fwd`` / ``conv_bwd`` / ``conv_dbwd``) with fake implementations, so
``torch.compile(fullgraph=True)`` and ``torch.export`` see one opaque node per direction. The
static problem travels as the TP spec string plus backend / dataflow strings; the graph as its six
index tensors (the node count is ``ptr_dst.shape[0] - 1``, so it stays symbolic). Outside tracing
the same implementations and formulas run through plain autograd.Functions (no dispatcher cost).
"""
from __future__ import annotations

import warnings
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from .. import reference
from ..ir import double_backward_tables
from .graph import ConvGraph
from .tp import _check_same, _eager, autocast_dtype, check_dtypes, plan_of, spec_of

NAMES = "xyw"
FLOWS = ("atomic", "deterministic")


class _Conv:
    """Static context of one call: problem spec, graph, dataflow, backend, math dtype (not a tensor:
    autograd skips it)."""
    __slots__ = ("spec", "graph", "flow", "backend", "math", "_plan")

    def __init__(self, spec: str, graph, flow: str, backend: str, math: Optional[torch.dtype] = None, plan=None):
        self.spec, self.graph, self.flow, self.backend, self.math = spec, graph, flow, backend, math
        self._plan = plan

    @property
    def plan(self):
        if self._plan is None:
            self._plan = plan_of(self.spec)
        return self._plan

    def tensors(self) -> Tuple[Tensor, ...]:
        g = self.graph
        return g.src, g.dst, g.perm_dst, g.ptr_dst, g.perm_src, g.ptr_src

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


ConvCall = _Conv  # public name for the opt-in paths in equikernels.experimental


def _conv_of(src, dst, perm_dst, ptr_dst, perm_src, ptr_src, spec, backend, flow, math) -> _Conv:
    """The context of a custom-op call, rebuilt from its arguments."""
    if flow not in FLOWS:
        raise ValueError(f"flow: expected one of {FLOWS}, got {flow!r}")
    graph = ConvGraph(src, dst, ptr_dst.shape[0] - 1, perm_dst, ptr_dst, perm_src, ptr_src)
    return _Conv(spec, graph, flow, backend, math)


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


def _bwd_tuple(r: Dict[str, Tensor], x, y, w) -> Tuple[Tensor, Tensor, Tensor]:
    return tuple(r.get("g" + n, t.new_empty(0)) for n, t in zip(NAMES, (x, y, w)))


def _dbwd_tuple(r: Dict[str, Tensor], names: str, x, y, w, g) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dy, dw, dg): zeros for a requested result that no cotangent reaches, empty if not requested."""
    return tuple((r["d" + n] if "d" + n in r else torch.zeros_like(t)) if n in names else t.new_empty(0)
                 for n, t in zip("xywg", (x, y, w, g)))


# --- custom ops -----------------------------------------------------------------------------------
@torch.library.custom_op("equikernels::conv_fwd", mutates_args=())
def conv_fwd(x: Tensor, y: Tensor, w: Tensor, src: Tensor, dst: Tensor, perm_dst: Tensor, ptr_dst: Tensor,
             perm_src: Tensor, ptr_src: Tensor, spec: str, backend: str, flow: str, out_dtype: torch.dtype,
             math_dtype: Optional[torch.dtype] = None) -> Tensor:
    """out[ptr_dst.shape[0] - 1, dim_out] in out_dtype."""
    c = _conv_of(src, dst, perm_dst, ptr_dst, perm_src, ptr_src, spec, backend, flow, math_dtype)
    return _fwd_impl(c, x, y, w, out_dtype)


@conv_fwd.register_fake
def _(x, y, w, src, dst, perm_dst, ptr_dst, perm_src, ptr_src, spec, backend, flow, out_dtype, math_dtype=None):
    return x.new_empty(ptr_dst.shape[0] - 1, plan_of(spec).problem.dim_out, dtype=out_dtype)


@torch.library.custom_op("equikernels::conv_bwd", mutates_args=())
def conv_bwd(x: Tensor, y: Tensor, w: Tensor, g: Tensor, src: Tensor, dst: Tensor, perm_dst: Tensor, ptr_dst: Tensor,
             perm_src: Tensor, ptr_src: Tensor, spec: str, backend: str, flow: str, names: str,
             math_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """(gx, gy, gw) for ``names`` (a subset of "xyw"; the others are empty), each in its operand's dtype."""
    c = _conv_of(src, dst, perm_dst, ptr_dst, perm_src, ptr_src, spec, backend, flow, math_dtype)
    return _bwd_tuple(_bwd_impl(c, x, y, w, g, names), x, y, w)


@conv_bwd.register_fake
def _(x, y, w, g, src, dst, perm_dst, ptr_dst, perm_src, ptr_src, spec, backend, flow, names, math_dtype=None):
    return tuple(t.new_empty(t.shape) if n in names else t.new_empty(0) for n, t in zip(NAMES, (x, y, w)))


@torch.library.custom_op("equikernels::conv_dbwd", mutates_args=())
def conv_dbwd(x: Tensor, y: Tensor, w: Tensor, g: Tensor, a: Tensor, b: Tensor, c: Tensor, src: Tensor, dst: Tensor,
              perm_dst: Tensor, ptr_dst: Tensor, perm_src: Tensor, ptr_src: Tensor, spec: str, backend: str, flow: str,
              have: str, names: str, math_dtype: Optional[torch.dtype] = None
              ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dy, dw, dg) of the trilinear identity for ``names`` (subset of "xywg"); the cotangents
    a, b, c named in ``have`` are used, the others are ignored (pass empty tensors)."""
    cv = _conv_of(src, dst, perm_dst, ptr_dst, perm_src, ptr_src, spec, backend, flow, math_dtype)
    a_, b_, c_ = (t if k in have else None for k, t in zip("abc", (a, b, c)))
    return _dbwd_tuple(_dbwd_impl(cv, x, y, w, g, a_, b_, c_, names), names, x, y, w, g)


@conv_dbwd.register_fake
def _(x, y, w, g, a, b, c, src, dst, perm_dst, ptr_dst, perm_src, ptr_src, spec, backend, flow, have, names,
      math_dtype=None):
    return tuple(t.new_empty(t.shape) if n in names else t.new_empty(0) for n, t in zip("xywg", (x, y, w, g)))


# --- dispatch: plain autograd.Functions in eager, the custom ops when traced -----------------------
def cfwd(c: _Conv, x, y, w, out_dtype: torch.dtype) -> Tensor:
    if _eager(x, y, w):
        return _ConvFwd.apply(x, y, w, c, out_dtype)
    return conv_fwd(x, y, w, *c.tensors(), c.spec, c.backend, c.flow, out_dtype, c.math)


def cbwd(c: _Conv, x, y, w, g, names: str):
    if _eager(x, y, w, g):
        if torch.is_grad_enabled():
            return _ConvBwd.apply(x, y, w, g, c, names)
        return _bwd_tuple(_bwd_impl(c, x, y, w, g, names), x, y, w)
    return conv_bwd(x, y, w, g, *c.tensors(), c.spec, c.backend, c.flow, names, c.math)


def cdbwd(c: _Conv, x, y, w, g, a, b, cc, names: str):
    """Not differentiable: used only when no higher derivative is being recorded."""
    given = [t for t in (a, b, cc) if t is not None]
    if _eager(x, y, w, g, *given):
        return _dbwd_tuple(_dbwd_impl(c, x, y, w, g, a, b, cc, names), names, x, y, w, g)
    have = "".join(k for k, t in zip("abc", (a, b, cc)) if t is not None)
    e = x.new_empty(0)
    return conv_dbwd(x, y, w, g, *(t if t is not None else e for t in (a, b, cc)), *c.tensors(), c.spec,
                     c.backend, c.flow, have, names, c.math)


# --- derivative formulas (shared by both paths) -----------------------------------------------------
def _needed(flags) -> str:
    return "".join(n for n, f in zip(NAMES, flags) if f)


def _fwd_grads(c: _Conv, x, y, w, g, flags):
    names = _needed(flags[:3])
    if not names:
        return None, None, None
    gx, gy, gw = cbwd(c, x, y, w, g.contiguous(), names)
    return gx if "x" in names else None, gy if "y" in names else None, gw if "w" in names else None


def _bwd_grads(c: _Conv, x, y, w, g, names: str, ga, gb, gc, flags):
    """Trilinear identity: S = <g, C(a,y,w) + C(x,b,w) + C(x,y,c)>, (a, b, c) the cotangents."""
    a, b, cc = (t.contiguous() if n in names and t is not None and t.shape == like.shape else None
                for n, t, like in zip(NAMES, (ga, gb, gc), (x, y, w)))
    nx, ny, nw, ng = flags[:4]
    if not torch.is_grad_enabled():  # the usual force-training step: one fused pass
        want = _needed((nx, ny, nw)) + ("g" if ng else "")
        if a is None and b is None and cc is None:
            return tuple(torch.zeros_like(t) if f else None for f, t in zip((nx, ny, nw, ng), (x, y, w, g)))
        r = cdbwd(c, x, y, w, g, a, b, cc, want)
        return tuple(t if f else None for t, f in zip(r, (nx, ny, nw, ng)))
    # higher orders are being recorded: compose the identity from differentiable ops
    dx = dy = dw = dg = None

    def acc(old, new):
        return new if old is None else old + new

    # C(x, y, cc) is the part of C that depends on w: the unweighted instructions' C(x, y, 0) is
    # taken out again (exact: C is affine in w)
    c0 = (torch.zeros_like(cc) if cc is not None and any(not i.has_weight for i in c.plan.problem.instructions)
          else None)
    if ng:
        for args in ((a, y, w), (x, b, w), (x, y, cc)):
            if all(t is not None for t in args):
                dg = acc(dg, cfwd(c, *args, g.dtype))  # dg in g's dtype
        if c0 is not None:
            dg = dg - cfwd(c, x, y, c0, g.dtype)
    for sub, wrt in (((x, b, w), "xw"), ((x, y, cc), "xy"), ((a, y, w), "yw")):
        if any(t is None for t in sub):
            continue
        want = "".join(n for n, f in zip(NAMES, (nx, ny, nw)) if f and n in wrt)
        if not want:
            continue
        rx, ry, rw = cbwd(c, *sub, g, want)
        if c0 is not None and wrt == "xy":  # the term with cc in place of w
            rx0, ry0, _ = cbwd(c, x, y, c0, g, want)
            rx, ry = (rx - rx0 if "x" in want else rx), (ry - ry0 if "y" in want else ry)
        dx = acc(dx, rx) if "x" in want else dx
        dy = acc(dy, ry) if "y" in want else dy
        dw = acc(dw, rw) if "w" in want else dw
    if ng and dg is None:
        dg = torch.zeros_like(g)
    return dx, dy, dw, dg


class _ConvFwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, w, c, out_dtype):
        ctx.save_for_backward(x, y, w)
        ctx.c = c
        return _fwd_impl(c, x, y, w, out_dtype)

    @staticmethod
    def backward(ctx, g):
        return _fwd_grads(ctx.c, *ctx.saved_tensors, g, ctx.needs_input_grad) + (None, None)


class _ConvBwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, w, g, c, names):
        ctx.save_for_backward(x, y, w, g)
        ctx.c, ctx.names = c, names
        return _bwd_tuple(_bwd_impl(c, x, y, w, g, names), x, y, w)

    @staticmethod
    def backward(ctx, ga, gb, gc):
        return _bwd_grads(ctx.c, *ctx.saved_tensors, ctx.names, ga, gb, gc, ctx.needs_input_grad) + (None, None)


# autograd of the custom ops: the graph tensors are saved with the operands, the rest on ctx
def _op_fwd_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:9])
    ctx.static = inputs[9:12] + (inputs[13] if len(inputs) > 13 else None,)  # spec, backend, flow, math


def _op_ctx(ctx, k: int):
    saved = ctx.saved_tensors
    spec, backend, flow, math = ctx.static
    return _conv_of(*saved[k:], spec, backend, flow, math), saved[:k]


def _op_fwd_backward(ctx, g):
    c, (x, y, w) = _op_ctx(ctx, 3)
    return _fwd_grads(c, x, y, w, g, ctx.needs_input_grad) + (None,) * 11


def _op_bwd_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:10])
    ctx.static = inputs[10:13] + (inputs[14] if len(inputs) > 14 else None,)
    ctx.names = inputs[13]


def _op_bwd_backward(ctx, ga, gb, gc):
    c, (x, y, w, g) = _op_ctx(ctx, 4)
    return _bwd_grads(c, x, y, w, g, ctx.names, ga, gb, gc, ctx.needs_input_grad) + (None,) * 11


conv_fwd.register_autograd(_op_fwd_backward, setup_context=_op_fwd_setup)
conv_bwd.register_autograd(_op_bwd_backward, setup_context=_op_bwd_setup)


# --- entry point ------------------------------------------------------------------------------------
def fused_conv(problem, x: Tensor, y: Tensor, weight: Optional[Tensor], graph, layout: str, backend: str,
               flow: str, math_dtype: Optional[torch.dtype] = None, output_dtype: Optional[torch.dtype] = None
               ) -> Tensor:
    """Dtypes as ``ops.tensor_product``: float16/bfloat16/float32 operands mixed freely (float64 only
    with float64); output in ``output_dtype`` (default: the autocast dtype under autocast, else
    x's); gradients in their operand's dtype."""
    if flow not in FLOWS:
        raise ValueError(f"flow: expected one of {FLOWS}, got {flow!r}")
    spec = spec_of(problem, layout)
    w = weight.contiguous() if problem.weight_numel else x.new_empty(0)
    check_dtypes(math_dtype, output_dtype)
    for name, t in (("y", y), ("weight", w)):
        _check_same(name, t, x)
    if graph.src.device != x.device:
        raise ValueError(f"src/dst: device {graph.src.device} does not match x ({x.device})")
    out_dtype = output_dtype or autocast_dtype(x) or x.dtype
    # plan_of is not traced (lru_cache + JSON): the traced path passes only the spec string
    c = _Conv(spec, graph, flow, backend, math_dtype, plan_of(spec) if _eager(x, y, w) else None)
    return cfwd(c, x.contiguous(), y.contiguous(), w, out_dtype)
