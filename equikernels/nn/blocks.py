"""One irreps block of feature rows as a matrix for a channel-mixing product."""
from __future__ import annotations

import torch


def rows_by_component(block: torch.Tensor, n: int, d: int, mul: int, ir_mul: bool) -> torch.Tensor:
    """``block`` [n, mul * d] (any row stride) -> [n * d, mul], row ``i * d + m`` = component m of row i.

    Copies unless the block is already contiguous in ir_mul order: a matrix product on this matrix
    is one GEMM, while ``matmul`` on the strided [n, d, mul] view runs a batched product per row
    with the weight broadcast (many times slower on CUDA).
    """
    if ir_mul:
        return block.reshape(n * d, mul)
    return block.reshape(n, mul, d).transpose(1, 2).reshape(n * d, mul)
