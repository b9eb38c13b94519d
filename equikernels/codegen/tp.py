"""Generated Triton kernels for a batched tensor product plan: build, cache, launch."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
from dataclasses import dataclass
from typing import Dict, Optional

import torch
import triton
import triton.language as tl

from .. import settings
from .cache import load_module
from ..ir import Table, double_backward_tables
from ..dtypes import acc_dtype, math_dtype_of
from .emit import Group, KernelMeta, generate, path_segment
from .launch import FastLaunch
from . import uvw_rows

# storage dtype -> the kernels' math dtype (DT): half-precision operands are loaded, combined and
# accumulated in float32 and only rounded when stored (stores cast to the output pointer's type)
_DT = {torch.float16: tl.float32, torch.bfloat16: tl.float32, torch.float32: tl.float32,
       torch.float64: tl.float64}
NEED_X, NEED_Y, NEED_W = 1, 2, 4
# per-row uvw (uvw_rows.py), H200, DiffDock-L2, 50k rows, kernel only: the backward's weight gradient in the same
# kernel as gx / gy (1.03 ms at 2 rows x 2 warps; split: 0.635 ms at 1 row x 4 warps + 0.464 ms at
# 2 x 2); the double backward split (dx, dy, dg 1.27 ms at 4 x 4 + dw 0.48 ms at 2 x 2; one kernel
# for all four spills: 3.8 ms at 2 x 2)
UVW_FUSED = {"bwd": True, "dbwd": False}
# (rows, warps) per kernel: "xy" (gx/gy, or dx/dy/dg), "w" (weight gradient alone), "all" (fused)
UVW_CFG = {("bwd", "xy"): (1, 4), ("bwd", "w"): (2, 2), ("bwd", "all"): (2, 2),
           ("dbwd", "xy"): (4, 4), ("dbwd", "w"): (2, 2), ("dbwd", "all"): (4, 4)}


@dataclass(frozen=True)
class LaunchConfig:
    rows: int = 4          # rows per program
    num_warps: int = 4
    num_stages: int = 1
    tf32: bool = False     # tl.dot channel mixing in tf32 (opt-in; default ieee fp32 for e3nn parity)


def weights_dominate(problem) -> bool:
    """Per-row weights larger than the output (DiffDock's uvw): the weights are most of each row's
    traffic, which sets both the launch shape (default_config) and the kernel split (TPKernels)."""
    return not problem.shared_weights and problem.weight_numel > 4 * problem.dim_out


def channelwise_rows(problem) -> bool:
    """Channel-wise (uvu) products with per-row weights: MACE's and NequIP's convolution products."""
    return not problem.shared_weights and all(i.mode == "uvu" for i in problem.instructions)


def narrow_channelwise(problem) -> bool:
    """Channel-wise (uvu) products with per-row weights and at most 32 channels per block: one
    element per thread at 4 rows, latency-bound in the double backward (nequip-lips)."""
    return channelwise_rows(problem) and max(m for m, _, _ in problem.irreps_in1) <= 32


def wide_channelwise(problem) -> bool:
    """Channel-wise (uvu) products with per-row weights and at least 128 channels in every block
    (the MACE products): their backward gets per-thread partial channel sums, loads issued early,
    one-warp programs, a register cap in float32 too and, in half precision, rows asked into L2
    ahead of their loads (TPKernels._partial_sums, _prefetch, _l2, default_config; measurements in
    docs/performance.md)."""
    return channelwise_rows(problem) and min(m for m, _, _ in problem.irreps_in1) >= 128


def default_config(kind: str, dtype: torch.dtype, problem=None) -> LaunchConfig:
    """Heuristic launch configuration (measured on an H100): 4 rows per
    program; problems whose per-row weights dominate the row (uvw with per-row weights, e.g.
    DiffDock) stream better with 8 rows forward, 4 backward and 2 double backward (H200, DiffDock,
    with the weight gradient in its own kernel: backward 2.64 ms with 1 row, 1.74 with 4; double
    backward 8.87 with 4 rows, 8.03 with 2 rows x 2 warps)."""
    s = settings.get()
    env = s.per_kind("rows", kind)
    rows = 4 if dtype == torch.float32 else 2
    if problem is not None and weights_dominate(problem):
        rows = ({"fwd": 8, "bwd": 4, "dbwd": 2} if dtype != torch.float64 else {"fwd": 8, "bwd": 1}).get(kind, rows)
    elif (problem is not None and problem.shared_weights and dtype != torch.float64 and kind in ("bwd", "dbwd")
          and all(i.mode == "uvw" for i in problem.instructions)):
        # shared-weight uvw (tetris-poly-1): 8 rows, H200 tuner table: backward 0.55 -> 0.39 ms,
        # double backward 1.20 -> 0.72 ms
        rows = 8
    elif problem is not None and kind == "dbwd" and dtype != torch.float64 and narrow_channelwise(problem):
        # two rows per thread: nequip-lips 1.405 -> 1.280 ms at 50k rows (H200)
        rows = 8
    one_warp = problem is not None and kind == "bwd" and dtype != torch.float64 and wide_channelwise(problem)
    if one_warp:
        # one row per one-warp program: no barriers between the warps of a program, and occupancy in
        # steps of one warp (H200, 50k rows, mace-large backward fp32 0.791 -> 0.778 ms, bf16
        # 0.550 -> 0.543; mace-medium bf16 0.217 -> 0.195)
        rows = 1
    rows = env if env is not None else rows
    # warps along the row axis keep the channel reductions (tl.sum over a [ROWS, MUL] block) inside
    # a warp; a warp split over channels makes every reduction a shared-memory round trip
    # (measured on an H100: mace-large backward 1.20 ms with 4 rows x 4 warps, 2.55 ms with 8 warps)
    warps = 1 if one_warp and rows == 1 else 4 if rows == 1 else min(4, rows)
    env = s.per_kind("warps", kind)
    warps = env if env is not None else warps
    return LaunchConfig(rows=rows, num_warps=warps, tf32=s.tf32)


def _shape_set(s) -> bool:
    """Any rows / warps setting (EQUIKERNELS_ROWS*, EQUIKERNELS_WARPS*) given."""
    return any(s.per_kind(name, kind) is not None for name in ("rows", "warps") for kind in ("fwd", "bwd", "dbwd"))


def _poison() -> bool:
    return settings.get().poison


def _alloc(shape, like: torch.Tensor, zero: bool, dtype: Optional[torch.dtype] = None,
           poison: Optional[bool] = None) -> torch.Tensor:
    """Output buffer (dtype of ``like`` unless given). Elements the kernel does not write are
    zero-filled; with EQUIKERNELS_POISON=1 (``poison``: the caller read it already) the rest are
    NaN-filled so tests see any element a kernel forgets to write."""
    dtype = dtype or like.dtype
    if zero:
        return torch.zeros(shape, dtype=dtype, device=like.device)
    if _poison() if poison is None else poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)


def math_of(*tensors, math_dtype: Optional[torch.dtype] = None) -> torch.dtype:
    """The kernels' math dtype, the reference's rule: ``math_dtype`` if given, else float64 when any
    operand is float64 and float32 otherwise (float32, float16, bfloat16 operands)."""
    return math_dtype_of(tensors, math_dtype)


def in1_outer(problem, kind: str) -> bool:
    """Share gx/dx inner sums with the weight gradient (emit.generate) in double backwards of
    channel-wise problems (H200: mace-large 2.87 -> 2.54 ms, MACE-MP L2 and lips unchanged;
    DiffDock's uvw got slower, 9.94 -> 10.55). Used by the batched and the convolution kernels."""
    return kind == "dbwd" and all(i.mode == "uvu" for i in problem.instructions)


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


# public names for the opt-in kernels in equikernels.experimental
num_sms = _num_sms
KERNEL_DT = _DT


class Kernel:
    """One generated Triton kernel over ``groups`` (its source, metadata and launch)."""

    def __init__(self, name: str, groups, layout: str, row_operands, describe: str, in1_major: bool = False,
                 lazy_budget: Optional[int] = None, in1_outer: bool = False, built=None, partial: bool = False,
                 prefetch: int = 0, cap_fp32: bool = False, l2: Optional[int] = None):
        # ``built``: (source, KernelMeta) from another generator (uvw_rows), else emit.generate
        body, self.meta = built or generate(name, groups, layout, row_operands, in1_major=in1_major,
                                            lazy_budget=lazy_budget, in1_outer=in1_outer, partial=partial,
                                            prefetch=prefetch, l2=l2)
        header = f"# {describe}\nimport triton\nimport triton.language as tl\n\n\n"
        digest = hashlib.sha256((header + body).encode()).hexdigest()[:12]
        self.module = load_module(f"{name}_{digest}", header + body)
        self.fn = getattr(self.module, name)
        # cap_fp32: float32 builds just above an occupancy step are capped too (launch.register_cap)
        self.launcher = FastLaunch(self.fn, cap_fp32)
        self.source_path = self.module.__file__
        self.acc_outputs = frozenset(g.out_ptr for g in groups if g.accumulate and not g.reduce_rows)

    def launch(self, tensors: Dict[str, torch.Tensor], outputs: Dict[str, torch.Tensor], n: int,
               cfg: LaunchConfig, dtype: torch.dtype, programs: Optional[int] = None):
        nblk = (n + cfg.rows - 1) // cfg.rows
        grid = (max(1, min(nblk, programs)) if programs else max(1, nblk),)
        args = [tensors[k] for k in self.meta.inputs] + [outputs[k] for k in self.meta.outputs]
        dt = _DT[dtype]
        prec = "tf32" if cfg.tf32 and dt == tl.float32 else "ieee"
        # kernel parameters: pointers, N, NBLK, then the constexprs ROWS, DT, PREC (emit.generate)
        self.launcher(grid, args, (n, nblk), (cfg.rows, dt, prec), cfg.num_warps, cfg.num_stages)


PREFETCH: Dict[str, int] = {"fwd": 4, "bwd": 4}  # kind -> default of TPKernels._prefetch
DBWD_PREFETCH = 16  # TPKernels._dbwd_prefetched's double backwards
NARROW_PREFETCH = 16  # forward and backward of narrow channel-wise products (TPKernels._prefetch)
L2_AHEAD: Dict[str, int] = {"bwd": 16}  # kind -> default of TPKernels._l2


def max_paths() -> int:
    """Forward paths per generated kernel; larger problems are split so each kernel compiles fast."""
    return settings.get().max_paths


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


def _elements(table, chunk, in1: bool) -> set:
    """(segment, channel, component) of every output element the paths of ``chunk`` write."""
    out = set()
    for p in table.paths:
        if path_segment(p, in1) not in chunk:
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


class _KernelSet:
    """A problem split over several kernels launched in sequence on one stream. Outputs that two
    parts write are zero-filled first and added into (see _split_groups), so the result equals the
    single kernel's."""

    def __init__(self, parts, zero_init):
        self.parts = parts
        outs = tuple(dict.fromkeys(o for k in parts for o in k.meta.outputs))
        self.meta = KernelMeta(parts[0].meta.name, tuple(dict.fromkeys(i for k in parts for i in k.meta.inputs)),
                               outs, tuple(o for o in outs if o in zero_init), tuple(dict.fromkeys(r for k in parts for r in k.meta.reduce_rows)),
                               max(k.meta.min_rows for k in parts))
        self.acc_outputs = frozenset().union(*(k.acc_outputs for k in parts))

    def launch(self, tensors, outputs, n, cfg, dtype, programs=None):
        for k in self.parts:
            k.launch(tensors, outputs, n, cfg, dtype, programs)


class TPKernels:
    """Forward and backward kernels of one Plan (problem + layout), built lazily per dtype/config.
    ``tuner``: the autotuner these launches consult (``equikernels.tune``'s functions: enabled,
    active, bucket, cache, device_key, choose, time_ms), or None for the heuristic defaults."""

    def __init__(self, plan, tuner=None):
        self.plan = plan
        self.problem = plan.problem
        self.tuner = tuner
        self._cache: Dict[tuple, Optional[Kernel]] = {}
        self._configs: Dict[tuple, LaunchConfig] = {}
        self._tuned_cfgs: Dict[tuple, LaunchConfig] = {}  # autotuner choices already looked up

    def _cfg(self, kind: str, dtype) -> LaunchConfig:
        key = (kind, dtype)
        if key not in self._configs:
            self._configs[key] = default_config(kind, dtype, self.problem)
        return self._configs[key]

    def _in1_major(self) -> bool:
        """Visit paths by first-input segment when every output segment has exactly one forward path
        (MACE/NequIP channel-wise products): fewer live tiles, each g tile still loaded once.
        EQUIKERNELS_VISIT=out|in1 overrides."""
        env = settings.get().visit
        if env is not None:
            return env == "in1"
        segs = [p.output.segment for p in self.plan.table.paths]
        return len(segs) == len(set(segs))

    def _row_operands(self):
        rows = {"x", "y", "g", "a", "b"}
        if not self.problem.shared_weights:
            rows |= {"w", "c"}
        return rows

    def _lazy_budget(self, kind: str) -> Optional[int]:
        """Backward kernels sum channels per path unless the un-reduced accumulators fit in about 32
        registers per thread at the default launch shape (emit.generate); the double backward
        always defers (H200: mace-large 4.90 -> 2.87 ms, others equal or faster)."""
        if kind != "bwd":
            return None
        cfg = self._cfg(kind, torch.float32)
        return 32 * 32 * cfg.num_warps // cfg.rows

    def _partial_sums(self, kind: str) -> bool:
        """Per-thread partial channel sums (emit.KernelBuilder._partial) in backward kernels: they
        keep the y-gradient sums un-reduced within the lazy budget (mace-large backward, sm_90:
        355 -> 80 shuffles per thread). EQUIKERNELS_PARTIAL_SUM=0|1 overrides for every kind."""
        env = settings.get().partial_sum
        return env if env is not None else kind == "bwd" and wide_channelwise(self.problem)

    def _prefetch(self, kind: str) -> int:
        """Loads issued this many loads early (emit._prefetched): in the double backward of
        channel-wise products (_dbwd_prefetched), the forward and backward of narrow ones
        (NARROW_PREFETCH) and those of wide ones (PREFETCH; H200, 50k rows, one-warp backward:
        mace-large bf16 backward 0.543 ms with 0, 0.505 with 4, 0.534 with 2, 0.547 with 6 and 8;
        mace-medium 0.195, 0.184, 0.192, 0.171, 0.171; fp32 within 2 %).
        EQUIKERNELS_PREFETCH_<KIND> / EQUIKERNELS_PREFETCH override."""
        env = settings.get().per_kind("prefetch", kind)
        if env is not None:
            return env
        if kind == "dbwd":
            return DBWD_PREFETCH if self._dbwd_prefetched() else 0
        if kind in ("fwd", "bwd") and narrow_channelwise(self.problem):
            # narrow (<= 32 channels) channel-wise rows are small: 16 loads ahead keeps enough in
            # flight (H200, 50k rows, GPU ms, 0 / 8 / 16 ahead: nequip-water forward 0.075 / 0.069 /
            # 0.068, backward 0.106 / 0.093 / 0.092; nequip-lips forward 0.328 / 0.260 / 0.256,
            # backward 0.431 / 0.364 / 0.316)
            return NARROW_PREFETCH
        return PREFETCH.get(kind, 0) if wide_channelwise(self.problem) else 0

    def _dbwd_prefetched(self) -> bool:
        """The channel-wise per-row double backwards that run as one kernel (or one split by
        first-input segment) wait on their loads (ncu, nequip-water 50k rows: 87 % of stall cycles on
        the long scoreboard, 63 % of DRAM bandwidth); issuing loads DBWD_PREFETCH loads early keeps
        more in flight. H200, 50k rows, ms, prefetch 0 / 8 / 16 / 32: nequip-water 0.301 / 0.256 /
        0.249 / 0.248, nequip-lips 1.111 / 0.913 / 0.921 / 0.890, mace-medium 1.042 / 0.854 / 0.811 /
        0.823, MACE-MP L2 1.331 / 1.095 / 1.082 / 1.268. mace-large's two kernels are not faster
        (2.468 -> 2.506 at 16) and keep none."""
        return channelwise_rows(self.problem) and not self._weights_dominate() and self._dbwd_one()

    def _l2(self, kind: str) -> Optional[int]:
        """Half-precision row operands asked into L2 this many loads ahead (emit.l2_prefetched) in
        the backward of wide channel-wise products. H200, 50k rows, bf16 backward, ms (fp32 builds get
        none): mace-large 0.509 without, 0.488 all at the top of the row, 0.472 / 0.460 / 0.466 at
        8 / 16 / 32 loads ahead; MACE-MP L2 0.246 -> 0.232 at 16; mace-medium 0.184 -> 0.164.
        None under the interpreter (inline asm).
        EQUIKERNELS_L2_PREFETCH[_<KIND>]=off|row|N overrides."""
        s = settings.get()
        if s.triton_interpret:
            return None
        env = s.per_kind("l2_prefetch", kind)
        if env is not None:
            return None if env == "off" else 0 if env == "row" else env
        return L2_AHEAD.get(kind) if wide_channelwise(self.problem) else None

    def _weights_dominate(self) -> bool:
        """Whether the weight gradient (a streamed outer product when weights_dominate) gets a
        kernel of its own, so the gx / gy kernel does not hold the weight tiles and the gradient
        tiles at once. EQUIKERNELS_SPLIT_GW=0 keeps one kernel."""
        return weights_dominate(self.problem) and settings.get().split_gw

    def _in1_outer(self, kind: str) -> bool:
        return in1_outer(self.problem, kind)

    def _uvw_rows(self) -> bool:
        """Per-row uvw weights (DiffDock): backward and double backward from uvw_rows.py."""
        if not hasattr(self, "_uvw"):
            self._uvw = uvw_rows.eligible(self.problem, self.plan.table)
        return self._uvw

    def _uvw_fused(self, kind: str) -> bool:
        """One kernel for the weight gradient and the rest (EQUIKERNELS_UVW_FUSE=1|0 overrides)."""
        env = settings.get().uvw_fuse
        return env if env is not None else UVW_FUSED[kind]

    def _uvw_cfg(self, kind: str, part: int, need: int, cfg: LaunchConfig, math) -> LaunchConfig:
        """Launch shape of one uvw_rows kernel: UVW_CFG when ``cfg`` is the heuristic default and no
        EQUIKERNELS_ROWS* / EQUIKERNELS_WARPS override is set (a tuned or given cfg is kept);
        float64 with half the rows (registers)."""
        if cfg is not self._cfg(kind, math) or _shape_set(settings.get()):
            return cfg
        wbit = NEED_W
        which = "all" if part == need and part & wbit and part & ~wbit else ("w" if part == wbit else "xy")
        rows, warps = UVW_CFG[(kind, which)]
        if math == torch.float64:
            rows = max(1, rows // 2)
        return LaunchConfig(rows, warps, cfg.num_stages, cfg.tf32)

    def kernel(self, kind: str, need: int = 0, have: str = "") -> Optional[Kernel]:
        key = (kind, need, have)
        if key not in self._cache and kind != "fwd" and self._uvw_rows():
            p = self.plan
            names = "".join(n for bit, n in zip((1, 2, 4, 8), "xywg") if need & bit)
            name = f"tp_{kind}{need or ''}{have}_{self.problem.key()}_{p.layout}_uvw"
            built = uvw_rows.generate(name, p.table, p.layout, kind, names, have)
            self._cache[key] = None if built is None else Kernel(
                name, (), p.layout, (), f"{kind} of {self.problem.describe()} [{p.layout}], per-row uvw", built=built)
        if key not in self._cache:
            p = self.plan
            shared = self.problem.shared_weights
            if kind == "fwd":
                groups = [Group(p.table, "out")]
            elif kind == "bwd":
                groups = [Group(p.grad_tables[n], "g" + n, reduce_rows=(n == "w" and shared))
                          for bit, n in ((NEED_X, "x"), (NEED_Y, "y"), (NEED_W, "w")) if need & bit]
            else:  # dbwd: need bits over (x, y, w, g), have = cotangents present
                names = "".join(n for bit, n in zip((1, 2, 4, 8), "xywg") if need & bit)
                tables = double_backward_tables(p.table, have, names)
                groups = [Group(t, "d" + n, reduce_rows=(n == "w" and shared)) for n, t in tables.items()]
            if not groups:
                self._cache[key] = None  # nothing to compute (e.g. dg without cotangents)
                return None
            name = f"tp_{kind}{need or ''}{have}_{self.problem.key()}_{p.layout}"
            in1 = self._in1_major()
            limit = max_paths()
            if kind == "dbwd":
                limit = min(limit, self._dbwd_part_paths() or limit)
            chunks = _chunks(p.table, limit, in1)
            lazy = self._lazy_budget(kind)
            partial = self._partial_sums(kind)
            kw = dict(partial=partial, prefetch=self._prefetch(kind), cap_fp32=partial, l2=self._l2(kind))
            if len(chunks) == 1:
                self._cache[key] = Kernel(name, groups, p.layout, self._row_operands(),
                                           f"{kind} of {self.problem.describe()} [{p.layout}]", in1, lazy,
                                           self._in1_outer(kind), **kw)
            else:
                split, zero = _split_groups(groups, chunks, in1)
                self._cache[key] = _KernelSet([
                    Kernel(f"{name}_part{j}", gs, p.layout, self._row_operands(),
                            f"{kind} of {self.problem.describe()} [{p.layout}], part {j + 1}/{len(chunks)}", in1,
                            lazy, self._in1_outer(kind), **kw)
                    for j, gs in enumerate(split)], zero)
        return self._cache[key]

    def _tuned(self, kind: str, tag: str, x: torch.Tensor, math: torch.dtype, run) -> LaunchConfig:
        """The autotuner's configuration for this direction and row-count bucket, or
        the heuristic default off the GPU, while compiling or capturing a CUDA graph, or with
        EQUIKERNELS_AUTOTUNE=0. ``run(cfg)`` launches the direction with ``cfg``."""
        default = self._cfg(kind, math)
        tune = self.tuner
        if tune is None or not (tune.enabled() and tune.active(x.device)):  # x.device builds an object: test the env first
            return default
        # a hit costs a dict lookup: the key string (problem hash, device name) is built once
        memo = (tag, x.dtype, math, x.device, tune.bucket(x.shape[0]), tune.cache().path)
        cfg = self._tuned_cfgs.get(memo)
        if cfg is None:
            mtag = "" if math == x.dtype else f"|math={math}"
            key = (f"{tune.device_key(x.device)}|tp|{self.problem.key()}|{self.plan.layout}|{x.dtype}{mtag}|{tag}|"
                   f"{tune.bucket(x.shape[0])}")
            best = tune.choose(key, lambda: [dataclasses.asdict(c) for c in self._candidates(default, math)],
                               lambda c: tune.time_ms(lambda: run(LaunchConfig(**c)), x.device),
                               dataclasses.asdict(default))
            cfg = self._tuned_cfgs[memo] = LaunchConfig(**best)
        return cfg

    @staticmethod
    def _candidates(default: LaunchConfig, dtype) -> list:
        """Rows per program around the heuristic (half, same, double; at most 8, 4 in float64),
        warps along the rows as the heuristic does."""
        top = 8 if dtype == torch.float32 else 4
        rows = sorted({r for r in (max(1, default.rows // 2), default.rows, default.rows * 2) if r <= top}
                      | {default.rows})
        return [LaunchConfig(r, 4 if r == 1 else min(4, r), default.num_stages, default.tf32) for r in rows]

    # Dtypes: operands may be float16 / bfloat16 / float32 (mixed) or float64; every kernel computes
    # in ``math`` (math_of: float32 unless float64 is involved), the forward writes ``out_dtype``
    # (default x's), every gradient is written in the dtype of the operand it is the gradient of.
    def forward(self, x, y, w, cfg: Optional[LaunchConfig] = None, out_dtype: Optional[torch.dtype] = None,
                math: Optional[torch.dtype] = None):
        math = math_of(x, y, w, math_dtype=math)
        k, ins = self.kernel("fwd"), {"x": x, "y": y, "w": w}
        outs = {"out": ((x.shape[0], self.problem.dim_out), out_dtype or x.dtype)}
        cfg = cfg or self._tuned("fwd", "fwd", x, math, lambda c: self._run(k, ins, outs, c, math))
        return self._run(k, ins, outs, cfg, math)["out"]

    def backward(self, x, y, w, g, need: int, cfg: Optional[LaunchConfig] = None, math: Optional[torch.dtype] = None):
        math = math_of(x, y, w, g, math_dtype=math)
        if cfg is None:
            cfg = self._tuned("bwd", f"bwd{need}", x, math, lambda c: self.backward(x, y, w, g, need, c, math))
        outs = {"g" + n: (t.shape, t.dtype) for bit, n, t in ((NEED_X, "x", x), (NEED_Y, "y", y), (NEED_W, "w", w))
                if need & bit}
        res = {}
        for part in self.bwd_parts(need, cfg):
            if part:
                names = {"g" + n for bit, n in ((NEED_X, "x"), (NEED_Y, "y"), (NEED_W, "w")) if part & bit}
                pcfg = self._uvw_cfg("bwd", part, need, cfg, math) if self._uvw_rows() else cfg
                res.update(self._run(self.kernel("bwd", part), {"x": x, "y": y, "w": w, "g": g},
                                     {k: v for k, v in outs.items() if k in names}, pcfg, math))
        # placeholders only for the gradients not asked for (a .get default would allocate all three)
        return tuple(res["g" + n] if "g" + n in res else t.new_empty(0) for n, t in (("x", x), ("y", y), ("w", w)))

    def double_backward(self, x, y, w, g, a, b, c, need: int, cfg: Optional[LaunchConfig] = None,
                        math: Optional[torch.dtype] = None):
        """(dx, dy, dw, dg) of the trilinear identity; a, b, c may be None."""
        math = math_of(x, y, w, g, a, b, c, math_dtype=math)
        have = "".join(k for k, t in zip("abc", (a, b, c)) if t is not None)
        if cfg is None:
            cfg = self._tuned("dbwd", f"dbwd{need}{have}", x, math,
                              lambda c_: self.double_backward(x, y, w, g, a, b, c, need, c_, math))
        like = {"x": x, "y": y, "w": w, "g": g}
        names = [n for bit, n in zip((1, 2, 4, 8), "xywg") if need & bit]
        tensors = {"x": x, "y": y, "w": w, "g": g, "a": a, "b": b, "c": c}
        written = {}
        # two kernels (trilinearity): dg = three forward products; dx, dy, dw = backward passes with
        # substituted arguments. One kernel for all four holds too many tiles at once. A shared
        # weight's gradient (loop-carried, row-summed accumulators) gets a third kernel of its own:
        # it reads only the small row operands again and frees the registers of the dx/dy kernel.
        for part in self.dbwd_parts(need):
            if not part:
                continue
            k = self.kernel("dbwd", part, have)
            if k is None:
                continue
            pcfg = self._uvw_cfg("dbwd", part, need, cfg, math) if self._uvw_rows() else cfg
            written.update(self._run(k, tensors, {"d" + n: (like[n].shape, like[n].dtype) for n in names
                                                  if "d" + n in k.meta.outputs}, pcfg, math))
        # outputs with no contributing term (e.g. dg without cotangents) are zero; zero-filled only
        # then (a .get default would fill every output: one extra kernel and a full write each)
        return tuple((written["d" + n] if "d" + n in written else torch.zeros_like(like[n])) if n in names
                     else like[n].new_empty(0) for n in "xywg")

    def bwd_parts(self, need: int, cfg: LaunchConfig) -> tuple:
        """The need bitmasks of the kernels ``backward`` launches with ``cfg``, in order. The weight
        gradient gets a kernel of its own when it is a streamed outer product (per-row uvw unless
        fused, weights_dominate) or a tl.dot row sum needing more rows per program than ``cfg``
        has, so the gx / gy kernel keeps its rows per program."""
        if self._uvw_rows():
            split = need & NEED_W and need & 3 and not self._uvw_fused("bwd")
        else:
            split = need & NEED_W and need & 3 and (self._weights_dominate() or (
                self.problem.shared_weights and self.kernel("bwd", NEED_W).meta.min_rows > cfg.rows))
        return (need & 3, need & NEED_W) if split else (need,)

    def dbwd_parts(self, need: int) -> tuple:
        """The need bitmasks of the kernels ``double_backward`` launches, in order (zero parts are
        skipped by the callers). Channel-wise per-row products: dg in one kernel, dx / dy / dw in a
        second, or all four in one kernel (each operand and cotangent read once, every tile live at
        once) when ``_dbwd_one`` says so."""
        if self._uvw_rows():  # dx, dy, dg read the weights and c; dw (outer products) only writes
            return (need,) if self._uvw_fused("dbwd") else (need & 11, need & 4)
        if self.problem.shared_weights or self._weights_dominate():
            return (need & 8, need & 3, need & 4)
        return (need,) if self._dbwd_one() else (need & 8, need & 7)

    def _dbwd_part_paths(self) -> Optional[int]:
        """Paths per double-backward kernel when a channel-wise per-row product with many paths is split
        by first-input segment (each part reads its x / a tiles once, writes its dx, dw and dg whole and
        adds into dy only), else None. Narrow blocks (at most 32 channels) with more than 12 paths, 6 per
        part (EQUIKERNELS_DBWD_PATHS=N overrides, 0 turns the split off). nequip-lips, H200, 50k rows:
        two kernels 1.298 ms, one kernel in parts of 12 paths 1.269, of 6 paths 1.109 (cuEquivariance
        1.135-1.792 across runs)."""
        env = settings.get().dbwd_paths
        if env is not None:
            return env or None
        if not hasattr(self, "_part_paths"):  # double_backward asks on every call (via _dbwd_one)
            p = self.problem
            self._part_paths = 6 if len(p.instructions) > 12 and narrow_channelwise(p) and self._in1_major() else None
        return self._part_paths

    def _dbwd_one(self) -> bool:
        """One double-backward kernel for a channel-wise per-row product with few paths
        (EQUIKERNELS_DBWD_ONE=1|0 overrides). H200, 20k / 50k rows, two kernels -> one: mace-medium
        0.744 / 1.105 -> 0.430 / 1.043 ms, MACE-MP L2 0.566 / 1.375 -> 0.546 / 1.331, nequip-water
        (50k, fastest of several runs) 0.329 -> 0.299; slower with many paths: mace-large (17 paths,
        the fused kernel at the register cap) 2.47 -> 4.60 at 50k; nequip-lips (30) equal or slower
        unless the kernel is split by
        first-input segment (_dbwd_part_paths)."""
        env = settings.get().dbwd_one
        if env is not None:
            return env
        return len(self.problem.instructions) <= 12 or self._dbwd_part_paths() is not None

    def _run(self, k: Kernel, tensors, outputs, cfg: LaunchConfig, math: torch.dtype):
        """Allocate the outputs (``outputs[name]`` = (shape, dtype), on x's device), launch, reduce
        partials. Buffers added into more than once (row partials, outputs several kernels add
        into) are kept in float32 for half-precision results and rounded once at the end."""
        x = tensors["x"]
        n = x.shape[0]
        if cfg.rows < k.meta.min_rows:
            cfg = LaunchConfig(k.meta.min_rows, cfg.num_warps, cfg.num_stages, cfg.tf32)
        res, partial, wide = {}, {}, {}
        poison = _poison()  # once per launch, not per buffer (an environment read is a few us)
        for name, (shape, dtype) in outputs.items():
            if name in k.meta.reduce_rows:
                partial[name] = (shape, dtype)
            else:
                dt = acc_dtype(dtype) if name in k.acc_outputs else dtype
                if dt != dtype:
                    wide[name] = dtype
                res[name] = _alloc(shape, x, name in k.meta.zero_init or name in wide, dt, poison)
        if n == 0:
            res.update({name: torch.zeros(shape, dtype=dt, device=x.device) for name, (shape, dt) in partial.items()})
            return {name: t.to(wide.get(name, t.dtype)) for name, t in res.items()}
        programs = None
        if partial:
            programs = min(triton.cdiv(n, cfg.rows), 4 * _num_sms(x.device))
            for name, (shape, dtype) in partial.items():
                res[name] = _alloc((programs, shape[-1]), x, name in k.meta.zero_init, acc_dtype(dtype), poison)
        k.launch(tensors, res, n, cfg, math, programs)
        for name, (_, dtype) in partial.items():  # deterministic, no precision loss
            res[name] = res[name].sum(0, dtype=torch.float64).to(dtype)
        for name, dt in wide.items():
            res[name] = res[name].to(dt)
        return res
