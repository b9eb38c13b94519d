"""Output rows of the grouped CPU product from per-segment path results, in one pass each way.

Each output segment is the sum of its sources: a [rows, do, mul] slice of a path result
[rows, K, mul], times the path's channel weights where it has them. The forward writes every segment
straight into its place in the output row and the backward writes each source's gradient straight
into one buffer per result: no concatenation, weight gather or index-add. In ir_mul every
elementwise pass runs along the contiguous channel axis; in mul_ir the segment is written through a
transposed view (``ops.cpu_grouped`` says where that pays), and the backward copies each segment's
cotangent once into channel order, so that its sources' passes read it contiguously.
Differentiable to any order: with a graph being recorded the backward is composed of
differentiable torch operations.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

# (result index, first component k, do, weight index or -1, path within the weight)
Source = Tuple[int, int, int, int, int]
# (offset in the row, mul, do, sources)
Segment = Tuple[int, int, int, Tuple[Source, ...]]


def assemble(segments: Sequence[Segment], dim_out: int, results: List[Tensor], weights: List[Tensor],
             layout: str = "ir_mul") -> Tensor:
    """[rows, dim_out] in ``layout``: every segment the sum of its sources, zeros where it has none.

    ``results[r]``: [rows, K_r, mul]; ``weights[i]``: [rows or 1, paths, mul]. Every component of
    every result is the source of exactly one segment."""
    segments = tuple((off, mul, do, sources, layout == "mul_ir") for off, mul, do, sources in segments)
    return _Assemble.apply(segments, dim_out, len(results), *results, *weights)


def _dst(out: Tensor, off: int, mul: int, do: int, transposed: bool) -> Tensor:
    """The segment's [rows, do, mul] view of a row (a transposed view of its [rows, mul, do] in mul_ir)."""
    seg = out.narrow(1, off, mul * do)
    return seg.view(-1, mul, do).transpose(1, 2) if transposed else seg.view(-1, do, mul)


def _term(results, weights, src: Source) -> Tuple[Tensor, Optional[Tensor]]:
    r, k0, do, wi, p = src
    v = results[r].narrow(1, k0, do)
    return v, (weights[wi].narrow(1, p, 1) if wi >= 0 else None)  # [rows, 1, mul]


def _forward(segments, dim_out: int, results, weights) -> Tensor:
    out = results[0].new_empty(results[0].shape[0], dim_out)
    for off, mul, do, sources, transposed in segments:
        dst = _dst(out, off, mul, do, transposed)
        if not sources:
            dst.zero_()
        for n, src in enumerate(sources):
            v, w = _term(results, weights, src)
            if n == 0:
                torch.mul(v, w, out=dst) if w is not None else dst.copy_(v)
            elif w is not None:
                dst.addcmul_(v, w)
            else:
                dst.add_(v)
    return out


def _weight_grad(gs: Tensor, v: Tensor, like: Tensor) -> Tensor:
    """[rows or 1, mul]: sum over the components of gs * v (and over rows for shared weights)."""
    prod = (gs * v).sum(1)
    return prod if like.shape[0] == prod.shape[0] else prod.sum(0, keepdim=True)


def _backward_fused(segments, results, weights, g: Tensor, need_r, need_w):
    grad_r = [torch.empty_like(v) if need else None for v, need in zip(results, need_r)]
    grad_w = [torch.empty_like(w) if need else None for w, need in zip(weights, need_w)]
    for off, mul, do, sources, transposed in segments:
        gs = _dst(g, off, mul, do, transposed)
        if transposed and sources:
            gs = gs.contiguous()  # one strided copy; then each source's passes run along the channels
        for src in sources:
            r, k0, _, wi, p = src
            v, w = _term(results, weights, src)
            if grad_r[r] is not None:
                dst = grad_r[r].narrow(1, k0, do)
                torch.mul(gs, w, out=dst) if w is not None else dst.copy_(gs)
            if wi >= 0 and grad_w[wi] is not None:
                grad_w[wi].select(1, p).copy_(_weight_grad(gs, v, weights[wi]))
    return grad_r, grad_w


def _backward_composed(segments, results, weights, g: Tensor, need_r, need_w):
    """The same gradients from differentiable operations (a higher derivative is being recorded)."""
    pieces_r = [{} for _ in results]
    pieces_w = [{} for _ in weights]
    for off, mul, do, sources, transposed in segments:
        gs = _dst(g, off, mul, do, transposed)
        for src in sources:
            r, k0, _, wi, p = src
            v, w = _term(results, weights, src)
            if need_r[r]:
                pieces_r[r][k0] = gs * w if w is not None else gs
            if wi >= 0 and need_w[wi]:
                pieces_w[wi][p] = _weight_grad(gs, v, weights[wi])
    grad_r = [torch.cat([pieces[k] for k in sorted(pieces)], 1) if need else None
              for pieces, need in zip(pieces_r, need_r)]
    grad_w = [torch.stack([pieces[p] for p in sorted(pieces)], 1) if need else None
              for pieces, need in zip(pieces_w, need_w)]
    return grad_r, grad_w


class _Assemble(torch.autograd.Function):
    @staticmethod
    def forward(ctx, segments, dim_out, n_results, *tensors):
        ctx.save_for_backward(*tensors)
        ctx.meta = (segments, n_results)
        return _forward(segments, dim_out, list(tensors[:n_results]), list(tensors[n_results:]))

    @staticmethod
    def backward(ctx, g):
        segments, n_results = ctx.meta
        tensors = ctx.saved_tensors
        results, weights = list(tensors[:n_results]), list(tensors[n_results:])
        need = ctx.needs_input_grad[3:]
        fn = _backward_composed if torch.is_grad_enabled() else _backward_fused
        grad_r, grad_w = fn(segments, results, weights, g, need[:n_results], need[n_results:])
        return (None, None, None, *grad_r, *grad_w)
