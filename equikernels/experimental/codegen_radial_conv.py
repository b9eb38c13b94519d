"""Generated Triton kernels of the convolution with the radial MLP's last layer fused in:

    out[n] = sum_{e: dst[e] = n} TP(x[src[e]], y[e], w[e]),   w[e] = h[e] @ W

``h`` [E, H] is the MLP's last hidden activation (times the cutoff), ``W`` [H, weight_numel] its
last (scaled) layer. The per-edge weights w are formed block by block with ``tl.dot`` in registers
and never written: the [E, weight_numel] tensor (93 % of the unfused convolution's traffic for
MACE-MP medium) disappears from the forward and the backward.

Channel-wise (uvu) paths with ``mul 1`` edge irreps, one path per output segment (MACE's
convolution). The kernels own one path's weight slice W_p at a time, loaded once per program:

- ``fwd``: program (path p, group of G destination nodes). Tiles are [channels, edges]: the
  per-edge weights wb = W_p^T h^T come from the tensor cores (wgmma on Hopper; W_p^T stays in shared
  memory, split into tf32 hi / lo parts on the host), the messages accumulate per node as 2-d
  tiles and are summed over the edge axis once per node: deterministic, no atomics.
- ``gx``: program (input segment s, group of source nodes): the paths reading s run one after the
  other, the first storing the group's rows, the others adding into them.
- ``edge``: program (node n) owns n's incoming edges and runs every path in turn over them, adding
  its part of gy and gh = sum_p gw_p @ W_p^T into those edge rows (no atomics: one owner per row).
- ``gW``: program (edge chunk, path p): sum over the chunk of h^T gw_p in registers, one partial
  per chunk (summed by the caller in a fixed order).

A whole-MLP fusion would recompute the hidden layers once per path program (10x for MACE-MP) and
hold all their weights beside W_p; h is 64 floats per edge against weight_numel (1,280), so it is
computed outside (experimental.mlp) and only the wide last layer is fused.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import triton

from .. import settings
from ..codegen.cache import load_module
from ..codegen.tp import KERNEL_DT, num_sms


@dataclass(frozen=True)
class RPath:
    """One uvu path: segments (offset, mul, dim) of x, y, out; weight offset; CG entries."""
    x: Tuple[int, int, int]
    y: Tuple[int, int, int]
    out: Tuple[int, int, int]
    woff: int
    entries: Tuple[Tuple[int, int, int, float], ...]  # (i, j, k, coefficient)


def block_width(n: int) -> bool:
    """Whether ``n`` channels fill whole tl.dot blocks: a power of two >= 16."""
    return n >= 16 and n & (n - 1) == 0


def paths_of(plan) -> Tuple[Optional[List[RPath]], str]:
    """The fusable paths of a plan, or (None, why not)."""
    pr, table = plan.problem, plan.table
    if pr.shared_weights or not pr.weight_numel:
        return None, "needs per-edge weights"
    ops = {o.name: o for o in table.operands}
    res, outs = [], set()
    for p in table.paths:
        lab = p.label_sizes
        if p.weight is None or set(lab) - {"u", "v"} or lab.get("v", 1) != 1:
            return None, "only channel-wise (uvu) paths with mul-1 edge irreps"
        fx, fy = p.factors
        if (fx.operand, fy.operand) != ("x", "y") or fx.base or fy.base or p.output.base:
            return None, "unexpected factor layout"
        if dict(fx.strides) != {"u": 1} or dict(p.output.strides) != {"u": 1} or dict(p.weight.strides).get("u") != 1:
            return None, "only channel-wise (uvu) paths"
        sx, sy, so = (ops[n].segments[s] for n, s in (("x", fx.segment), ("y", fy.segment), ("out", p.output.segment)))
        if sy.mul != 1 or sx.mul != so.mul or not block_width(sx.mul):
            return None, "channels must be a power of two >= 16 and edge irreps of multiplicity 1"
        if p.output.segment in outs:
            return None, "two paths write one output segment"
        outs.add(p.output.segment)
        res.append(RPath((sx.offset, sx.mul, sx.dim), (sy.offset, 1, sy.dim), (so.offset, so.mul, so.dim),
                         p.weight.base, tuple((c[0], c[1], k, v) for c, k, v in p.entries)))
    if not res:
        return None, "no paths"
    return res, ""


class _Src:
    def __init__(self):
        self.lines: List[str] = []

    def __call__(self, line: str = "", indent: int = 1):
        self.lines.append("    " * indent + line if line else "")


def _addr(layout: str, seg: Tuple[int, int, int], comp: int, ch: str) -> str:
    """Column of channel vector ``ch`` of component ``comp`` in a segment."""
    off, mul, dim = seg
    if layout == "ir_mul":
        return f"({off + comp * mul} + {ch})"
    return f"({off + comp} + {ch} * {dim})" if dim > 1 else f"({off} + {ch})"


def _lit(c: float) -> str:
    return repr(float(c))


def _coef_terms(p: RPath, ik: Tuple[int, int], yname: str = "y") -> str:
    """sum_j C_ijk y_j for fixed (i, k): a [B] expression."""
    terms = [f"{_lit(c)} * {yname}{j}" for i, j, k, c in p.entries if (i, k) == ik]
    return " + ".join(terms)


def _pairs(p: RPath) -> List[Tuple[int, int]]:
    seen = []
    for i, _, k, _ in p.entries:
        if (i, k) not in seen:
            seen.append((i, k))
    return seen


def _load_y(src: _Src, ind: int, p: RPath, prefix: str = "y"):
    off, _, dim = p.y
    for j in range(dim):
        if any(jj == j for _, jj, _, _ in p.entries):
            src(f"{prefix}{j} = tl.load(y_ptr + e * DY + {off + j}, mask=m, other=0.0).to(DT)", ind)


def _load_seg(src: _Src, ind: int, layout: str, name: str, ptr: str, row: str, stride: str, seg, comps):
    for c in comps:
        src(f"{name}{c} = tl.load({ptr} + {row}[:, None] * {stride} + {_addr(layout, seg, c, 'ru')}[None, :], "
            f"mask=m[:, None], other=0.0).to(DT)", ind)


HEADER = "B: tl.constexpr, H: tl.constexpr, DX: tl.constexpr, DY: tl.constexpr, DO: tl.constexpr, " \
         "WN: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr"
# node-group kernels (fwd, gx): channels along the rows of every tile, edges along the columns
HEADER_T = HEADER + ", G: tl.constexpr, SPLIT: tl.constexpr"


def _wT_tiles(src: _Src, ind: int, p: RPath):
    """W_p^T [MUL, H] (host-transposed, pre-split into tf32 hi / lo parts when SPLIT): loaded once
    per program and held across its nodes, the tensor-core A operand of every edge block."""
    src(f"ru = tl.arange(0, {p.x[1]})", ind)
    src(f"wrow = ({p.woff} + ru)[:, None] * H + rh[None, :]", ind)
    src("ahi = tl.load(whi_ptr + wrow).to(DT)", ind)
    src("if SPLIT:", ind)
    src("alo = tl.load(wlo_ptr + wrow)", ind + 1)


def _edge_ids(src: _Src, ind: int, other_ptr: str):
    src("r = e0 + rb", ind)
    src("m = r < end", ind)
    src("e = tl.load(perm_ptr + r, mask=m, other=0)", ind)
    src(f"o = tl.load({other_ptr} + e, mask=m, other=0)", ind)


def _wb_dot(src: _Src, ind: int):
    """wb [MUL, B] = W_p^T @ h^T."""
    src("hT = tl.load(h_ptr + e[None, :] * H + rh[:, None], mask=m[None, :], other=0.0).to(DT)", ind)
    _dot(src, ind, "wb", "ahi", "alo", "hT")


def _dot(src: _Src, ind: int, out: str, a_hi: str, a_lo: str, b: str):
    """out = A @ b: with SPLIT, three tf32 products of hi / lo parts (fp32 accuracy on tensor cores;
    A comes split from the host, b is split here); otherwise one product at PREC."""
    src("if SPLIT:", ind)
    src(f"bhi = ({b}.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)", ind + 1)
    src(f'{out} = tl.dot({a_lo}, bhi, input_precision="tf32")', ind + 1)
    src(f'{out} = tl.dot({a_hi}, {b} - bhi, {out}, input_precision="tf32")', ind + 1)
    src(f'{out} = tl.dot({a_hi}, bhi, {out}, input_precision="tf32")', ind + 1)
    src("else:", ind)
    src(f"{out} = tl.dot({a_hi}, {b}, input_precision=PREC, out_dtype=DT)", ind + 1)


def _node_loop(src: _Src, ind: int):
    """``for n in range(n0, n1)`` over the group's nodes, with n's edge range in CSR order."""
    src("for n in range(n0, n1):", ind)
    src("start = tl.load(ptr_ptr + n)", ind + 1)
    src("end = tl.load(ptr_ptr + n + 1)", ind + 1)


def _load_yT(src: _Src, ind: int, p: RPath):
    off, _, dim = p.y
    for j in sorted({j for _, j, _, _ in p.entries}):
        src(f"y{j} = tl.load(y_ptr + e * DY + {off + j}, mask=m, other=0.0).to(DT)", ind)


def _load_segT(src: _Src, ind: int, layout: str, name: str, ptr: str, stride: str, seg, comps):
    for c in comps:
        src(f"{name}{c} = tl.load({ptr} + o[None, :] * {stride} + {_addr(layout, seg, c, 'ru')}[:, None], "
            f"mask=m[None, :], other=0.0).to(DT)", ind)


def _group_prologue(src: _Src):
    """Program (program_id(0) = path or input segment, program_id(1) = group of G nodes): grid
    order puts the programs of one node group side by side, so its rows are read from L2."""
    src("q = tl.program_id(0)")
    src("n0 = tl.program_id(1).to(tl.int64) * G")
    src("n1 = tl.minimum(n0 + G, N)")
    src("rb = tl.arange(0, B)")
    src("rh = tl.arange(0, H)")


def gen_fwd(paths: List[RPath], layout: str) -> str:
    """Program (path, node group): for each node of the group, its incoming edges B at a time;
    the messages are accumulated as [MUL, B] tiles (no per-block reduction) and summed over the
    edge axis once per node; every output row written once, no atomics."""
    s = _Src()
    s("@triton.jit", 0)
    s(f"def rconv_fwd(x_ptr, y_ptr, h_ptr, whi_ptr, wlo_ptr, out_ptr, src_ptr, perm_ptr, ptr_ptr, N, {HEADER_T}):", 0)
    _group_prologue(s)
    for q, p in enumerate(paths):
        s(f"{'if' if q == 0 else 'elif'} q == {q}:")
        _wT_tiles(s, 2, p)
        ks = sorted({k for _, _, k, _ in p.entries})
        comps = sorted({i for i, _, _, _ in p.entries})
        _node_loop(s, 2)
        for k in ks:
            s(f"acc{k} = tl.zeros([{p.x[1]}, B], dtype=DT)", 3)
        s("for e0 in range(start, end, B):", 3)
        _edge_ids(s, 4, "src_ptr")
        _wb_dot(s, 4)
        _load_yT(s, 4, p)
        _load_segT(s, 4, layout, "x", "x_ptr", "DX", p.x, comps)
        for i in comps:
            s(f"x{i} = x{i} * wb", 4)
        for k in ks:
            terms = [f"x{i} * ({_coef_terms(p, (i, k))})[None, :]" for i, kk in _pairs(p) if kk == k]
            s(f"acc{k} += {' + '.join(terms)}", 4)
        for k in range(p.out[2]):
            val = f"tl.sum(acc{k}, axis=1)" if k in ks else f"tl.zeros([{p.x[1]}], dtype=DT)"
            s(f"tl.store(out_ptr + n * DO + {_addr(layout, p.out, k, 'ru')}, {val})", 3)
    return "\n".join(s.lines) + "\n"


def in1_groups(paths: List[RPath]) -> List[Tuple[Tuple[int, int, int], List[int]]]:
    groups: Dict[Tuple[int, int, int], List[int]] = {}
    for q, p in enumerate(paths):
        groups.setdefault(p.x, []).append(q)
    return list(groups.items())


def gen_gx(paths: List[RPath], layout: str) -> str:
    """Program (input segment, source-node group): the paths reading the segment run one after the
    other, each with its W_p loaded once; per node, [MUL, B] tiles accumulate over the outgoing
    edges and are summed once. The first path stores the group's rows, the next ones add into
    them (rows owned by this program: a fixed order, no atomics)."""
    s = _Src()
    s("@triton.jit", 0)
    s(f"def rconv_gx(g_ptr, y_ptr, h_ptr, whi_ptr, wlo_ptr, gx_ptr, dst_ptr, perm_ptr, ptr_ptr, N, {HEADER_T}):", 0)
    _group_prologue(s)
    for gi, (seg, members) in enumerate(in1_groups(paths)):
        s(f"{'if' if gi == 0 else 'elif'} q == {gi}:")
        for mi, q in enumerate(members):
            p = paths[q]
            if mi:
                s("tl.debug_barrier()", 2)
            s(f"# path {q}", 2)
            _wT_tiles(s, 2, p)
            pairs = _pairs(p)
            ks = sorted({k for _, _, k, _ in p.entries})
            comps = sorted({i for i, _, _, _ in p.entries})
            _node_loop(s, 2)
            for i in comps:
                s(f"acc{i} = tl.zeros([{seg[1]}, B], dtype=DT)", 3)
            s("for e0 in range(start, end, B):", 3)
            _edge_ids(s, 4, "dst_ptr")
            _wb_dot(s, 4)
            _load_yT(s, 4, p)
            for k in ks:  # one g tile live at a time
                _load_segT(s, 4, layout, "g", "g_ptr", "DO", p.out, [k])
                s(f"g{k} = g{k} * wb", 4)
                for i, kk in pairs:
                    if kk == k:
                        s(f"acc{i} += g{k} * ({_coef_terms(p, (i, k))})[None, :]", 4)
            for i in range(seg[2]):
                col = f"gx_ptr + n * DX + {_addr(layout, seg, i, 'ru')}"
                val = f"tl.sum(acc{i}, axis=1)" if i in comps else f"tl.zeros([{seg[1]}], dtype=DT)"
                s(f"tl.store({col}, {val})" if mi == 0 else f"tl.store({col}, tl.load({col}) + {val})", 3)
    return "\n".join(s.lines) + "\n"


def _gw_block(s: _Src, ind: int, p: RPath, layout: str):
    """gw [B, MUL] = sum_ijk C x_i y_j g_k for the current edge block (x, g gathered), one g
    component live at a time."""
    _load_y(s, ind, p)
    xs = sorted({i for i, _, _, _ in p.entries})
    _load_seg(s, ind, layout, "x", "x_ptr", "sr", "DX", p.x, xs)
    first = True
    for k in sorted({k for _, _, k, _ in p.entries}):
        _load_seg(s, ind, layout, "g", "g_ptr", "ds", "DO", p.out, [k])
        for i, kk in _pairs(p):
            if kk == k:
                term = f"x{i} * g{k} * ({_coef_terms(p, (i, k))})[:, None]"
                s(f"gw = {term}" if first else f"gw += {term}", ind)
                first = False


def _g_node(p: RPath, layout: str):
    """Lines loading node n's g components of path p as [MUL] vectors (once per node)."""
    return [f"g{k} = tl.load(g_ptr + n * DO + {_addr(layout, p.out, k, 'ru')}).to(DT)"
            for k in sorted({k for _, _, k, _ in p.entries})]


def gen_edge(paths: List[RPath], layout: str, dy: int) -> str:
    """gy and gh. Program (node group) owns the groups' incoming edges (dst order) and runs the
    paths one after the other over them, with [channels, edges] tiles as the forward:

    - gy_j[e] = sum_u wb[u, e] sum_i t_i[u, e] G_ij[u], t_i = x_i * wb, G_ij = sum_k C_ijk g_k (per node);
    - gh[e] = W_p gw[:, e] on the tensor cores, gw = sum_(i,k) c_ik(y) x_i g_k.

    Each path adds into the edge rows (the first path stores gh; gy is zero-filled by the caller):
    rows owned by one program, a barrier between paths, no atomics."""
    s = _Src()
    s("@triton.jit", 0)
    s(f"def rconv_edge(x_ptr, y_ptr, h_ptr, whi_ptr, wlo_ptr, vhi_ptr, vlo_ptr, g_ptr, gy_ptr, gh_ptr, src_ptr, "
      f"perm_ptr, ptr_ptr, N, {HEADER_T}, NEED_Y: tl.constexpr, NEED_H: tl.constexpr):", 0)
    _group_prologue(s)
    for q, p in enumerate(paths):
        if q:
            s("tl.debug_barrier()")
        s(f"# path {q}")
        _wT_tiles(s, 1, p)  # W_p^T (wb for gy)
        s(f"vrow = rh[:, None] * WN + ({p.woff} + ru)[None, :]")  # W_p (gh = W_p gw)
        s("vhi = tl.load(vhi_ptr + vrow).to(DT)")
        s("if SPLIT:")
        s("vlo = tl.load(vlo_ptr + vrow)", 2)
        pairs = _pairs(p)
        comps = sorted({i for i, _, _, _ in p.entries})
        js = sorted({j for _, j, _, _ in p.entries})
        _node_loop(s, 1)
        for line in _g_node(p, layout):
            s(line, 2)
        s("if NEED_Y:", 2)
        for i in comps:
            for j in js:
                terms = [f"{_lit(c)} * g{k}" for ii, jj, k, c in p.entries if (ii, jj) == (i, j)]
                if terms:
                    s(f"G{i}_{j} = ({' + '.join(terms)})[:, None]", 3)
        s("for e0 in range(start, end, B):", 2)
        _edge_ids(s, 3, "src_ptr")
        _load_segT(s, 3, layout, "x", "x_ptr", "DX", p.x, comps)
        s("if NEED_Y:", 3)
        _wb_dot(s, 4)
        for j in js:
            terms = [f"x{i} * G{i}_{j}" for i in comps if any((ii, jj) == (i, j) for ii, jj, _, _ in p.entries)]
            s(f"yp = gy_ptr + e * DY + {p.y[0] + j}", 4)
            s(f"tl.store(yp, tl.load(yp, mask=m, other=0.0) + tl.sum(wb * ({' + '.join(terms)}), axis=0), mask=m)", 4)
        s("if NEED_H:", 3)
        _load_yT(s, 4, p)
        first = True
        for i in comps:
            cs = [f"g{k}[:, None] * ({_coef_terms(p, (i, k))})[None, :]" for ii, k in pairs if ii == i]
            s(f"gw {'=' if first else '+='} x{i} * ({' + '.join(cs)})", 4)
            first = False
        _dot(s, 4, "gb", "vhi", "vlo", "gw")
        s("hp = gh_ptr + e[None, :] * H + rh[:, None]", 4)
        if q == 0:
            s("tl.store(hp, gb, mask=m[None, :])", 4)
        else:
            s("tl.store(hp, tl.load(hp, mask=m[None, :], other=0.0) + gb, mask=m[None, :])", 4)
    return "\n".join(s.lines) + "\n"


def gen_gw(paths: List[RPath], layout: str) -> str:
    s = _Src()
    s("@triton.jit", 0)
    s(f"def rconv_gw(x_ptr, y_ptr, h_ptr, g_ptr, part_ptr, src_ptr, dst_ptr, E, CHUNK, {HEADER}):", 0)
    s("c = tl.program_id(0).to(tl.int64)")
    s("p = tl.program_id(1)")
    s("rb = tl.arange(0, B)")
    s("rh = tl.arange(0, H)")
    s("lo = c * CHUNK")
    s("hi = tl.minimum(lo + CHUNK, E)")
    for q, p in enumerate(paths):
        s(f"{'if' if q == 0 else 'elif'} p == {q}:")
        s(f"ru = tl.arange(0, {p.x[1]})", 2)
        s(f"acc = tl.zeros([H, {p.x[1]}], dtype=DT)", 2)
        s("for e0 in range(lo, hi, B):", 2)
        s("e = e0 + rb", 3)
        s("m = e < hi", 3)
        s("sr = tl.load(src_ptr + e, mask=m, other=0)", 3)
        s("ds = tl.load(dst_ptr + e, mask=m, other=0)", 3)
        s("hb = tl.load(h_ptr + e[:, None] * H + rh[None, :], mask=m[:, None], other=0.0).to(DT)", 3)
        _gw_block(s, 3, p, layout)
        s("acc += tl.dot(tl.trans(hb), gw, input_precision=PREC, out_dtype=DT)", 3)
        s(f"tl.store(part_ptr + c * H * WN + rh[:, None] * WN + ({p.woff} + ru)[None, :], acc)", 2)
    return "\n".join(s.lines) + "\n"


@dataclass(frozen=True)
class RConfig:
    block: int       # edges per step
    warps: int
    precision: str   # float32 tl.dot precision: ieee | tf32x3 | tf32
    stages: int      # software-pipelining depth of the edge loops


PRECISIONS = ("ieee", "tf32x3", "tf32")


def default_config(kind: str, dtype: torch.dtype) -> RConfig:
    """EQUIKERNELS_RCONV_BLOCK / _WARPS / _PRECISION / _STAGES override (block >= 16: tl.dot's minimum)."""
    s = settings.get()
    block, warps, prec = s.rconv_block, s.rconv_warps, s.rconv_precision
    if prec not in PRECISIONS:
        raise ValueError(f"EQUIKERNELS_RCONV_PRECISION: expected one of {PRECISIONS}, got {prec!r}")
    if block < 16 or block & (block - 1):
        raise ValueError(f"EQUIKERNELS_RCONV_BLOCK: expected a power of two >= 16, got {block}")
    stages = 3 if s.rconv_stages is None else s.rconv_stages
    return RConfig(block, warps, "ieee" if dtype == torch.float64 else prec, stages)


class RadialConvKernels:
    """The four kernels of one (plan, hidden width)."""

    def __init__(self, plan, hidden: int):
        paths, why = paths_of(plan)
        if paths is None:
            raise ValueError(why)
        if not block_width(hidden):
            raise ValueError(f"hidden width must be a power of two >= 16, got {hidden}")
        self.plan, self.paths, self.hidden = plan, paths, hidden
        self.layout = plan.layout
        pr = plan.problem
        self.dims = dict(DX=pr.dim_in1, DY=pr.dim_in2, DO=pr.dim_out, WN=pr.weight_numel, H=hidden)
        covered = sum(p.out[1] * p.out[2] for p in paths)
        self.out_covered = covered == pr.dim_out
        self.x_groups = in1_groups(paths)
        self.gx_covered = sum(seg[1] * seg[2] for seg, _ in self.x_groups) == pr.dim_in1
        self._fns: Dict[str, object] = {}

    def fn(self, kind: str):
        if kind not in self._fns:
            body = {"fwd": lambda: gen_fwd(self.paths, self.layout),
                    "gx": lambda: gen_gx(self.paths, self.layout),
                    "edge": lambda: gen_edge(self.paths, self.layout, self.dims["DY"]),
                    "gw": lambda: gen_gw(self.paths, self.layout)}[kind]()
            src = f"# radial conv {kind}: {self.plan.problem.describe()}\nimport triton\nimport triton.language as tl\n\n\n"
            src += body
            digest = hashlib.sha256(src.encode()).hexdigest()[:12]
            self._fns[kind] = getattr(load_module(f"rconv_{kind}_{digest}", src), f"rconv_{kind}")
        return self._fns[kind]

    def _meta(self, kind: str, dtype: torch.dtype) -> dict:
        cfg = default_config(kind, dtype)
        return dict(B=cfg.block, DT=KERNEL_DT[dtype], PREC=cfg.precision, num_warps=cfg.warps, num_stages=cfg.stages,
                    **self.dims)

    def _meta_t(self, kind: str, dtype: torch.dtype) -> dict:
        meta = self._meta(kind, dtype)
        meta["G"] = settings.get().rconv_group
        meta["SPLIT"] = dtype == torch.float32 and meta["PREC"] == "tf32x3"
        # H200, 10,192 Cu atoms, MACE-MP L2:
        # fwd / gx 8.3 / 10.1 ms at 16 edges x 4 warps, 12.2 / 14.6 at 8 warps, 12.6 / 12.8 at 32 x 8
        meta["num_stages"] = settings.get().rconv_stages or 1
        return meta

    def forward(self, x, y, h, w, graph):
        n = graph.num_nodes
        out = (torch.empty if self.out_covered else torch.zeros)((n, self.dims["DO"]), dtype=x.dtype, device=x.device)
        if _poison() and self.out_covered:
            out.fill_(float("nan"))
        if n:
            meta = self._meta_t("fwd", x.dtype)
            whi, wlo = split_wT(w, meta["SPLIT"])
            self.fn("fwd")[(len(self.paths), triton.cdiv(n, meta["G"]))](
                x, y, h, whi, wlo, out, graph.src, graph.perm_dst, graph.ptr_dst, n, **meta)
        return out

    def backward(self, x, y, h, w, g, graph, need_x: bool, need_y: bool, need_h: bool, need_w: bool):
        gx = gy = gh = gw = None
        n, e = graph.num_nodes, graph.num_edges
        if need_x:
            gx = (torch.empty if self.gx_covered else torch.zeros)(x.shape, dtype=x.dtype, device=x.device)
            if _poison() and self.gx_covered:
                gx.fill_(float("nan"))
            if n:
                meta = self._meta_t("gx", x.dtype)
                whi, wlo = split_wT(w, meta["SPLIT"])
                self.fn("gx")[(len(self.x_groups), triton.cdiv(n, meta["G"]))](
                    g, y, h, whi, wlo, gx, graph.dst, graph.perm_src, graph.ptr_src, n, **meta)
        if need_y or need_h:
            gy = torch.zeros(y.shape, dtype=y.dtype, device=y.device) if need_y else y.new_empty(0)
            gh = _buffer(h.shape, h) if need_h else h.new_empty(0)
            if e:
                meta = self._meta_t("edge", x.dtype)
                whi, wlo = split_wT(w, meta["SPLIT"])
                vhi, vlo = split_wT(w.t(), meta["SPLIT"])
                # gy and gh in two passes by default: one kernel holding both spills (measured on an
                # H200); EQUIKERNELS_RCONV_EDGE_SPLIT=0 runs one
                split = settings.get().rconv_edge_split
                for ny, nh in ([(need_y, False), (False, need_h)] if split else [(need_y, need_h)]):
                    if ny or nh:
                        self.fn("edge")[(1, triton.cdiv(n, meta["G"]))](
                            x, y, h, whi, wlo, vhi, vlo, g, gy, gh, graph.src, graph.perm_dst, graph.ptr_dst, n,
                            NEED_Y=ny, NEED_H=nh, **meta)
            elif need_h:
                gh.zero_()
            gy, gh = (gy if need_y else None), (gh if need_h else None)
        if need_w:
            meta = self._meta("gw", x.dtype)
            blocks = triton.cdiv(max(e, 1), meta["B"])
            chunks = max(1, min(blocks, 4 * num_sms(x.device) // max(1, len(self.paths))))
            chunk = triton.cdiv(blocks, chunks) * meta["B"]
            chunks = triton.cdiv(max(e, 1), chunk)
            part = torch.zeros((chunks, self.hidden, self.dims["WN"]), dtype=x.dtype, device=x.device)
            if e:
                self.fn("gw")[(chunks, len(self.paths))](x, y, h, g, part, graph.src, graph.dst, e, chunk, **meta)
            gw = part.sum(0)
        return gx, gy, gh, gw


def split_wT(w: torch.Tensor, split: bool):
    """W^T [WN, H] and, with ``split`` (float32, tf32x3), its parts hi (exact in tf32: low 13
    mantissa bits cleared) and lo = W^T - hi, so three tf32 products give float32 accuracy;
    otherwise (W^T, W^T) and the kernel reads the first alone."""
    wt = w.t().contiguous()
    if not split:
        return wt, wt
    hi = (wt.view(torch.int32) & -8192).view(torch.float32)
    return hi, wt - hi


def _poison() -> bool:
    return settings.get().poison


def _buffer(shape, like):
    if _poison():
        return torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def kernels_for(plan, hidden: int) -> RadialConvKernels:
    cache = plan.__dict__.setdefault("_rconv_kernels", {})
    if hidden not in cache:
        cache[hidden] = RadialConvKernels(plan, hidden)
    return cache[hidden]
