"""Autograd's batched cotangents (``torch.autograd.grad(is_grads_batched=True)``, ``vectorize=True`` in
torch.autograd.functional): the kernels cannot read such a tensor, so derivative passes that receive
one run the custom ops, which autograd's batching calls once per batch entry."""
from __future__ import annotations

import torch
from torch import Tensor

try:
    _legacy_batched = torch._C._functorch.is_legacy_batchedtensor
except AttributeError:  # a torch without the query: no batched cotangents to see
    def _legacy_batched(t: Tensor) -> bool:
        return False

DEPTH = [0]  # derivative passes running on batched cotangents; the chain's ``is_eager`` reads it
BATCHED_TABLE_ERROR = ("batched cotangents (torch.autograd.grad(is_grads_batched=True), torch.autograd.functional's "
                       "vectorize=True) cannot pass a path table such as the symmetric contraction; use "
                       "torch.func.vmap over torch.autograd.grad, torch.func.jacrev / hessian, or vectorize=False")


def legacy_batched(*ts) -> bool:
    """Whether a cotangent (None: absent) carries autograd's own batch dimension."""
    for t in ts:
        if t is not None and _legacy_batched(t):
            return True
    return False


class batched_cotangents:
    """Inside: every chain call takes its custom op (``is_eager`` is False)."""

    def __enter__(self):
        DEPTH[0] += 1

    def __exit__(self, *exc):
        DEPTH[0] -= 1
