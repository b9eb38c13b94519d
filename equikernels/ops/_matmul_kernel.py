"""The Triton kernel of ``ops.matmul`` (imported only where Triton runs)."""
import triton
import triton.language as tl

from ..codegen.launch import FastLaunch


@triton.jit
def _load_x(x_ptr, rm, rk, mask, sxm, sxk, pair_rows, PAIR: tl.constexpr, SILU_IN: tl.constexpr):
    """a(x[rm, rk]), x[rm] + x[rm + pair_rows] where ``PAIR``, a = SiLU where ``SILU_IN``."""
    offs = rm[:, None] * sxm + rk[None, :] * sxk
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if PAIR:
        x = x + tl.load(x_ptr + pair_rows * sxm + offs, mask=mask, other=0.0)
    if SILU_IN:
        x = x * tl.sigmoid(x)
    return x


@triton.jit
def _store_tile(out_ptr, z_ptr, acc, rm, rn, mm, nm, pair_rows, N: tl.constexpr, DSILU_OUT: tl.constexpr,
                PAIR: tl.constexpr):
    """out[rm, rn] = acc, times SiLU'(z[rm, rn]) where ``DSILU_OUT``, also into out[rm + pair_rows, rn]
    where ``PAIR``; ``out`` and ``z`` contiguous [*, N]."""
    offs = rm[:, None] * N + rn[None, :]
    om = mm[:, None] & nm[None, :]
    if DSILU_OUT:
        z = tl.load(z_ptr + offs, mask=om, other=0.0)
        s = tl.sigmoid(z)
        acc = acc * (s * (1.0 + z * (1.0 - s)))
    tl.store(out_ptr + offs, acc, mask=om)
    if PAIR:
        tl.store(out_ptr + pair_rows * N + offs, acc, mask=om)


@triton.jit
def matmul_kernel(x_ptr, w_ptr, z_ptr, out_ptr, M, sxm, sxk, swk, swn, pair_rows, N: tl.constexpr, K: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
                  SILU_IN: tl.constexpr, DSILU_OUT: tl.constexpr, PAIR_IN: tl.constexpr, PAIR_OUT: tl.constexpr):
    """One [BM, BN] tile of out[M, N] = a(x)[M, K] @ w[K, N], a = SiLU where ``SILU_IN``, times
    SiLU'(z[M, N]) where ``DSILU_OUT``; ``out`` and ``z`` are contiguous. ``PAIR_IN``: x's rows are
    x[m] + x[m + pair_rows]; ``PAIR_OUT``: row m is also stored as row m + pair_rows."""
    rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    mm, nm = rm < M, rn < N
    acc = tl.zeros((BM, BN), dtype=out_ptr.dtype.element_ty)
    for k0 in tl.range(0, K, BK, num_stages=3):
        km = (k0 + rk) < K
        x = _load_x(x_ptr, rm, k0 + rk, mm[:, None] & km[None, :], sxm, sxk, pair_rows, PAIR_IN, SILU_IN)
        w = tl.load(w_ptr + (k0 + rk)[:, None] * swk + rn[None, :] * swn, mask=km[:, None] & nm[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PRECISION, out_dtype=acc.dtype)
    _store_tile(out_ptr, z_ptr, acc, rm, rn, mm, nm, pair_rows, N, DSILU_OUT, PAIR_OUT)


@triton.jit
def matmul_rows_kernel(x_ptr, w_ptr, z_ptr, out_ptr, M, sxm, sxk, swk, swn, pair_rows, N: tl.constexpr,
                       K: tl.constexpr, KP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       PRECISION: tl.constexpr, SILU_IN: tl.constexpr, DSILU_OUT: tl.constexpr,
                       PAIR_IN: tl.constexpr, PAIR_OUT: tl.constexpr):
    """All of ``BM`` rows of out[M, N] = a(x)[M, K] @ w[K, N] (times SiLU'(z) where ``DSILU_OUT``; pairs
    of rows as ``matmul_kernel``), ``BN`` columns at a time: x's tile (K <= KP) is loaded, activated
    and split for the tensor cores once, then reused for every column tile."""
    rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    rk = tl.arange(0, KP)
    mm, km = rm < M, rk < K
    x = _load_x(x_ptr, rm, rk, mm[:, None] & km[None, :], sxm, sxk, pair_rows, PAIR_IN, SILU_IN)
    for n0 in tl.range(0, N, BN, num_stages=2):
        rn = n0 + tl.arange(0, BN)
        nm = rn < N
        w = tl.load(w_ptr + rk[:, None] * swk + rn[None, :] * swn, mask=km[:, None] & nm[None, :], other=0.0)
        acc = tl.dot(x, w, input_precision=PRECISION, out_dtype=out_ptr.dtype.element_ty)
        _store_tile(out_ptr, z_ptr, acc, rm, rn, mm, nm, pair_rows, N, DSILU_OUT, PAIR_OUT)


def launch(x, w, out, config, silu_in: bool = False, dsilu_z=None, pair_in: bool = False,
           pair_out: bool = False) -> None:
    """``out`` = a(``x``) @ ``w`` [* SiLU'(``dsilu_z``)] with ``config`` = (BM, BN, BK, warps, precision,
    rows): ``rows`` = one program per BM rows looping over the columns (K in one step), else one per
    [BM, BN] tile. ``pair_in``: x has 2M rows and row m of the product reads x[m] + x[M + m];
    ``pair_out``: out has 2M rows, rows m and M + m both the product's row m (M = out's computed rows)."""
    bm, bn, bk, warps, precision, rows = config
    k = x.shape[1]
    m = x.shape[0] // 2 if pair_in else x.shape[0]
    n = w.shape[1]
    z = out if dsilu_z is None else dsilu_z
    flags = (precision, silu_in, dsilu_z is not None, pair_in, pair_out)
    tensors, ints = (x, w, z, out), (m, x.stride(0), x.stride(1), w.stride(0), w.stride(1), m)
    if rows:
        _ROWS((triton.cdiv(m, bm),), tensors, ints, (n, k, max(16, triton.next_power_of_2(k)), bm, bn) + flags,
              warps, NUM_STAGES)
        return
    _TILES((triton.cdiv(m, bm), triton.cdiv(n, bn)), tensors, ints, (n, k, bm, bn, bk) + flags, warps, NUM_STAGES)


NUM_STAGES = 3  # Triton's default (the loops set their own); no register cap: launched as Triton would
_ROWS, _TILES = FastLaunch(matmul_rows_kernel, cap=False), FastLaunch(matmul_kernel, cap=False)
