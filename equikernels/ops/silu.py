"""SiLU whose second derivative is one elementwise pass.

Force training differentiates the radial MLP twice. torch's derivative of ``silu_backward`` is a
chain of about twenty elementwise kernels over each [edges, hidden] activation; here it is one
kernel with two outputs (Triton where the backend is "triton", the same formula in torch
elsewhere). The forward and first derivative are torch's own single kernels. Third and higher
derivatives run through differentiable torch formulas.

    silu(z) = z s,   silu'(z) = s (1 + z (1 - s)),   silu''(z) = s (1 - s) (2 + z (1 - 2 s)),
    s = sigmoid(z)
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .batching import legacy_batched
from .chain import in_transform
from .tp import resolve_backend, triton_available

BLOCK = 1024


def silu(z: Tensor) -> Tensor:
    """``torch.nn.functional.silu(z)``, differentiable to any order (torch.func transforms, torch.jit.trace
    and compilation see torch's own op)."""
    if not (torch.is_grad_enabled() and z.requires_grad) or _torch_op_only():
        return torch.nn.functional.silu(z)
    return _SiLU.apply(z)


def silu_grad(z: Tensor, g: Tensor) -> Tensor:
    """``g * silu'(z)`` (the cotangent of z given g of silu(z)), differentiable to any order."""
    if not (torch.is_grad_enabled() and (z.requires_grad or g.requires_grad)) or _torch_op_only():
        return torch.ops.aten.silu_backward(g, z)
    return _SiLUBackward.apply(z, g)


def _torch_op_only() -> bool:
    """Where the Functions cannot run: compiled graphs, torch.func transforms (even on captured plain
    tensors) and torch.jit.trace (a traced Python autograd Function cannot be saved)."""
    return torch.compiler.is_compiling() or in_transform() or _is_tracing()


_is_tracing = getattr(torch._C, "_is_tracing", torch.jit.is_tracing)  # (half the cost of the public wrapper)


def _derivatives(z: Tensor) -> Tuple[Tensor, Tensor]:
    s = torch.sigmoid(z)
    return s * (1 + z * (1 - s)), s * (1 - s) * (2 + z * (1 - 2 * s))


def second_order(z: Tensor, g: Tensor, gg: Tensor, need_z: bool, need_g: bool) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """The cotangents of ``silu_backward(g, z) = g silu'(z)`` given its cotangent ``gg``:
    (gg g silu''(z), gg silu'(z)), None where not needed."""
    if (torch.is_grad_enabled() or resolve_backend(None, z.device) != "triton" or not triton_available()
            or legacy_batched(gg, g)):  # autograd's batched cotangents: the kernel cannot read them
        d1, d2 = _derivatives(z)
        return (gg * g * d2 if need_z else None), (gg * d1 if need_g else None)
    z, g, gg = z.contiguous(), g.contiguous(), gg.contiguous()
    gz = torch.empty_like(z) if need_z else None
    gdg = torch.empty_like(z) if need_g else None
    if z.numel():
        from ._silu_kernel import launch  # noqa: PLC0415 (Triton only where it runs)
        launch(z, g, gg, gz, gdg, BLOCK)
    return gz, gdg


class _SiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return torch.nn.functional.silu(z)

    @staticmethod
    def backward(ctx, g):
        (z,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            return _SiLUBackward.apply(z, g)
        return torch.ops.aten.silu_backward(g, z)


class _SiLUBackward(torch.autograd.Function):
    """``g silu'(z)`` (torch's ``silu_backward``) with a one-pass derivative."""

    @staticmethod
    def forward(ctx, z, g):
        ctx.save_for_backward(z, g)
        return torch.ops.aten.silu_backward(g, z)

    @staticmethod
    def backward(ctx, gg):
        z, g = ctx.saved_tensors
        return second_order(z, g, gg, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
