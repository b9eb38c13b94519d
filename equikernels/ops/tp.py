"""The batched tensor product: its implementations (Triton on CUDA, dense contractions or e3nn on
CPU, the reference elsewhere) as a ``chain.Method``, and the public entry point.

The chain (``ops.chain``) makes them the custom ops ``tp_fwd(x, y, w)``, ``tp_bwd(x, y, w, g) ->
(gx, gy, gw)`` and ``tp_dbwd``, differentiable to any order. The static problem travels as a JSON
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
from ..dtypes import MATH_DTYPES, STORAGE_DTYPES, math_dtype_of
from . import cpu_e3nn, cpu_grouped, cpu_tp, native, trilinear
from .chain import NEED_W, NEED_X, NEED_Y, Chain, Method, have_of
from .chain import autocast_dtype, is_eager  # noqa: F401 (public names for equikernels.experimental)
from ..ir import Table, double_backward_tables, grad_table, tp_table
from ..problem import TPProblem, problem_from_spec

BACKENDS = ("auto", "triton", "reference", "cpu")  # cpu: ops.cpu_grouped, e3nn's module (ops.cpu_e3nn) or ops.cpu_tp
LAYOUTS = reference.LAYOUTS
# Precision policy (docs in tensor_product, dtypes in equikernels.dtypes): each operand is read in
# its own dtype, nothing is copied; math in float32, float64 when the operands are float64.


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


def check_backend(backend: Optional[str]) -> Optional[str]:
    """``backend`` when it is None (the setting decides at the call) or one of ``BACKENDS``; raises a
    one-line ``ValueError`` otherwise, so that a module refuses a misspelt backend when it is built."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend: expected None or one of {BACKENDS}, got {backend!r}")
    return backend


def resolve_backend(backend: Optional[str], device: torch.device) -> str:
    b = backend if backend is not None else settings.get().backend
    if b not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {b!r} (argument or EQUIKERNELS_BACKEND)")
    if b == "auto":
        if device.type == "cuda" and triton_available():
            return "triton"
        return "cpu" if device.type == "cpu" else "reference"
    if b == "triton" and not triton_available():
        raise ValueError("backend 'triton' needs Triton, which is not installed (pip install triton); "
                         "backend 'auto' chooses one that runs here (argument or EQUIKERNELS_BACKEND)")
    if b == "triton" and device.type != "cuda" and not settings.get().triton_interpret:
        settings.reload()  # TRITON_INTERPRET may have been set after the settings were read
        if not settings.get().triton_interpret:
            raise ValueError(f"backend 'triton' runs on CUDA devices, or on the CPU with TRITON_INTERPRET=1; "
                             f"the tensors are on {device.type}")
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



@functools.lru_cache(maxsize=None)
def _has_unweighted(spec: str) -> bool:
    """Whether the product mixes in instructions without weights (their paths do not depend on w)."""
    return any(not ins.has_weight for ins in plan_of(spec).problem.instructions)


def _double_backward(x, y, w, g, a, b, c, spec, be, m, nx, ny, nw, ng):
    """(dx, dy, dw, dg) of the trilinear identity (ops.trilinear), None for those not asked for
    (nx ... ng); a, b, c the cotangents, None where absent."""
    return trilinear.double_backward(TP, (spec, be), m, x, y, w, g, a, b, c, nx, ny, nw, ng)


# --- fused double backward (not differentiable: used only when nothing records higher orders) ---
def _dbwd_impl(x: Tensor, y: Tensor, w: Tensor, g: Tensor, a: Optional[Tensor], b: Optional[Tensor],
               c: Optional[Tensor], spec: str, backend: str, have: str, need: int,
               math_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """a, b, c: used where named in ``have`` (the others may be None or placeholders)."""
    plan = plan_of(spec)
    a_, b_, c_ = (t if k in have else None for k, t in zip("abc", (a, b, c)))
    math = math_dtype_of((x, y, w, g, a_, b_, c_), math_dtype)
    if backend == "triton" and all(plan.generated("dbwd", part, have)
                                   for part in plan.kernels.dbwd_parts(need, math) if part):
        return plan.kernels.double_backward(x, y, w, g, a_, b_, c_, need, math=math)
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


# --- the product as the chain's method ---------------------------------------------------------------
class _Product(Method):
    """The batched product's implementations; a call is (spec, backend)."""
    name = "tp"
    static = ("spec", "backend")

    @staticmethod
    def args_of(call):
        return call

    @staticmethod
    def call_of(extra, static):
        return static

    @staticmethod
    def out_shape(x, extra, static):
        return x.shape[0], plan_of(static[0]).problem.dim_out

    @staticmethod
    def unweighted(call) -> bool:
        return _has_unweighted(call[0])

    @staticmethod
    def fwd(call, x, y, w, math, out_dtype):
        return _fwd_impl(x, y, w, call[0], call[1], math, out_dtype)

    @staticmethod
    def bwd(call, x, y, w, g, need, math):
        return _bwd_impl(x, y, w, g, call[0], call[1], need, math)

    @staticmethod
    def dbwd(call, x, y, w, g, a, b, c, have, need, math):
        return _dbwd_impl(x, y, w, g, a, b, c, call[0], call[1], have, need, math)

    @staticmethod
    def plain_fwd(call, x, y, w, math, out_dtype):
        """The reference (plain torch operations) on every backend: what torch.func transforms run."""
        plan = plan_of(call[0])
        return reference.evaluate(plan.table, {"x": x, "y": y, "w": w}, plan.layout, rows=x.shape[0],
                                  math_dtype=math, out_dtype=out_dtype or x.dtype)

    @staticmethod
    def eager_fwd(call, x, y, w, math, out_dtype):
        """On the cpu backend the grouped channel-wise product or e3nn's module, with autograd, where
        either applies."""
        if call[1] != "cpu":
            return None
        plan = plan_of(call[0])
        if cpu_grouped.applicable(plan.problem, x, y, w, math, out_dtype):
            return cpu_grouped.forward(plan.problem, plan.layout, x, y, w)
        if cpu_e3nn.applicable(plan.problem, x, y, w, math, out_dtype):
            return cpu_e3nn.forward(plan.problem, plan.layout, x, y, w)
        return None

    @staticmethod
    def direct_bwd(call, x, y, w, g, need, math):
        return _bwd_direct(x, y, w, g, call[0], need, math) if FAST_BWD and call[1] == "triton" else None

    @staticmethod
    def direct_dbwd(call, x, y, w, g, a, b, c, have, need, math):
        if FAST_BWD and call[1] == "triton":
            return _dbwd_direct(x, y, w, g, a, b, c, call[0], have, need, math)
        return None

    @staticmethod
    def record_bwd(call, x, y, w, g, need, math):
        if FAST_BWD and call[1] == "triton" and native.wanted(x):
            return _bwd_native(x, y, w, g, call[0], call[1], need, math)
        return None


TP = Chain(_Product())
tp_fwd, tp_bwd, tp_dbwd = TP.fwd_op, TP.bwd_op, TP.dbwd_op


# --- eager backward without per-call planning ----------------------------------------------------
# TPKernels.backward asks for its plan, kernels and buffers on every call: host time that makes a
# small product's backward host-bound (nequip-water). For the products the launcher pins recipes for
# (codegen.recipe: one plain backward kernel; no autotuning, no poisoning) the answer depends only
# on (problem, need, dtypes): the recipe is kept per key and a call allocates and launches, with the
# same kernel, launch shape and pointer order as TPKernels, so results are bit-identical
# (tests/codegen/test_launch.py compares the two paths). Only the eager no-grad backward of tp_fwd
# takes it (and of tp_bwd: _dbwd_direct below); EQUIKERNELS_FAST_BWD=0 turns both off.
FAST_BWD = settings.at_import().fast_bwd


def _env_tuning_or_poison() -> bool:
    """Autotuning or poisoning on (both need TPKernels' full path), asked per call as the full path
    asks (tests toggle them)."""
    s = settings.get()
    return s.autotune or s.poison


_BWD_DIRECT: dict = {}


def _bwd_direct_plan(spec: str, need: int, x, y, w, g, math_dtype):
    """The pinned recipe (codegen.recipe.BwdRecipe) of this backward, or None (the full path runs)."""
    return plan_of(spec).kernels.recipe("bwd", need, "", math_dtype_of((x, y, w, g), math_dtype))


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


# The double backward the same way (host-bound too for small products): a codegen.recipe.DbwdRecipe
# per (problem, have, need, dtypes, math_dtype) launches each kernel of the plan in order and
# zero-fills the outputs no kernel writes, as TPKernels.double_backward does. The plan (e.g.
# EQUIKERNELS_DBWD_ONE) is read when a recipe is made, not per call.
_DBWD_DIRECT: dict = {}


def _dbwd_direct_plan(spec: str, have: str, need: int, x, y, w, g, a, b, c, math_dtype):
    """The pinned recipe (codegen.recipe.DbwdRecipe) of this double backward, or None."""
    math = math_dtype_of((x, y, w, g, a, b, c), math_dtype)
    return plan_of(spec).kernels.recipe("dbwd", need, have, math, (x.dtype, y.dtype, w.dtype, g.dtype))


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
            d = _DBWD_DIRECT.get(_dbwd_key(x, y, w, g, a, b, c, spec, have_of(a, b, c), need, m))
            if d:
                hb = (a is not None) | (b is not None) << 1 | (c is not None) << 2
                native.register(_NATIVE_ENTRIES[key], hb, need, d, x.shape[0])
        return res
    return fallback


def _bwd_native(x, y, w, g, spec, backend, need, math_dtype):
    """bwd under create_graph with a C++ node recording it (same results as the chain's eager backward)."""
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
    return TP.fwd((spec, backend), x, y, w, math_dtype, out_dtype)


def bwd(x, y, w, g, spec, backend, need, math_dtype=None):
    return TP.bwd((spec, backend), x, y, w, g, need, math_dtype)


def dbwd(x, y, w, g, a, b, c, spec, backend, have, need, math_dtype=None):
    """a, b, c: None (or a placeholder) where not named in ``have``."""
    return TP.dbwd((spec, backend), x, y, w, g, a, b, c, have, need, math_dtype)


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
        return TP.fwd((spec, be), x.contiguous(), y.contiguous(), w, math_dtype, output_dtype)
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
    """A floating-point tensor on x's device, of a dtype that may be combined with x's
    (float16/bfloat16/float32 freely, float64 only with float64)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():  # (before the float64 rule below, whose message assumes a float)
        raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if t.dtype not in STORAGE_DTYPES:
        raise TypeError(f"{name}: expected a float16, bfloat16, float32 or float64 tensor, got {t.dtype}")
    if t.dtype != x.dtype and torch.float64 in (t.dtype, x.dtype):
        raise TypeError(f"{name}: dtype {t.dtype} does not match x ({x.dtype}); float64 operands cannot be mixed "
                        "with other dtypes (float16, bfloat16 and float32 can)")
    if t.device != x.device:
        raise ValueError(f"{name}: device {t.device} does not match x ({x.device})")


check_same = _check_same  # public name for the opt-in paths in equikernels.experimental
