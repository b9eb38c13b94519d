"""Edge-length features of MACE: radial bases, the polynomial envelope, distance transforms, the
radial MLP and the ZBL pair repulsion.

Every formula follows mace-torch 0.3.16 term by term (including which operands are integer or
python scalars), because operand types decide the rounding and the parity tests compare at 1e-8.
Constants live in buffers so a checkpoint's values (and dtypes) are carried over exactly. Where
the Triton backend runs, the Bessel basis times the envelope is one op (ops/radial_basis.py): the
same formula, rounded in another order (float64 forces agree to about 1e-17 eV/A).
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
from torch import nn

from ..dtypes import HALF
from ..nn.frozen import frozen_key, held, state_without
from ..ops import radial_basis
from ..ops.matmul import matmul
from ..ops.silu import silu
from ..ops.tp import check_backend
from . import hooks
from .data import both_halves
from .._compat import e3nn  # noqa: F401  (safe e3nn import before e3nn.math)
from e3nn.math import normalize2mom  # noqa: E402

RADIAL_TYPES = ("bessel", "gaussian", "chebyshev")
DISTANCE_TRANSFORMS = ("None", "Agnesi", "Soft")
GATES = {"silu": torch.nn.functional.silu, "tanh": torch.tanh, "abs": torch.abs, "None": None}


def _covalent_radii() -> torch.Tensor:
    from ase.data import covalent_radii  # noqa: PLC0415 (ase only needed when a model uses it)
    return torch.tensor(covalent_radii, dtype=torch.get_default_dtype())


def node_atomic_numbers(atomic_numbers: torch.Tensor, node_attrs: torch.Tensor) -> torch.Tensor:
    return atomic_numbers[torch.argmax(node_attrs, dim=1)].unsqueeze(-1)


class BesselBasis(nn.Module):
    """sqrt(2/r_max) * sin(n pi r / r_max) / r, n = 1..num_basis."""

    def __init__(self, r_max: float, num_basis: int) -> None:
        super().__init__()
        self.register_buffer("bessel_weights", math.pi / r_max * torch.linspace(1.0, num_basis, num_basis))
        self.register_buffer("prefactor", torch.tensor(math.sqrt(2.0 / r_max)))

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        return self.prefactor * (torch.sin(self.bessel_weights * r) / r)


class GaussianBasis(nn.Module):
    def __init__(self, r_max: float, num_basis: int) -> None:
        super().__init__()
        self.register_buffer("gaussian_weights", torch.linspace(0.0, r_max, num_basis))
        self.coeff = -0.5 / (r_max / (num_basis - 1)) ** 2

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.coeff * torch.pow(r - self.gaussian_weights, 2))


class ChebyshevBasis(nn.Module):
    def __init__(self, r_max: float, num_basis: int) -> None:
        super().__init__()
        self.register_buffer("n", torch.arange(1, num_basis + 1, dtype=torch.get_default_dtype()).unsqueeze(0))
        self.num_basis = num_basis

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        return torch.special.chebyshev_polynomial_t(r.repeat(1, self.num_basis), self.n.repeat(len(r), 1))


def polynomial_envelope(r: torch.Tensor, r_max, p) -> torch.Tensor:
    """1 - (p+1)(p+2)/2 x^p + p(p+2) x^(p+1) - p(p+1)/2 x^(p+2), x = r/r_max; 0 beyond r_max."""
    x = r / r_max
    env = (1.0 - ((p + 1.0) * (p + 2.0) / 2.0) * torch.pow(x, p) + p * (p + 2.0) * torch.pow(x, p + 1)
           - (p * (p + 1.0) / 2) * torch.pow(x, p + 2))
    return env * (r < r_max)


def _int_value(module: nn.Module, name: str) -> Optional[int]:
    """An integer buffer as a Python int, read once (one host sync) and kept while it is unchanged."""
    t = getattr(module, name)
    if torch.compiler.is_compiling():
        return None
    key = frozen_key((t,))
    cached = module.__dict__.get(f"_{name}_int")
    if cached is None or cached[0] != key:
        cached = module.__dict__[f"_{name}_int"] = (key, int(t.item()), held((t,)))
    return cached[1]


def envelope_int_p(r: torch.Tensor, r_max, p: int) -> torch.Tensor:
    """``polynomial_envelope`` for an integer p known on the host: the coefficients (exact integers)
    are Python numbers, not 0-dim tensor ops (a dozen tiny kernels per call on a GPU)."""
    x = r / r_max
    env = (1.0 - ((p + 1.0) * (p + 2.0) / 2.0) * torch.pow(x, p) + float(p * (p + 2)) * torch.pow(x, p + 1)
           - (p * (p + 1.0) / 2) * torch.pow(x, p + 2))
    return env * (r < r_max)


class PolynomialCutoff(nn.Module):
    def __init__(self, r_max: float, p: int) -> None:
        super().__init__()
        self.register_buffer("p", torch.tensor(p, dtype=torch.int))
        self.register_buffer("r_max", torch.tensor(r_max))

    def forward(self, r: torch.Tensor) -> torch.Tensor:
        p = _int_value(self, "p")
        if p is None:
            return polynomial_envelope(r, self.r_max, self.p.to(torch.int))
        return envelope_int_p(r, self.r_max, p)


class AgnesiTransform(nn.Module):
    """r -> 1 / (1 + a (r/r0)^q / (1 + (r/r0)^(q-p))), r0 = mean covalent radius of the pair."""

    def __init__(self, q: float = 0.9183, p: float = 4.5791, a: float = 1.0805) -> None:
        super().__init__()
        self.register_buffer("q", torch.tensor(q))
        self.register_buffer("p", torch.tensor(p))
        self.register_buffer("a", torch.tensor(a))
        self.register_buffer("covalent_radii", _covalent_radii())

    def forward(self, r, node_z, sender, receiver):
        z_u, z_v = node_z[sender].to(torch.int64), node_z[receiver].to(torch.int64)
        r0 = 0.5 * (self.covalent_radii[z_u] + self.covalent_radii[z_v])
        x = r / r0
        return (1 + (self.a * torch.pow(x, self.q) / (1 + torch.pow(x, self.q - self.p)))).reciprocal_()


class SoftTransform(nn.Module):
    """Smooth clamp of short distances: p0 + (r - p0) * (1 + tanh(alpha (r - m))) / 2."""

    def __init__(self, alpha: float = 4.0) -> None:
        super().__init__()
        self.register_buffer("alpha", torch.tensor(alpha))
        self.register_buffer("covalent_radii", _covalent_radii())

    def forward(self, r, node_z, sender, receiver):
        z_u, z_v = node_z[sender].to(torch.int64), node_z[receiver].to(torch.int64)
        r0 = self.covalent_radii[z_u] + self.covalent_radii[z_v]
        p0, p1 = (3 / 4) * r0, (4 / 3) * r0
        m = 0.5 * (p0 + p1)
        alpha = self.alpha / (p1 - p0)
        return p0 + (r - p0) * (0.5 * (1.0 + torch.tanh(alpha * (r - m))))


class RadialEmbedding(nn.Module):
    """Edge lengths [E, 1] -> (radial features [E, num_basis], cutoff [E, 1] or None).

    With ``apply_cutoff`` the envelope is folded into the features (cutoff returned as None);
    otherwise the interaction blocks multiply their weights by it.
    """

    def __init__(self, r_max: float, num_bessel: int, num_polynomial_cutoff: int, radial_type: str = "bessel",
                 distance_transform: str = "None", apply_cutoff: bool = True) -> None:
        super().__init__()
        if radial_type not in RADIAL_TYPES:
            raise ValueError(f"radial_type: expected one of {RADIAL_TYPES}, got {radial_type!r}")
        if distance_transform not in DISTANCE_TRANSFORMS:
            raise ValueError(f"distance_transform: expected one of {DISTANCE_TRANSFORMS}, got {distance_transform!r}")
        self.basis = {"bessel": BesselBasis, "gaussian": GaussianBasis, "chebyshev": ChebyshevBasis}[radial_type](
            r_max, num_bessel)
        self.transform = {"None": None, "Agnesi": AgnesiTransform, "Soft": SoftTransform}[distance_transform]
        if self.transform is not None:
            self.transform = self.transform()
        self.cutoff = PolynomialCutoff(r_max, num_polynomial_cutoff)
        self.apply_cutoff = apply_cutoff
        self.out_dim = num_bessel

    def forward(self, lengths, node_z, sender, receiver):
        fused = self._fused(lengths)
        if fused is not None:
            return fused, None
        cutoff = self.cutoff(lengths)
        if self.transform is not None:
            lengths = self.transform(lengths, node_z, sender, receiver)
        radial = self.basis(lengths)
        if not self.apply_cutoff:
            return radial, cutoff
        return radial * cutoff, None

    def _fused(self, lengths: torch.Tensor) -> Optional[torch.Tensor]:
        """Bessel basis times envelope as one op (ops/radial_basis.py) where its kernels run, else None."""
        if not (isinstance(self.basis, BesselBasis) and self.transform is None and self.apply_cutoff
                and lengths.dim() == 2 and lengths.shape[1] == 1 and radial_basis.fused_available(lengths)):
            return None
        p = _int_value(self.cutoff, "p")
        if p is None or p < 1:
            return None
        b, c = self.basis, self.cutoff
        key = (frozen_key((b.prefactor, c.r_max)), lengths.dtype)
        cached = self.__dict__.get("_consts")
        if cached is None or cached[0] != key:
            consts = torch.stack([b.prefactor.reshape(()), c.r_max.reshape(())]).to(lengths.dtype)
            cached = self.__dict__["_consts"] = (key, consts, held((b.prefactor, c.r_max)))
        w = b.bessel_weights if b.bessel_weights.dtype == lengths.dtype else b.bessel_weights.to(lengths.dtype)
        return radial_basis.bessel_envelope(lengths, w, cached[1], p)


class ZBLRepulsion(nn.Module):
    """Ziegler-Biersack-Littmark pair repulsion, enveloped at the sum of covalent radii; returns
    one energy per receiver node (half of each pair's energy per directed edge)."""

    def __init__(self, p: int) -> None:
        super().__init__()
        self.register_buffer("c", torch.tensor([0.1818, 0.5099, 0.2802, 0.02817]))
        self.register_buffer("p", torch.tensor(p, dtype=torch.int))
        self.register_buffer("covalent_radii", _covalent_radii())
        self.register_buffer("a_exp", torch.tensor(0.300))
        self.register_buffer("a_prefactor", torch.tensor(0.4543))

    def forward(self, r, node_z, sender, receiver, num_nodes: int) -> torch.Tensor:
        z_u, z_v = node_z[sender].to(torch.int64), node_z[receiver].to(torch.int64)
        a = self.a_prefactor * 0.529 / (torch.pow(z_u, self.a_exp) + torch.pow(z_v, self.a_exp))
        x = r / a
        c = self.c
        phi = (c[0] * torch.exp(-3.2 * x) + c[1] * torch.exp(-0.9423 * x) + c[2] * torch.exp(-0.4028 * x)
               + c[3] * torch.exp(-0.2016 * x))
        v = (14.3996 * z_u * z_v) / r * phi
        env = polynomial_envelope(r, self.covalent_radii[z_u] + self.covalent_radii[z_v], self.p)
        v = 0.5 * v * env
        out = v.new_zeros((num_nodes,) + v.shape[1:]).index_add(0, receiver, v)
        return out.squeeze(-1)


class RadialMLP(nn.Module):
    """e3nn ``FullyConnectedNet(hs, act)``: bias-free layers ``x @ W / sqrt(fan_in)``, the
    activation scaled to unit second moment between layers, none after the last. The parameters
    are named ``layer{i}.weight`` as in e3nn, so checkpoints map one to one.

    The layers' products run ``ops.matmul`` (its Triton kernel for float32 on CUDA with constant
    weights). With SiLU (MACE's) and ``equikernels.experimental`` enabled, the chain may run as its
    fused Triton kernels. ``backend`` (attribute, not saved) is the backend of both: None =
    ``EQUIKERNELS_BACKEND`` / automatic, or "triton" / "reference" to force one."""

    fused: bool = False  # class defaults for modules pickled before these attributes existed
    backend: Optional[str] = None

    def __init__(self, hs: List[int], act: Optional[str] = "silu", backend: Optional[str] = None) -> None:
        super().__init__()
        self.hs = list(hs)
        if act not in GATES:
            raise ValueError(f"act: expected one of {tuple(GATES)}, got {act!r}")
        self.act = normalize2mom(GATES[act]) if GATES[act] is not None else None
        self.fused = act == "silu"  # the fused op's activation
        check_backend(backend)  # said at construction, not at the first call
        self.backend = backend
        self.layers = nn.ModuleList()
        for h_in, h_out in zip(self.hs, self.hs[1:]):
            layer = nn.Module()
            layer.weight = nn.Parameter(torch.randn(h_in, h_out))
            self.layers.append(layer)

    def _cst(self) -> float:
        """The activation's second-moment constant (1 without one or where e3nn skips it)."""
        return 1.0 if self.act is None or self.act._is_id else float(self.act.cst)

    def _scale(self, ws: List[torch.Tensor]) -> List[torch.Tensor]:
        # the activation constant multiplies the next (small) weight, not the [edges, hidden] activations
        c = self._cst()
        return [w * ((c if i else 1.0) / self.hs[i] ** 0.5) for i, w in enumerate(ws)]

    def __getstate__(self):
        return state_without(self, ("_scaled_cache", "_half_cache"))

    def _scaled(self) -> List[torch.Tensor]:
        """W / sqrt(fan_in) per layer, the previous layer's activation constant folded in; kept
        between calls while the weights are frozen and unchanged."""
        ws = [layer.weight for layer in self.layers]
        if any(w.requires_grad for w in ws) or torch.compiler.is_compiling():
            return self._scale(ws)
        key = frozen_key(ws)
        cached = self.__dict__.get("_scaled_cache")
        if cached is None or cached[0] != key:
            cached = self.__dict__["_scaled_cache"] = (key, self._scale(ws), held(ws))
        return cached[1]

    def _gate(self, x: torch.Tensor) -> torch.Tensor:
        if self.act is None:
            return x
        return silu(x) if self.act.f is torch.nn.functional.silu else self.act.f(x)

    def forward(self, x: torch.Tensor, paired: bool = False, row_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The MLP of ``x`` [rows, in]; ``paired``: the result twice, stacked ([2 rows, out]; the last
        layer writes both copies). ``row_scale`` [rows, 1]: the result's rows times it, applied to the
        last layer's input (the last layer is linear, and its input is narrower than its output)."""
        last = len(self.layers) - 1
        ws = self._scaled()
        if ws and x.dtype != ws[0].dtype:
            ws = _half_weights(self, ws, x)
        return self._chain(x, ws, last, paired, row_scale)

    def _chain(self, x: torch.Tensor, ws: List[torch.Tensor], last: int, paired: bool = False,
               row_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x through the layers ``ws``, the activation after each layer before index ``last``; with
        ``paired`` the result twice, stacked; rows times ``row_scale`` (see ``forward``)."""
        if ws and self.fused and x.dim() == 2:
            if hooks.radial_mlp is not None:  # opt-in: equikernels.experimental (None: the torch chain)
                out = hooks.radial_mlp(self, x, ws)
                if out is not None:
                    out = out if row_scale is None else out * row_scale
                    return both_halves(out) if paired else out
            else:
                hooks.check_mlp_unrequested()
        # SiLU is applied by the next layer's product as it reads its input (ops.matmul)
        fuse = self.act is not None and self.act.f is torch.nn.functional.silu
        act: Optional[str] = None
        for i, w in enumerate(ws):
            if i == last and row_scale is not None:
                x = (self._gate(x) if act is not None else x) * row_scale
                act = None
            x = matmul(x, w, self.backend, act, paired and i == last)
            act = None
            if i < last:
                if fuse:
                    act = "silu"
                else:
                    x = self._gate(x)
        if not ws:
            x = x if row_scale is None else x * row_scale
            x = both_halves(x) if paired else x
        return x

    def split_last(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(hidden, W) with ``forward(x) == hidden @ W``: the bare activation after the last hidden
        layer and the last layer's scaled weight [H, out], its constant folded in (for the fused
        last-layer convolution)."""
        ws = self._scaled()
        if len(ws) < 2:
            raise ValueError("split_last: the MLP needs at least one hidden layer")
        if x.dtype != ws[0].dtype:
            ws = _half_weights(self, ws, x)
        z = self._chain(x, ws[:-1], len(ws) - 2)
        return self._gate(z), ws[-1]


def _half_weights(mlp: "RadialMLP", ws: List[torch.Tensor], x: torch.Tensor) -> List[torch.Tensor]:
    """float32 weights for half-precision inputs: rounded to the input's type (matmuls in the half
    type, as autocast runs them; the cast's backward returns float32 gradients to the masters)."""
    if not (x.dtype in HALF and ws[0].dtype == torch.float32):
        raise TypeError(f"RadialMLP: input dtype {x.dtype} does not match the weights ({ws[0].dtype}); only "
                        "float16/bfloat16 inputs with float32 weights mix")
    if any(w.requires_grad for w in ws) or torch.compiler.is_compiling():
        return [w.to(x.dtype) for w in ws]
    key = (x.dtype, frozen_key(ws))
    cached = mlp.__dict__.get("_half_cache")
    if cached is None or cached[0] != key:
        cached = mlp.__dict__["_half_cache"] = (key, [w.to(x.dtype) for w in ws], held(ws))
    return cached[1]
