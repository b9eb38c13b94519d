"""The Triton kernels of ``ops.radial_basis`` (imported only where Triton runs)."""
import triton
import triton.language as tl

from ..codegen.launch import FastLaunch


@triton.jit
def _envelope(x, inside, P: tl.constexpr):
    """(u, du/dx, d2u/dx2) of u = 1 - (p+1)(p+2)/2 x^p + p(p+2) x^(p+1) - p(p+1)/2 x^(p+2), zero
    outside; a caller's unused terms are not computed (dead code in the compiled kernel)."""
    xm2 = x * 0.0 + 1.0  # x^(p-2) by repeated products: p is a small integer (unused at p = 1)
    for _ in tl.static_range(P - 2):
        xm2 = xm2 * x
    xm = x * 0.0 + 1.0 if P == 1 else xm2 * x
    xp = xm * x
    c1 = (P + 1.0) * (P + 2.0) / 2.0
    c2 = P * (P + 2.0)
    c3 = P * (P + 1.0) / 2.0
    u = 1.0 - c1 * xp + c2 * xp * x - c3 * xp * x * x
    du = -c1 * P * xm + c2 * (P + 1.0) * xp - c3 * (P + 2.0) * xp * x
    d2u = -c1 * P * (P - 1.0) * xm2 + c2 * (P + 1.0) * P * xm - c3 * (P + 2.0) * (P + 1.0) * xp
    return tl.where(inside, u, 0.0), tl.where(inside, du, 0.0), tl.where(inside, d2u, 0.0)


@triton.jit
def _block(r_ptr, w_ptr, c_ptr, E, NB: tl.constexpr, NBP: tl.constexpr, BLOCK: tl.constexpr):
    """This program's edges and Bessel columns, their masks, lengths (1 where masked: no division
    by zero), frequencies, prefactor and r_max."""
    e = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    k = tl.arange(0, NBP)
    em, km = e < E, k < NB
    r = tl.load(r_ptr + e, mask=em, other=1.0)
    w = tl.load(w_ptr + k, mask=km, other=0.0)
    return e, k, em, km, r, w, tl.load(c_ptr), tl.load(c_ptr + 1)


@triton.jit
def bessel_envelope_fwd(r_ptr, w_ptr, c_ptr, out_ptr, E, NB: tl.constexpr, NBP: tl.constexpr, P: tl.constexpr,
                        BLOCK: tl.constexpr):
    e, k, em, km, r, w, pref, rmax = _block(r_ptr, w_ptr, c_ptr, E, NB, NBP, BLOCK)
    u, _, _ = _envelope(r / rmax, r < rmax, P)
    s = tl.sin(r[:, None] * w[None, :])
    out = pref * (s / r[:, None]) * u[:, None]
    tl.store(out_ptr + e[:, None] * NB + k[None, :], out.to(out_ptr.dtype.element_ty), mask=em[:, None] & km[None, :])


@triton.jit
def bessel_envelope_bwd(r_ptr, w_ptr, c_ptr, g_ptr, gr_ptr, E, NB: tl.constexpr, NBP: tl.constexpr,
                        P: tl.constexpr, BLOCK: tl.constexpr):
    e, k, em, km, r, w, pref, rmax = _block(r_ptr, w_ptr, c_ptr, E, NB, NBP, BLOCK)
    g = tl.load(g_ptr + e[:, None] * NB + k[None, :], mask=em[:, None] & km[None, :], other=0.0).to(r.dtype)
    u, du, _ = _envelope(r / rmax, r < rmax, P)
    wr = r[:, None] * w[None, :]
    s, c = tl.sin(wr), tl.cos(wr)
    rr = r[:, None]
    # d/dr [pref sin(w r) / r u(r / rmax)]
    d = pref * (((wr * c - s) / (rr * rr)) * u[:, None] + (s / rr) * (du / rmax)[:, None])
    tl.store(gr_ptr + e, tl.sum(g * d, axis=1).to(gr_ptr.dtype.element_ty), mask=em)


@triton.jit
def bessel_envelope_bwd2(r_ptr, w_ptr, c_ptr, g_ptr, ggr_ptr, gg_ptr, gr_ptr, E, NB: tl.constexpr,
                         NBP: tl.constexpr, P: tl.constexpr, BLOCK: tl.constexpr):
    """The backward of ``bessel_envelope_bwd`` (gr = sum_k g d_k): gg[e, k] = ggr[e] d_k(r_e) and
    gr[e] = ggr[e] sum_k g[e, k] d2_k(r_e), d_k and d2_k the first and second r-derivatives."""
    e, k, em, km, r, w, pref, rmax = _block(r_ptr, w_ptr, c_ptr, E, NB, NBP, BLOCK)
    mask = em[:, None] & km[None, :]
    g = tl.load(g_ptr + e[:, None] * NB + k[None, :], mask=mask, other=0.0).to(r.dtype)
    ggr = tl.load(ggr_ptr + e, mask=em, other=0.0).to(r.dtype)
    u, du, d2u = _envelope(r / rmax, r < rmax, P)
    du = du / rmax
    d2u = d2u / (rmax * rmax)
    wr = r[:, None] * w[None, :]
    s, c = tl.sin(wr), tl.cos(wr)
    rr = r[:, None]
    b = s / rr  # sin(w r) / r and its first two derivatives
    db = (wr * c - s) / (rr * rr)
    d2b = -(w[None, :] * w[None, :]) * b - 2.0 * db / rr
    d = pref * (db * u[:, None] + b * du[:, None])
    d2 = pref * (d2b * u[:, None] + 2.0 * db * du[:, None] + b * d2u[:, None])
    tl.store(gg_ptr + e[:, None] * NB + k[None, :], (ggr[:, None] * d).to(gg_ptr.dtype.element_ty), mask=mask)
    tl.store(gr_ptr + e, (ggr * tl.sum(g * d2, axis=1)).to(gr_ptr.dtype.element_ty), mask=em)


def launch_fwd(r, w, consts, out, p: int, block: int = 128) -> None:
    """``out`` [E, NB] from ``r`` [E], ``w`` [NB] and ``consts`` = (prefactor, r_max), one dtype."""
    e, nb = out.shape
    _FWD((triton.cdiv(e, block),), (r, w, consts, out), (e,), (nb, triton.next_power_of_2(nb), p, block), 4, 3)


def launch_bwd(r, w, consts, g, gr, p: int, block: int = 128) -> None:
    """``gr`` [E] = sum_k ``g``[E, k] d out[E, k] / dr."""
    e, nb = g.shape
    _BWD((triton.cdiv(e, block),), (r, w, consts, g, gr), (e,), (nb, triton.next_power_of_2(nb), p, block), 4, 3)


def launch_bwd2(r, w, consts, g, ggr, gg, gr, p: int, block: int = 128) -> None:
    """``gg`` [E, NB] = ``ggr``[E] d out / dr and ``gr`` [E] = ``ggr`` sum_k ``g``[E, k] d2 out[E, k] / dr2."""
    e, nb = g.shape
    _BWD2((triton.cdiv(e, block),), (r, w, consts, g, ggr, gg, gr), (e,), (nb, triton.next_power_of_2(nb), p, block),
          4, 3)


# Triton's default launch shape (4 warps, 3 stages), through the cached launcher
_FWD, _BWD, _BWD2 = (FastLaunch(k, cap=False) for k in (bessel_envelope_fwd, bessel_envelope_bwd, bessel_envelope_bwd2))
