"""Tall-skinny matrix products of the radial MLPs: ``x [E, K] @ w [K, N]`` with E edges and K, N of
a few tens to a few thousand.

cuBLAS's float32 kernels run these shapes without tensor cores at about half the FMA peak. On the
"triton" backend (CUDA by default) float32 products with constant weights (inference, MD) run one
Triton kernel whose tile shape and dot precision ``config`` picks per shape: FMA dots ("ieee",
float32 rounding) where K and N are small, three TF32 tensor-core passes ("tf32x3", split operands,
float32 accumulation) where K is large, and where a narrow input feeds a wide output (one program
per row block, its input tile split once and reused for every column tile). Measured on an H100
against float64 products, both stay within float32 error (see docs/performance.md).

With ``act="silu"`` the product is ``silu(x) @ w``, the activation applied as the kernel loads x
(the MLP's activations are never written), and its backward ``(g @ w.T) * silu'(x)`` is one kernel
too. The backward is this op again for ``x`` and a torch product for ``w``; under ``create_graph``
both are recorded with differentiable operations, so derivatives of any order are exact autograd.

With ``paired=True`` the product of M rows is returned twice, as rows m and M + m of a [2M, N]
result: the radial weights of an edge and of its reverse (the same length) are computed once. The
kernel stores each tile twice, and the backward reads the two rows' cotangents summed as it loads
them (no [2M, N] intermediate).
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch
from torch import Tensor

from .chain import in_transform
from .silu import silu, silu_grad
from .tp import resolve_backend, triton_available

# dtypes sent to the kernel on CUDA by default (float64 stays on cuBLAS's tensor-core DGEMM). By
# default only constant weights: a training step with the kernels measured 1 % slower than cuBLAS.
AUTO_DTYPES = (torch.float32,)
KERNEL_DTYPES = (torch.float32, torch.float64)
MIN_DIM = 16  # tl.dot's smallest K and N
ACTS = (None, "silu")


ROWS_MAX_K = 128  # the widest x tile one program keeps in registers across its column tiles
# below this many rows a deep product (k >= 256) runs 64-row tiles: twice the programs to fill the
# GPU (H100, 40,128 rows x 1280 -> 64: 0.293 -> 0.249 ms; at 405,472 rows 128-row tiles stay faster)
DEEP_SMALL_ROWS = 150_000


def config(k: int, n: int, dtype: torch.dtype, tf32: bool = True,
           rows: Optional[int] = None) -> Tuple[int, int, int, int, str, bool]:
    """(rows, columns, depth per step, warps, dot precision, row programs) of the kernel for
    ``[rows, k] @ [k, n]``; ``tf32``: whether the device has TF32 tensor cores. Row programs loop over
    the output's columns, x's tile loaded and split once."""
    if dtype == torch.float64:
        return 64, 64, 16, 4, "ieee", False
    if k >= 256 and tf32:  # the backward of a wide layer: tensor cores, the depth loop is long
        return (64 if rows is not None and rows < DEEP_SMALL_ROWS else 128), 64, 32, 4, "tf32x3", False
    if k <= ROWS_MAX_K and n >= 256 and tf32:  # a wide layer's forward: the output's store dominates
        return 128, 64, k, 4, "tf32x3", True
    return (64, 128, 32, 4, "ieee", False) if n >= 128 else (64, 64, 32, 4, "ieee", False)


def kernel_available(x: Tensor, w: Tensor, backend: Optional[str] = None) -> bool:
    """Whether ``matmul(x, w, backend)`` runs the kernel (else torch's ``x @ w``): ``backend`` None
    = float32 on CUDA with weights that take no gradient (inference, MD) where the backend in force
    is "triton"; "triton" = float32 and float64 on any device (Triton's interpreter off CUDA)."""
    if x.dim() != 2 or w.dim() != 2 or x.dtype != w.dtype or x.device != w.device:
        return False
    if x.shape[1] < MIN_DIM or w.shape[1] < MIN_DIM or torch.compiler.is_compiling():
        return False
    if in_transform() or resolve_backend(backend, x.device) != "triton":  # (inside transforms: torch's matmul)
        return False
    if backend is None:  # automatic: CUDA float32, constant weights (the interpreter elsewhere is for tests)
        return (x.device.type == "cuda" and x.dtype in AUTO_DTYPES and not w.requires_grad
                and triton_available())
    return x.dtype in KERNEL_DTYPES and triton_available()


def matmul(x: Tensor, w: Tensor, backend: Optional[str] = None, act: Optional[str] = None,
           paired: bool = False) -> Tensor:
    """``a(x) @ w`` for ``x`` [M, K] and ``w`` [K, N], ``a`` the identity or SiLU (``act="silu"``),
    differentiable to any order; with ``paired`` the [M, N] product twice, stacked: [2M, N]."""
    if act not in ACTS:
        raise ValueError(f"act: expected one of {ACTS}, got {act!r}")
    if not kernel_available(x, w, backend):
        a = silu(x) if act else x
        if paired and x.dtype == torch.float64:
            # DGEMM on tensor cores: computing both halves costs less than copying the [2M, N] result
            return torch.cat((a, a)) @ w
        y = a @ w
        return torch.cat((y, y)) if paired else y
    return _MatMul.apply(x, w, act, backend, bool(paired))


@functools.lru_cache(maxsize=None)
def _has_tf32(device: torch.device) -> bool:
    # TF32 tensor cores from compute capability 8.0; the interpreter off CUDA takes any precision
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 0)


def _product(x: Tensor, w: Tensor, silu_in: bool = False, dsilu_z: Optional[Tensor] = None,
             pair_in: bool = False, pair_out: bool = False) -> Tensor:
    """The kernel's a(x) @ w (times SiLU'(dsilu_z)); ``pair_in``: of x[:M] + x[M:] (x has 2M rows);
    ``pair_out``: the result twice, [2M, N]."""
    from ._matmul_kernel import launch  # noqa: PLC0415 (Triton only where it runs)
    m = x.shape[0] // 2 if pair_in else x.shape[0]
    out = torch.empty(2 * m if pair_out else m, w.shape[1], dtype=x.dtype, device=x.device)
    if out.numel():
        launch(x, w, out, config(x.shape[1], w.shape[1], x.dtype, _has_tf32(x.device), m), silu_in,
               None if dsilu_z is None else dsilu_z.contiguous(), pair_in, pair_out)
    return out


class _MatMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, act, backend, paired):
        ctx.save_for_backward(x, w)
        ctx.act, ctx.backend, ctx.paired = act, backend, paired
        return _product(x.detach(), w.detach(), silu_in=act == "silu", pair_out=paired)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = gw = None
        fused = not torch.is_grad_enabled() and kernel_available(g, w.t(), ctx.backend)
        m = x.shape[0]
        # the two rows' cotangents summed, unless only the kernel reads them (it sums them as it loads)
        gs = g[:m] + g[m:] if ctx.paired and (not fused or ctx.needs_input_grad[1]) else g
        if ctx.needs_input_grad[0]:
            if fused:  # SiLU's derivative applied as the product's tile is stored
                gx = _product(g, w.t(), dsilu_z=x if ctx.act else None, pair_in=ctx.paired)
            else:
                gx = matmul(gs, w.t(), ctx.backend)
                gx = silu_grad(x, gx) if ctx.act else gx
        if ctx.needs_input_grad[1]:
            gw = (silu(x) if ctx.act else x).t() @ gs
        return gx, gw, None, None, None
