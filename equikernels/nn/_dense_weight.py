"""A trained block-sparse ``Linear`` weight spread into its dense [dim_in, dim_out] matrix as one op.

``spread(w, place, scale, shape)``: position p of the flattened matrix holds ``w[place[p]] *
scale[p]`` (``place[p] == w.numel()``: a zero). Its adjoint ``collect`` sums a matrix-shaped gradient
back onto the weights; each is the other's backward, so the pair is differentiable to any order
with one autograd node per use instead of the pad / gather / scale / view chain.
"""
from __future__ import annotations

from typing import Tuple

import torch


class _Spread(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, place, scale, shape):
        ctx.save_for_backward(place, scale)
        ctx.numel = w.shape[0]
        return torch.nn.functional.pad(w, (0, 1)).index_select(0, place).mul_(scale).view(shape)

    @staticmethod
    def backward(ctx, g):
        place, scale = ctx.saved_tensors
        return _Collect.apply(g, place, scale, ctx.numel), None, None, None


class _Collect(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, place, scale, numel):
        ctx.save_for_backward(place, scale)
        ctx.shape = g.shape
        return g.new_zeros(numel + 1).index_add_(0, place, g.reshape(-1) * scale)[:numel]

    @staticmethod
    def backward(ctx, gw):
        place, scale = ctx.saved_tensors
        return _Spread.apply(gw, place, scale, ctx.shape), None, None, None


def spread(w: torch.Tensor, place: torch.Tensor, scale: torch.Tensor, shape: Tuple[int, int]) -> torch.Tensor:
    """The dense matrix of ``shape`` whose flattened position p is ``w[place[p]] * scale[p]``
    (zero where ``place[p] == w.numel()``); ``w`` 1-D, ``place`` int64 and ``scale`` (w's dtype)
    of ``shape``'s size."""
    return _Spread.apply(w, place, scale, tuple(shape))
