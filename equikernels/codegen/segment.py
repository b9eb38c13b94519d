"""Deterministic segment sum: out[n] = sum of rows val[perm[ptr[n]:ptr[n+1]]], in that order.

Used by the deterministic convolution for node gradients computed per edge (gx, dx), so that no
atomics are needed and the summation order is fixed by the sorted edge order.
"""
import torch
import triton
import triton.language as tl

_DT = {torch.float32: tl.float32, torch.float64: tl.float64}


@triton.jit
def _segment_sum(val_ptr, perm_ptr, nptr_ptr, out_ptr, D, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
                 DT: tl.constexpr):
    node = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    e0 = tl.load(nptr_ptr + node)
    e1 = tl.load(nptr_ptr + node + 1)
    acc = tl.zeros([BLOCK_E, BLOCK_D], DT)
    for k0 in range(e0, e1, BLOCK_E):
        r = k0 + tl.arange(0, BLOCK_E)
        m = r < e1
        e = tl.load(perm_ptr + r, mask=m, other=0).to(tl.int64)
        acc += tl.load(val_ptr + e[:, None] * D + cols[None, :], mask=m[:, None] & cmask[None, :], other=0.0).to(DT)
    tl.store(out_ptr + node.to(tl.int64) * D + cols, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=cmask)


def segment_sum(val: torch.Tensor, perm: torch.Tensor, ptr: torch.Tensor, num_nodes: int) -> torch.Tensor:
    d = val.shape[1]
    out = torch.empty(num_nodes, d, dtype=val.dtype, device=val.device)
    if num_nodes == 0 or d == 0:
        return out
    block_d = min(256, triton.next_power_of_2(d))
    _segment_sum[(num_nodes, triton.cdiv(d, block_d))](val, perm, ptr, out, d, BLOCK_E=4, BLOCK_D=block_d,
                                                       DT=_DT[val.dtype], num_warps=4)
    return out
