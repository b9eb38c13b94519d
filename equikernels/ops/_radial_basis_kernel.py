"""The Triton kernels of ``ops.radial_basis`` (imported only where Triton runs)."""
import triton
import triton.language as tl


@triton.jit
def _envelope(x, inside, P: tl.constexpr):
    """(u(x), du/dx) of u = 1 - (p+1)(p+2)/2 x^p + p(p+2) x^(p+1) - p(p+1)/2 x^(p+2), zero outside."""
    xm = x  # x^(p-1) by repeated products: p is a small integer
    for _ in tl.static_range(P - 2):
        xm = xm * x
    if P == 1:
        xm = x * 0.0 + 1.0
    xp = xm * x
    c1 = (P + 1.0) * (P + 2.0) / 2.0
    c2 = P * (P + 2.0)
    c3 = P * (P + 1.0) / 2.0
    u = 1.0 - c1 * xp + c2 * xp * x - c3 * xp * x * x
    du = -c1 * P * xm + c2 * (P + 1.0) * xp - c3 * (P + 2.0) * xp * x
    return tl.where(inside, u, 0.0), tl.where(inside, du, 0.0)


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
    u, _ = _envelope(r / rmax, r < rmax, P)
    s = tl.sin(r[:, None] * w[None, :])
    out = pref * (s / r[:, None]) * u[:, None]
    tl.store(out_ptr + e[:, None] * NB + k[None, :], out.to(out_ptr.dtype.element_ty), mask=em[:, None] & km[None, :])


@triton.jit
def bessel_envelope_bwd(r_ptr, w_ptr, c_ptr, g_ptr, gr_ptr, E, NB: tl.constexpr, NBP: tl.constexpr,
                        P: tl.constexpr, BLOCK: tl.constexpr):
    e, k, em, km, r, w, pref, rmax = _block(r_ptr, w_ptr, c_ptr, E, NB, NBP, BLOCK)
    g = tl.load(g_ptr + e[:, None] * NB + k[None, :], mask=em[:, None] & km[None, :], other=0.0).to(r.dtype)
    u, du = _envelope(r / rmax, r < rmax, P)
    wr = r[:, None] * w[None, :]
    s, c = tl.sin(wr), tl.cos(wr)
    rr = r[:, None]
    # d/dr [pref sin(w r) / r u(r / rmax)]
    d = pref * (((wr * c - s) / (rr * rr)) * u[:, None] + (s / rr) * (du / rmax)[:, None])
    tl.store(gr_ptr + e, tl.sum(g * d, axis=1).to(gr_ptr.dtype.element_ty), mask=em)


def launch_fwd(r, w, consts, out, p: int, block: int = 128) -> None:
    """``out`` [E, NB] from ``r`` [E], ``w`` [NB] and ``consts`` = (prefactor, r_max), one dtype."""
    e, nb = out.shape
    bessel_envelope_fwd[(triton.cdiv(e, block),)](r, w, consts, out, e, NB=nb, NBP=triton.next_power_of_2(nb),
                                                  P=p, BLOCK=block)


def launch_bwd(r, w, consts, g, gr, p: int, block: int = 128) -> None:
    """``gr`` [E] = sum_k ``g``[E, k] d out[E, k] / dr."""
    e, nb = g.shape
    bessel_envelope_bwd[(triton.cdiv(e, block),)](r, w, consts, g, gr, e, NB=nb, NBP=triton.next_power_of_2(nb),
                                                  P=p, BLOCK=block)
