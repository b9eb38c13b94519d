"""e3nn-compatible ``SphericalHarmonics`` module with a ``layout`` option.

The polynomials themselves are e3nn's (already fused elementwise code, cheap next to the tensor
products), evaluated by a private e3nn instance so the numbers match the installed e3nn exactly.
"""
from typing import List, Optional

import torch
from torch import nn

from .._compat import o3
from e3nn.o3._spherical_harmonics import _spherical_harmonics  # noqa: E402 (after the safe e3nn import)
from e3nn.util.jit import compile_mode  # noqa: E402
from ..problem import TensorProductError, TensorProductTypeError, ir_mul_index, parse_irreps

__all__ = ["SphericalHarmonics", "ir_mul_permutation"]


def ir_mul_permutation(irreps) -> Optional[torch.Tensor]:
    """Index ``perm`` with ``x_ir_mul = x_mul_ir[..., perm]``; None when both layouts coincide."""
    perm = ir_mul_index(parse_irreps(irreps, "irreps"))
    return None if perm == list(range(len(perm))) else torch.tensor(perm, dtype=torch.long)


MAX_L = 12  # the highest degree e3nn implements


def _check_ls(irreps_out) -> None:
    """The degrees asked for: an int, a list of ints, or irreps; each l in [0, MAX_L], at least one."""
    if isinstance(irreps_out, (str, o3.Irreps)):
        ls = [l for mul, l, _ in parse_irreps(irreps_out, "irreps_out") for _ in range(mul)]
    elif isinstance(irreps_out, (list, tuple)):
        ls = list(irreps_out)
    else:
        ls = [irreps_out]
    for l in ls:
        if isinstance(l, bool) or not hasattr(l, "__index__"):
            raise TensorProductTypeError(f"irreps_out: expected degrees l as integers (an int, a list of ints or "
                                         f"irreps such as '0e+1o+2e'), got {irreps_out!r}")
        if not 0 <= int(l) <= MAX_L:
            raise TensorProductError(f"irreps_out: each degree l must lie in [0, {MAX_L}], got {int(l)}")
    if not ls:
        raise TensorProductError(f"irreps_out: expected at least one degree l, got {irreps_out!r}")


def _block_factors(impl) -> List[float]:
    """Per requested l, the factor between the installed e3nn's output and its raw polynomial
    ``_spherical_harmonics`` (the normalisation convention differs between e3nn versions)."""
    probe = torch.tensor([0.3, -0.5, 0.81], dtype=torch.float64)
    probe = probe / probe.norm()
    with torch.no_grad():
        out = impl(probe)
        raw = _spherical_harmonics(impl._lmax, probe[0], probe[1], probe[2])
    factors, off = [], 0
    for l in impl._ls_list:
        d = 2 * l + 1
        factors.append(float(out[off:off + d].norm() / raw[l * l:l * l + d].norm()))
        off += d
    return factors


@compile_mode("script")
class SphericalHarmonics(nn.Module):
    """Drop-in ``e3nn.o3.SphericalHarmonics(irreps_out, normalize, normalization, irreps_in)``.

    ``layout="ir_mul"`` returns component-major blocks. For the usual one-copy-per-l output
    (``[0, 1, 2]``, ``"0e+1o+2e"``) both layouts are the same tensor; they differ only when an l
    is repeated consecutively (``"2x1o"``), which the permutation handles. ``torch.jit.script``
    works (as for e3nn's module).
    """

    _ls_list: List[int]
    _ts_factors: List[float]

    def __init__(self, irreps_out, normalize: bool, normalization: str = "integral", irreps_in=None, *,
                 layout: str = "mul_ir") -> None:
        super().__init__()
        if layout not in ("mul_ir", "ir_mul"):
            raise ValueError(f"layout: expected 'mul_ir' or 'ir_mul', got {layout!r}")
        if normalization not in ("integral", "component", "norm"):
            raise TensorProductError(f"normalization: expected 'integral', 'component' or 'norm', "
                                     f"got {normalization!r}")
        _check_ls(irreps_out)
        impl = o3.SphericalHarmonics(irreps_out, normalize, normalization, irreps_in)
        self._impl = (impl,)  # a tuple, so it is not a registered submodule (keeps named_modules clean)
        self.irreps_in, self.irreps_out = impl.irreps_in, impl.irreps_out
        self.normalize, self.normalization = normalize, normalization
        self._ls_list, self._lmax, self._is_range_lmax = impl._ls_list, impl._lmax, impl._is_range_lmax
        self.layout = layout
        self._ts_factors = _block_factors(impl)
        perm = ir_mul_permutation(self.irreps_out) if layout == "ir_mul" else None
        self.register_buffer("_perm", perm, persistent=False)  # e3nn's module has no state to mirror

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        if "_ts_factors" not in self.__dict__:  # pickled by an earlier version
            self._ts_factors = _block_factors(self._impl[0])

    def __repr__(self) -> str:
        lay = "" if self.layout == "mul_ir" else f", layout={self.layout}"
        return f"{self.__class__.__name__}({self._ls_list}, normalize={self.normalize}{lay})"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., 3] -> [..., irreps_out.dim]."""
        if torch.jit.is_scripting():
            if x.dim() < 1 or x.shape[-1] != 3:
                raise ValueError("x: expected last dimension 3 (a vector)")
            sh = self._script_sh(x)
        else:
            sh = self._sh(x)
        perm = self._perm
        return sh if perm is None else sh.index_select(-1, perm)

    @torch.jit.unused
    def _sh(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != 3:
            raise ValueError(f"x: expected last dimension 3 (a vector, irreps_in={self.irreps_in}), "
                             f"got shape {tuple(x.shape)}")
        return self._impl[0](x)

    def _script_sh(self, x: torch.Tensor) -> torch.Tensor:
        """e3nn's forward, for TorchScript (the private e3nn instance is not scriptable): its raw
        polynomials times the per-l factors measured at construction."""
        if self.normalize:
            x = torch.nn.functional.normalize(x, dim=-1)
        sh = _spherical_harmonics(self._lmax, x[..., 0], x[..., 1], x[..., 2])
        if not self._is_range_lmax:
            sh = torch.cat([sh[..., l * l:(l + 1) * (l + 1)] for l in self._ls_list], dim=-1)
        ls, fs = self._ls_list, self._ts_factors
        return sh * torch.cat([fs[k] * torch.ones(2 * ls[k] + 1, dtype=sh.dtype, device=sh.device)
                               for k in range(len(ls))])
