"""The Triton kernel of ``ops.matmul`` (imported only where Triton runs)."""
import triton
import triton.language as tl


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
    offs = rm[:, None] * N + rn[None, :]
    om = mm[:, None] & nm[None, :]
    if DSILU_OUT:
        z = tl.load(z_ptr + offs, mask=om, other=0.0)
        s = tl.sigmoid(z)
        acc = acc * (s * (1.0 + z * (1.0 - s)))
    tl.store(out_ptr + offs, acc, mask=om)


def launch(x, w, out, config, silu_in: bool = False, dsilu_z=None) -> None:
    """``out`` = a(``x``) @ ``w`` [* SiLU'(``dsilu_z``)] with ``config`` = (BM, BN, BK, warps, precision)."""
    bm, bn, bk, warps, precision = config
    m, k = x.shape
    n = w.shape[1]
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    z = out if dsilu_z is None else dsilu_z
    matmul_kernel[grid](x, w, z, out, m, x.stride(0), x.stride(1), w.stride(0), w.stride(1), N=n, K=k,
                        BM=bm, BN=bn, BK=bk, PRECISION=precision, SILU_IN=silu_in, DSILU_OUT=dsilu_z is not None,
                        num_warps=warps)
