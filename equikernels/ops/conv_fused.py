"""The fused convolution C(x, y, w)[n] = sum_{e: dst[e]=n} TP(x[src[e]], y[e], w[e]) as a trilinear
``chain.Method``.

C is trilinear in (x, y, w) like the batched product, so the chain (``ops.chain``) gives it the
custom ops ``equikernels::conv_fwd`` / ``conv_bwd`` / ``conv_dbwd`` with fakes, the eager
Functions and derivatives of any order. The graph travels as its six index tensors (never
differentiated; the node count is ``ptr_dst.shape[0] - 1``, so it stays symbolic), the problem as
the TP spec string plus backend and dataflow strings. The Triton kernels run when the backend is
"triton"; otherwise (or when the generator cannot express a table) the same math runs as gathered
reference products plus index_add.
"""
from __future__ import annotations

import warnings
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from .. import reference
from ..codegen.conv_planner import kernel_layout
from ..codegen.plan_types import need_letters
from ..dtypes import acc_dtype
from ..ir import double_backward_tables
from ..problem import ir_mul_index
from .chain import Chain, Method, autocast_dtype, is_eager
from .graph import ConvGraph
from .tp import _check_same, _has_unweighted, check_dtypes, plan_of, spec_of

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


def _fallback(conv: _Conv, what: str, exc: Exception) -> None:
    key = (conv.flow, what)
    done = conv.plan.__dict__.setdefault("_conv_warned", set())
    if key not in done:
        done.add(key)
        warnings.warn(f"equikernels: no generated convolution kernel for {what} of {conv.plan.problem.describe()} "
                      f"({exc}); using the PyTorch reference")


# --- implementations (not differentiable) -------------------------------------------------------
def _fwd_impl(c: _Conv, x: Tensor, y: Tensor, w: Tensor, math, out_dtype: Optional[torch.dtype]) -> Tensor:
    out_dtype = out_dtype or x.dtype
    ks = c.kernels()
    if ks is not None:
        try:
            return ks[0].forward(x, y, w, c.graph, out_dtype=out_dtype, math=math)
        except ks[1] as exc:
            _fallback(c, "fwd", exc)
    g = c.graph
    msgs = reference.evaluate(c.plan.table, {"x": x.index_select(0, g.src), "y": y, "w": w}, c.plan.layout,
                              rows=g.num_edges, math_dtype=math, out_dtype=acc_dtype(out_dtype))
    return msgs.new_zeros(g.num_nodes, msgs.shape[1]).index_add_(0, g.dst, msgs).to(out_dtype)


def _bwd_impl(c: _Conv, x, y, w, g, names: str, math) -> Dict[str, Tensor]:
    ks = c.kernels()
    if ks is not None:
        try:
            return ks[0].backward(x, y, w, g, c.graph, names, math=math)
        except ks[1] as exc:
            _fallback(c, "bwd", exc)
    gr = c.graph
    ops = {"x": x.index_select(0, gr.src), "y": y, "w": w, "g": g.index_select(0, gr.dst)}
    like = {"x": x, "y": y, "w": w}
    res = {}
    for n in names:
        shared = n == "w" and w.dim() == 1
        r = reference.evaluate(c.plan.grad_tables[n], ops, c.plan.layout, reduce_rows=shared, rows=gr.num_edges,
                               math_dtype=math, out_dtype=acc_dtype(like[n].dtype))
        if n == "x":
            r = r.new_zeros(x.shape).index_add_(0, gr.src, r)
        res["g" + n] = r.to(like[n].dtype)
    return res


def _dbwd_impl(c: _Conv, x, y, w, g, a, b, cc, have: str, names: str, math) -> Dict[str, Tensor]:
    ks = c.kernels()
    if ks is not None:
        try:
            return ks[0].double_backward(x, y, w, g, a, b, cc, c.graph, names, math=math)
        except ks[1] as exc:
            _fallback(c, "dbwd", exc)
    gr = c.graph
    ops = {"x": x.index_select(0, gr.src), "y": y, "w": w, "g": g.index_select(0, gr.dst),
           "a": a.index_select(0, gr.src) if a is not None else None, "b": b, "c": cc}
    tables = double_backward_tables(c.plan.table, have, names)
    like = {"x": x, "y": y, "w": w, "g": g}
    res = {}
    for n, t in tables.items():
        r = reference.evaluate(t, {k: v for k, v in ops.items() if v is not None}, c.plan.layout,
                               reduce_rows=(n == "w" and w.dim() == 1), rows=gr.num_edges, math_dtype=math,
                               out_dtype=acc_dtype(like[n].dtype))
        if n == "x":
            r = r.new_zeros(x.shape).index_add_(0, gr.src, r)
        elif n == "g":
            r = r.new_zeros(g.shape).index_add_(0, gr.dst, r)
        res["d" + n] = r.to(like[n].dtype)
    return res


# --- the convolution as the chain's method -------------------------------------------------------------
class _Convolution(Method):
    """The fused convolution's implementations; a call is a ``_Conv``."""
    name = "conv"
    extra = ("src", "dst", "perm_dst", "ptr_dst", "perm_src", "ptr_src")
    static = ("spec", "backend", "flow")

    @staticmethod
    def args_of(c: _Conv) -> tuple:
        return c.tensors() + (c.spec, c.backend, c.flow)

    @staticmethod
    def call_of(extra, static) -> _Conv:
        src, dst, perm_dst, ptr_dst, perm_src, ptr_src = extra
        spec, backend, flow = static
        if flow not in FLOWS:
            raise ValueError(f"flow: expected one of {FLOWS}, got {flow!r}")
        graph = ConvGraph(src, dst, ptr_dst.shape[0] - 1, perm_dst, ptr_dst, perm_src, ptr_src)
        return _Conv(spec, graph, flow, backend)

    @staticmethod
    def out_shape(x, extra, static):
        return extra[3].shape[0] - 1, plan_of(static[0]).problem.dim_out

    @staticmethod
    def unweighted(c: _Conv) -> bool:
        return _has_unweighted(c.spec)

    @staticmethod
    def fwd(c, x, y, w, math, out_dtype):
        return _fwd_impl(c, x, y, w, math, out_dtype)

    @staticmethod
    def bwd(c, x, y, w, g, need, math):
        r = _bwd_impl(c, x, y, w, g, need_letters(need & 7), math)
        return tuple(r.get("g" + n, t.new_empty(0)) for n, t in zip(NAMES, (x, y, w)))

    @staticmethod
    def dbwd(c, x, y, w, g, a, b, cc, have, need, math):
        names = need_letters(need)
        r = _dbwd_impl(c, x, y, w, g, a, b, cc, have, names, math)
        return tuple((r["d" + n] if "d" + n in r else torch.zeros_like(t)) if n in names else t.new_empty(0)
                     for n, t in zip("xywg", (x, y, w, g)))


CONV = Chain(_Convolution())
conv_fwd, conv_bwd, conv_dbwd = CONV.fwd_op, CONV.bwd_op, CONV.dbwd_op


def cbwd(c: _Conv, x, y, w, g, names: str):
    """(gx, gy, gw) for ``names`` (a subset of "xyw"), differentiable; the others are empty."""
    return CONV.bwd(c, x, y, w, g, sum(1 << NAMES.index(n) for n in names), c.math)


_PERMS: Dict[tuple, Tuple[Tensor, Tensor]] = {}


class _Permute(torch.autograd.Function):
    """Columns of ``t`` [rows, dim] permuted; the gradient is the inverse permutation (a gather,
    not index_select's scatter-add), differentiable again."""

    @staticmethod
    def forward(ctx, t: Tensor, perm: Tensor, inverse: Tensor) -> Tensor:
        ctx.save_for_backward(perm, inverse)
        return t.index_select(1, perm)

    @staticmethod
    def backward(ctx, g: Tensor):
        perm, inverse = ctx.saved_tensors
        return _Permute.apply(g, inverse, perm), None, None


def _ir_mul(t: Tensor, irreps, inverse: bool) -> Tensor:
    """``t`` [rows, dim] in mul_ir -> ir_mul (``inverse``: ir_mul -> mul_ir)."""
    key = (irreps, t.device)
    perms = _PERMS.get(key) if is_eager(t) else None
    if perms is None:
        idx = torch.tensor(ir_mul_index(irreps), dtype=torch.long, device=t.device)
        perms = (idx, torch.argsort(idx))
        if is_eager(t):
            _PERMS[key] = perms
    perm, inv = perms
    if inverse:
        perm, inv = inv, perm
    # traced: plain index_select (the compiled backward of a custom Function is not differentiated again)
    return _Permute.apply(t, perm, inv) if is_eager(t) else t.index_select(1, perm)


# --- entry point ------------------------------------------------------------------------------------
def fused_conv(problem, x: Tensor, y: Tensor, weight: Optional[Tensor], graph, layout: str, backend: str,
               flow: str, math_dtype: Optional[torch.dtype] = None, output_dtype: Optional[torch.dtype] = None
               ) -> Tensor:
    """Dtypes as ``ops.tensor_product``: float16/bfloat16/float32 operands mixed freely (float64 only
    with float64); output in ``output_dtype`` (default: the autocast dtype under autocast, else
    x's); gradients in their operand's dtype."""
    if flow not in FLOWS:
        raise ValueError(f"flow: expected one of {FLOWS}, got {flow!r}")
    edges = graph.src.shape[0]
    # a symbolic edge count (torch.compile / export) is not branched on: no guard on the graph's size
    run = kernel_layout(problem, layout, edges if isinstance(edges, int) else None) if backend == "triton" else layout
    if run != layout:  # mul_ir asked, ir_mul kernels: x and out permuted (node rows)
        out = fused_conv(problem, _ir_mul(x, problem.irreps_in1, False), y, weight, graph, run, backend, flow,
                         math_dtype, output_dtype)
        return _ir_mul(out, problem.irreps_out, True)
    spec = spec_of(problem, layout)
    w = weight.contiguous() if problem.weight_numel else x.new_empty(0)
    check_dtypes(math_dtype, output_dtype)
    for name, t in (("y", y), ("weight", w)):
        _check_same(name, t, x)
    if graph.src.device != x.device:
        raise ValueError(f"src/dst: device {graph.src.device} does not match x ({x.device})")
    out_dtype = output_dtype or autocast_dtype(x) or x.dtype
    # plan_of is not traced (lru_cache + JSON): the traced path passes only the spec string
    c = _Conv(spec, graph, flow, backend, math_dtype, plan_of(spec) if is_eager(x, y, w) else None)
    return CONV.fwd(c, x.contiguous(), y.contiguous(), w, math_dtype, out_dtype)
