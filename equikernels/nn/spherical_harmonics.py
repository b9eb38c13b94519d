"""e3nn-compatible ``SphericalHarmonics`` module with a ``layout`` option.

On CUDA, up to l = 4 in float32 and float64, the harmonics are one matrix product: every ordered
product of l components of the vector, degree by degree, times coefficients fitted at construction
to the installed e3nn's polynomials (each degree is homogeneous, so the fit is exact and unique as
a function). That is about ten operations forward and twenty backward where e3nn's elementwise
recurrences take about fifty and a hundred and fifty: on a GPU each is a kernel launch, and together
they were a large part of a small model call's host time. Elsewhere (the CPU, where the elementwise
code is faster) a private e3nn instance evaluates them.
"""
from typing import List, Optional, Tuple

import torch
from torch import nn

from .._compat import o3
from e3nn.o3._spherical_harmonics import _spherical_harmonics  # noqa: E402 (after the safe e3nn import)
from e3nn.util.jit import compile_mode  # noqa: E402
from ..problem import TensorProductError, TensorProductTypeError, ir_mul_index, parse_irreps
from .frozen import outside_inference_mode

__all__ = ["SphericalHarmonics", "ir_mul_permutation"]


def ir_mul_permutation(irreps) -> Optional[torch.Tensor]:
    """Index ``perm`` with ``x_ir_mul = x_mul_ir[..., perm]``; None when both layouts coincide."""
    perm = ir_mul_index(parse_irreps(irreps, "irreps"))
    return None if perm == list(range(len(perm))) else torch.tensor(perm, dtype=torch.long)


MAX_L = 12  # the highest degree e3nn implements
PRODUCT_DEVICES = ("cuda",)  # device types that take the product path
POLY_MAX_L = 4  # the product path: 3^l ordered products per degree (81 at l = 4)
_FIT_POINTS = 256
_FIT_TOL = 1e-12


def _products(x: torch.Tensor, lmax: int) -> torch.Tensor:
    """[..., 3] -> [..., 3 + 9 + ... + 3^lmax]: every ordered product of l components of ``x``,
    l = 1 .. lmax, degree after degree."""
    cols, cur = [x], x
    for _ in range(1, lmax):
        cur = (cur.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)
        cols.append(cur)
    return cols[0] if len(cols) == 1 else torch.cat(cols, dim=-1)


def _fit(impl, normalize: bool) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """(bias [dim], coefficients [3 + ... + 3^lmax, dim]) in float64 with
    ``bias + _products(x) @ coefficients == impl(x)`` (x normalised first if ``normalize``), each
    output block of degree l fitted on the degree-l products alone; None if the fit is not exact."""
    lmax = impl._lmax
    gen = torch.Generator().manual_seed(0)
    pts = torch.randn(_FIT_POINTS, 3, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        y = impl(pts)
        u = torch.nn.functional.normalize(pts, dim=-1) if normalize else pts
        prods = _products(u, lmax)
    start = [0, 0]
    for l in range(1, lmax + 1):
        start.append(start[-1] + 3 ** l)
    bias = torch.zeros(y.shape[1], dtype=torch.float64)
    coef = torch.zeros(prods.shape[1], y.shape[1], dtype=torch.float64)
    off = 0
    for l in impl._ls_list:
        d = 2 * l + 1
        if l == 0:
            bias[off] = y[:, off].mean()
        else:
            block = prods[:, start[l]:start[l + 1]]
            coef[start[l]:start[l + 1], off:off + d] = torch.linalg.pinv(block) @ y[:, off:off + d]
        off += d
    err = (torch.addmm(bias, prods, coef) - y).abs().max()
    return (bias, coef) if float(err) <= _FIT_TOL * max(1.0, float(y.abs().max())) else None


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
        if hasattr(impl, "sph_func"):  # e3nn's jit_mode "script" makes it a ScriptFunction, which cannot be pickled
            impl.sph_func = _spherical_harmonics
        self._impl = (impl,)  # a tuple, so it is not a registered submodule (keeps named_modules clean)
        self.irreps_in, self.irreps_out = impl.irreps_in, impl.irreps_out
        self.normalize, self.normalization = normalize, normalization
        self._ls_list, self._lmax, self._is_range_lmax = impl._ls_list, impl._lmax, impl._is_range_lmax
        self.layout = layout
        self._ts_factors = _block_factors(impl)
        self._poly = _fit(impl, normalize) if 1 <= self._lmax <= POLY_MAX_L else None
        self._poly_on = {}  # (device, dtype) -> (bias, coefficients) there
        perm = ir_mul_permutation(self.irreps_out) if layout == "ir_mul" else None
        self.register_buffer("_perm", perm, persistent=False)  # e3nn's module has no state to mirror

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_poly_on", None)  # per-device copies: made again on first use, not saved
        return state

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_poly_on", {})
        if "_ts_factors" not in self.__dict__:  # pickled by an earlier version
            self._ts_factors = _block_factors(self._impl[0])
        if "_poly" not in self.__dict__:  # pickled by an earlier version
            self._poly = _fit(self._impl[0], self.normalize) if 1 <= self._lmax <= POLY_MAX_L else None

    def __repr__(self) -> str:
        lay = "" if self.layout == "mul_ir" else f", layout={self.layout}"
        return f"{self.__class__.__name__}({self._ls_list}, normalize={self.normalize}{lay})"

    @outside_inference_mode
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
        if self.normalize and not x.is_floating_point():  # (torch's own error names vector_norm, not x)
            raise TypeError(f"x: expected a floating-point tensor (normalize=True), got {x.dtype}")
        if (self._poly is None or x.dtype not in (torch.float32, torch.float64) or x.device.type not in PRODUCT_DEVICES
                or torch.jit.is_tracing()):  # (its per-device constants would enter a trace differently per call)
            return self._impl[0](x)
        return self._poly_sh(x)

    @torch.jit.unused
    def _poly_sh(self, x: torch.Tensor) -> torch.Tensor:
        """The product path. It multiplies in float64 where a float32 product could take TF32, and
        outside autocast: e3nn's elementwise code keeps float32 under both."""
        if self.normalize:
            x = torch.nn.functional.normalize(x, dim=-1)
        dev = x.device.type
        tf32 = dev == "cuda" and x.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
        math = torch.float64 if tf32 else x.dtype
        consts = self._poly_on.get((x.device, math))
        if consts is None:  # per device and dtype: no host-to-device copy per call
            consts = self._poly_on[(x.device, math)] = tuple(t.to(device=x.device, dtype=math) for t in self._poly)
        prods = _products(x, self._lmax)
        flat = prods.reshape(-1, prods.shape[-1]).to(math)
        if torch.is_autocast_enabled(dev):
            with torch.autocast(dev, enabled=False):
                sh = torch.addmm(consts[0], flat, consts[1])
        else:
            sh = torch.addmm(consts[0], flat, consts[1])
        return sh.to(x.dtype).reshape(x.shape[:-1] + (sh.shape[-1],))

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
