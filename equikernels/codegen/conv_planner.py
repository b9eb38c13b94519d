"""The convolution planner: every kernel decision of the fused graph convolution, made in one place.

``ConvPlanner(tables).plan(flow, direction, need, have, math, launch)`` returns the ``ConvPlan`` of
one (problem, layout, dataflow, direction, need bits, cotangents present, math dtype): which kernels
run (node- or edge-parallel, owner side, edge loops), how each is generated (hoisting, edge-loop
prefetch, shared inner sums, atomics), its launch shape and register cap, and how its buffers are
handled (zero-filled, float32 accumulation, per-program partials, per-edge gradients summed per
node). The generator (emit.py) builds what a step says and the launcher (conv.ConvKernels) runs a
plan's steps. Plans are cached per planner and follow the settings in force.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Dict, Optional, Tuple

import torch

from .. import settings
from ..ir import double_backward_tables
from .emit import Group, Rowing, generate
from .plan_types import ConvKernelStep, ConvPlan, KernelChoice, LaunchConfig, need_letters
from .planner import DIRECTIONS, channel_mul, channel_parts, in1_outer

FLOWS = ("atomic", "deterministic")
# which graph side each operand / output lives on (everything else is per edge)
SRC_SIDE = ("x", "a", "gx", "dx")
DST_SIDE = ("out", "g", "dg")
# float64 node-parallel kernels: warps per program (one edge per step); float32 keeps one warp,
# whose reductions and carried sums stay inside the warp
CONV_WARPS_F64 = {"fwd": 4, "bwd": 1, "dbwd": 2}
PARTIAL_PROGRAMS_PER_SM = 4  # edge-parallel programs per multiprocessor writing row partials
STAGES = 3  # pipeliner stages of the float32 forward and backward edge loops (conv_stages)
STAGES_F64 = 2  # of the float64 backward and double backward edge loops (its forward runs faster unstaged)
STAGED_BYTES_MAX = 48 * 1024  # shared memory the staged edge rows of one program may take


# --- heuristics and settings ----------------------------------------------------------------------
def conv_knob(name: str, kind: str, default: str = "") -> str:
    """Setting ``name`` of direction ``kind`` for the node-parallel convolution kernels:
    EQUIKERNELS_CONV_<NAME>_<KIND>, else EQUIKERNELS_CONV_<NAME>, else ``default``."""
    v = settings.get().per_kind(f"conv_{name.lower()}", kind)
    return default if v is None else str(int(v)) if isinstance(v, bool) else str(v)


def conv_config(kind: str, mode: str, dtype: torch.dtype) -> LaunchConfig:
    """Edges per program step of a convolution kernel of direction ``kind``. Edge-parallel: 4 (fp32)
    / 2 (fp64) with warps along the edge axis, as the batched product. Node-parallel: one edge per
    step, one warp per node (float64: CONV_WARPS_F64). EQUIKERNELS_CONV_ROWS / _WARPS override."""
    nodes = mode == "nodes"
    default = 1 if nodes else (4 if dtype == torch.float32 else 2)
    s = settings.get()
    rows = s.conv_rows or default
    warps = CONV_WARPS_F64[kind] if nodes and dtype == torch.float64 and not s.conv_rows else min(4, rows)
    return LaunchConfig(rows=rows, num_warps=s.conv_warps or warps, tf32=s.tf32)


def conv_prefetch(kind: str, math: torch.dtype = torch.float32, staged: bool = False) -> str:
    """Edge-loop pipelining (emit.Rowing.prefetch) of the node-parallel kernels: '', 'idx' or 'all'.
    The one-warp float32 gradient kernels are latency bound: they issue the next edge's loads early
    ('all') unless their loop is ``staged`` (conv_stages: the pipeliner does not stage loads carried
    in registers); float64 would spill, it and the forward keep ''. EQUIKERNELS_CONV_PREFETCH[_<KIND>]."""
    v = conv_knob("PREFETCH", kind, "" if kind == "fwd" or math == torch.float64 or staged else "all")
    if v not in ("", "idx", "all"):
        raise ValueError(f"EQUIKERNELS_CONV_PREFETCH: expected '', 'idx' or 'all', got {v!r}")
    return v


def conv_stages(problem, kind: str, math: torch.dtype = torch.float32) -> int:
    """Stages of Triton's loop pipeliner on a node-parallel kernel's edge loop (emit.Rowing.stages;
    0: a plain loop): the next edges' rows are copied into shared memory while this one computes.
    Default: STAGES in the float32 forward and backward, STAGES_F64 in the float64 backward and
    double backward, where the staged rows (stages - 1 buffers of x, y and per-edge weights) fit
    STAGED_BYTES_MAX; none in the float32 double backward (slower staged than with its early loads
    into registers) and in the float64 forward (slower staged). EQUIKERNELS_CONV_STAGES[_<KIND>]."""
    v = settings.get().per_kind("conv_stages", kind)
    if v is not None:
        return v
    f64 = math == torch.float64
    if (kind == "dbwd" and not f64) or (f64 and kind == "fwd"):
        return 0
    stages = STAGES_F64 if f64 else STAGES
    row = problem.dim_in1 + problem.dim_in2 + (0 if problem.shared_weights else problem.weight_numel)
    return stages if (stages - 1) * row * (8 if f64 else 4) <= STAGED_BYTES_MAX else 0


def conv_hoist(kind: str, math: torch.dtype) -> bool:
    """Whether a node-parallel kernel holds its owned node's rows (g) in registers across the edge
    loop instead of re-reading them per edge: not in the double backward, which holds twice the
    operands, nor in a float64 backward. EQUIKERNELS_CONV_HOIST[_<KIND>] overrides."""
    spill = kind == "dbwd" or (kind == "bwd" and math == torch.float64)
    return conv_knob("HOIST", kind, "0" if spill else "1") == "1"


def conv_in1_outer(problem, kind: str, math: torch.dtype, nodes: bool) -> bool:
    """Shared gx/dx inner sums (in1_outer), and in the float64 node-parallel backward of channel-wise
    products too (fewer registers there). EQUIKERNELS_CONV_IN1OUTER[_<KIND>] overrides."""
    on = in1_outer(problem, kind) or (nodes and kind == "bwd" and math == torch.float64
                                      and all(i.mode == "uvu" for i in problem.instructions))
    return conv_knob("IN1OUTER", kind, "1" if on else "0") == "1"


def conv_channel_parts(problem, kind: str, math: torch.dtype, carried: bool = False) -> int:
    """Channel parts of a node-parallel gradient kernel: the kernel of a channel-wise product whose
    inputs and outputs all have M channels runs as that many kernels, each over M / parts channels
    (fewer live registers: a float64 backward of 128 channels with vector inputs spills, two of 64
    do not). Default: 64 channels a part in the float64 backward when the first input has more than
    scalars (a scalar first input does not spill and runs slower split) and in a double backward
    that also carries dg (``carried``), one part elsewhere. EQUIKERNELS_CONV_CHANNEL_PARTS[_<KIND>]
    overrides where it divides M."""
    m = channel_mul(problem)
    if m is None:
        return 1
    v = settings.get().per_kind("conv_channel_parts", kind)
    if v is None:
        vectors = any(l > 0 for _, l, _ in problem.irreps_in1)
        split = (kind == "bwd" and math == torch.float64 and vectors) or (kind == "dbwd" and carried)
        v = max(1, m // 64) if split else 1
    return v if v >= 1 and m % v == 0 else 1


def conv_dbwd_dg(problem, math: torch.dtype) -> str:
    """Where the node-parallel double backward computes dg: "apart" (a kernel of its own, which
    reads the per-edge weights and their cotangents again) or "fused" (carried per node in the edge
    loops of dx, dy, dw, in channel parts of 64: 128 channels in one part spill). Default: fused for
    channel-wise products of 128 or more channels (a multiple of 64) outside float64, which has
    not been measured fused. EQUIKERNELS_CONV_DBWD_DG overrides."""
    v = settings.get().conv_dbwd_dg
    if v is not None:
        return v
    m = channel_mul(problem)
    return "fused" if m is not None and m >= 128 and m % 64 == 0 and math != torch.float64 else "apart"


def _layouts_differ(irreps) -> bool:
    return any(m > 1 and l > 0 for m, l, _ in irreps)


# H100, fp32 model calls, ir_mul kernels on permuted node rows against the asked mul_ir ones: SevenNet-0
# 3 % slower at 48k-86k edges and even at 461k, the MACE-MP-medium layers 10 % slower at 92k edges
# and 9 % faster at 856k (below, the permutations' host work is not paid back)
IR_MUL_MIN_EDGES = 400_000


def kernel_layout(problem, layout: str, num_edges: Optional[int] = None) -> str:
    """The layout the fused kernels of a ``layout`` convolution over ``num_edges`` edges run in.
    Channel-wise (uvu) products asked for in mul_ir run in ir_mul from ``IR_MUL_MIN_EDGES`` edges
    (any size when ``num_edges`` is None), the node tensors x and out permuted around the kernels
    (node rows, not edge rows): there the kernels read and write each channel's components as one
    contiguous run (docs/performance.md). Only when y and the weights read the same in both
    layouts. EQUIKERNELS_CONV_LAYOUT=asked keeps the asked layout, =ir_mul ignores the size."""
    mode = settings.get().conv_layout
    if layout != "mul_ir" or mode == "asked":
        return layout
    if mode == "auto" and num_edges is not None and num_edges < IR_MUL_MIN_EDGES:
        return layout
    return _channelwise_layout(problem)


@functools.lru_cache(maxsize=256)
def _channelwise_layout(problem) -> str:
    if (not problem.instructions or any(i.mode != "uvu" for i in problem.instructions)
            or _layouts_differ(problem.irreps_in2)):
        return "mul_ir"
    return "ir_mul" if _layouts_differ(problem.irreps_in1) or _layouts_differ(problem.irreps_out) else "mul_ir"


def rowing(mode: str, operands, owner: Optional[str] = None, sections: str = "segment", hoist: bool = True,
           scatter_src: bool = False, prefetch: str = "", adds=(), stages: int = 0) -> Rowing:
    """How a convolution kernel's rows map to edges and nodes: operands of the owner's side are
    addressed by the owned node, the others through src[e] / dst[e]; node outputs of edge-parallel
    kernels (and with ``scatter_src`` the source-side gradients) are added with atomics, and so are
    ``adds``: per-edge outputs a later double-backward channel part adds into (one addend per element
    and program order within a program: the sum is the same in every run, and the edge loop does not
    wait on a load of the earlier value)."""
    rowvar, index = {}, {}
    operands = sorted(operands)  # a fixed order: the generated source (and its cache key) must not vary per process
    for name in operands:
        side = "src" if name in SRC_SIDE else "dst" if name in DST_SIDE else None
        if side is None:
            continue
        if side == owner:
            rowvar[name] = "noderow"
        else:
            var = "srcrow" if side == "src" else "dstrow"
            rowvar[name] = var
            index[var] = side
    scatter = tuple(n for n in operands if (mode == "edges" and n in ("out", "dg", "gx", "dx"))
                    or (scatter_src and n in ("gx", "dx")) or n in adds)
    r = Rowing(mode, sections, rowvar, index, scatter, hoist)
    r.prefetch, r.stages = prefetch, stages
    return r


class _Kernel:
    """A generated convolution kernel before its launch shape is chosen."""
    __slots__ = ("name", "describe", "body", "meta", "rowing", "choice")

    def __init__(self, name, describe, body, meta, rowing_, choice):
        self.name, self.describe, self.body, self.meta, self.rowing, self.choice = (
            name, describe, body, meta, rowing_, choice)


class ConvPlanner:
    """Convolution plans of one (problem, layout). ``tables``: as ``planner.Planner``'s (``problem``,
    ``layout``, ``table``, ``grad_tables``)."""

    def __init__(self, tables):
        self.tables = tables
        self.problem = tables.problem
        self._kernels: Dict[tuple, _Kernel] = {}
        self._plans: Dict[tuple, ConvPlan] = {}
        self._settings = None

    def row_operands(self) -> frozenset:
        rows = {"x", "y", "g", "a", "b"}
        if not self.problem.shared_weights:
            rows |= {"w", "c"}
        return frozenset(rows)

    def in1_major(self) -> bool:
        """Visit paths by first-input segment when every output segment has one forward path."""
        segs = [p.output.segment for p in self.tables.table.paths]
        return len(segs) == len(set(segs))

    def arrangement(self, flow: str, kind: str) -> str:
        """"edges" for the atomic dataflow with EQUIKERNELS_CONV_ATOMIC[_<KIND>]=edges, else "nodes"."""
        return "edges" if flow == "atomic" and conv_knob("ATOMIC", kind, "nodes") == "edges" else "nodes"

    def grad_loops(self) -> str:
        """Edge loops of the node-parallel gradient kernel: one per x segment (fewer live tiles, no
        spills), or a single one with EQUIKERNELS_CONV_GRAD_LOOPS=one."""
        return "one" if settings.get().conv_grad_loops == "one" else "in1all"

    def _split(self, flow: str, kind: str, names, math: torch.dtype = torch.float32) -> list:
        """(names, mode, owner, sections) of the direction's kernels, in launch order."""
        out = []
        if self.arrangement(flow, kind) == "edges":
            if kind == "dbwd":  # dg alone; dx, dy, dw together (fewer live tiles, as the batched TP)
                if "g" in names:
                    out.append((["g"], "edges", None, "segment"))
                rest = [n for n in names if n != "g"]
                if rest:
                    out.append((rest, "edges", None, "segment"))
            else:
                out.append((list(names), "edges", None, "segment"))
            return out
        # Every kernel owns destination nodes and walks their edges in dst-sorted order. out / dg
        # (wide node outputs): carried per node, one edge loop per first-input segment. Gradients:
        # one pass in which the node's g row is loaded once, the per-edge outputs stored per edge,
        # and gx / dx written per edge then summed per source node (deterministic) or added into
        # their rows atomically (atomic).
        shared_w = ["w"] if "w" in names and self.problem.shared_weights else []
        rest = [n for n in names if n in ("x", "y", "w") and n not in shared_w]
        fused = kind == "dbwd" and "g" in names and rest and conv_dbwd_dg(self.problem, math) == "fused"
        if fused:
            out.append((["g"] + rest, "nodes", "dst", self.grad_loops()))
        else:
            if "out" in names or "g" in names:
                n = "out" if "out" in names else "g"
                out.append(([n], "nodes", "dst", "in1"))
            if rest:
                out.append((rest, "nodes", "dst", self.grad_loops()))
        if shared_w:
            out.append((shared_w, "edges", None, "segment"))
        return out

    def _groups(self, kind: str, names, have: str, carry, per_edge: Optional[str]):
        """Groups computing ``names``; those in ``carry`` are node outputs of a node-parallel kernel
        (summed over the node's edges), a shared weight's gradient is summed over all edges;
        ``per_edge``: the source-side gradient written per edge (renamed ``per_edge + "e"``)."""
        t, shared = self.tables, self.problem.shared_weights
        red = lambda n: n in carry or (n == "w" and shared)  # noqa: E731
        if kind == "fwd":
            groups = [Group(t.table, "out", reduce_rows=red("out"))]
        elif kind == "bwd":
            groups = [Group(t.grad_tables[n], "g" + n, reduce_rows=red(n)) for n in names]
        else:
            tables = double_backward_tables(t.table, have, "".join(names))
            groups = [Group(tables[n], "d" + n, reduce_rows=red(n)) for n in names if n in tables]
        if per_edge:
            groups = [Group(g.table, per_edge + "e", g.reduce_rows, g.accumulate) if g.out_ptr == per_edge else g
                      for g in groups]
        return groups

    def _kernel(self, key: tuple, tag: str, groups, rowing_: Rowing, choice: KernelChoice) -> _Kernel:
        k = self._kernels.get(key)
        if k is None:
            p, layout = self.problem, self.tables.layout
            name = f"conv_{tag}_{rowing_.mode}_{p.key()}_{layout}"
            body, meta = generate(name, groups, layout, choice, rowing_)
            describe = f"{tag} of the convolution of {p.describe()} [{layout}, {rowing_.mode}]"
            k = self._kernels[key] = _Kernel(name, describe, body, meta, rowing_, choice)
        return k

    def plan(self, flow: str, direction: str, need: int = 0, have: str = "", math: torch.dtype = torch.float32,
             launch: Optional[LaunchConfig] = None) -> ConvPlan:
        """The plan of ``direction`` (fwd; bwd with need bits over x, y, w; dbwd with need bits over
        x, y, w, g and cotangents ``have``) of dataflow ``flow`` in math dtype ``math``; ``launch``: a
        given launch shape for every kernel (None: each kernel's heuristic default). Cached; raises
        emit.Unsupported where a kernel cannot be generated."""
        if flow not in FLOWS:
            raise ValueError(f"flow: expected 'atomic' or 'deterministic', got {flow!r}")
        if direction not in DIRECTIONS:
            raise ValueError(f"direction: expected one of {DIRECTIONS}, got {direction!r}")
        s = settings.get()
        if s is not self._settings:  # decisions follow the settings in force (tests override them)
            self._plans.clear()
            self._settings = s
        key = (flow, direction, need, have, math, launch)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(flow, direction, need, have, math, launch)
        return plan

    def _plan(self, flow: str, kind: str, need: int, have: str, math, launch) -> ConvPlan:
        names = ["out"] if kind == "fwd" else list(need_letters(need if kind == "dbwd" else need & 7))
        arrangement = self.arrangement(flow, kind)
        nodes_atomic = flow == "atomic" and arrangement == "nodes"
        steps = []
        for ns, mode, owner, sections in self._split(flow, kind, names, math):
            nodes = mode == "nodes"
            carry = [n for n in ns if n in ("out", "g")] if nodes else []
            per_edge = ("gx" if kind == "bwd" else "dx") if nodes and "x" in ns and not nodes_atomic else None
            groups = self._groups(kind, [n for n in ns if n != "out"], have, carry, per_edge)
            if not groups:
                continue
            grads = any(n not in ("out", "g") for n in ns)
            parts = conv_channel_parts(self.problem, kind, math, bool(carry)) if nodes and grads else 1
            sliced = channel_parts(groups, channel_mul(self.problem), parts)
            if sliced is None:
                steps.append(self._step(flow, kind, have, math, launch, ns, mode, owner, sections, groups, per_edge))
                continue
            full = self._step(flow, kind, have, math, launch, ns, mode, owner, sections, groups, per_edge)
            part_steps = [self._step(flow, kind, have, math, launch, ns, mode, owner, sections, part, per_edge,
                                     (lo, hi)) for lo, hi, part in sliced]
            added = frozenset().union(*(st.acc_outputs for st in part_steps))
            first = part_steps[0]
            # the first part allocates, zero-filled where the parts together leave elements out
            steps.append(dataclasses.replace(first, acc_outputs=added, zero_filled=tuple(
                o for o in first.outputs if o in full.zero_filled or o in first.scatter)))
            steps += [dataclasses.replace(st, zero_filled=(), acc_outputs=added, continues=tuple(st.outputs))
                      for st in part_steps[1:]]
        notes: Tuple[Tuple[str, object], ...] = (("in1_major", self.in1_major()),
                                                 ("shared_weights", self.problem.shared_weights))
        return ConvPlan(flow, kind, need, have, math, launch, arrangement, tuple(steps), notes)

    def _step(self, flow, kind, have, math, launch, ns, mode, owner, sections, groups, per_edge,
              channels: Tuple[int, int] = (0, 0)) -> ConvKernelStep:
        """The plan step of one kernel computing ``groups`` (channel slice ``channels``)."""
        nodes = mode == "nodes"
        nodes_atomic = flow == "atomic" and self.arrangement(flow, kind) == "nodes"
        tag = f"{kind}{have}_{''.join(ns)}" + (f"_c{channels[0]}_{channels[1]}" if channels != (0, 0) else "")
        # the double backward's gradient kernel holds twice the operands: its owned-node rows
        # (g) are re-read per edge from cache instead of held in registers
        hoist = conv_hoist(kind, math) if nodes else kind != "dbwd"
        share = conv_in1_outer(self.problem, kind, math, nodes)
        stages = conv_stages(self.problem, kind, math) if nodes else 0
        prefetch = conv_prefetch(kind, math, stages > 0) if nodes else ""
        maxnreg = int(conv_knob("MAXNREG", kind, "0")) if nodes else 0
        scatter_src = nodes_atomic and nodes
        # the float64 backward's later parts keep their measured read-add-store
        adds = (tuple(sorted(g.out_ptr for g in groups if g.accumulate and not g.reduce_rows))
                if nodes and kind == "dbwd" else ())
        merged = kind == "dbwd" and settings.get().dbwd_merge
        kkey = (tag, mode, owner, sections, hoist, share, prefetch, stages, maxnreg, scatter_src, adds, merged)
        ops = set()
        for g in groups:
            ops.add(g.out_ptr)
            ops.update(o.name for o in g.table.operands if o.name != g.table.output)
        rw = rowing(mode, ops, owner, sections, hoist, scatter_src, prefetch, adds, stages)
        choice = KernelChoice(row_operands=self.row_operands(), in1_major=self.in1_major(), in1_outer=share,
                              merge=merged)
        k = self._kernel(kkey, tag, groups, rw, choice)
        partials = tuple(g.out_ptr for g in groups if g.reduce_rows and mode == "edges")
        added = tuple(g.out_ptr for g in groups if g.out_ptr not in partials
                      and (g.out_ptr in k.rowing.scatter or g.accumulate))
        zero = tuple(g.out_ptr for g in groups if g.out_ptr not in partials
                     and (g.out_ptr in k.meta.zero_init or g.out_ptr in added))
        cfg = launch or conv_config(kind, mode, math)
        if cfg.rows < k.meta.min_rows:
            cfg = LaunchConfig(k.meta.min_rows, cfg.num_warps, cfg.num_stages, cfg.tf32)
        return ConvKernelStep(
            kkey, k.name, k.describe, tuple(ns), mode, owner, sections, hoist, prefetch, k.rowing.scatter,
            choice, cfg, maxnreg, tuple(k.meta.inputs), tuple(k.meta.outputs), k.rowing.args,
            zero, frozenset(added), partials, PARTIAL_PROGRAMS_PER_SM if partials else 0, per_edge,
            k.meta.min_rows, k.body, channels, stages=stages)
