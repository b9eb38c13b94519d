"""e3nn-compatible ``SphericalHarmonics`` module with a ``layout`` option.

The polynomials themselves are e3nn's (already fused elementwise code, cheap next to the tensor
products), evaluated by a private e3nn instance so the numbers match the installed e3nn exactly.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .._compat import o3

__all__ = ["SphericalHarmonics", "ir_mul_permutation"]


def ir_mul_permutation(irreps) -> Optional[torch.Tensor]:
    """Index ``perm`` with ``x_ir_mul = x_mul_ir[..., perm]``; None when both layouts coincide."""
    perm, off = [], 0
    for mul, ir in o3.Irreps(irreps):
        d = ir.dim
        perm += [off + u * d + i for i in range(d) for u in range(mul)]
        off += mul * d
    return None if perm == list(range(off)) else torch.tensor(perm, dtype=torch.long)


class SphericalHarmonics(nn.Module):
    """Drop-in ``e3nn.o3.SphericalHarmonics(irreps_out, normalize, normalization, irreps_in)``.

    ``layout="ir_mul"`` returns component-major blocks. For the usual one-copy-per-l output
    (``[0, 1, 2]``, ``"0e+1o+2e"``) both layouts are the same tensor; they differ only when an l
    is repeated consecutively (``"2x1o"``), which the permutation handles.
    """

    def __init__(self, irreps_out, normalize: bool, normalization: str = "integral", irreps_in=None, *,
                 layout: str = "mul_ir") -> None:
        super().__init__()
        if layout not in ("mul_ir", "ir_mul"):
            raise ValueError(f"layout: expected 'mul_ir' or 'ir_mul', got {layout!r}")
        if normalization not in ("integral", "component", "norm"):
            raise ValueError(f"normalization: expected 'integral', 'component' or 'norm', got {normalization!r}")
        impl = o3.SphericalHarmonics(irreps_out, normalize, normalization, irreps_in)
        self._impl = (impl,)  # a tuple, so it is not a registered submodule (keeps named_modules clean)
        self.irreps_in, self.irreps_out = impl.irreps_in, impl.irreps_out
        self.normalize, self.normalization = normalize, normalization
        self._ls_list, self._lmax, self._is_range_lmax = impl._ls_list, impl._lmax, impl._is_range_lmax
        self.layout = layout
        perm = ir_mul_permutation(self.irreps_out) if layout == "ir_mul" else None
        self.register_buffer("_perm", perm, persistent=False)  # e3nn's module has no state to mirror

    def __repr__(self) -> str:
        lay = "" if self.layout == "mul_ir" else f", layout={self.layout}"
        return f"{self.__class__.__name__}({self._ls_list}, normalize={self.normalize}{lay})"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., 3] -> [..., irreps_out.dim]."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != 3:
            raise ValueError(f"x: expected last dimension 3 (a vector, irreps_in={self.irreps_in}), "
                             f"got shape {tuple(x.shape)}")
        sh = self._impl[0](x)
        return sh if self._perm is None else sh.index_select(-1, self._perm)
