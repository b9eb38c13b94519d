"""A trained block-sparse ``Linear`` weight spread into its dense [dim_in, dim_out] matrix as one op.

``spread(w, place, scale, shape)``: position p of the flattened matrix holds ``w[place[p]] *
scale[p]`` (``place[p] == w.numel()``: a zero). Its adjoint ``collect`` sums a matrix-shaped gradient
back onto the weights; each is the other's backward (both are linear, so each is its own forward-mode
derivative), so the pair is differentiable to any order, in forward mode and under torch.func
transforms, with one autograd node per use instead of the pad / gather / scale / view chain.
"""
from __future__ import annotations

from typing import Tuple

import torch


def _spread(w, place, scale, shape):
    return (torch.nn.functional.pad(w, (0, 1)).index_select(0, place) * scale).view(shape)


def _collect(g, place, scale, numel):
    return g.new_zeros(numel + 1).index_add(0, place, g.reshape(-1) * scale)[:numel]


class _Spread(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(w, place, scale, shape):
        return _spread(w, place, scale, shape)

    @staticmethod
    def setup_context(ctx, inputs, output):
        w, place, scale, shape = inputs
        ctx.save_for_backward(place, scale)
        ctx.save_for_forward(place, scale)
        ctx.numel, ctx.shape = w.shape[0], shape

    @staticmethod
    def backward(ctx, g):
        place, scale = ctx.saved_tensors
        return _Collect.apply(g, place, scale, ctx.numel), None, None, None

    @staticmethod
    def jvp(ctx, w_t, place_t, scale_t, shape_t):
        place, scale = ctx.saved_tensors
        return _Spread.apply(w_t, place, scale, ctx.shape)


class _Collect(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(g, place, scale, numel):
        return _collect(g, place, scale, numel)

    @staticmethod
    def setup_context(ctx, inputs, output):
        g, place, scale, numel = inputs
        ctx.save_for_backward(place, scale)
        ctx.save_for_forward(place, scale)
        ctx.numel, ctx.shape = numel, tuple(g.shape)

    @staticmethod
    def backward(ctx, gw):
        place, scale = ctx.saved_tensors
        return _Spread.apply(gw, place, scale, ctx.shape), None, None, None

    @staticmethod
    def jvp(ctx, g_t, place_t, scale_t, numel_t):
        place, scale = ctx.saved_tensors
        return _Collect.apply(g_t, place, scale, ctx.numel)


def spread(w: torch.Tensor, place: torch.Tensor, scale: torch.Tensor, shape: Tuple[int, int]) -> torch.Tensor:
    """The dense matrix of ``shape`` whose flattened position p is ``w[place[p]] * scale[p]``
    (zero where ``place[p] == w.numel()``); ``w`` 1-D, ``place`` int64 and ``scale`` (w's dtype)
    of ``shape``'s size. Traced by torch.compile: the plain operations."""
    if torch.compiler.is_compiling():
        return _spread(w, place, scale, tuple(shape))
    return _Spread.apply(w, place, scale, tuple(shape))
