"""Fused radial MLP: ``out = L_{n-1}(σ(… σ(L_0(x))))`` with ``L_i(h) = h @ W_i`` (bias-free, the
weights already divided by sqrt(fan_in)) and ``σ = act_scale · SiLU`` between layers, none after
the last: e3nn's ``FullyConnectedNet(hs, silu)`` as MACE runs it per edge.

On the triton backend (CUDA by default; ``backend="triton"`` / ``EQUIKERNELS_BACKEND=triton``
elsewhere runs Triton's interpreter) float32 and float64 inputs run experimental/codegen_mlp.py's kernels: one
for the forward of the whole chain, one for its backward, which recomputes the activations from x
(nothing per row is saved but x). Weight gradients are matmuls of the activations and deltas that
the backward kernel writes when a weight needs one. Everywhere else (the reference backend,
float16/bfloat16, widths the kernels do not take) the plain torch chain runs.

Dot precision of the kernels (float32 only; float64 is always exact): ``precision=`` or
``EQUIKERNELS_MLP_PRECISION`` = ieee | tf32x3 | tf32, default ``DEFAULT_PRECISION``.

Derivatives of any order: a backward that is itself being recorded (``create_graph=True``) is
computed with differentiable torch ops (the chain recomputed), so second and higher derivatives
are exact autograd. As in ops/tp.py, eager calls go through a plain autograd.Function (no
dispatcher cost) and traced ones (torch.compile / export) through the custom ops
``equikernels::mlp_fwd`` / ``mlp_bwd`` with fake implementations.
"""
from __future__ import annotations

from numbers import Real
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import settings
from ..ops.tp import is_eager, resolve_backend

PRECISIONS = ("ieee", "tf32x3", "tf32")
# float32 dot precision of the kernels: three tf32 tensor-core passes, about fp32 accuracy (plain
# tf32 would cost ~1e-3 relative, beyond the 1e-5 fp32 parity with mace-torch; ieee runs the dots on
# CUDA cores). To be confirmed on the H200: devtools/s5/mlp_gpu.py measures all three.
DEFAULT_PRECISION = "tf32x3"
PRECISION_ENV = "EQUIKERNELS_MLP_PRECISION"
# dtypes the kernels take (others run the torch chain)
KERNEL_DTYPES = (torch.float32, torch.float64)
# dtypes the "auto" backend sends to the kernels on CUDA: float64 stays on cuBLAS (its kernel
# spills on sm_90 and was not timed against DGEMM); backend="triton" runs the kernels for both
AUTO_DTYPES = (torch.float32,)
# Under the auto backend the kernels are opt-in (EQUIKERNELS_FUSED_MLP=1). H200, 795,010 rows,
# fp32 tf32x3 vs cuBLAS: layer [10,64,64,64,1280] forward 5.08 vs 5.22 ms, backward for x 3.73 vs
# 4.29, backward for x and W 11.4 vs 10.2; in a MACE E+F step (weights requiring grad, so this op's
# backward also forms weight gradients that autograd would have pruned) 37.3 vs 30.0 ms
# (H200). Off until fused into the convolution.
FUSED_ENV = "EQUIKERNELS_FUSED_MLP"


def resolve_precision(precision: Optional[str], dtype: torch.dtype) -> str:
    p = precision if precision is not None else (settings.get().mlp_precision or DEFAULT_PRECISION)
    if p not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {p!r} (argument or {PRECISION_ENV})")
    return "ieee" if dtype == torch.float64 else p


# --- the plain torch chain and its derivative formulas (differentiable) -------------------------------
def _act(z: Tensor, act_scale: float) -> Tensor:
    a = torch.nn.functional.silu(z)
    return a if act_scale == 1.0 else a.mul(act_scale)  # e3nn normalize2mom: f(x).mul(cst)


def mlp_chain(x: Tensor, weights: Sequence[Tensor], act_scale: float) -> Tensor:
    last = len(weights) - 1
    for i, w in enumerate(weights):
        x = x @ w
        if i < last:
            x = _act(x, act_scale)
    return x


def _torch_grads(x: Tensor, weights: Sequence[Tensor], g: Tensor, act_scale: float, need_x: bool,
                 need_w: Sequence[bool]) -> Tuple[Optional[Tensor], List[Optional[Tensor]]]:
    """(grad_x, [grad_W_i]) of <g, chain(x)> by explicit torch ops: autograd can differentiate them
    again (double backward and beyond)."""
    acts, ps = [x], []
    h = x
    for w in weights[:-1]:
        z = h @ w
        s = torch.sigmoid(z)
        h = _act(z, act_scale)
        acts.append(h)
        ps.append(act_scale * s * (1 + z * (1 - s)))  # d/dz of act_scale * z * sigmoid(z)
    gws: List[Optional[Tensor]] = [None] * len(weights)
    d = g
    for i in range(len(weights) - 1, -1, -1):
        if need_w[i]:
            gws[i] = acts[i].transpose(0, 1) @ d
        if i == 0 and not need_x:
            break
        d = d @ weights[i].transpose(0, 1)
        if i > 0:
            d = d * ps[i - 1]
    return (d if need_x else None), gws


# --- kernel implementations (not differentiable) -------------------------------------------------------
def _widths(x: Tensor, weights: Sequence[Tensor]) -> Tuple[int, ...]:
    return (int(x.shape[1]),) + tuple(int(w.shape[1]) for w in weights)


def _fwd_impl(x: Tensor, weights: Sequence[Tensor], act_scale: float, precision: str) -> Tensor:
    from .codegen_mlp import kernels_for  # noqa: PLC0415 (Triton imported on demand)
    return kernels_for(_widths(x, weights)).forward(x, weights, act_scale, precision)


def _bwd_impl(x: Tensor, weights: Sequence[Tensor], g: Tensor, act_scale: float, precision: str,
              need: int) -> List[Tensor]:
    """[grad_x] + [grad_W_i]; bit 0 of ``need`` asks for grad_x, bit i+1 for grad_W_i (the others
    come back empty)."""
    from .codegen_mlp import kernels_for  # noqa: PLC0415
    need_w = [bool(need >> (i + 1) & 1) for i in range(len(weights))]
    gx, acts, deltas = kernels_for(_widths(x, weights)).backward(x, weights, g, act_scale, precision,
                                                                 bool(need & 1), any(need_w))
    ins, outs = [x] + acts, deltas + [g]
    gws = [ins[i].transpose(0, 1) @ outs[i] if n else w.new_empty(0) for i, (w, n) in enumerate(zip(weights, need_w))]
    return [gx if gx is not None else x.new_empty(0)] + gws


@torch.library.custom_op("equikernels::mlp_fwd", mutates_args=())
def mlp_fwd(x: Tensor, weights: List[Tensor], act_scale: float, precision: str) -> Tensor:
    """out [rows, weights[-1].shape[1]] by the fused kernel."""
    return _fwd_impl(x, weights, act_scale, precision)


@mlp_fwd.register_fake
def _(x, weights, act_scale, precision):
    return x.new_empty(x.shape[0], weights[-1].shape[1])


@torch.library.custom_op("equikernels::mlp_bwd", mutates_args=())
def mlp_bwd(x: Tensor, weights: List[Tensor], g: Tensor, act_scale: float, precision: str, need: int
            ) -> List[Tensor]:
    """[grad_x] + [grad_W_i] by the fused backward kernel (see _bwd_impl for ``need``). Not
    differentiable: used only when no higher derivative is being recorded."""
    return _bwd_impl(x, weights, g, act_scale, precision, need)


@mlp_bwd.register_fake
def _(x, weights, g, act_scale, precision, need):
    return [x.new_empty(x.shape) if need & 1 else x.new_empty(0)] + [
        w.new_empty(w.shape) if need >> (i + 1) & 1 else w.new_empty(0) for i, w in enumerate(weights)]


# --- autograd (shared by the eager Function and the custom op) ------------------------------------------
def _grads(x: Tensor, weights: Sequence[Tensor], g: Tensor, act_scale: float, precision: str, need_x: bool,
           need_w: Sequence[bool]) -> Tuple[Optional[Tensor], List[Optional[Tensor]]]:
    need_w = [bool(n) for n in need_w]
    if not (need_x or any(need_w)):
        return None, [None] * len(weights)
    g = g.contiguous()
    if torch.is_grad_enabled():  # the backward is being recorded: differentiable torch ops
        return _torch_grads(x, weights, g, act_scale, need_x, need_w)
    need = int(need_x) | sum(1 << (i + 1) for i, n in enumerate(need_w) if n)
    if is_eager(x, g, *weights):
        res = _bwd_impl(x, weights, g, act_scale, precision, need)
    else:
        res = mlp_bwd(x, list(weights), g, act_scale, precision, need)
    return (res[0] if need_x else None), [r if n else None for r, n in zip(res[1:], need_w)]


class _Fwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, act_scale, precision, *weights):
        ctx.save_for_backward(x, *weights)
        ctx.act_scale, ctx.precision = act_scale, precision
        return _fwd_impl(x, weights, act_scale, precision)

    @staticmethod
    def backward(ctx, g):
        x, *weights = ctx.saved_tensors
        gx, gws = _grads(x, weights, g, ctx.act_scale, ctx.precision, ctx.needs_input_grad[0],
                         ctx.needs_input_grad[3:])
        return (gx, None, None, *gws)


def _op_setup(ctx, inputs, output):
    x, weights, act_scale, precision = inputs
    ctx.save_for_backward(x, *weights)
    ctx.act_scale, ctx.precision = act_scale, precision


def _op_backward(ctx, g):
    x, *weights = ctx.saved_tensors
    need_w = ctx.needs_input_grad[1]
    gx, gws = _grads(x, weights, g, ctx.act_scale, ctx.precision, ctx.needs_input_grad[0],
                     need_w if isinstance(need_w, (list, tuple)) else [need_w] * len(weights))
    return gx, gws, None, None


mlp_fwd.register_autograd(_op_backward, setup_context=_op_setup)


# --- public entry point ---------------------------------------------------------------------------------
def _check(x, weights, act_scale) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if not isinstance(weights, (list, tuple)) or len(weights) == 0:
        raise ValueError(f"weights: expected a non-empty list of 2-D tensors, got {type(weights).__name__}"
                         + (" of length 0" if isinstance(weights, (list, tuple)) else ""))
    if x.dim() != 2:
        raise ValueError(f"x: expected a 2-D tensor [rows, features], got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x: expected a floating-point tensor, got {x.dtype}")
    width, prev = x.shape[1], "x"
    for i, w in enumerate(weights):
        name = f"weights[{i}]"
        if not isinstance(w, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(w).__name__}")
        if w.dim() != 2:
            raise ValueError(f"{name}: expected a 2-D tensor [fan_in, fan_out], got shape {tuple(w.shape)}")
        if w.shape[0] != width:
            raise ValueError(f"{name}: expected {width} rows (the width of {prev}), got shape {tuple(w.shape)}")
        if w.dtype != x.dtype:
            raise TypeError(f"{name}: dtype {w.dtype} does not match x ({x.dtype})")
        if w.device != x.device:
            raise ValueError(f"{name}: device {w.device} does not match x ({x.device})")
        width, prev = w.shape[1], name
    if isinstance(act_scale, bool) or not isinstance(act_scale, Real):
        raise TypeError(f"act_scale: expected a real number, got {type(act_scale).__name__}")


def kernel_path(x: Tensor, weights: Sequence[Tensor], backend: Optional[str] = None) -> bool:
    """Whether ``radial_mlp`` runs the fused kernels for these operands (else the torch chain)."""
    if resolve_backend(backend, x.device) != "triton" or x.dtype not in KERNEL_DTYPES:
        return False
    s = settings.get()
    if (backend or s.backend) == "auto" and (x.dtype not in AUTO_DTYPES or not s.fused_mlp):
        return False
    from .codegen_mlp import unsupported  # noqa: PLC0415
    return unsupported(_widths(x, weights)) is None


def radial_mlp(x: Tensor, weights: Sequence[Tensor], act_scale: float = 1.0, *, backend: Optional[str] = None,
               precision: Optional[str] = None) -> Tensor:
    """``x [rows, weights[0].shape[0]] -> [rows, weights[-1].shape[1]]``: ``h = h @ W_i``, then
    ``act_scale * silu(h)`` between layers (none after the last).

    ``weights``: 2-D tensors ``[fan_in, fan_out]`` (already scaled; e3nn divides by sqrt(fan_in)),
    same dtype and device as x. ``backend``: "auto" (Triton on CUDA), "triton" or "reference"
    (default ``EQUIKERNELS_BACKEND``). ``precision``: dot precision of the float32 kernels, one of
    ``PRECISIONS`` (default ``EQUIKERNELS_MLP_PRECISION`` or ``DEFAULT_PRECISION``).
    """
    _check(x, weights, act_scale)
    act_scale = float(act_scale)
    prec = resolve_precision(precision, x.dtype)
    if not kernel_path(x, weights, backend):
        return mlp_chain(x, weights, act_scale)
    x = x.contiguous()
    ws = [w.contiguous() for w in weights]
    if is_eager(x, *ws):
        return _Fwd.apply(x, act_scale, prec, *ws)
    return mlp_fwd(x, ws, act_scale, prec)
