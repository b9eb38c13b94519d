"""Pinned launch recipes: a direction plan resolved once into pre-bound Triton launchers.

A recipe is what ``TPKernels`` would do for one (plan, operand dtypes) with nothing left to decide
per call: a call allocates its outputs and launches. It exists for small products, whose eager
backward is host-bound. Stable interface (ops.tp's direct path and the C++ node of ops/native.py
read these attributes, nothing else):

``BwdRecipe``: ``launch`` (a launch.Pinned), ``rows``, ``args`` (pointer parameters as indexes into
(x, y, w, g, *gradients)), ``order`` (operand index, x 0 .. w 2, of each gradient computed, in order;
gradients are allocated like their operand, uninitialised).

``DbwdRecipe``: ``launches``, per kernel in launch order (launch.Pinned, rows, pointer parameters as
indexes into (x, y, w, g, a, b, c, *outputs), ((operand index x 0 .. g 3, zero-filled), ...) of the
outputs allocated before it); ``res``: per x, y, w, g the index of its result in that list, -1 zeros,
-2 an empty placeholder; ``written``: every result comes from a kernel.

A kernel launches with (pointers, N, NBLK) and constexprs (ROWS, DT, PREC), NBLK = ceil(N / ROWS).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import triton.language as tl

from ..dtypes import acc_dtype
from .launch import Pinned
from .plan_types import DirectionPlan, KernelStep, LaunchConfig

# math dtype -> the kernels' DT constexpr: half-precision operands are computed in float32
KERNEL_DT = {torch.float16: tl.float32, torch.bfloat16: tl.float32, torch.float32: tl.float32,
             torch.float64: tl.float64}


def constexprs(cfg: LaunchConfig, math: torch.dtype) -> tuple:
    """(ROWS, DT, PREC) of a launch: tf32 channel mixing only where asked and the math is float32."""
    dt = KERNEL_DT[math]
    return cfg.rows, dt, "tf32" if cfg.tf32 and dt == tl.float32 else "ieee"


class BwdRecipe:
    __slots__ = ("launch", "rows", "args", "order")

    def __init__(self, launch: Pinned, rows: int, args: tuple, order: tuple):
        self.launch, self.rows, self.args, self.order = launch, rows, args, order


class DbwdRecipe:
    __slots__ = ("launches", "res", "written")

    def __init__(self, launches: tuple, res: tuple):
        self.launches = launches
        self.res = res
        self.written = min(res) >= 0


def _plain(step: KernelStep) -> bool:
    """One kernel writing each element of its outputs once."""
    return len(step.members) == 1 and not (step.zero_filled or step.row_partials or step.acc_outputs)


def _pinned(launcher, step: KernelStep, math) -> Pinned:
    cfg = step.launch
    return Pinned(launcher, constexprs(cfg, math), cfg.num_warps, cfg.num_stages)


def bwd_recipe(plan: DirectionPlan, launchers: Callable[[KernelStep], Sequence]) -> Optional[BwdRecipe]:
    """The backward ``plan`` as one plain kernel, else None. ``launchers(step)``: the launch.FastLaunch
    of each of the step's members."""
    need = plan.need
    names = tuple("g" + n for bit, n in ((1, "x"), (2, "y"), (4, "w")) if need & bit)
    if len(plan.steps) != 1:
        return None
    step = plan.steps[0]
    if step.part != need or not _plain(step) or set(step.outputs) != set(names):
        return None
    slot = {n: i for i, n in enumerate(("x", "y", "w", "g") + names)}
    args = tuple(slot[a] for a in step.inputs + step.outputs)
    return BwdRecipe(_pinned(launchers(step)[0], step, plan.math), step.launch.rows, args,
                     tuple("xyw".index(nm[1]) for nm in names))


def dbwd_recipe(plan: DirectionPlan, dtypes: Sequence[torch.dtype],
                launchers: Callable[[KernelStep], Sequence]) -> Optional[DbwdRecipe]:
    """The double backward ``plan`` as plain kernels or kernels adding into zero-filled outputs (no
    row partials, no float32 accumulation buffer for a half-precision result), else None.
    ``dtypes``: of x, y, w, g (their gradients are allocated alike)."""
    have, need = plan.have, plan.need
    slot = {n: i for i, n in enumerate("xywgabc") if i < 4 or n in have}
    dt = dict(zip(("dx", "dy", "dw", "dg"), dtypes))
    written: dict = {}
    launches = []
    for step in plan.steps:
        mine = {"d" + n for bit, n in zip((1, 2, 4, 8), "xywg") if step.part & bit}
        if ((len(step.members) == 1 and not _plain(step)) or step.row_partials
                or not set(step.outputs) <= mine or any(o in written for o in step.outputs)
                or not set(step.inputs) <= set(slot)):
            return None
        if any(acc_dtype(dt[o]) != dt[o] for o in step.acc_outputs):
            return None
        new = tuple(o for o in ("dx", "dy", "dw", "dg") if o in step.outputs)  # the launcher's order
        for o in new:
            written[o] = 7 + len(written)
        allocs = tuple(("xywg".index(o[1]), o in step.zero_filled) for o in new)
        for m, fl in zip(step.members, launchers(step)):
            args = tuple(slot[i] for i in m.inputs) + tuple(written[o] for o in m.outputs)
            launches.append((_pinned(fl, step, plan.math), step.launch.rows, args, allocs))
            allocs = ()
    res = tuple(written.get("d" + n, -1) if need & bit else -2 for bit, n in zip((1, 2, 4, 8), "xywg"))
    return DbwdRecipe(tuple(launches), res)
