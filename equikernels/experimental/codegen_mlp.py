"""Fused radial MLP kernels: e3nn ``FullyConnectedNet`` with SiLU, as MACE runs it per edge.

The chain is ``z_i = a_i @ W_i`` (``a_0 = x``; the weights already divided by sqrt(fan_in)),
``a_{i+1} = SCALE * silu(z_i)`` between layers and ``out = z_{L-1}`` (no activation after the
last layer). For each tuple of layer widths one source file is generated (content-hashed under
the cache directory, ``cache.load_module``) holding two kernels:

* ``mlp_fwd``: a program takes ``BE`` rows, loads ``x[BE, H0]`` once, runs the hidden layers with
  ``tl.dot`` on ``[BE, K] x [K, H]`` tiles with the activation applied in registers, and loops
  over column tiles of ``BN`` columns of the last layer, storing each output tile. Nothing but the
  output goes to memory.
* ``mlp_bwd``: accumulates ``e = g @ W_last^T`` over the column tiles of the upstream gradient
  ``g``, recomputes the activations from x (nothing per row is saved by the forward but x),
  keeping ``act'(z_i)`` in registers, then walks back through the hidden layers
  (``d_i = e_{i+1} * act'(z_i)``, ``e_i = d_i @ W_i^T``) and writes ``grad_x = e_0`` (NEED_X).
  With NEED_W it also writes the hidden activations ``a_1..a_{L-1}`` and the deltas
  ``d_0..d_{L-2}`` (``[E, H]`` each); the weight gradients are then plain matmuls
  (``a_i^T @ d_i``, ``a_{L-1}^T @ g``: deterministic), done by the caller.

Widths are padded to powers of two (at least 16, tl.dot's minimum) with masked loads; the padded
columns stay exactly zero through the chain (silu(0) = 0, the padded weight rows are zero).
Hidden and input widths up to ``MAX_WIDTH``; the output width is arbitrary (column tiles).
Dot precision ``PREC`` is a constexpr: "ieee" (exact fp32; always for float64), "tf32x3" or "tf32"
(validated by experimental/mlp.py, which owns the choice and its default).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

from .. import settings
from ..codegen.cache import load_module

MIN_DOT = 16      # smallest tl.dot dimension
MAX_WIDTH = 128   # widest input / hidden layer the kernels hold in registers
_DT = {torch.float32: tl.float32, torch.float64: tl.float64}
DTYPES = tuple(_DT)


@dataclass(frozen=True)
class MLPConfig:
    rows: int = 64        # BE: rows (edges) per program, >= 16
    cols: int = 64        # BN: columns per tile of the last layer (the output / upstream gradient)
    num_warps: int = 4
    num_stages: int = 2


def default_config(direction: str, dtype: torch.dtype, precision: str) -> MLPConfig:
    """Launch configuration by direction ("fwd" / "bwd"), dtype and dot precision. Chosen from
    offline sm_90 compiles (ptxas registers and spills; devtools/offline_regs.py's method), not yet
    timed on a GPU (devtools/s5/mlp_gpu.py sweeps alternatives):

    * float32 tf32x3/tf32 (wgmma, one warpgroup per 64 rows): forward 64 rows x 4 warps, no
      spills; the backward spills a little after its g @ W^T loop (act'(z_i) of every hidden layer
      plus the accumulator are live) at 4 or 8 warps alike, the loop itself needs fewer registers
      with 8.
    * float32 ieee (FMA dots): both operands are held in registers; 8 warps avoid the spills of 4.
    * float64 (mma, operands in registers): 32 rows.

    The tensor-core backward runs with 4 warps: with 8 (and tf32x3), Triton 3.6's code reads past
    its shared-memory buffer (H200, compute-sanitizer: "Invalid __shared__ read of size 1024" in
    mlp_bwd, an illegal-address fault without it); every 4-warp shape tried (64x64 and 32x32
    stages 1, 16x16) ran clean (devtools/s5/mlp_sanitize.py)."""
    if dtype == torch.float64:
        return MLPConfig(rows=32, cols=32, num_warps=4, num_stages=1)
    if precision == "ieee":
        return MLPConfig(rows=64, cols=64, num_warps=8, num_stages=2)
    if direction == "bwd":
        return MLPConfig(rows=64, cols=64, num_warps=4, num_stages=1)
    return MLPConfig(rows=64, cols=64, num_warps=4, num_stages=2)


def padded(h: int) -> int:
    return max(MIN_DOT, triton.next_power_of_2(int(h)))


def unsupported(widths: Sequence[int]) -> Optional[str]:
    """Why the kernels cannot run this chain (None when they can)."""
    if len(widths) < 2:
        return "no layers"
    if any(int(h) < 1 for h in widths):
        return f"empty layer in {tuple(widths)}"
    wide = [h for h in widths[:-1] if h > MAX_WIDTH]
    if wide:
        return f"input/hidden width {wide[0]} > {MAX_WIDTH}"
    return None


def _alloc(shape, like: torch.Tensor) -> torch.Tensor:
    """Output buffer; NaN-filled under EQUIKERNELS_POISON=1 so tests see any element not written
    (the convention of codegen/tp.py)."""
    if settings.get().poison:
        return torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)
    return torch.empty(shape, dtype=like.dtype, device=like.device)


# --- source generation ------------------------------------------------------------------------------
class _Src:
    def __init__(self):
        self.lines: List[str] = []

    def __call__(self, line: str = "", indent: int = 1):
        self.lines.append("    " * indent + line if line else "")


def _mask(*parts: str) -> str:
    parts = [p for p in parts if p]
    return " & ".join(parts)


def _load(src: _Src, name: str, ptr: str, offs: str, mask: str, indent: int = 1):
    if mask:
        src(f"{name} = tl.load({ptr} + {offs}, mask={mask}, other=0.0)", indent)
    else:
        src(f"{name} = tl.load({ptr} + {offs})", indent)


def _prologue(src: _Src, h: Sequence[int]):
    """Rows of this program and the column ranges/masks of every width but the last."""
    src("pid = tl.program_id(0)")
    src("rows = pid * BE + tl.arange(0, BE)")
    src("row_ok = rows < E")
    src("rows = rows.to(tl.int64)")
    src("scale = tl.full([], SCALE, DT)")
    for i, hi in enumerate(h[:-1]):
        src(f"k{i} = tl.arange(0, {padded(hi)})")
        if padded(hi) != hi:
            src(f"k{i}_ok = k{i} < {hi}")


def _ok(h: Sequence[int], i: int, axis: str) -> str:
    """Column-mask term for width i broadcast along ``axis`` ("row": [None, :], "col": [:, None])."""
    if padded(h[i]) == h[i]:
        return ""
    return f"k{i}_ok[None, :]" if axis == "row" else f"k{i}_ok[:, None]"


def _recompute(src: _Src, h: Sequence[int], backward: bool):
    """x -> a_{L-1}: loads x and the hidden weights, applies the activation (and, for the backward,
    keeps act'(z_i) as p_i and optionally stores a_i)."""
    L = len(h) - 1
    _load(src, "a0", "x_ptr", f"rows[:, None] * {h[0]} + k0[None, :]", _mask("row_ok[:, None]", _ok(h, 0, "row")))
    for i in range(L - 1):
        src(f"# layer {i}: [BE, {padded(h[i])}] @ [{padded(h[i])}, {padded(h[i + 1])}], then SCALE * silu")
        _load(src, f"w{i}", f"w{i}_ptr", f"k{i}[:, None] * {h[i + 1]} + k{i + 1}[None, :]",
              _mask(_ok(h, i, "col"), _ok(h, i + 1, "row")))
        src(f"z{i} = tl.dot(a{i}, w{i}, input_precision=PREC, out_dtype=DT)")
        src(f"s{i} = tl.sigmoid(z{i})")
        src(f"a{i + 1} = scale * z{i} * s{i}")
        if backward:
            src(f"p{i} = scale * s{i} * (1.0 + z{i} * (1.0 - s{i}))")
            src("if NEED_W:")
            src(f"tl.store(a{i + 1}_ptr + rows[:, None] * {h[i + 1]} + k{i + 1}[None, :], a{i + 1}, "
                f"mask={_mask('row_ok[:, None]', _ok(h, i + 1, 'row'))})", 2)


def _transposed(src: _Src, h: Sequence[int], i: int, indent: int):
    """W_i^T [P_{i+1}, P_i], loaded again rather than ``tl.trans`` of the forward's tile: a fresh
    load is staged through shared memory like any dot operand, while a transposed register tile
    stays live in registers (offline sm_90 compiles: tf32x3 backward spills 484 -> 168 bytes,
    float64 4004 -> 2372)."""
    _load(src, f"w{i}t", f"w{i}_ptr", f"k{i + 1}[:, None] + k{i}[None, :] * {h[i + 1]}",
          _mask(_ok(h, i + 1, "col"), _ok(h, i, "row")), indent)


def generate(widths: Sequence[int]) -> str:
    h = [int(v) for v in widths]
    L = len(h) - 1
    N, last, pl = h[-1], L - 1, padded(h[-2])
    ws = ", ".join(f"w{i}_ptr" for i in range(L))
    consts = "SCALE: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr, BE: tl.constexpr, BN: tl.constexpr"
    src = _Src()
    src(f"# fused radial MLP, widths {h}: SCALE * silu between layers, none after the last", 0)
    src("import triton", 0)
    src("import triton.language as tl", 0)
    src("", 0)
    src("", 0)
    # forward
    src("@triton.jit", 0)
    src(f"def mlp_fwd(x_ptr, {ws}, out_ptr, E, {consts}):", 0)
    _prologue(src, h)
    _recompute(src, h, backward=False)
    src(f"# layer {last} (output, {N} columns): column tiles of BN")
    src(f"for n0 in range(0, {N}, BN):")
    src("cols = n0 + tl.arange(0, BN)", 2)
    src(f"col_ok = cols < {N}", 2)
    _load(src, "wt", f"w{last}_ptr", f"k{last}[:, None] * {N} + cols[None, :]",
          _mask(_ok(h, last, "col"), "col_ok[None, :]"), 2)
    src(f"o = tl.dot(a{last}, wt, input_precision=PREC, out_dtype=DT)", 2)
    src(f"tl.store(out_ptr + rows[:, None] * {N} + cols[None, :], o, mask=row_ok[:, None] & col_ok[None, :])", 2)
    src("", 0)
    src("", 0)
    # backward
    acts = "".join(f", a{i}_ptr" for i in range(1, L))
    deltas = "".join(f", d{i}_ptr" for i in range(L - 1))
    src("@triton.jit", 0)
    src(f"def mlp_bwd(x_ptr, {ws}, g_ptr, gx_ptr{acts}{deltas}, E, {consts}, NEED_X: tl.constexpr, "
        "NEED_W: tl.constexpr):", 0)
    _prologue(src, h)
    # the upstream gradient first: nothing else is live during the loop over its column tiles
    src(f"# e{last} = g @ W{last}^T over column tiles of g")
    src(f"e{last} = tl.zeros([BE, {pl}], dtype=DT)")
    src(f"for n0 in range(0, {N}, BN):")
    src("cols = n0 + tl.arange(0, BN)", 2)
    src(f"col_ok = cols < {N}", 2)
    src(f"g = tl.load(g_ptr + rows[:, None] * {N} + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], "
        "other=0.0)", 2)
    _load(src, "wt", f"w{last}_ptr", f"cols[:, None] + k{last}[None, :] * {N}",
          _mask("col_ok[:, None]", _ok(h, last, "row")), 2)
    src(f"e{last} = tl.dot(g, wt, e{last}, input_precision=PREC, out_dtype=DT)", 2)
    _recompute(src, h, backward=True)
    for i in range(L - 2, -1, -1):
        src(f"# back through the activation and layer {i}")
        src(f"d{i} = e{i + 1} * p{i}")
        src("if NEED_W:")
        src(f"tl.store(d{i}_ptr + rows[:, None] * {h[i + 1]} + k{i + 1}[None, :], d{i}, "
            f"mask={_mask('row_ok[:, None]', _ok(h, i + 1, 'row'))})", 2)
        if i > 0:
            _transposed(src, h, i, 1)
            src(f"e{i} = tl.dot(d{i}, w{i}t, input_precision=PREC, out_dtype=DT)")
    src("if NEED_X:")
    if L > 1:
        _transposed(src, h, 0, 2)
        src("e0 = tl.dot(d0, w0t, input_precision=PREC, out_dtype=DT)", 2)
    gx_mask = _mask("row_ok[:, None]", _ok(h, 0, "row"))
    src(f"tl.store(gx_ptr + rows[:, None] * {h[0]} + k0[None, :], e0, mask={gx_mask})", 2)
    return "\n".join(src.lines) + "\n"


# --- launch -------------------------------------------------------------------------------------------
class MLPKernels:
    """The two kernels of one width tuple."""

    def __init__(self, widths: Sequence[int]):
        why = unsupported(widths)
        if why is not None:
            raise ValueError(f"widths: the fused MLP kernels cannot run {tuple(widths)} ({why})")
        self.widths = tuple(int(h) for h in widths)
        name = "mlp_" + "_".join(map(str, self.widths))
        self.module = load_module(name, generate(self.widths))
        self.source_path = self.module.__file__
        self.fwd, self.bwd = self.module.mlp_fwd, self.module.mlp_bwd

    def _meta(self, x: torch.Tensor, act_scale: float, precision: str, cfg: MLPConfig) -> dict:
        if x.dtype not in _DT:
            raise TypeError(f"x: the fused MLP kernels take float32 or float64, got {x.dtype}")
        if cfg.rows < MIN_DOT:
            raise ValueError(f"cfg.rows: expected at least {MIN_DOT}, got {cfg.rows}")
        return dict(SCALE=float(act_scale), DT=_DT[x.dtype], PREC="ieee" if x.dtype == torch.float64 else precision,
                    BE=cfg.rows, BN=min(max(MIN_DOT, cfg.cols), padded(self.widths[-1])), num_warps=cfg.num_warps,
                    num_stages=cfg.num_stages)

    def forward(self, x: torch.Tensor, weights: Sequence[torch.Tensor], act_scale: float, precision: str,
                cfg: Optional[MLPConfig] = None) -> torch.Tensor:
        """out [E, widths[-1]]; x and the weights contiguous, one dtype."""
        cfg = cfg or default_config("fwd", x.dtype, precision)
        meta = self._meta(x, act_scale, precision, cfg)
        e = x.shape[0]
        out = _alloc((e, self.widths[-1]), x)
        if e:
            self.fwd[(triton.cdiv(e, cfg.rows),)](x, *weights, out, e, **meta)
        return out

    def backward(self, x: torch.Tensor, weights: Sequence[torch.Tensor], g: torch.Tensor, act_scale: float,
                 precision: str, need_x: bool, need_w: bool, cfg: Optional[MLPConfig] = None
                 ) -> Tuple[Optional[torch.Tensor], List[torch.Tensor], List[torch.Tensor]]:
        """(grad_x or None, [a_1..a_{L-1}], [d_0..d_{L-2}]); the last two are empty lists unless need_w."""
        cfg = cfg or default_config("bwd", x.dtype, precision)
        meta = self._meta(x, act_scale, precision, cfg)
        e, h = x.shape[0], self.widths
        gx = _alloc(x.shape, x) if need_x else None
        acts = [_alloc((e, h[i]), x) for i in range(1, len(h) - 1)] if need_w else []
        deltas = [_alloc((e, h[i + 1]), x) for i in range(len(h) - 2)] if need_w else []
        if e and (need_x or len(h) > 2):
            dummy = x  # never touched: the constexpr flags remove its stores
            self.bwd[(triton.cdiv(e, cfg.rows),)](
                x, *weights, g, gx if need_x else dummy, *(acts or [dummy] * (len(h) - 2)),
                *(deltas or [dummy] * (len(h) - 2)), e, NEED_X=bool(need_x), NEED_W=bool(need_w), **meta)
        return gx, acts, deltas


@functools.lru_cache(maxsize=None)
def kernels_for(widths: Tuple[int, ...]) -> MLPKernels:
    return MLPKernels(widths)
