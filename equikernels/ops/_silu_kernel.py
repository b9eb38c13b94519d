"""The Triton kernel of ``ops.silu.second_order`` (imported only where Triton runs)."""
import torch
import triton
import triton.language as tl

from ..codegen.launch import FastLaunch


@triton.jit
def silu_second_order(z_ptr, g_ptr, gg_ptr, gz_ptr, gdg_ptr, n, NEED_Z: tl.constexpr, NEED_G: tl.constexpr,
                      F64: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    z = tl.load(z_ptr + offs, mask=mask, other=0.0)
    gg = tl.load(gg_ptr + offs, mask=mask, other=0.0)
    out_type = z.dtype
    # half types compute in float32, float64 in float64
    if F64:
        z = z.to(tl.float64)
        gg = gg.to(tl.float64)
    else:
        z = z.to(tl.float32)
        gg = gg.to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-z))
    if NEED_Z:
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(z.dtype)
        d2 = s * (1.0 - s) * (2.0 + z * (1.0 - 2.0 * s))
        tl.store(gz_ptr + offs, (gg * g * d2).to(out_type), mask=mask)
    if NEED_G:
        d1 = s * (1.0 + z * (1.0 - s))
        tl.store(gdg_ptr + offs, (gg * d1).to(out_type), mask=mask)


def launch(z, g, gg, gz, gdg, block: int) -> None:
    """Writes ``gz`` and/or ``gdg`` (None: not needed) from contiguous ``z``, ``g``, ``gg``."""
    n = z.numel()
    _LAUNCH((triton.cdiv(n, block),), (z, g, gg, gz if gz is not None else z, gdg if gdg is not None else z), (n,),
            (gz is not None, gdg is not None, z.dtype == torch.float64, block), 4, 3)


_LAUNCH = FastLaunch(silu_second_order, cap=False)  # Triton's default launch shape: 4 warps, 3 stages
