"""MACE's radial features in one pass: ``bessel(r) * envelope(r)``,

    out[e, k] = pref sin(w_k r_e) / r_e * u(r_e / r_max),
    u(x) = 1 - (p+1)(p+2)/2 x^p + p(p+2) x^(p+1) - p(p+1)/2 x^(p+2) for x < 1, else 0,

where torch runs about 17 elementwise kernels forward and 30 backward per call. On the "triton"
backend (CUDA by default) the forward, the first derivative and the backward of the first derivative
(force training) are one kernel each; a third order runs the formulas as torch operations, so any
order is exact autograd. Elsewhere the caller keeps its torch formula.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .batching import legacy_batched
from .chain import in_transform
from .tp import resolve_backend, triton_available


def fused_available(r: Tensor, backend=None) -> bool:
    """Whether ``bessel_envelope`` runs its kernels for ``r`` (else the caller's torch formula)."""
    return (r.dtype in (torch.float32, torch.float64) and not torch.compiler.is_compiling()
            and not in_transform() and resolve_backend(backend, r.device) == "triton"
            and triton_available())


def bessel_envelope(r: Tensor, w: Tensor, consts: Tensor, p: int) -> Tensor:
    """``out`` [E, NB] for lengths ``r`` [E, 1], Bessel frequencies ``w`` [NB], ``consts`` =
    (prefactor, r_max) [2] and the envelope's integer power ``p`` (>= 1), all in r's dtype;
    differentiable in ``r`` to any order."""
    if w.dtype != r.dtype or consts.dtype != r.dtype:
        raise TypeError(f"bessel_envelope: w ({w.dtype}) and consts ({consts.dtype}) must have r's dtype ({r.dtype})")
    if p < 1:
        raise ValueError(f"p: expected an integer >= 1, got {p}")
    return _BesselEnvelope.apply(r, w.contiguous(), consts, int(p))


def _envelope(r: Tensor, rmax: Tensor, p: int, second: bool = False):
    """(u, du/dr[, d2u/dr2]) of the envelope's polynomial as torch operations (not masked)."""
    x = r / rmax
    c1, c2, c3 = (p + 1.0) * (p + 2.0) / 2.0, p * (p + 2.0), p * (p + 1.0) / 2.0
    u = 1.0 - c1 * x.pow(p) + c2 * x.pow(p + 1) - c3 * x.pow(p + 2)
    du = (-c1 * p * x.pow(p - 1) + c2 * (p + 1) * x.pow(p) - c3 * (p + 2) * x.pow(p + 1)) / rmax
    if not second:
        return u, du
    d2u = (-c1 * p * (p - 1) * x.pow(max(p - 2, 0)) + c2 * (p + 1) * p * x.pow(p - 1)
           - c3 * (p + 2) * (p + 1) * x.pow(p)) / (rmax * rmax)
    return u, du, d2u


def derivative(r: Tensor, w: Tensor, consts: Tensor, p: int) -> Tensor:
    """d out / d r [E, NB] as torch operations (differentiable)."""
    pref, rmax = consts[0], consts[1]
    u, du = _envelope(r, rmax, p)
    wr = r * w
    s = torch.sin(wr)
    d = pref * (((wr * torch.cos(wr) - s) / (r * r)) * u + (s / r) * du)
    return d * (r < rmax)


def second_derivative(r: Tensor, w: Tensor, consts: Tensor, p: int) -> Tensor:
    """d2 out / dr2 [E, NB] as torch operations (differentiable)."""
    pref, rmax = consts[0], consts[1]
    u, du, d2u = _envelope(r, rmax, p, second=True)
    wr = r * w
    b = torch.sin(wr) / r
    db = (wr * torch.cos(wr) - torch.sin(wr)) / (r * r)
    d2b = -(w * w) * b - 2.0 * db / r
    return pref * (d2b * u + 2.0 * db * du + b * d2u) * (r < rmax)


class _BesselEnvelope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, r, w, consts, p):
        from ._radial_basis_kernel import launch_fwd  # noqa: PLC0415 (Triton only where it runs)
        rc = r.detach().reshape(-1).contiguous()
        out = torch.empty(rc.shape[0], w.shape[0], dtype=r.dtype, device=r.device)
        if rc.numel():
            launch_fwd(rc, w, consts, out, p)
        ctx.save_for_backward(r, w, consts)
        ctx.p = p
        return out

    @staticmethod
    def backward(ctx, g):
        r, w, consts = ctx.saved_tensors
        if legacy_batched(g):  # autograd's batched cotangents: the kernels cannot read them, torch formulas can
            return (g * derivative(r, w, consts, ctx.p)).sum(-1, keepdim=True), None, None, None
        if torch.is_grad_enabled():  # the derivative is differentiated again (force training)
            return _BesselEnvelopeGrad.apply(r, g, w, consts, ctx.p), None, None, None
        return _first(r, g, w, consts, ctx.p), None, None, None


def _first(r: Tensor, g: Tensor, w: Tensor, consts: Tensor, p: int) -> Tensor:
    """sum_k g[:, k] d out[:, k] / dr, shaped as ``r`` (one kernel)."""
    from ._radial_basis_kernel import launch_bwd  # noqa: PLC0415
    rc = r.detach().reshape(-1).contiguous()
    gr = torch.empty_like(rc)
    if rc.numel():
        launch_bwd(rc, w, consts, g.detach().contiguous(), gr, p)
    return gr.view(r.shape)


class _BesselEnvelopeGrad(torch.autograd.Function):
    """(r, g) -> sum_k g[:, k] d out[:, k] / dr: the first derivative as an op of its own, whose
    backward is one kernel (torch formulas when that backward is differentiated again)."""

    @staticmethod
    def forward(ctx, r, g, w, consts, p):
        ctx.save_for_backward(r, g, w, consts)
        ctx.p = p
        return _first(r, g, w, consts, p)

    @staticmethod
    def backward(ctx, ggr):
        r, g, w, consts = ctx.saved_tensors
        p = ctx.p
        if torch.is_grad_enabled() or legacy_batched(ggr):  # a third order or batched cotangents: torch operations
            return ((ggr * second_derivative(r, w, consts, p) * g).sum(-1, keepdim=True),
                    ggr * derivative(r, w, consts, p), None, None, None)
        from ._radial_basis_kernel import launch_bwd2  # noqa: PLC0415
        rc = r.detach().reshape(-1).contiguous()
        gg = torch.empty(g.shape, dtype=g.dtype, device=g.device)
        gr = torch.empty_like(rc)
        if rc.numel():
            launch_bwd2(rc, w, consts, g.detach().contiguous(), ggr.detach().reshape(-1).contiguous(), gg, gr, p)
        return gr.view(r.shape), gg, None, None, None
