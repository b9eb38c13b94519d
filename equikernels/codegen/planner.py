"""The planner: every kernel decision of the batched tensor product, made in one place.

``Planner(tables).plan(direction, need, have, math, launch)`` returns the ``DirectionPlan`` of one
(problem, layout, direction, need bits, cotangents present, math dtype) from the heuristics below
and the settings in force: kernel split, per-kernel generator choices, launch shapes and buffer
handling. The generator (emit.py, uvw_rows.py) builds what a ``KernelChoice`` says and the
launcher (tp.TPKernels, the pinned recipes of recipe.py) runs a plan's steps. Plans are cached per
planner; the measurements behind the defaults are in docs/performance.md. The fused graph
convolution's decisions are conv_planner.py's, built on the same problem classes.
"""
from __future__ import annotations

import functools
import itertools
from typing import Dict, Optional, Tuple

import torch

from .. import settings
from ..ir import Table, channel_label, channel_slice, double_backward_tables
from . import uvw_rows
from .emit import Group, generate, path_segment
from .plan_types import (UVW_ROWS, DirectionPlan, KernelChoice, KernelStep, LaunchConfig, Member,
                         UvwOptions)

NEED_X, NEED_Y, NEED_W = 1, 2, 4
DIRECTIONS = ("fwd", "bwd", "dbwd")

# per-row uvw (uvw_rows.py): the backward's weight gradient fused with gx / gy; the double
# backward's split off (one kernel for all four spills)
UVW_FUSED = {"bwd": True, "dbwd": False}
# (rows, warps) per uvw_rows kernel: "xy" (gx/gy, or dx/dy/dg), "w" (weight gradient alone), "all"
UVW_CFG = {("bwd", "xy"): (1, 4), ("bwd", "w"): (2, 2), ("bwd", "all"): (2, 2),
           ("dbwd", "xy"): (4, 4), ("dbwd", "w"): (2, 2), ("dbwd", "all"): (4, 4)}
PREFETCH: Dict[str, int] = {"fwd": 4, "bwd": 4}  # kind -> loads ahead, wide channel-wise products
# math dtype -> loads ahead, backward of wide channel-wise products in ir_mul (float64 slows at 32;
# in mul_ir deeper is slower: mace-large float32 3x at 32, MACE-MP L2 float64 1.7x at 16)
IR_MUL_BWD_PREFETCH: Dict[torch.dtype, int] = {torch.float32: 32, torch.float64: 16}
DBWD_PREFETCH = 16  # channel-wise double backwards run as one kernel (_dbwd_prefetched)
NARROW_PREFETCH = 16  # forward and backward of narrow channel-wise products
L2_AHEAD: Dict[str, int] = {"bwd": 16}  # kind -> L2 prefetch distance, wide channel-wise products
# float64 forwards split anyway (more paths than max_paths) run parts of this many paths: wider
# float64 parts spill (benzene, 68 paths: 2 parts 3.79 ms, parts of 20 4.01, of 12 2.80 at 50k rows)
F64_FWD_PART_PATHS = 12


# --- problem classes the heuristics test ----------------------------------------------------------
def weights_dominate(problem) -> bool:
    """Per-row weights larger than the output (DiffDock's uvw): the weights are most of each row's
    traffic, which sets both the launch shape and the kernel split."""
    return not problem.shared_weights and problem.weight_numel > 4 * problem.dim_out


def channelwise_rows(problem) -> bool:
    """Channel-wise (uvu) products with per-row weights: MACE's and NequIP's convolution products."""
    return not problem.shared_weights and all(i.mode == "uvu" for i in problem.instructions)


def narrow_channelwise(problem) -> bool:
    """Channel-wise products with per-row weights and at most 32 channels per block (nequip-lips)."""
    return channelwise_rows(problem) and max((m for m, _, _ in problem.irreps_in1), default=0) <= 32


def wide_channelwise(problem) -> bool:
    """Channel-wise products with per-row weights and at least 128 channels in every block (the MACE
    products): partial channel sums, early loads, one-row backward programs, L2 prefetch."""
    return channelwise_rows(problem) and min((m for m, _, _ in problem.irreps_in1), default=0) >= 128


@functools.lru_cache(maxsize=256)
def channel_mul(problem) -> Optional[int]:
    """M when every instruction is channel-wise and every first-input and output segment has M
    channels, else None."""
    muls = {m for m, _, _ in problem.irreps_in1} | {m for m, _, _ in problem.irreps_out}
    if not problem.instructions or any(i.mode != "uvu" for i in problem.instructions) or len(muls) != 1:
        return None
    return muls.pop()


def channel_parts(groups, mul: Optional[int], parts: int):
    """The groups of each of ``parts`` channel parts ([lo, hi) of the ``mul`` channels), or None for
    one part, no channel count (``channel_mul`` None) or tables without one common channel label.
    Slices write disjoint parts of outputs with channels; outputs without (dy) get partial sums,
    added into (accumulate) by the later parts."""
    if parts <= 1 or not mul or mul % parts:
        return None
    labels = {channel_label(g.table, mul) for g in groups}
    if None in labels or len(labels) != 1:
        return None
    label = labels.pop()
    res = []
    for k in range(parts):
        lo, hi = k * mul // parts, (k + 1) * mul // parts
        part = []
        for g in groups:
            chan = any(label in dict(p.output.strides) for p in g.table.paths)
            part.append(Group(channel_slice(g.table, label, lo, hi), g.out_ptr, g.reduce_rows,
                              g.accumulate or (k > 0 and not chan)))
        res.append((lo, hi, part))
    return res


def in1_outer(problem, kind: str) -> bool:
    """Share gx/dx inner sums with the weight gradient in double backwards of channel-wise problems
    (faster for MACE, slower for DiffDock's uvw). Used by the batched and the convolution kernels."""
    return kind == "dbwd" and all(i.mode == "uvu" for i in problem.instructions)


def default_config(kind: str, dtype: torch.dtype, problem=None) -> LaunchConfig:
    """Heuristic launch shape of direction ``kind`` for math ``dtype``: 4 rows per program in
    float32, 2 in float64, adjusted per problem class; EQUIKERNELS_ROWS*/WARPS* override."""
    s = settings.get()
    env = s.per_kind("rows", kind)
    rows = 4 if dtype == torch.float32 else 2
    if problem is not None and weights_dominate(problem):
        # the weights stream better with more rows forward, fewer backward
        rows = ({"fwd": 8, "bwd": 4, "dbwd": 2} if dtype != torch.float64 else {"fwd": 8, "bwd": 1}).get(kind, rows)
    elif (problem is not None and problem.shared_weights and dtype != torch.float64 and kind in ("bwd", "dbwd")
          and all(i.mode == "uvw" for i in problem.instructions)):
        rows = 8  # shared-weight uvw (tetris-poly-1): fewer programs to reduce the weight gradient over
    elif problem is not None and kind == "dbwd" and dtype != torch.float64 and narrow_channelwise(problem):
        rows = 8  # two rows per thread hide latency (nequip-lips)
    one_row = problem is not None and kind == "bwd" and wide_channelwise(problem)
    if one_row:
        rows = 1  # one-row programs: no barriers between warps, occupancy in steps of one program
    rows = env if env is not None else rows
    # warps along the row axis keep the channel reductions (tl.sum over [ROWS, MUL]) inside a warp;
    # a float64 row takes two warps: in one, its values spill (MACE-MP L2: 1,216 bytes per thread)
    warps = (2 if dtype == torch.float64 else 1) if one_row and rows == 1 else 4 if rows == 1 else min(4, rows)
    env = s.per_kind("warps", kind)
    warps = env if env is not None else warps
    return LaunchConfig(rows=rows, num_warps=warps, tf32=s.tf32)


def candidates(default: LaunchConfig, dtype) -> list:
    """The autotuner's launch-shape variants of a plan: rows per program around the heuristic (half,
    same, double; at most 8, 4 in float64), warps along the rows as the heuristic does."""
    top = 8 if dtype == torch.float32 else 4
    rows = sorted({r for r in (max(1, default.rows // 2), default.rows, default.rows * 2) if r <= top}
                  | {default.rows})
    return [LaunchConfig(r, 4 if r == 1 else min(4, r), default.num_stages, default.tf32) for r in rows]


def _shape_set(s) -> bool:
    """Any rows / warps setting (EQUIKERNELS_ROWS*, EQUIKERNELS_WARPS*) given."""
    return any(s.per_kind(name, kind) is not None for name in ("rows", "warps") for kind in DIRECTIONS)


# --- splitting a product over several kernels ------------------------------------------------------
def _chunks(table, limit: int, in1: bool = False):
    """Output segments grouped into runs of at most ``limit`` forward paths."""
    count: Dict[int, int] = {}
    for p in table.paths:
        count[path_segment(p, in1)] = count.get(path_segment(p, in1), 0) + 1
    chunks, cur, n = [], [], 0
    for seg in sorted(count):
        if cur and n + count[seg] > limit:
            chunks.append(frozenset(cur))
            cur, n = [], 0
        cur.append(seg)
        n += count[seg]
    return chunks + [frozenset(cur)] if cur else chunks or [frozenset()]


def _restrict(g: Group, chunk, accumulate: bool, in1: bool) -> Group:
    """The part of a group's table in ``chunk``."""
    t = g.table
    if any(path_segment(p, in1) < 0 for p in t.paths):
        raise AssertionError(f"a path of {t.output}'s table has no split unit")
    return Group(Table(t.operands, t.output, tuple(p for p in t.paths if path_segment(p, in1) in chunk)), g.out_ptr,
                 g.reduce_rows, accumulate=accumulate)


def _elements(table, chunk=None, in1: bool = False) -> set:
    """(segment, channel, component) of every output element the paths of ``chunk`` (None: all)
    write."""
    out = set()
    for p in table.paths:
        if chunk is not None and path_segment(p, in1) not in chunk:
            continue
        sizes = p.label_sizes
        st = p.output.strides
        comps = {k for _, k, _ in p.entries}
        for idx in itertools.product(*[range(sizes[l]) for l, _ in st]):
            ch = p.output.base + sum(s * i for (_, s), i in zip(st, idx))
            out.update((p.output.segment, ch, k) for k in comps)
    return out


def _split_groups(groups, chunks, in1: bool):
    """Per chunk, its part of every group. A group's output accumulates across parts (read-add-
    store into a zero-filled buffer) only where two parts write the same element: a forward split
    by output segment writes each element once, so it pays no extra traffic."""
    parts = [[] for _ in chunks]
    zero = set()
    for g in groups:
        sets = [_elements(g.table, c, in1) for c in chunks]
        total = sum(len(s) for s in sets)
        union = set().union(*sets)
        acc = total != len(union)
        out = g.table.operand(g.table.output)
        full = sum(seg.mul * seg.dim for seg in out.segments)
        if acc or len(union) < full or g.reduce_rows:
            zero.add(g.out_ptr)
        for j, c in enumerate(chunks):
            parts[j].append(_restrict(g, c, acc, in1))
    return parts, zero


def _unwritten(parts) -> set:
    """Outputs of ``parts`` (lists of groups) that the parts together leave partly unwritten or add
    into: zero-filled before the first part runs."""
    zero = set()
    for gs in zip(*parts):
        t = gs[0].table
        out = t.operand(t.output)
        written = set().union(*(_elements(g.table) for g in gs))
        if len(written) < sum(seg.mul * seg.dim for seg in out.segments) or any(g.accumulate for g in gs):
            zero.add(gs[0].out_ptr)
    return zero


def _member(name: str, describe: str, built, groups=()) -> Member:
    body, meta = built
    return Member(name, describe, body, meta.inputs, meta.outputs, meta.zero_init, meta.reduce_rows,
                  meta.min_rows, frozenset(g.out_ptr for g in groups if g.accumulate and not g.reduce_rows))


class _Built:
    """The generated kernel(s) of one (direction, part, have), before a launch shape is chosen."""
    __slots__ = ("name", "choice", "members", "inputs", "outputs", "zero", "reduce_rows", "acc", "min_rows")

    def __init__(self, name: str, choice: KernelChoice, members, zero=None):
        self.name, self.choice, self.members = name, choice, tuple(members)
        ms = self.members
        self.inputs = tuple(dict.fromkeys(i for m in ms for i in m.inputs))
        self.outputs = tuple(dict.fromkeys(o for m in ms for o in m.outputs))
        self.zero = ms[0].zero_init if zero is None else tuple(o for o in self.outputs if o in zero)
        self.reduce_rows = tuple(dict.fromkeys(r for m in ms for r in m.reduce_rows))
        self.acc = frozenset().union(*(m.acc_outputs for m in ms))
        self.min_rows = max(m.min_rows for m in ms)


class Planner:
    """Plans of one (problem, layout). ``tables``: an object with ``problem``, ``layout``, ``table``
    (the forward path table) and ``grad_tables`` (x, y, w -> backward table)."""

    def __init__(self, tables):
        self.tables = tables
        self.problem = tables.problem
        self._defaults: Dict[tuple, LaunchConfig] = {}
        self._built: Dict[tuple, Optional[_Built]] = {}
        self._plans: Dict[tuple, DirectionPlan] = {}
        self._settings = None
        # per-row uvw products from uvw_rows.py (EQUIKERNELS_UVW_ROWS=0: from emit.py)
        self._uvw = settings.get().uvw_rows and uvw_rows.eligible(self.problem, tables.table)

    # --- launch shape ---------------------------------------------------------------------------
    def default_launch(self, kind: str, math: torch.dtype) -> LaunchConfig:
        """The heuristic launch shape (one object per (kind, math): plans compare it by identity)."""
        key = (kind, math)
        cfg = self._defaults.get(key)
        if cfg is None:
            cfg = self._defaults[key] = default_config(kind, math, self.problem)
        return cfg

    def candidates(self, kind: str, math: torch.dtype) -> list:
        return candidates(self.default_launch(kind, math), math)

    # --- per-kernel generator choices -----------------------------------------------------------
    def in1_major(self) -> bool:
        """Visit paths by first-input segment when every output segment has exactly one forward path
        (MACE/NequIP channel-wise products): fewer live tiles. EQUIKERNELS_VISIT=out|in1 overrides."""
        env = settings.get().visit
        if env is not None:
            return env == "in1"
        segs = [p.output.segment for p in self.tables.table.paths]
        return len(segs) == len(set(segs))

    def row_operands(self) -> frozenset:
        rows = {"x", "y", "g", "a", "b"}
        if not self.problem.shared_weights:
            rows |= {"w", "c"}
        return frozenset(rows)

    def lazy_budget(self, kind: str) -> Optional[int]:
        """Backward kernels sum channels per path unless the un-reduced sums fit in about 32 registers
        per thread at the default float32 launch shape; the double backward always defers."""
        if kind != "bwd":
            return None
        cfg = self.default_launch(kind, torch.float32)
        return 32 * 32 * cfg.num_warps // cfg.rows

    def partial_sums(self, kind: str) -> bool:
        """Per-thread partial channel sums in backward kernels of wide channel-wise products (fewer
        shuffles). EQUIKERNELS_PARTIAL_SUM=0|1 overrides for every kind."""
        env = settings.get().partial_sum
        return env if env is not None else kind == "bwd" and wide_channelwise(self.problem)

    def prefetch(self, kind: str, math: torch.dtype = torch.float32) -> int:
        """Loads issued this many loads early: double backwards run as one kernel, forward and
        backward of narrow and of wide channel-wise products. EQUIKERNELS_PREFETCH[_<KIND>] overrides."""
        env = settings.get().per_kind("prefetch", kind)
        if env is not None:
            return env
        if kind == "dbwd":
            return DBWD_PREFETCH if self.dbwd_prefetched(math) else 0
        if kind in ("fwd", "bwd") and narrow_channelwise(self.problem):
            return NARROW_PREFETCH  # small rows: 16 loads ahead keep enough in flight
        if not wide_channelwise(self.problem):
            return 0
        if kind == "bwd" and self.tables.layout == "ir_mul":
            return IR_MUL_BWD_PREFETCH.get(math, IR_MUL_BWD_PREFETCH[torch.float32])
        return PREFETCH.get(kind, 0)

    def dbwd_prefetched(self, math: torch.dtype = torch.float32) -> bool:
        """Channel-wise per-row double backwards run as one kernel (or one split by first-input
        segment) wait on their loads: they issue them early (two-kernel ones gain nothing)."""
        return channelwise_rows(self.problem) and not self.split_weight_grad() and self.dbwd_one(math)

    def l2(self, kind: str) -> Optional[int]:
        """Half-precision row operands asked into L2 this many loads ahead in the backward of wide
        channel-wise products; None under the interpreter (inline asm).
        EQUIKERNELS_L2_PREFETCH[_<KIND>]=off|row|N overrides."""
        s = settings.get()
        if s.triton_interpret:
            return None
        env = s.per_kind("l2_prefetch", kind)
        if env is not None:
            return None if env == "off" else 0 if env == "row" else env
        return L2_AHEAD.get(kind) if wide_channelwise(self.problem) else None

    def split_weight_grad(self) -> bool:
        """The weight gradient (a streamed outer product where weights dominate) gets a kernel of its
        own, so the gx / gy kernel does not hold weight and gradient tiles at once.
        EQUIKERNELS_SPLIT_GW=0 keeps one kernel."""
        return weights_dominate(self.problem) and settings.get().split_gw

    def uvw_rows(self) -> bool:
        """Per-row uvw weights (DiffDock): backward and double backward from uvw_rows.py."""
        return self._uvw

    def uvw_fused(self, kind: str) -> bool:
        """One uvw_rows kernel for the weight gradient and the rest (EQUIKERNELS_UVW_FUSE=1|0)."""
        env = settings.get().uvw_fuse
        return env if env is not None else UVW_FUSED[kind]

    def dbwd_part_paths(self) -> Optional[int]:
        """Paths per double-backward kernel when a narrow channel-wise per-row product with more than
        12 paths is split by first-input segment (each part reads its x / a tiles once): 6, else None.
        EQUIKERNELS_DBWD_PATHS=N overrides (0: no split)."""
        env = settings.get().dbwd_paths
        if env is not None:
            return env or None
        p = self.problem
        return 6 if len(p.instructions) > 12 and narrow_channelwise(p) and self.in1_major() else None

    def dbwd_one(self, math: torch.dtype = torch.float32) -> bool:
        """One double-backward kernel for a channel-wise per-row product with few paths (or one split
        by first-input segment or by channels); many paths put the fused kernel at the register cap.
        EQUIKERNELS_DBWD_ONE=1|0 overrides."""
        env = settings.get().dbwd_one
        if env is not None:
            return env
        return (len(self.problem.instructions) <= 12 or self.dbwd_part_paths() is not None
                or self.dbwd_channel_parts(math) > 1)

    def dbwd_channel_parts(self, math: torch.dtype = torch.float32) -> int:
        """Channel parts of the one-kernel double backward of a channel-wise per-row product (each
        kernel computes dx, dy, dw, dg over a slice of the channels: half the live registers at two
        parts, and the weights and their cotangents read once). Default in float32: 64 channels a
        part for products of 128 or more channels with more than 12 paths (mace-large), whose one
        kernel over all channels is at the register cap; one part elsewhere. float64 values take two
        registers: half the channels of a float32 part, down to 32, where float32 runs one kernel for
        all four gradients (products with many paths and fewer channels keep dg apart).
        EQUIKERNELS_DBWD_CHANNEL_PARTS=N overrides where N divides the channels."""
        p = self.problem
        m = channel_mul(p) if channelwise_rows(p) and not self._uvw else None
        if m is None:
            return 1
        v = settings.get().dbwd_channel_parts
        if v is None:
            many = len(p.instructions) > 12
            width = 64 if m >= 128 and m % 64 == 0 and many else m
            # halved where float32 runs one kernel for all four gradients (few paths or channel parts)
            if math == torch.float64 and width >= 64 and width % 2 == 0 and (width < m or not many):
                width //= 2
            v = m // width
        return v if m % v == 0 else 1

    def choice(self, kind: str, math: torch.dtype = torch.float32) -> KernelChoice:
        """The generator choices of the emitted kernels of direction ``kind`` in math dtype ``math``."""
        partial = self.partial_sums(kind)
        limit = settings.get().max_paths
        if kind == "dbwd":
            limit = min(limit, self.dbwd_part_paths() or limit)
        elif kind == "fwd" and math == torch.float64 and len(self.problem.instructions) > limit:
            limit = min(limit, F64_FWD_PART_PATHS)
        return KernelChoice(row_operands=self.row_operands(), in1_major=self.in1_major(),
                            lazy_budget=self.lazy_budget(kind), in1_outer=in1_outer(self.problem, kind),
                            partial=partial, prefetch=self.prefetch(kind, math), l2=self.l2(kind), cap_fp32=partial,
                            part_paths=limit, merge=kind == "dbwd" and settings.get().dbwd_merge)

    @staticmethod
    def uvw_choice() -> KernelChoice:
        s = settings.get()
        return KernelChoice(generator=UVW_ROWS, uvw=UvwOptions(s.uvw_ub, s.uvw_wb, s.uvw_exact, s.uvw_lazy_h))

    # --- kernel split ---------------------------------------------------------------------------
    def bwd_parts(self, need: int, cfg: LaunchConfig) -> tuple:
        """The need bitmasks of the backward's kernels with launch shape ``cfg``, in order. The weight
        gradient gets a kernel of its own when it is a streamed outer product (per-row uvw unless
        fused, weights_dominate) or a tl.dot row sum needing more rows per program than ``cfg`` has."""
        if self._uvw:
            split = need & NEED_W and need & 3 and not self.uvw_fused("bwd")
        else:
            split = need & NEED_W and need & 3 and (self.split_weight_grad() or (
                self.problem.shared_weights and self.built("bwd", NEED_W).min_rows > cfg.rows))
        return (need & 3, need & NEED_W) if split else (need,)

    def dbwd_parts(self, need: int, math: torch.dtype = torch.float32) -> tuple:
        """The need bitmasks (over x, y, w, g) of the double backward's kernels in math dtype ``math``,
        in order (zero parts are skipped): dg apart from dx / dy / dw (shared or dominating weights: dw
        apart too), per-row uvw with dw apart, or one kernel for all four (dbwd_one)."""
        if self._uvw:  # dx, dy, dg read the weights and c; dw (outer products) only writes
            return (need,) if self.uvw_fused("dbwd") else (need & 11, need & 4)
        if self.problem.shared_weights or self.split_weight_grad():
            return (need & 8, need & 3, need & 4)
        return (need,) if self.dbwd_one(math) else (need & 8, need & 7)

    # --- generated kernels ----------------------------------------------------------------------
    def built(self, kind: str, need: int = 0, have: str = "", math: torch.dtype = torch.float32) -> Optional[_Built]:
        """The generated kernel(s) of (kind, need bits, have) for math dtype ``math``, None where
        nothing is computed; raises emit.Unsupported where the generator cannot express it."""
        # the choice and the channel split follow the settings in force and the dtype
        parts = self.dbwd_channel_parts(math) if kind == "dbwd" else 1
        choice = self.choice(kind, math)
        key = (kind, need, have, choice, parts)
        if key not in self._built:
            self._built[key] = self._build(kind, need, have, choice, parts)
        return self._built[key]

    def _build(self, kind: str, need: int, have: str, choice: KernelChoice, parts: int) -> Optional[_Built]:
        t, p = self.tables, self.problem
        if kind != "fwd" and self._uvw:
            names = "".join(n for bit, n in zip((1, 2, 4, 8), "xywg") if need & bit)
            name = f"tp_{kind}{need or ''}{have}_{p.key()}_{t.layout}_uvw"
            choice = self.uvw_choice()
            built = uvw_rows.generate(name, t.table, t.layout, kind, names, have, choice)
            if built is None:
                return None
            return _Built(name, choice, [_member(name, f"{kind} of {p.describe()} [{t.layout}], per-row uvw", built)])
        shared = p.shared_weights
        if kind == "fwd":
            groups = [Group(t.table, "out")]
        elif kind == "bwd":
            groups = [Group(t.grad_tables[n], "g" + n, reduce_rows=(n == "w" and shared))
                      for bit, n in ((NEED_X, "x"), (NEED_Y, "y"), (NEED_W, "w")) if need & bit]
        else:  # dbwd: need bits over (x, y, w, g), have = cotangents present
            names = "".join(n for bit, n in zip((1, 2, 4, 8), "xywg") if need & bit)
            tables = double_backward_tables(t.table, have, names)
            groups = [Group(tb, "d" + n, reduce_rows=(n == "w" and shared)) for n, tb in tables.items()]
        if not groups:
            return None  # nothing to compute (e.g. dg without cotangents)
        name = f"tp_{kind}{need or ''}{have}_{p.key()}_{t.layout}"
        what = f"{kind} of {p.describe()} [{t.layout}]"
        sliced = channel_parts(groups, channel_mul(p), parts) if kind == "dbwd" else None
        if sliced is not None:
            members = [_member(f"{name}_c{lo}_{hi}", f"{what}, channels [{lo}, {hi})",
                               generate(f"{name}_c{lo}_{hi}", gs, t.layout, choice), gs) for lo, hi, gs in sliced]
            return _Built(members[0].name, choice, members, _unwritten([gs for _, _, gs in sliced]))
        chunks = _chunks(t.table, choice.part_paths, choice.in1_major)
        if len(chunks) == 1:
            return _Built(name, choice, [_member(name, what, generate(name, groups, t.layout, choice), groups)])
        split, zero = _split_groups(groups, chunks, choice.in1_major)
        members = []
        for j, (gs, chunk) in enumerate(zip(split, chunks)):
            # named by its segments: a part of another split (another dtype) is another kernel
            mname = f"{name}_s{min(chunk)}_{max(chunk)}" if chunk else f"{name}_part{j}"
            members.append(_member(mname, f"{what}, part {j + 1}/{len(chunks)}",
                                   generate(mname, gs, t.layout, choice), gs))
        return _Built(members[0].name, choice, members, zero)  # a split step goes by its first kernel's name

    # --- plans ------------------------------------------------------------------------------------
    def _step_launch(self, kind: str, part: int, need: int, cfg: LaunchConfig, default: bool, math,
                     b: _Built) -> LaunchConfig:
        """A step's launch shape: per-row uvw kernels take UVW_CFG when the direction's is the
        heuristic default and no rows / warps setting is given (float64: half the rows); every kernel
        gets at least its min_rows."""
        if b.choice.generator == UVW_ROWS and default and not _shape_set(settings.get()):
            which = "all" if part == need and part & NEED_W and part & ~NEED_W else (
                "w" if part == NEED_W else "xy")
            rows, warps = UVW_CFG[(kind, which)]
            if math == torch.float64:
                rows = max(1, rows // 2)
            cfg = LaunchConfig(rows, warps, cfg.num_stages, cfg.tf32)
        if cfg.rows < b.min_rows:
            cfg = LaunchConfig(b.min_rows, cfg.num_warps, cfg.num_stages, cfg.tf32)
        return cfg

    def plan(self, direction: str, need: int = 0, have: str = "", math: torch.dtype = torch.float32,
             launch: Optional[LaunchConfig] = None) -> DirectionPlan:
        """The plan of ``direction`` (fwd; bwd with need bits over x, y, w; dbwd with need bits over
        x, y, w, g and cotangents ``have``) in math dtype ``math``; ``launch``: a tuned or given launch
        shape (None: the heuristic default). Cached; raises emit.Unsupported where a kernel cannot be
        generated."""
        s = settings.get()
        if s is not self._settings:  # the split follows the settings in force (tests override them)
            self._plans.clear()
            self._settings = s
        default_cfg = self.default_launch(direction, math)
        default = launch is None or launch is default_cfg
        key = (direction, need, have, math) if default else (direction, need, have, math, launch)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(direction, need, have, math, default_cfg if default else launch,
                                                 default)
        return plan

    def _plan(self, direction: str, need: int, have: str, math, cfg: LaunchConfig, default: bool) -> DirectionPlan:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction: expected one of {DIRECTIONS}, got {direction!r}")
        if direction == "fwd":
            parts = (0,)
        elif direction == "bwd":
            parts = tuple(q for q in self.bwd_parts(need, cfg) if q)
        else:
            parts = tuple(q for q in self.dbwd_parts(need, math) if q)
        steps = []
        for part in parts:
            b = self.built(direction, part, have, math)
            if b is None:
                continue
            steps.append(KernelStep((direction, part, have), b.name, part, b.choice,
                                    self._step_launch(direction, part, need, cfg, default, math, b),
                                    b.inputs, b.outputs, b.zero, b.reduce_rows, b.acc, b.min_rows, b.members))
        notes: Tuple[Tuple[str, object], ...] = (
            ("weights_dominate", weights_dominate(self.problem)),
            ("channelwise_rows", channelwise_rows(self.problem)),
            ("narrow_channelwise", narrow_channelwise(self.problem)),
            ("wide_channelwise", wide_channelwise(self.problem)),
            ("per_row_uvw", self._uvw))
        if direction == "dbwd":
            notes += (("dbwd_one_kernel", self.dbwd_one(math)), ("dbwd_part_paths", self.dbwd_part_paths()),
                      ("dbwd_channel_parts", self.dbwd_channel_parts(math)))
        return DirectionPlan(direction, need, have, math, cfg, default, tuple(steps), notes)

