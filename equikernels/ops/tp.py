"""Batched tensor product as torch custom ops with a composable autograd chain.

``tp_fwd(x, y, w)`` and ``tp_bwd(x, y, w, g) -> (gx, gy, gw)`` are opaque custom ops (Triton on
CUDA, the reference elsewhere). The backward of ``tp_bwd`` is expressed with the same two ops by
trilinearity (docs/architecture.md), so derivatives of any order work. The static problem travels as a JSON
string argument, which keeps exported graphs self-contained.
"""
from __future__ import annotations

import functools
import json
import warnings
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import reference, settings
from . import cpu_e3nn, cpu_tp, native
from ..ir import Table, double_backward_tables, grad_table, tp_table
from ..problem import TPProblem, problem_from_spec

BACKENDS = ("auto", "triton", "reference", "cpu")  # cpu: e3nn's module (ops.cpu_e3nn) or dense contractions (ops.cpu_tp)
LAYOUTS = reference.LAYOUTS
NEED_X, NEED_Y, NEED_W = 1, 2, 4
# Precision policy (docs in tensor_product): operands in any of STORAGE_DTYPES; float16, bfloat16
# and float32 operands may be mixed (each is read in its own dtype, nothing is copied), float64
# only with float64. Math in MATH_DTYPES (default float32, float64 when the operands are float64).
STORAGE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MATH_DTYPES = (torch.float32, torch.float64)
_AUTOCAST_DEVICES = ("cuda", "cpu")


class Plan:
    """Everything static about one (problem, layout): tables and (lazily) generated kernels."""

    def __init__(self, problem: TPProblem, layout: str):
        self.problem = problem
        self.layout = layout
        self.table: Table = tp_table(problem)
        self.grad_tables = {n: grad_table(self.table, n) for n in ("x", "y", "w")}
        self._kernels = None
        self._unsupported = set()
        self._supported = set()

    def generated(self, kind: str, need: int = 0, have: str = "") -> bool:
        """Whether the generator can express this direction (else the reference runs, with a warning)."""
        if (kind, need, have) in self._supported:
            return True
        from ..codegen.emit import Unsupported
        try:
            self.kernels.kernel(kind, need, have)
            self._supported.add((kind, need, have))
            return True
        except Unsupported as exc:
            if (kind, need, have) not in self._unsupported:
                self._unsupported.add((kind, need, have))
                warnings.warn(f"equikernels: no generated kernel for {kind} of {self.problem.describe()} "
                              f"({exc}); using the PyTorch reference")
            return False

    @property
    def kernels(self):
        if self._kernels is None:
            from .. import tune
            from ..codegen.tp import TPKernels  # imported lazily: Triton is optional on CPU
            self._kernels = TPKernels(self, tuner=tune)
        return self._kernels


def spec_of(problem: TPProblem, layout: str) -> str:
    return problem.spec_json[:-1] + ',"layout":"' + layout + '"}'


@functools.lru_cache(maxsize=None)
def plan_of(spec: str) -> Plan:
    d = json.loads(spec)
    layout = d.pop("layout")
    # the tables are built from real CG tensors even when first asked for under a fake-tensor trace
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        return Plan(problem_from_spec(d), layout)


def resolve_backend(backend: Optional[str], device: torch.device) -> str:
    b = backend if backend is not None else settings.get().backend
    if b not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {b!r} (argument or EQUIKERNELS_BACKEND)")
    if b == "auto":
        if device.type == "cuda" and triton_available():
            return "triton"
        return "cpu" if device.type == "cpu" else "reference"
    return b


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


# --- forward ------------------------------------------------------------------------------------
def _fwd_impl(x: Tensor, y: Tensor, w: Tensor, spec: str, backend: str, math_dtype: Optional[torch.dtype] = None,
              out_dtype: Optional[torch.dtype] = None) -> Tensor:
    plan = plan_of(spec)
    if backend == "triton" and plan.generated("fwd"):
        return plan.kernels.forward(x, y, w, out_dtype=out_dtype, math=math_dtype)
    if backend == "cpu":
        return cpu_tp.forward(plan.problem, plan.layout, x, y, w, math_dtype, out_dtype or x.dtype)
    return reference.evaluate(plan.table, {"x": x, "y": y, "w": w}, plan.layout, rows=x.shape[0],
                              math_dtype=math_dtype, out_dtype=out_dtype or x.dtype)


@torch.library.custom_op("equikernels::tp_fwd", mutates_args=())
def tp_fwd(x: Tensor, y: Tensor, w: Tensor, spec: str, backend: str, math_dtype: Optional[torch.dtype] = None,
           out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """out_dtype None: x's dtype (under autocast: the autocast dtype, see _autocast_fwd)."""
    return _fwd_impl(x, y, w, spec, backend, math_dtype, out_dtype)


@tp_fwd.register_fake
def _(x, y, w, spec, backend, math_dtype=None, out_dtype=None):
    return x.new_empty(x.shape[0], plan_of(spec).problem.dim_out, dtype=out_dtype or x.dtype)


def autocast_dtype(x: Tensor) -> Optional[torch.dtype]:
    """The output dtype autocast asks for (None when autocast is off for x's device, or x is float64:
    autocast leaves float64 alone, as it does for matmul)."""
    dev = x.device.type
    if dev not in _AUTOCAST_DEVICES or x.dtype == torch.float64 or not torch.is_autocast_enabled(dev):
        return None
    return torch.get_autocast_dtype(dev)


def _autocast_fwd(keyset, *args, **kwargs):
    """Autocast rule of tp_fwd: the output is written in the autocast dtype (unless out_dtype is
    given); the operands are *not* cast. The kernels read each operand in its own dtype and compute
    in float32, so a cast would only add a read-and-write pass (and a rounding) per float32 operand.
    Gradients come back in each operand's dtype (tp_bwd / tp_dbwd have no autocast rule)."""
    names = ("x", "y", "w", "spec", "backend", "math_dtype", "out_dtype")
    full = dict(zip(names, args), **kwargs)
    full.setdefault("math_dtype", None)
    if full.get("out_dtype") is None:
        full["out_dtype"] = autocast_dtype(full["x"])
    dev = full["x"].device.type
    with torch.autocast(dev, enabled=False):
        return tp_fwd._opoverload(*(full[n] for n in names))


_autocast_lib = torch.library.Library("equikernels", "IMPL")  # kept alive: it owns the registrations
for _key in ("AutocastCUDA", "AutocastCPU"):
    _autocast_lib.impl("tp_fwd", _autocast_fwd, _key, with_keyset=True)


# --- backward -----------------------------------------------------------------------------------
def _bwd_impl(x: Tensor, y: Tensor, w: Tensor, g: Tensor, spec: str, backend: str, need: int,
              math_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor, Tensor]:
    plan = plan_of(spec)
    if backend == "triton" and plan.generated("bwd", need):
        return plan.kernels.backward(x, y, w, g, need, math=math_dtype)
    if backend == "cpu":
        return cpu_tp.backward(plan.problem, plan.layout, x, y, w, g, need, math_dtype)
    ops = {"x": x, "y": y, "w": w, "g": g}
    res = []
    for bit, name, like in ((NEED_X, "x", x), (NEED_Y, "y", y), (NEED_W, "w", w)):
        if need & bit:
            shared = name == "w" and w.dim() == 1
            res.append(reference.evaluate(plan.grad_tables[name], ops, plan.layout, reduce_rows=shared,
                                          rows=x.shape[0], math_dtype=math_dtype, out_dtype=like.dtype))
        else:
            res.append(like.new_empty(0))
    return tuple(res)


@torch.library.custom_op("equikernels::tp_bwd", mutates_args=())
def tp_bwd(x: Tensor, y: Tensor, w: Tensor, g: Tensor, spec: str, backend: str, need: int,
           math_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """(gx, gy, gw), each in the dtype of its operand."""
    return _bwd_impl(x, y, w, g, spec, backend, need, math_dtype)


@tp_bwd.register_fake
def _(x, y, w, g, spec, backend, need, math_dtype=None):
    return tuple(t.new_empty(t.shape) if need & bit else t.new_empty(0)
                 for bit, t in ((NEED_X, x), (NEED_Y, y), (NEED_W, w)))


# --- autograd -----------------------------------------------------------------------------------
def _fwd_setup(ctx, inputs, output):
    x, y, w, spec, backend = inputs[:5]
    ctx.save_for_backward(x, y, w)
    ctx.spec, ctx.backend = spec, backend
    ctx.math = inputs[5] if len(inputs) > 5 else None


def _fwd_backward(ctx, g, *_):
    x, y, w = ctx.saved_tensors
    ni = ctx.needs_input_grad
    need = ni[0] + 2 * ni[1] + 4 * ni[2]
    if need == 0:
        return None, None, None, None, None, None, None
    g = g.contiguous()
    res = None
    if FAST_BWD and ctx.backend == "triton" and not torch.is_grad_enabled() and _eager(x, y, w, g):
        res = _bwd_direct(x, y, w, g, ctx.spec, need, ctx.math)
    gx, gy, gw = res if res is not None else bwd(x, y, w, g, ctx.spec, ctx.backend, need, ctx.math)
    return (gx if need & NEED_X else None, gy if need & NEED_Y else None, gw if need & NEED_W else None,
            None, None, None, None)


tp_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup)


def _bwd_setup(ctx, inputs, output):
    x, y, w, g, spec, backend, need = inputs[:7]
    ctx.save_for_backward(x, y, w, g)
    ctx.spec, ctx.backend, ctx.need = spec, backend, need
    ctx.math = inputs[7] if len(inputs) > 7 else None


def _cot(t: Optional[Tensor], wanted: bool) -> Optional[Tensor]:
    """A usable cotangent, or None when autograd gave none or the output was a placeholder (not
    ``wanted``). A wanted one has its output's shape: autograd checks what it hands a node."""
    return t.contiguous() if wanted and t is not None else None


def _bwd_backward(ctx, ga, gb, gc):
    x, y, w, g = ctx.saved_tensors
    cn = ctx.need
    a, b, c = _cot(ga, cn & NEED_X), _cot(gb, cn & NEED_Y), _cot(gc, cn & NEED_W)
    nx, ny, nw, ng = ctx.needs_input_grad[:4]
    return _double_backward(x, y, w, g, a, b, c, ctx.spec, ctx.backend, ctx.math, nx, ny, nw, ng) \
        + (None, None, None, None)


@functools.lru_cache(maxsize=None)
def _has_unweighted(spec: str) -> bool:
    """Whether the product mixes in instructions without weights (their paths do not depend on w)."""
    return any(not ins.has_weight for ins in plan_of(spec).problem.instructions)


def _have(a, b, c) -> str:
    """The cotangents present, as dbwd's ``have``."""
    return ("a" if a is not None else "") + ("b" if b is not None else "") + ("c" if c is not None else "")


def _double_backward(x, y, w, g, a, b, c, spec, be, m, nx, ny, nw, ng):
    """Trilinear identity: S = <g, T(a,y,w) + T(x,b,w) + T(x,y,c)>, (a,b,c) the cotangents (None:
    absent). (dx, dy, dw, dg), None for those not asked for (nx ... ng).

    When no higher derivative is being recorded (the usual force-training step) one fused op
    computes all four results; otherwise the same identity is composed from tp_fwd / tp_bwd, which
    are differentiable themselves, so any order works.
    """
    if not torch.is_grad_enabled():
        # plain arithmetic, not generators: this runs once per force-training step and is host time
        need = nx + 2 * ny + 4 * nw + 8 * ng
        have = _have(a, b, c)
        res = None
        if FAST_BWD and be == "triton" and _eager(x, y, w, g, a, b, c):
            res = _dbwd_direct(x, y, w, g, a, b, c, spec, have, need, m)
        if res is None:
            e = x.new_empty(0) if len(have) < 3 else None  # placeholder for a missing cotangent
            res = dbwd(x, y, w, g, a if a is not None else e, b if b is not None else e,
                       c if c is not None else e, spec, be, have, need, m)
        return tuple(r if n else None for r, n in zip(res, (nx, ny, nw, ng)))
    dx = dy = dw = dg = None

    def acc(old, new):
        return new if old is None else old + new

    # the T(x, y, c) term is the part of T that depends on w: the unweighted instructions' T(x, y, 0)
    # is taken out again (exact: T is affine in w)
    c0 = torch.zeros_like(c) if c is not None and _has_unweighted(spec) else None
    if ng:
        for args in ((a, y, w), (x, b, w), (x, y, c)):
            if all(t is not None for t in args):
                dg = acc(dg, fwd(*args, spec, be, m, g.dtype))  # dg in g's dtype
        if c0 is not None:
            dg = dg - fwd(x, y, c0, spec, be, m, g.dtype)
    if b is not None and (nx or nw):  # from T(x, b, w): d/dx and d/dw
        rx, _, rw = bwd(x, b, w, g, spec, be, (NEED_X if nx else 0) | (NEED_W if nw else 0), m)
        dx = acc(dx, rx) if nx else dx
        dw = acc(dw, rw) if nw else dw
    if c is not None and (nx or ny):  # from T(x, y, c)
        rx, ry, _ = bwd(x, y, c, g, spec, be, (NEED_X if nx else 0) | (NEED_Y if ny else 0), m)
        if c0 is not None:
            rx0, ry0, _ = bwd(x, y, c0, g, spec, be, (NEED_X if nx else 0) | (NEED_Y if ny else 0), m)
            rx, ry = (rx - rx0 if nx else rx), (ry - ry0 if ny else ry)
        dx = acc(dx, rx) if nx else dx
        dy = acc(dy, ry) if ny else dy
    if a is not None and (ny or nw):  # from T(a, y, w)
        _, ry, rw = bwd(a, y, w, g, spec, be, (NEED_Y if ny else 0) | (NEED_W if nw else 0), m)
        dy = acc(dy, ry) if ny else dy
        dw = acc(dw, rw) if nw else dw
    if ng and dg is None:
        dg = torch.zeros_like(g)
    return dx, dy, dw, dg


tp_bwd.register_autograd(_bwd_backward, setup_context=_bwd_setup)


# --- fused double backward (not differentiable: used only when nothing records higher orders) ---
def _dbwd_impl(x: Tensor, y: Tensor, w: Tensor, g: Tensor, a: Tensor, b: Tensor, c: Tensor, spec: str,
               backend: str, have: str, need: int, math_dtype: Optional[torch.dtype] = None
               ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    plan = plan_of(spec)
    a_, b_, c_ = (t if k in have else None for k, t in zip("abc", (a, b, c)))
    if backend == "triton" and all(plan.generated("dbwd", part, have) for part in plan.kernels.dbwd_parts(need)
                                   if part):
        return plan.kernels.double_backward(x, y, w, g, a_, b_, c_, need, math=math_dtype)
    if backend == "cpu":
        return cpu_tp.double_backward(plan.problem, plan.layout, x, y, w, g, a_, b_, c_, need, math_dtype)
    tensors = {"x": x, "y": y, "w": w, "g": g, "a": a, "b": b, "c": c}
    names = "".join(n for bit, n in zip((1, 2, 4, 8), "xywg") if need & bit)
    tables = double_backward_tables(plan.table, have, names)
    res = []
    for n, like in zip("xywg", (x, y, w, g)):
        if n not in names:
            res.append(like.new_empty(0))
        elif n in tables:
            res.append(reference.evaluate(tables[n], {k: v for k, v in tensors.items() if k in "xywg" or k in have},
                                          plan.layout, rows=x.shape[0], reduce_rows=(n == "w" and w.dim() == 1),
                                          math_dtype=math_dtype, out_dtype=like.dtype))
        else:
            res.append(torch.zeros_like(like))
    return tuple(res)


@torch.library.custom_op("equikernels::tp_dbwd", mutates_args=())
def tp_dbwd(x: Tensor, y: Tensor, w: Tensor, g: Tensor, a: Tensor, b: Tensor, c: Tensor, spec: str, backend: str,
            have: str, need: int, math_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dy, dw, dg), each in the dtype of x, y, w, g."""
    return _dbwd_impl(x, y, w, g, a, b, c, spec, backend, have, need, math_dtype)


@tp_dbwd.register_fake
def _(x, y, w, g, a, b, c, spec, backend, have, need, math_dtype=None):
    return tuple(t.new_empty(t.shape) if need & bit else t.new_empty(0)
                 for bit, t in zip((1, 2, 4, 8), (x, y, w, g)))


# --- eager fast path ------------------------------------------------------------------------------
# torch.library dispatch costs tens of microseconds per call, which is most of the time of a small
# product. Outside tracing the same implementations and autograd formulas run through plain
# autograd.Functions; under torch.compile / export (or fake tensors) the custom ops are used.
_PLAIN = (Tensor, torch.nn.Parameter)


def _eager(*ts) -> bool:
    """Plain tensors outside tracing (None: an absent cotangent, skipped). A loop, not a generator:
    the eager backward and double backward ask this on every call (host time)."""
    if torch.compiler.is_compiling():
        return False
    for t in ts:
        if t is not None and t.__class__ not in _PLAIN:
            return False
    return True


is_eager = _eager  # public name for the opt-in paths in equikernels.experimental


class _Fwd(torch.autograd.Function):
    # ctx-style forward: a separate setup_context makes apply() bind arguments through inspect
    @staticmethod
    def forward(ctx, x, y, w, spec, backend, math_dtype, out_dtype):
        _fwd_setup(ctx, (x, y, w, spec, backend, math_dtype, out_dtype), None)
        return _fwd_impl(x, y, w, spec, backend, math_dtype, out_dtype)

    backward = staticmethod(_fwd_backward)


class _Bwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, w, g, spec, backend, need, math_dtype):
        _bwd_setup(ctx, (x, y, w, g, spec, backend, need, math_dtype), None)
        return _bwd_impl(x, y, w, g, spec, backend, need, math_dtype)

    backward = staticmethod(_bwd_backward)


# --- eager backward without per-call planning ----------------------------------------------------
# TPKernels.backward works out the kernel, launch shape, buffers and split on every call: ~35 us of
# host time on the H200 machine, most of what makes a small product's backward host-bound
# (nequip-water). For channel-wise products with per-row weights whose backward is one
# kernel writing every element once (no autotuning, no poisoning), that answer depends only on
# (problem, need, dtypes): _BwdDirect keeps it, and a call allocates and launches (a launch.Pinned:
# the dtypes are part of the recipe's key). Same kernel, configuration and arguments as
# Kernel.launch passes (pointers in meta.inputs + meta.outputs order, N, NBLK, ROWS, DT, PREC), so
# results are bit-identical (tests/codegen/test_launch.py compares the two paths). Only the eager
# no-grad backward of tp_fwd takes it (and of tp_bwd: _dbwd_direct below); EQUIKERNELS_FAST_BWD=0
# turns both off.
FAST_BWD = settings.get().fast_bwd


def _env_tuning_or_poison() -> bool:
    """Autotuning or poisoning on (both need TPKernels' full path), asked per call as the full path
    asks (tests toggle them)."""
    s = settings.get()
    return s.autotune or s.poison


class _BwdDirect:
    """The resolved backward of one (problem, need, operand dtypes, math_dtype)."""
    __slots__ = ("launch", "rows", "args", "order")

    def __init__(self, launch, rows: int, args: tuple, order: tuple):
        self.launch, self.rows = launch, rows
        self.args = args    # kernel pointer parameters: index into (x, y, w, g, *outputs)
        self.order = order  # operand index (x 0, y 1, w 2) of each gradient computed, in that order


_BWD_DIRECT: dict = {}


def _direct_problem(problem) -> bool:
    """Channel-wise products with per-row weights (MACE / NequIP, the host-bound ones) take the direct
    paths: shared weights are reduced over rows, uvw products may split the weight gradient off or
    take uvw_rows' kernels."""
    from ..codegen import tp as ct  # noqa: PLC0415 - Triton is optional
    return ct.channelwise_rows(problem) and not ct.weights_dominate(problem)


def _plain_kernel(k) -> bool:
    """One kernel writing each element of its outputs once (not split into parts that add into
    zero-filled outputs, no row partials, no wide accumulation buffers)."""
    from ..codegen import tp as ct  # noqa: PLC0415
    return isinstance(k, ct.Kernel) and not (k.meta.zero_init or k.meta.reduce_rows or k.acc_outputs)


def _set_parts(k) -> Optional[list]:
    """The kernels of a _KernelSet (a product split over kernels launched in sequence; outputs two
    parts write are zero-filled and added into) without row partials (its meta's reduce_rows is
    every part's), else None."""
    from ..codegen import tp as ct  # noqa: PLC0415
    return k.parts if isinstance(k, ct._KernelSet) and not k.meta.reduce_rows else None


def _pinned_launch(kernels, kind: str, k, math: torch.dtype, min_rows: int = 0):
    """(launch.Pinned, rows) with the configuration, rows and constexprs Kernel.launch would use
    (``_cfg``: what ``_tuned`` returns without autotuning; ``min_rows``: a _KernelSet's, which _run
    applies to every part)."""
    from ..codegen import tp as ct  # noqa: PLC0415
    from ..codegen.launch import Pinned  # noqa: PLC0415
    cfg = kernels._cfg(kind, math)
    rows = max(cfg.rows, k.meta.min_rows, min_rows)  # as _run raises it
    dt = ct._DT[math]
    prec = "tf32" if cfg.tf32 and dt == ct.tl.float32 else "ieee"
    return Pinned(k.launcher, (rows, dt, prec), cfg.num_warps, cfg.num_stages), rows


def _bwd_direct_plan(spec: str, need: int, x, y, w, g, math_dtype) -> Optional[_BwdDirect]:
    """What TPKernels.backward would launch (None: a case it handles differently, so it runs)."""
    from ..codegen import tp as ct  # noqa: PLC0415 - Triton is optional
    plan = plan_of(spec)
    if not _direct_problem(plan.problem) or not plan.generated("bwd", need):
        return None
    k = plan.kernels.kernel("bwd", need)
    names = tuple("g" + n for bit, n in ((NEED_X, "x"), (NEED_Y, "y"), (NEED_W, "w")) if need & bit)
    if not _plain_kernel(k) or set(k.meta.outputs) != set(names):
        return None
    launch, rows = _pinned_launch(plan.kernels, "bwd", k, ct.math_of(x, y, w, g, math_dtype=math_dtype))
    slot = {n: i for i, n in enumerate(("x", "y", "w", "g") + names)}
    args = tuple(slot[a] for a in k.meta.inputs + k.meta.outputs)
    order = tuple("xyw".index(nm[1]) for nm in names)
    return _BwdDirect(launch, rows, args, order)


def _bwd_direct(x: Tensor, y: Tensor, w: Tensor, g: Tensor, spec: str, need: int,
                math_dtype: Optional[torch.dtype]):
    """(gx, gy, gw) as _bwd_impl computes them (None for those not in ``need``), or None where the full
    path must run."""
    if x.dim() != 2 or _env_tuning_or_poison():
        return None
    key = (spec, need, x.dtype, y.dtype, w.dtype, g.dtype, math_dtype)
    d = _BWD_DIRECT.get(key, False)
    if d is False:
        d = _BWD_DIRECT[key] = _bwd_direct_plan(spec, need, x, y, w, g, math_dtype)
    n = x.shape[0]
    if d is None or n == 0:
        return None
    ops = [x, y, w]
    outs = [_empty_like(ops[i]) for i in d.order]  # operands are contiguous: so are these
    t = ops + [g] + outs
    nblk = (n + d.rows - 1) // d.rows
    d.launch(nblk, [t[i] for i in d.args], (n, nblk))
    if len(outs) == 3:
        return tuple(outs)
    res = [None, None, None]  # None, not a placeholder, for a gradient not asked for: _fwd_backward drops it
    for i, o in zip(d.order, outs):
        res[i] = o
    return tuple(res)


_empty_like = torch.empty_like  # the direct backward's allocator (tests swap in a NaN fill)


# The double backward the same way (nequip-water's double backward is host-bound too):
# TPKernels.double_backward works out the parts, kernels, configuration and buffers per call. For
# the same class of products (channel-wise, per-row weights; every part one plain kernel writing each
# element of its outputs once, or a _KernelSet whose kernels add into zero-filled outputs, as
# nequip-lips' split by first-input segment) _DbwdDirect keeps that per (problem, have, need, dtypes,
# math_dtype) and a call allocates, launches each kernel in double_backward's order and zero-fills the
# outputs no kernel writes, as double_backward does. dbwd_parts (EQUIKERNELS_DBWD_ONE) is read when a
# recipe is made, not per call.
class _DbwdDirect:
    """The resolved double backward of one (problem, have, need, operand dtypes, math_dtype)."""
    __slots__ = ("launches", "res", "written")

    def __init__(self, launches: tuple, res: tuple):
        # per kernel, in launch order: (launch.Pinned, rows, pointer parameters as indexes into
        # (x, y, w, g, a, b, c, *outputs), (operand index (x 0 .. g 3), zero-filled) of each output
        # allocated before it)
        self.launches = launches
        self.res = res  # per x, y, w, g: index of its output in that list, -1 zeros, -2 placeholder
        self.written = min(res) >= 0  # every result comes from a kernel (the usual case)


_DBWD_DIRECT: dict = {}


def _dbwd_direct_plan(spec: str, have: str, need: int, x, y, w, g, a, b, c, math_dtype) -> Optional[_DbwdDirect]:
    """What TPKernels.double_backward would launch (None: a case it handles differently)."""
    from ..codegen import tp as ct  # noqa: PLC0415 - Triton is optional
    plan = plan_of(spec)
    if not _direct_problem(plan.problem):
        return None
    kernels = plan.kernels
    parts = tuple(part for part in kernels.dbwd_parts(need) if part)
    if not all(plan.generated("dbwd", part, have) for part in parts):
        return None
    math = ct.math_of(x, y, w, g, a, b, c, math_dtype=math_dtype)
    slot = {n: i for i, n in enumerate("xywgabc") if i < 4 or n in have}  # x, y, w, g, cotangents present
    written: dict = {}  # "dx" ... -> index in (x, y, w, g, a, b, c, *outputs)
    launches = []
    for part in parts:
        k = kernels.kernel("dbwd", part, have)
        if k is None:  # nothing to compute (dg without cotangents): zeros below
            continue
        meta = k.meta
        mine = {"d" + n for bit, n in zip((1, 2, 4, 8), "xywg") if part & bit}
        sub = [k] if _plain_kernel(k) else _set_parts(k)
        if (sub is None or not set(meta.outputs) <= mine or any(o in written for o in meta.outputs)
                or not set(meta.inputs) <= set(slot)):
            return None
        # outputs the parts add into: _run keeps half-precision ones in a float32 buffer (declined here)
        dt = {"dx": x.dtype, "dy": y.dtype, "dw": w.dtype, "dg": g.dtype}
        if any(ct.acc_dtype(dt[o]) != dt[o] for o in k.acc_outputs):
            return None
        new = tuple(o for o in ("dx", "dy", "dw", "dg") if o in meta.outputs)  # _run's allocation order
        for o in new:
            written[o] = 7 + len(written)
        allocs = tuple(("xywg".index(o[1]), o in meta.zero_init) for o in new)
        for q in sub:
            args = tuple(slot[i] for i in q.meta.inputs) + tuple(written[o] for o in q.meta.outputs)
            launches.append(_pinned_launch(kernels, "dbwd", q, math, meta.min_rows) + (args, allocs))
            allocs = ()
    res = tuple(written.get("d" + n, -1) if need & bit else -2 for bit, n in zip((1, 2, 4, 8), "xywg"))
    return _DbwdDirect(tuple(launches), res)


def _dbwd_key(x, y, w, g, a, b, c, spec, have, need, math_dtype) -> tuple:
    """_DBWD_DIRECT's key: the recipe depends on these only."""
    return (spec, have, need, x.dtype, y.dtype, w.dtype, g.dtype, a.dtype if a is not None else None,
            b.dtype if b is not None else None, c.dtype if c is not None else None, math_dtype)


def _dbwd_direct(x: Tensor, y: Tensor, w: Tensor, g: Tensor, a: Optional[Tensor], b: Optional[Tensor],
                 c: Optional[Tensor], spec: str, have: str, need: int, math_dtype: Optional[torch.dtype]):
    """(dx, dy, dw, dg) as _dbwd_impl computes them (zeros for a result no term contributes to, an
    empty placeholder for one not in ``need``), or None where the full path must run. a, b, c: the
    cotangents, None where absent (``have`` names the others)."""
    if x.dim() != 2 or not need or _env_tuning_or_poison():
        return None
    key = _dbwd_key(x, y, w, g, a, b, c, spec, have, need, math_dtype)
    d = _DBWD_DIRECT.get(key, False)
    if d is False:
        d = _DBWD_DIRECT[key] = _dbwd_direct_plan(spec, have, need, x, y, w, g, a, b, c, math_dtype)
    n = x.shape[0]
    if d is None or n == 0:
        return None
    ops = (x, y, w, g)
    t = [x, y, w, g, a, b, c]
    for launch, rows, args, new in d.launches:
        for i, zero in new:  # operands are contiguous: so are these
            t.append(torch.zeros_like(ops[i]) if zero else _empty_like(ops[i]))
        nblk = (n + rows - 1) // rows
        launch(nblk, [t[i] for i in args], (n, nblk))
    r = d.res
    if d.written:
        return t[r[0]], t[r[1]], t[r[2]], t[r[3]]
    return tuple(t[j] if j >= 0 else (torch.zeros_like(o) if j == -1 else o.new_empty(0))
                 for j, o in zip(r, ops))


# --- the backward as a C++ autograd node (ops/native.py) ---------------------------------------------
# Under create_graph the backward's node is C++: its backward (the double backward) launches the
# direct path's kernels without Python, else calls _native_fallback. One entry per (problem, need,
# dtypes, math_dtype), kept for the process.
_NATIVE_ENTRIES: dict = {}


def _native_fallback(key):
    """The double backward for the C++ node of entry ``key`` where it has no recipe; a direct-path
    recipe that just ran is handed to the node."""
    spec, be, m = key[0], key[1], key[-1]

    def fallback(x, y, w, g, a, b, c, need):
        res = _double_backward(x, y, w, g, a, b, c, spec, be, m, need & 1, need >> 1 & 1, need >> 2 & 1,
                               need >> 3 & 1)
        if not torch.is_grad_enabled() and FAST_BWD and x.is_cuda:
            d = _DBWD_DIRECT.get(_dbwd_key(x, y, w, g, a, b, c, spec, _have(a, b, c), need, m))
            if d:
                hb = (a is not None) | (b is not None) << 1 | (c is not None) << 2
                native.register(_NATIVE_ENTRIES[key], hb, need, d, x.shape[0])
        return res
    return fallback


def _bwd_native(x, y, w, g, spec, backend, need, math_dtype):
    """bwd under create_graph with a C++ node recording it (same results as _Bwd.apply)."""
    key = (spec, backend, need, x.dtype, y.dtype, w.dtype, g.dtype, math_dtype)
    entry = _NATIVE_ENTRIES.get(key)
    if entry is None:
        entry = _NATIVE_ENTRIES[key] = native._ext.make_entry(need, _native_fallback(key))
    with torch.no_grad():
        res = _bwd_direct(x, y, w, g, spec, need, math_dtype)
        if res is None:
            res = _bwd_impl(x, y, w, g, spec, backend, need, math_dtype)
    gx, gy, gw = (r if need & bit else None for r, bit in zip(res, (NEED_X, NEED_Y, NEED_W)))
    return native._ext.attach(entry, x, y, w, g, gx, gy, gw)


def fwd(x, y, w, spec, backend, math_dtype=None, out_dtype=None):
    if _eager(x, y, w):
        # the eager path skips the dispatcher, so it applies tp_fwd's autocast rule itself
        out_dtype = out_dtype or autocast_dtype(x)
        if backend == "cpu":
            problem = plan_of(spec).problem
            if cpu_e3nn.applicable(problem, x, y, w, math_dtype, out_dtype):  # e3nn's module, its autograd
                return cpu_e3nn.forward(problem, plan_of(spec).layout, x, y, w)
        return _Fwd.apply(x, y, w, spec, backend, math_dtype, out_dtype)
    return tp_fwd(x, y, w, spec, backend, math_dtype, out_dtype)


def bwd(x, y, w, g, spec, backend, need, math_dtype=None):
    if _eager(x, y, w, g):
        if not torch.is_grad_enabled():  # a plain backward: nothing to record, skip Function.apply
            return _bwd_impl(x, y, w, g, spec, backend, need, math_dtype)
        if FAST_BWD and backend == "triton" and native.wanted(x):
            return _bwd_native(x, y, w, g, spec, backend, need, math_dtype)
        return _Bwd.apply(x, y, w, g, spec, backend, need, math_dtype)
    return tp_bwd(x, y, w, g, spec, backend, need, math_dtype)


def dbwd(x, y, w, g, a, b, c, spec, backend, have, need, math_dtype=None):
    if _eager(x, y, w, g, a, b, c):
        return _dbwd_impl(x, y, w, g, a, b, c, spec, backend, have, need, math_dtype)
    return tp_dbwd(x, y, w, g, a, b, c, spec, backend, have, need, math_dtype)


# --- public entry point -------------------------------------------------------------------------
def tensor_product(problem: TPProblem, x: Tensor, y: Tensor, weight: Optional[Tensor] = None, *,
                   layout: str = "mul_ir", backend: Optional[str] = None, math_dtype: Optional[torch.dtype] = None,
                   output_dtype: Optional[torch.dtype] = None) -> Tensor:
    """out = TP(x, y, weight) with e3nn semantics; leading dimensions broadcast like e3nn's.

    Precision: x, y and weight may be float16, bfloat16 or float32 in any combination (each is read
    in its own dtype), or all float64. ``math_dtype`` (float32 or float64; default float64 for
    float64 operands, else float32) is what every product is computed and accumulated in.
    ``output_dtype`` defaults to x's dtype, under ``torch.autocast`` (CUDA or CPU, x not float64)
    to the autocast dtype; the operands are not cast by autocast. Gradients come back in the dtype
    of the operand they belong to (per-program partial sums of a shared weight's gradient are
    float32 and summed in float64 before the final rounding).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    _check_tensor("x", x, problem.dim_in1, "irreps_in1")
    _check_tensor("y", y, problem.dim_in2, "irreps_in2")
    _check_same("y", y, x)
    check_dtypes(math_dtype, output_dtype)
    nw = problem.weight_numel
    be = resolve_backend(backend, x.device)
    spec = spec_of(problem, layout)
    if x.dim() == 2 and y.dim() == 2 and x.shape[0] == y.shape[0] and (
            nw == 0 or (isinstance(weight, Tensor) and weight.dtype == x.dtype and weight.device == x.device and (
                weight.shape == ((nw,) if problem.shared_weights else (x.shape[0], nw))))):
        # the common case (rows x features, matching weights): no broadcasting work on the hot path
        w = x.new_empty(0) if nw == 0 else weight.contiguous()
        return fwd(x.contiguous(), y.contiguous(), w, spec, be, math_dtype, output_dtype)
    try:
        batch = torch.broadcast_shapes(x.shape[:-1], y.shape[:-1])
    except RuntimeError:
        raise ValueError(f"x and y: batch dimensions {tuple(x.shape[:-1])} and {tuple(y.shape[:-1])} "
                         "do not broadcast") from None
    if nw == 0:
        w = x.new_empty(0)
    else:
        if weight is None:
            raise ValueError("weight: this tensor product has weights (internal_weights=False); pass weight")
        _check_same("weight", weight, x)
        if not weight.is_floating_point():
            raise TypeError(f"weight: expected a floating-point tensor, got {weight.dtype}")
        if problem.shared_weights:
            if weight.shape != (nw,):
                raise ValueError(f"weight: expected shape ({nw},) for shared weights, got {tuple(weight.shape)}")
            w = weight.contiguous()
        else:
            if weight.dim() < 1 or weight.shape[-1] != nw:
                raise ValueError(f"weight: expected shape (..., {nw}) for per-row weights, got {tuple(weight.shape)}")
            try:
                batch = torch.broadcast_shapes(batch, weight.shape[:-1])
            except RuntimeError:
                raise ValueError(f"weight: batch dimensions {tuple(weight.shape[:-1])} do not broadcast with "
                                 f"{tuple(batch)}") from None
            w = weight.expand(batch + (nw,)).reshape(batch.numel(), nw).contiguous()
    # explicit row counts: reshape(-1, 0) is ambiguous for zero-width (empty-irreps) operands
    xf = x.expand(batch + x.shape[-1:]).reshape(batch.numel(), x.shape[-1]).contiguous()
    yf = y.expand(batch + y.shape[-1:]).reshape(batch.numel(), y.shape[-1]).contiguous()
    out = fwd(xf, yf, w, spec, be, math_dtype, output_dtype)
    return out.reshape(batch + (problem.dim_out,))


def check_dtypes(math_dtype: Optional[torch.dtype], output_dtype: Optional[torch.dtype]) -> None:
    if math_dtype is not None and math_dtype not in MATH_DTYPES:
        raise ValueError(f"math_dtype: expected torch.float32 or torch.float64 (or None), got {math_dtype}")
    if output_dtype is not None and output_dtype not in STORAGE_DTYPES:
        raise ValueError(f"output_dtype: expected one of {', '.join(map(str, STORAGE_DTYPES))} (or None), "
                         f"got {output_dtype}")


def _check_tensor(name: str, t, dim: int, irreps_name: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if t.dtype not in STORAGE_DTYPES:
        raise TypeError(f"{name}: expected a float16, bfloat16, float32 or float64 tensor, got {t.dtype}")
    if t.dim() < 1 or t.shape[-1] != dim:
        raise ValueError(f"{name}: expected last dimension {dim} ({irreps_name}), got shape {tuple(t.shape)}")


def _check_same(name: str, t: Tensor, x: Tensor) -> None:
    """Same device as x; dtypes that may be combined (float16/bfloat16/float32 freely, float64 only
    with float64)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.is_floating_point() and t.dtype not in STORAGE_DTYPES:
        raise TypeError(f"{name}: expected a float16, bfloat16, float32 or float64 tensor, got {t.dtype}")
    if t.dtype != x.dtype and torch.float64 in (t.dtype, x.dtype):
        raise TypeError(f"{name}: dtype {t.dtype} does not match x ({x.dtype}); float64 operands cannot be mixed "
                        "with other dtypes (float16, bfloat16 and float32 can)")
    if t.device != x.device:
        raise ValueError(f"{name}: device {t.device} does not match x ({x.device})")


check_same = _check_same  # public name for the opt-in paths in equikernels.experimental
