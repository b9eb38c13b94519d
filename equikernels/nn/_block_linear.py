"""The frozen-weight ``Linear`` in the ir_mul layout as strided batched matrix products.

In the ir_mul layout component c of an irreps block (mul, l) of a feature row is ``mul`` contiguous
numbers at ``offset + c * mul``: over the rows and components the block is a [2l+1, N, mul] batch
of matrices whose row stride is the row width. A batched matrix product reads it where it lies and
writes its result where it belongs in the output row, so the map needs no regrouping copies and no
concatenation: one batched product per instruction, the weight broadcast over the components.

``block_linear(x, weights, terms, dim_out)`` is differentiable with respect to ``x`` to any order:
its backward is the same map with the transposed weights. The weights are constants (no gradient).
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch

# one instruction: (input offset, mul_in, ir dim, output offset, mul_out, index into the weights)
Term = Tuple[int, int, int, int, int, int]


def _apply(x: torch.Tensor, weights: Sequence[torch.Tensor], terms: Sequence[Term], dim_out: int) -> torch.Tensor:
    n, dim_in = x.shape
    covered = sum(d * mo for _, _, d, oo, mo, _ in {t[3]: t for t in terms}.values()) == dim_out
    out = x.new_empty(n, dim_out) if covered else x.new_zeros(n, dim_out)
    written = set()
    for in_off, mi, d, out_off, mo, k in terms:
        a = x.as_strided((d, n, mi), (mi, dim_in, 1), x.storage_offset() + in_off)
        y = out.as_strided((d, n, mo), (mo, dim_out, 1), out.storage_offset() + out_off)
        w = weights[k].expand(d, mi, mo)
        if covered and out_off not in written:
            torch.bmm(a, w, out=y)  # the first term of an output block writes it
            written.add(out_off)
        else:
            y.baddbmm_(a, w)
    return out


def _transposed(terms: Sequence[Term]) -> Tuple[Term, ...]:
    return tuple((oo, mo, d, io, mi, k) for io, mi, d, oo, mo, k in terms)


class _BlockLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weights, terms, dim_out):
        ctx.weights_t = tuple(w.t() for w in weights)
        ctx.terms_t = _transposed(terms)
        ctx.dim_in = x.shape[1]
        return _apply(x, weights, terms, dim_out)

    @staticmethod
    def backward(ctx, grad):
        return _BlockLinear.apply(grad.contiguous(), ctx.weights_t, ctx.terms_t, ctx.dim_in), None, None, None


def block_linear(x: torch.Tensor, weights: Sequence[torch.Tensor], terms: Sequence[Term], dim_out: int) -> torch.Tensor:
    """``x`` [N, dim_in] (ir_mul rows) -> [N, dim_out]: for every term, output block += input block @
    ``weights[k]`` ([mul_in, mul_out], no gradient), component by component; output columns that no
    term writes are zeros."""
    if any(w.requires_grad for w in weights):
        raise ValueError("block_linear: the weights are constants here (a weight that takes gradients "
                         "needs the per-block path)")
    return _BlockLinear.apply(x.contiguous(), tuple(weights), tuple(terms), int(dim_out))
