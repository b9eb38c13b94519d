"""The Triton kernel of ``ops.matmul`` (imported only where Triton runs)."""
import triton
import triton.language as tl


@triton.jit
def _store_tile(out_ptr, z_ptr, acc, rm, rn, mm, nm, N: tl.constexpr, DSILU_OUT: tl.constexpr):
    """out[rm, rn] = acc, times SiLU'(z[rm, rn]) where ``DSILU_OUT``; ``out`` and ``z`` contiguous [*, N]."""
    offs = rm[:, None] * N + rn[None, :]
    om = mm[:, None] & nm[None, :]
    if DSILU_OUT:
        z = tl.load(z_ptr + offs, mask=om, other=0.0)
        s = tl.sigmoid(z)
        acc = acc * (s * (1.0 + z * (1.0 - s)))
    tl.store(out_ptr + offs, acc, mask=om)


@triton.jit
def matmul_kernel(x_ptr, w_ptr, z_ptr, out_ptr, M, sxm, sxk, swk, swn, N: tl.constexpr, K: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
                  SILU_IN: tl.constexpr, DSILU_OUT: tl.constexpr):
    """One [BM, BN] tile of out[M, N] = a(x)[M, K] @ w[K, N], a = SiLU where ``SILU_IN``, times
    SiLU'(z[M, N]) where ``DSILU_OUT``; ``out`` and ``z`` are contiguous."""
    rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    mm, nm = rm < M, rn < N
    acc = tl.zeros((BM, BN), dtype=out_ptr.dtype.element_ty)
    for k0 in tl.range(0, K, BK, num_stages=3):
        km = (k0 + rk) < K
        x = tl.load(x_ptr + rm[:, None] * sxm + (k0 + rk)[None, :] * sxk, mask=mm[:, None] & km[None, :], other=0.0)
        if SILU_IN:
            x = x * tl.sigmoid(x)
        w = tl.load(w_ptr + (k0 + rk)[:, None] * swk + rn[None, :] * swn, mask=km[:, None] & nm[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PRECISION, out_dtype=acc.dtype)
    _store_tile(out_ptr, z_ptr, acc, rm, rn, mm, nm, N, DSILU_OUT)


@triton.jit
def matmul_rows_kernel(x_ptr, w_ptr, z_ptr, out_ptr, M, sxm, sxk, swk, swn, N: tl.constexpr, K: tl.constexpr,
                       KP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PRECISION: tl.constexpr,
                       SILU_IN: tl.constexpr, DSILU_OUT: tl.constexpr):
    """All of ``BM`` rows of out[M, N] = a(x)[M, K] @ w[K, N] (times SiLU'(z) where ``DSILU_OUT``),
    ``BN`` columns at a time: x's tile (K <= KP) is loaded, activated and split for the tensor
    cores once, then reused for every column tile."""
    rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    rk = tl.arange(0, KP)
    mm, km = rm < M, rk < K
    x = tl.load(x_ptr + rm[:, None] * sxm + rk[None, :] * sxk, mask=mm[:, None] & km[None, :], other=0.0)
    if SILU_IN:
        x = x * tl.sigmoid(x)
    for n0 in tl.range(0, N, BN, num_stages=2):
        rn = n0 + tl.arange(0, BN)
        nm = rn < N
        w = tl.load(w_ptr + rk[:, None] * swk + rn[None, :] * swn, mask=km[:, None] & nm[None, :], other=0.0)
        acc = tl.dot(x, w, input_precision=PRECISION, out_dtype=out_ptr.dtype.element_ty)
        _store_tile(out_ptr, z_ptr, acc, rm, rn, mm, nm, N, DSILU_OUT)


def launch(x, w, out, config, silu_in: bool = False, dsilu_z=None) -> None:
    """``out`` = a(``x``) @ ``w`` [* SiLU'(``dsilu_z``)] with ``config`` = (BM, BN, BK, warps, precision,
    rows): ``rows`` = one program per BM rows looping over the columns (K in one step), else one per
    [BM, BN] tile."""
    bm, bn, bk, warps, precision, rows = config
    m, k = x.shape
    n = w.shape[1]
    z = out if dsilu_z is None else dsilu_z
    if rows:
        matmul_rows_kernel[(triton.cdiv(m, bm),)](
            x, w, z, out, m, x.stride(0), x.stride(1), w.stride(0), w.stride(1), N=n, K=k,
            KP=max(16, triton.next_power_of_2(k)), BM=bm, BN=bn, PRECISION=precision, SILU_IN=silu_in,
            DSILU_OUT=dsilu_z is not None, num_warps=warps)
        return
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    matmul_kernel[grid](x, w, z, out, m, x.stride(0), x.stride(1), w.stride(0), w.stride(1), N=n, K=k,
                        BM=bm, BN=bn, BK=bk, PRECISION=precision, SILU_IN=silu_in, DSILU_OUT=dsilu_z is not None,
                        num_warps=warps)
