"""The kernel plan as data: what the planner decides and the generator and launcher act on.

``KernelChoice``: everything one generated kernel is built with beyond its path tables.
``KernelStep``: one kernel of a direction, with its launch shape and buffer handling.
``DirectionPlan``: the ordered kernels of one (problem, layout, direction, need, have, math dtype).
No Triton and no torch device needed: a plan can be made and printed anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import FrozenSet, Optional, Tuple

import torch

EMIT, UVW_ROWS = "emit", "uvw_rows"  # generators: path tables (emit.py), per-row uvw (uvw_rows.py)
NEED_LETTERS = "xywg"  # a plan's need bits 1, 2, 4, 8: the gradients of x, y, w and (double backward) g


def need_letters(bits: int) -> str:
    """The letters (of NEED_LETTERS) of need ``bits``."""
    return "".join(n for i, n in enumerate(NEED_LETTERS) if bits >> i & 1)


def need_bits(letters) -> int:
    """The need bits of ``letters`` (of NEED_LETTERS)."""
    return sum(1 << NEED_LETTERS.index(n) for n in set(letters))


@dataclass(frozen=True)
class LaunchConfig:
    rows: int = 4          # rows per program
    num_warps: int = 4
    num_stages: int = 1
    tf32: bool = False     # tl.dot channel mixing in tf32 (opt-in; default ieee fp32 for e3nn parity)


@dataclass(frozen=True)
class UvwOptions:
    """Chunking of the per-row uvw generator (uvw_rows.py)."""
    ub: int = 16        # u (rows of a weight block) per chunk
    wb: int = 16        # w (contiguous) per chunk
    exact: bool = False  # split remainders into powers of two instead of padding them
    lazy_h: bool = False  # keep H_k un-reduced over the chunks of w (one reduction per u chunk)


@dataclass(frozen=True)
class KernelChoice:
    """How one kernel is generated. ``row_operands``: operands with a row dimension (the others are
    shared across rows). ``in1_major``: visit paths by first-input segment (else by output segment).
    ``lazy_budget``: most padded elements per row of un-reduced channel sums (None: no limit).
    ``in1_outer``: share gx/dx inner sums with the weight gradient. ``partial``: per-thread partial
    channel sums. ``prefetch``: loads issued this many loads early (0: none). ``l2``: half-precision
    row operands asked into L2 this many loads ahead (0: at the top of the row, None: not).
    ``merge``: paths that differ only in one factor and the per-row weight evaluated once, over
    their weighted sum (terms.py). ``cap_fp32``: float32 builds get the register cap too (launch.register_cap). ``part_paths``:
    forward paths per kernel before the product is split into parts. ``split``/``dot``: the
    emitter's per-path split of wide blocks and tl.dot channel mixing. ``generator``: EMIT or
    UVW_ROWS (then ``uvw`` holds its chunking)."""
    row_operands: FrozenSet[str] = frozenset()
    in1_major: bool = False
    lazy_budget: Optional[int] = None
    in1_outer: bool = False
    merge: bool = False
    partial: bool = False
    prefetch: int = 0
    l2: Optional[int] = None
    cap_fp32: bool = False
    part_paths: int = 1 << 30
    split: bool = True
    dot: bool = True
    generator: str = EMIT
    uvw: Optional[UvwOptions] = None


@dataclass(frozen=True)
class Member:
    """One generated kernel of a step (a step split by paths has several): name, the comment line
    its source starts with, and the generated body."""
    name: str
    describe: str
    body: str = field(repr=False)
    inputs: Tuple[str, ...] = ()      # pointer arguments read, in order
    outputs: Tuple[str, ...] = ()     # pointer arguments written, in order
    zero_init: Tuple[str, ...] = ()   # outputs it does not fully cover
    reduce_rows: Tuple[str, ...] = ()  # outputs written as per-program partials
    min_rows: int = 1
    acc_outputs: FrozenSet[str] = frozenset()  # outputs it adds into


@dataclass(frozen=True)
class KernelStep:
    """One kernel (or one kernel split into ``members`` launched in sequence) of a direction.
    ``part``: the need bits it computes. ``launch``: its launch shape (rows already at least
    ``min_rows``). ``zero_filled``: outputs zero-filled before the launch (written partly or added
    into by several members). ``row_partials``: outputs written as per-program partials and summed
    after the launch. ``acc_outputs``: outputs added into more than once (kept in float32 for
    half-precision results)."""
    key: tuple              # (direction, part, have): the launcher's kernel cache key
    name: str
    part: int
    choice: KernelChoice
    launch: LaunchConfig
    inputs: Tuple[str, ...]
    outputs: Tuple[str, ...]
    zero_filled: Tuple[str, ...]
    row_partials: Tuple[str, ...]
    acc_outputs: FrozenSet[str]
    min_rows: int
    members: Tuple[Member, ...] = field(repr=False, compare=False)


@dataclass(frozen=True)
class DirectionPlan:
    """The kernels one direction launches, in order. ``launch``: the direction's launch shape the
    steps derive theirs from (the heuristic default, or a tuned / given one); ``need`` bits over
    (x, y, w) for bwd and (x, y, w, g) for dbwd, ``have`` the cotangents present; ``math``: the
    kernels' math dtype. ``default``: whether ``launch`` is the heuristic default."""
    direction: str
    need: int
    have: str
    math: torch.dtype
    launch: LaunchConfig
    default: bool
    steps: Tuple[KernelStep, ...]
    # (name, value) of the problem classes and switches the steps were decided from (printed by equikernels.plan)
    notes: Tuple[Tuple[str, object], ...] = ()


# --- the fused graph convolution (codegen/conv_planner.py, codegen/conv.py) ------------------------
@dataclass(frozen=True)
class ConvKernelStep:
    """One kernel of a convolution direction. ``names``: what it computes (x, y, w, g gradients, or
    out). ``mode``: "nodes" (each program owns a node of ``owner``'s side and walks its edges) or
    "edges" (rows are edges, node outputs added with atomics). ``sections``: the node kernel's edge
    loops (emit.Rowing). ``hoist``: the owned node's rows held across the edge loop. ``prefetch``:
    edge-loop pipelining ('', 'idx', 'all'). ``scatter``: outputs added with atomics. ``maxnreg``:
    register cap (0: none). ``launch``: rows already at least ``min_rows``. ``outputs``: pointer
    arguments written, in allocation order. ``zero_filled``: outputs zero-filled before the launch.
    ``acc_outputs``: outputs added into (float32 buffers for half-precision results, rounded once).
    ``row_partials``: outputs written as per-program partials (``programs_per_sm`` programs per
    multiprocessor at most) and summed after the launch. ``per_edge``: the source-side gradient
    (gx / dx) written per edge as ``per_edge + "e"`` and summed per source node in sorted order.
    ``channels``: the channel slice a channel part computes (parts run one after the other; the later
    ones write into the buffers of the first, ``continues``, and add into outputs without channels)."""
    key: tuple               # the launcher's kernel cache key
    name: str
    describe: str            # the comment line the kernel's source starts with
    names: Tuple[str, ...]
    mode: str
    owner: Optional[str]
    sections: str
    hoist: bool
    prefetch: str
    scatter: Tuple[str, ...]
    choice: KernelChoice
    launch: LaunchConfig
    maxnreg: int
    inputs: Tuple[str, ...]
    outputs: Tuple[str, ...]
    index_args: Tuple[str, ...]  # graph index arguments after the outputs (emit.Rowing.args)
    zero_filled: Tuple[str, ...]
    acc_outputs: FrozenSet[str]
    row_partials: Tuple[str, ...]
    programs_per_sm: int
    per_edge: Optional[str]
    min_rows: int
    body: str = field(repr=False, compare=False)
    channels: Tuple[int, int] = (0, 0)  # channel slice [lo, hi) of a channel part; (0, 0): every channel
    continues: Tuple[str, ...] = ()     # outputs an earlier step (channel part) allocated; written into
    stages: int = 0                     # edge-loop stages of Triton's pipeliner (emit.Rowing.stages)


@dataclass(frozen=True)
class ConvPlan:
    """The kernels one convolution direction launches, in order, for one dataflow ("atomic" or
    "deterministic"); ``need``/``have``/``math`` as ``DirectionPlan``. ``launch``: the given launch
    shape, or None for the heuristic default of each kernel's mode. ``arrangement``: "nodes"
    (node-parallel kernels; atomic: gx / dx added into their rows) or "edges" (edge-parallel,
    every node output added with atomics)."""
    flow: str
    direction: str
    need: int
    have: str
    math: torch.dtype
    launch: Optional[LaunchConfig]
    arrangement: str
    steps: Tuple[ConvKernelStep, ...]
    notes: Tuple[Tuple[str, object], ...] = ()
