"""One autograd chain for the operations of the package: the trilinear ones (the batched product,
the fused convolution) and path tables (the symmetric contraction).

An operation T(x, y, w) that is linear in each of x, y and w provides a ``Method``: its forward,
its backward for the operands in ``need`` and its fused double backward. ``Chain`` turns that into

- three ``torch.library`` custom ops ``equikernels::<name>_fwd`` / ``_bwd`` / ``_dbwd`` with fake
  implementations, so ``torch.compile(fullgraph=True)`` and ``torch.export`` see one opaque node per
  direction (the static problem travels as string arguments, graph tensors as extra tensor
  arguments that are never differentiated);
- plain ``autograd.Function`` twins for the eager path: dispatching through ``torch.library`` costs
  tens of microseconds per call, most of the time of a small product;
- derivatives of any order: the backward of the backward is the trilinear identity
  (``ops.trilinear``) composed from the same ops, or one fused pass when nothing records higher
  orders;
- the output dtype under autocast (the operands are never cast).

A path table (``ops.table_chain.TableOp``: n operands, not trilinear) goes through the same two
paths: the custom op ``equikernels::table`` (fake, autograd) when traced, the ``autograd.Function``
``_TableFn`` when eager. Its derivatives are the ops of its gradient tables, evaluated through this
chain again, so every order works and only the operands are saved.

Gradients come back in the dtype of their operand; half-precision sums are accumulated in float32
by the methods (``dtypes.acc_dtype``).
"""
from __future__ import annotations

import itertools
import weakref
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import reference
from . import trilinear
from .batching import BATCHED_TABLE_ERROR, DEPTH, batched_cotangents, legacy_batched
from .trilinear import have_of  # noqa: F401 (re-exported: the methods name their cotangents with it)

NEED_X, NEED_Y, NEED_W, NEED_G = 1, 2, 4, 8
_PLAIN = (Tensor, torch.nn.Parameter)
_AUTOCAST_DEVICES = ("cuda", "cpu")


def is_eager(*ts) -> bool:
    """Plain tensors outside tracing (None: an absent cotangent, skipped). A loop, not a generator:
    every eager call asks this (host time)."""
    if DEPTH[0] or torch.compiler.is_compiling():
        return False
    for t in ts:
        if t is not None and t.__class__ not in _PLAIN:
            return False
    return True


def functorch_wrapped(t: Tensor) -> bool:
    """Whether ``t`` is wrapped by a torch.func transform (grad, vmap, jvp): autograd Functions
    without ``setup_context`` cannot run on it, so callers take plain torch operations."""
    try:
        return bool(torch._C._functorch.is_functorch_wrapped_tensor(t))
    except AttributeError:  # a torch without the query: no transform can be active
        return False


try:
    _transforms_active = torch._C._are_functorch_transforms_active
except AttributeError:  # a torch without the query: no transform can be active
    def _transforms_active() -> bool:
        return False


def in_transform() -> bool:
    """Whether a torch.func transform (grad, vmap, jvp, jacrev, functional ensembles) is active: autograd
    Functions without ``setup_context`` then fail even on plain tensors (captured constants), so the
    eager paths take plain torch operations. About 0.04 us: one call into C++."""
    return _transforms_active()


def autocast_dtype(x: Tensor) -> Optional[torch.dtype]:
    """The output dtype autocast asks for (None when autocast is off for x's device, or x is float64:
    autocast leaves float64 alone, as it does for matmul)."""
    dev = x.device.type
    if dev not in _AUTOCAST_DEVICES or x.dtype == torch.float64 or not torch.is_autocast_enabled(dev):
        return None
    return torch.get_autocast_dtype(dev)


class Method:
    """The implementations one trilinear operation gives its ``Chain``. ``call`` is the method's own
    static context of one call (never a tensor argument of autograd).

    - ``name``: the custom ops are ``equikernels::<name>_fwd`` / ``_bwd`` / ``_dbwd``;
    - ``extra`` / ``static``: names of the non-differentiable tensor / string arguments that
      ``args_of(call)`` returns in that order and ``call_of(extra, static)`` turns back into a call;
    - ``out_shape(x, extra, static)``: the forward's output shape (fake tensors: no data read);
    - ``fwd(call, x, y, w, math, out_dtype)``: the output (out_dtype None: x's dtype);
    - ``bwd(call, x, y, w, g, need, math)``: (gx, gy, gw) for the bits of ``need`` (NEED_X ...),
      each in its operand's dtype, an empty placeholder for the others;
    - ``dbwd(call, x, y, w, g, a, b, c, have, need, math)``: (dx, dy, dw, dg) of the trilinear
      identity for the bits of ``need`` (NEED_X ... NEED_G); a, b, c the cotangents of gx, gy, gw,
      None where absent (``have`` names the present ones); zeros for a result no cotangent
      reaches, an empty placeholder for one not in ``need``;
    - ``unweighted(call)``: whether T mixes in terms that do not depend on w (T is then affine in w).

    ``plain_fwd`` (as ``fwd``, or None): the forward as differentiable plain torch operations, run
    inside torch.func transforms (where the chain's Functions cannot); None: the custom op runs there.

    Eager-only shortcuts (None: none): ``eager_fwd`` (same arguments as ``fwd``: an output with its
    own autograd, or None), ``direct_bwd`` (as ``bwd``, run when nothing is recorded: None entries
    for gradients not in ``need``, or None), ``direct_dbwd`` (as ``dbwd``, or None), ``record_bwd``
    (as ``bwd`` while autograd records: an output recorded by the method's own node, or None).
    """
    name: str = ""
    extra: Tuple[str, ...] = ()
    static: Tuple[str, ...] = ()
    plain_fwd = None
    eager_fwd = None
    direct_bwd = None
    direct_dbwd = None
    record_bwd = None


class Chain:
    """The custom ops, eager Functions and derivative chain of one ``Method`` (see the module)."""
    eager = staticmethod(is_eager)

    def __init__(self, method: Method):
        self.method = m = method
        if not m.name.isidentifier():
            raise ValueError(f"method.name: expected an identifier for the custom ops' names, got {m.name!r}")
        self._n = len(m.extra) + len(m.static)  # arguments between the operands and the scalars
        sig = "".join(f"Tensor {n}, " for n in m.extra) + "".join(f"str {n}, " for n in m.static)
        ns = f"equikernels::{m.name}"
        self.fwd_op = torch.library.custom_op(
            f"{ns}_fwd", self._fwd_op, mutates_args=(),
            schema=f"(Tensor x, Tensor y, Tensor w, {sig}ScalarType? math_dtype=None, "
                   "ScalarType? out_dtype=None) -> Tensor")
        self.bwd_op = torch.library.custom_op(
            f"{ns}_bwd", self._bwd_op, mutates_args=(),
            schema=f"(Tensor x, Tensor y, Tensor w, Tensor g, {sig}int need, ScalarType? math_dtype=None) "
                   "-> (Tensor, Tensor, Tensor)")
        self.dbwd_op = torch.library.custom_op(
            f"{ns}_dbwd", self._dbwd_op, mutates_args=(),
            schema=f"(Tensor x, Tensor y, Tensor w, Tensor g, Tensor a, Tensor b, Tensor c, {sig}str have, "
                   "int need, ScalarType? math_dtype=None) -> (Tensor, Tensor, Tensor, Tensor)")
        self.fwd_op.register_fake(self._fwd_fake)
        self.bwd_op.register_fake(self._bwd_fake)
        self.dbwd_op.register_fake(self._dbwd_fake)
        self.fwd_op.register_autograd(self._fwd_op_backward, setup_context=self._fwd_op_setup)
        self.bwd_op.register_autograd(self._bwd_op_backward, setup_context=self._bwd_op_setup)
        self._autocast = torch.library.Library("equikernels", "IMPL")  # kept alive: it owns the registrations
        for key in ("AutocastCUDA", "AutocastCPU"):
            self._autocast.impl(f"{m.name}_fwd", self._autocast_fwd, key, with_keyset=True)

    # --- entry points: the Functions when eager, the custom ops when traced ------------------------
    def fwd(self, call, x: Tensor, y: Tensor, w: Tensor, math: Optional[torch.dtype] = None,
            out_dtype: Optional[torch.dtype] = None) -> Tensor:
        if is_eager(x, y, w):
            # the eager path skips the dispatcher, so it applies the autocast rule itself
            out_dtype = out_dtype or autocast_dtype(x)
            m = self.method
            if in_transform():
                return self._transformed_fwd(call, x, y, w, math, out_dtype)
            if m.eager_fwd is not None:
                out = m.eager_fwd(call, x, y, w, math, out_dtype)
                if out is not None:
                    return out
            return _Fwd.apply(x, y, w, self, call, math, out_dtype)
        return self.fwd_op(x, y, w, *self.method.args_of(call), math, out_dtype)

    def bwd(self, call, x: Tensor, y: Tensor, w: Tensor, g: Tensor, need: int,
            math: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor, Tensor]:
        m = self.method
        if is_eager(x, y, w, g):
            if in_transform():
                return self._transformed_bwd(call, x, y, w, g, need, math)
            if not torch.is_grad_enabled():  # a plain backward: nothing to record, skip Function.apply
                return m.bwd(call, x, y, w, g, need, math)
            if m.record_bwd is not None:
                res = m.record_bwd(call, x, y, w, g, need, math)
                if res is not None:
                    return res
            return _Bwd.apply(x, y, w, g, self, call, need, math)
        return self.bwd_op(x, y, w, g, *m.args_of(call), need, math)

    def dbwd(self, call, x: Tensor, y: Tensor, w: Tensor, g: Tensor, a: Optional[Tensor], b: Optional[Tensor],
             c: Optional[Tensor], have: str, need: int, math: Optional[torch.dtype] = None
             ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """Not differentiable: used only when no higher derivative is being recorded."""
        if is_eager(x, y, w, g, a, b, c):
            return self.method.dbwd(call, x, y, w, g, a, b, c, have, need, math)
        e = x.new_empty(0)  # placeholder for a missing cotangent
        return self.dbwd_op(x, y, w, g, a if a is not None else e, b if b is not None else e,
                            c if c is not None else e, *self.method.args_of(call), have, need, math)

    # --- inside torch.func transforms: plain torch operations, which the transforms differentiate ---
    def _transformed_fwd(self, call, x, y, w, math, out_dtype) -> Tensor:
        plain = self.method.plain_fwd
        if plain is None:  # the registered custom op (its Python kernel sees the transformed tensors)
            return self.fwd_op(x, y, w, *self.method.args_of(call), math, out_dtype)
        return plain(call, x, y, w, math, out_dtype)

    def _transformed_bwd(self, call, x, y, w, g, need, math) -> Tuple[Tensor, Tensor, Tensor]:
        """``bwd`` as the vector-Jacobian product of the plain forward (placeholders outside ``need``)."""
        ops = (x, y, w)
        idx = [i for i, bit in enumerate((NEED_X, NEED_Y, NEED_W)) if need & bit]
        res = [t.new_empty(0) for t in ops]
        if idx:
            def part(*sel):
                full = list(ops)
                for i, t in zip(idx, sel):
                    full[i] = t
                return self._transformed_fwd(call, *full, math, g.dtype)
            _, vjp = torch.func.vjp(part, *(ops[i] for i in idx))
            for i, r in zip(idx, vjp(g)):
                res[i] = r.to(ops[i].dtype)
        return res[0], res[1], res[2]

    # --- derivative formulas, shared by both paths ------------------------------------------------
    def fwd_grads(self, call, math, x, y, w, g, ni) -> Tuple[Optional[Tensor], ...]:
        """(gx, gy, gw) of the forward for the flags ni[0..2], None for the others."""
        need = ni[0] + 2 * ni[1] + 4 * ni[2]
        if need == 0:
            return None, None, None
        if legacy_batched(g):
            with batched_cotangents():
                return self._fwd_grads(call, math, x, y, w, g, need)
        return self._fwd_grads(call, math, x, y, w, g, need)

    def _fwd_grads(self, call, math, x, y, w, g, need) -> Tuple[Optional[Tensor], ...]:
        g = g.contiguous()
        m = self.method
        if torch.is_grad_enabled() or not is_eager(x, y, w, g) or in_transform():
            gx, gy, gw = self.bwd(call, x, y, w, g, need, math)
        else:  # a plain backward (one eager check: this runs every training step)
            res = m.direct_bwd(call, x, y, w, g, need, math) if m.direct_bwd is not None else None
            gx, gy, gw = res if res is not None else m.bwd(call, x, y, w, g, need, math)
        return gx if need & NEED_X else None, gy if need & NEED_Y else None, gw if need & NEED_W else None

    def bwd_grads(self, call, math, x, y, w, g, need, ga, gb, gc, ni) -> Tuple[Optional[Tensor], ...]:
        """(dx, dy, dw, dg) of the backward for the flags ni[0..3]; ga, gb, gc the cotangents of its
        outputs (a placeholder output, not in ``need``, has none)."""
        a = ga.contiguous() if need & NEED_X and ga is not None else None
        b = gb.contiguous() if need & NEED_Y and gb is not None else None
        c = gc.contiguous() if need & NEED_W and gc is not None else None
        if not torch.compiler.is_compiling() and in_transform():
            with torch.enable_grad():  # the composed form: the fused pass cannot run on transformed tensors
                return trilinear.double_backward(self, call, math, x, y, w, g, a, b, c, ni[0], ni[1], ni[2], ni[3])
        return trilinear.double_backward(self, call, math, x, y, w, g, a, b, c, ni[0], ni[1], ni[2], ni[3])

    # --- custom-op implementations, fakes and autograd ---------------------------------------------
    def _split(self, rest: tuple, scalars: int):
        """(call, scalars) from the arguments after the operands (defaults filled in)."""
        k = len(self.method.extra)
        rest = rest + (None,) * (self._n + scalars - len(rest))
        return self.method.call_of(rest[:k], rest[k:self._n]), rest[self._n:]

    def _fwd_op(self, x, y, w, *rest):
        call, (math, out_dtype) = self._split(rest, 2)
        return self.method.fwd(call, x, y, w, math, out_dtype)

    def _bwd_op(self, x, y, w, g, *rest):
        call, (need, math) = self._split(rest, 2)
        return self.method.bwd(call, x, y, w, g, need, math)

    def _dbwd_op(self, x, y, w, g, a, b, c, *rest):
        call, (have, need, math) = self._split(rest, 3)
        a, b, c = (a if "a" in have else None), (b if "b" in have else None), (c if "c" in have else None)
        return self.method.dbwd(call, x, y, w, g, a, b, c, have, need, math)

    def _fwd_fake(self, x, y, w, *rest):
        k = len(self.method.extra)
        out_dtype = rest[self._n + 1] if len(rest) > self._n + 1 else None
        shape = self.method.out_shape(x, rest[:k], rest[k:self._n])
        return x.new_empty(shape, dtype=out_dtype or x.dtype)

    def _bwd_fake(self, x, y, w, g, *rest):
        need = rest[self._n]
        return tuple(t.new_empty(t.shape) if need & bit else t.new_empty(0)
                     for bit, t in ((NEED_X, x), (NEED_Y, y), (NEED_W, w)))

    def _dbwd_fake(self, x, y, w, g, a, b, c, *rest):
        need = rest[self._n + 1]
        return tuple(t.new_empty(t.shape) if need & bit else t.new_empty(0)
                     for bit, t in zip((1, 2, 4, 8), (x, y, w, g)))

    def _fwd_op_setup(self, ctx, inputs, output):
        k = 3 + len(self.method.extra)
        ctx.save_for_backward(*inputs[:k])  # the operands and the graph tensors
        ctx.static = tuple(inputs[k:3 + self._n])
        ctx.math = inputs[3 + self._n] if len(inputs) > 3 + self._n else None

    def _fwd_op_backward(self, ctx, g):
        saved = ctx.saved_tensors
        call = self.method.call_of(saved[3:], ctx.static)
        return self.fwd_grads(call, ctx.math, *saved[:3], g, ctx.needs_input_grad) + (None,) * (self._n + 2)

    def _bwd_op_setup(self, ctx, inputs, output):
        k = 4 + len(self.method.extra)
        ctx.save_for_backward(*inputs[:k])
        ctx.static = tuple(inputs[k:4 + self._n])
        ctx.need = inputs[4 + self._n]
        ctx.math = inputs[5 + self._n] if len(inputs) > 5 + self._n else None

    def _bwd_op_backward(self, ctx, ga, gb, gc):
        saved = ctx.saved_tensors
        call = self.method.call_of(saved[4:], ctx.static)
        return (self.bwd_grads(call, ctx.math, *saved[:4], ctx.need, ga, gb, gc, ctx.needs_input_grad)
                + (None,) * (self._n + 2))

    def _autocast_fwd(self, keyset, x, *args, **kwargs):
        """Autocast rule of the forward: the output is written in the autocast dtype (unless out_dtype
        is given); the operands are *not* cast. The kernels read each operand in its own dtype and
        compute in float32, so a cast would only add a read-and-write pass (and a rounding) per
        float32 operand. Gradients come back in each operand's dtype (no autocast rule there)."""
        args = args + (kwargs.get("math_dtype"), kwargs.get("out_dtype"))[len(args) - 2 - self._n:]
        if args[-1] is None:
            args = args[:-1] + (autocast_dtype(x),)
        with torch.autocast(x.device.type, enabled=False):
            return self.fwd_op._opoverload(x, *args)


class _Fwd(torch.autograd.Function):
    # ctx-style forward: a separate setup_context makes apply() bind arguments through inspect
    @staticmethod
    def forward(ctx, x, y, w, chain, call, math, out_dtype):
        ctx.save_for_backward(x, y, w)
        ctx.chain, ctx.call, ctx.math = chain, call, math
        return chain.method.fwd(call, x, y, w, math, out_dtype)

    @staticmethod
    def backward(ctx, g):
        x, y, w = ctx.saved_tensors
        return ctx.chain.fwd_grads(ctx.call, ctx.math, x, y, w, g, ctx.needs_input_grad) + (None, None, None, None)


class _Bwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, w, g, chain, call, need, math):
        ctx.save_for_backward(x, y, w, g)
        ctx.chain, ctx.call, ctx.need, ctx.math = chain, call, need, math
        return chain.method.bwd(call, x, y, w, g, need, math)

    @staticmethod
    def backward(ctx, ga, gb, gc):
        x, y, w, g = ctx.saved_tensors
        return ctx.chain.bwd_grads(ctx.call, ctx.math, x, y, w, g, ctx.need, ga, gb, gc,
                                   ctx.needs_input_grad) + (None, None, None, None)


# --- path tables ----------------------------------------------------------------------------------
_TABLES: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()  # custom-op key -> TableOp
_TABLE_IDS = itertools.count()


def register_table(op) -> str:
    """The key that names ``op`` (a ``TableOp``) in traced graphs; called when the op is made, outside
    any trace (a registration inside one would be deferred past the graph's fake run)."""
    key = f"{op.label}#{next(_TABLE_IDS)}"
    _TABLES[key] = op
    return key


def table_apply(op, out_dtype: torch.dtype, tensors: Sequence[Tensor]) -> Tensor:
    """``op`` (a ``TableOp``) on ``tensors`` (its operands in ``op.names`` order), differentiable to
    any order: the eager Function, or the custom op when traced."""
    if is_eager(*tensors):
        if in_transform():  # the reference evaluation: plain torch operations the transforms differentiate
            return reference.evaluate(op.table, dict(zip(op.names, tensors)), op.layout, rows=tensors[0].shape[0],
                                      out_dtype=out_dtype)
        return _TableFn.apply(op, out_dtype, *tensors)
    return _table_op(op.key, list(tensors), out_dtype)


def table_grads(op, tensors: Sequence[Tensor], g: Tensor, needs: Sequence[bool]) -> List[Optional[Tensor]]:
    """Gradients of ``op``'s output with cotangent ``g`` with respect to the operands flagged in
    ``needs``, each in its operand's dtype (None where not needed)."""
    if legacy_batched(g):
        raise RuntimeError(BATCHED_TABLE_ERROR)
    named = dict(zip(op.names, tensors))
    grads: List[Optional[Tensor]] = []
    for name, needed in zip(op.names, needs):
        if not needed:
            grads.append(None)
            continue
        gop = op.grad(name)
        grads.append(gop({**named, f"g{op.level}": g.contiguous()}, named[name].dtype) if gop.table.paths
                     else torch.zeros_like(named[name]))
    return grads


@torch.library.custom_op("equikernels::table", mutates_args=())
def _table_op(key: str, operands: List[Tensor], out_dtype: torch.dtype) -> Tensor:
    op = _TABLES[key]
    return op.evaluate(dict(zip(op.names, operands)), out_dtype)


@_table_op.register_fake
def _table_fake(key: str, operands: List[Tensor], out_dtype: torch.dtype) -> Tensor:
    op = _TABLES[key]
    return operands[0].new_empty((operands[0].shape[0], op.table.operand(op.table.output).dim), dtype=out_dtype)


def _table_setup(ctx, inputs, output):
    ctx.key = inputs[0]
    ctx.save_for_backward(*inputs[1])


def _table_backward(ctx, g):
    return None, table_grads(_TABLES[ctx.key], ctx.saved_tensors, g, ctx.needs_input_grad[1]), None


_table_op.register_autograd(_table_backward, setup_context=_table_setup)


class _TableFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, out_dtype: torch.dtype, *tensors):
        ctx.op = op
        ctx.save_for_backward(*tensors)
        return op.evaluate(dict(zip(op.names, tensors)), out_dtype)

    @staticmethod
    def backward(ctx, g):
        return (None, None, *table_grads(ctx.op, ctx.saved_tensors, g, ctx.needs_input_grad[2:]))
