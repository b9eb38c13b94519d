"""The precision rules every backend shares: which dtypes are half precision, the dtype math runs
in, and the dtype of buffers that are added into more than once."""
from __future__ import annotations

from typing import Iterable, Optional

import torch

HALF = (torch.float16, torch.bfloat16)
# operands may be stored in any of these: half and float32 mixed freely, float64 only with float64
STORAGE_DTYPES = HALF + (torch.float32, torch.float64)
MATH_DTYPES = (torch.float32, torch.float64)  # what products are computed and accumulated in


def math_dtype_of(tensors: Iterable[Optional[torch.Tensor]], math_dtype: Optional[torch.dtype] = None) -> torch.dtype:
    """float64 when any operand is float64, else float32 (half-precision operands are computed in
    float32, as the generated kernels do); ``math_dtype`` overrides."""
    if math_dtype is not None:
        return math_dtype
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of a buffer that is added into more than once (per-program partials, outputs that
    several kernels or atomics add into): float32 for half-precision results, so only the final
    value is rounded to the half type."""
    return torch.float32 if dtype in HALF else dtype
