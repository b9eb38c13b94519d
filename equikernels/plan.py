"""Print the planner's plan of one batched tensor product or fused convolution direction (no GPU needed).

``plan_for(problem, direction, dtype)`` returns the ``codegen.plan_types.DirectionPlan`` that the
launcher (``codegen.tp.TPKernels``) runs on a CUDA device with the settings in force: the
kernels in launch order, each with its generator choices, launch shape and buffer handling.
With autotuning on, a tuned launch shape from the tuning cache replaces the default at launch time
(a variant of the same plan). ``text(plan, dtype)`` formats it. ``conv_plan_for`` /
``conv_text`` do the same for the fused graph convolution's ``codegen.plan_types.ConvPlan`` (run by
``codegen.conv.ConvKernels``) of one dataflow.

    equikernels plan mace-large --direction dbwd --dtype float32
    python -m equikernels.plan mace-large --direction dbwd --dtype float32
    python -m equikernels.plan mace-large --conv --dataflow deterministic --direction bwd
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

import torch

from . import settings
from .catalog import problem as standard_problem
from .catalog import standard_problems
from .codegen.conv_planner import FLOWS, IR_MUL_MIN_EDGES, ConvPlanner, kernel_layout
from .codegen.launch import cap_dtypes
from .codegen.plan_types import UVW_ROWS, ConvPlan, DirectionPlan, need_bits, need_letters
from .codegen.planner import Planner
from .dtypes import acc_dtype, math_dtype_of
from .ir import grad_table, tp_table
from .problem import TPProblem

DIRECTIONS = ("fwd", "bwd", "dbwd")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
LAYOUTS = ("mul_ir", "ir_mul")


def _onoff(v) -> str:
    return "on" if v else "off"


def text(plan: DirectionPlan, dtype: torch.dtype, problem: str = "") -> str:
    """The plan as lines of text; ``dtype``: the operands' (float32 accumulation of half results)."""
    cfg = plan.launch
    lines = [f"{plan.direction} of {problem}" if problem else plan.direction,
             f"  dtype {str(dtype).replace('torch.', '')} (math {str(plan.math).replace('torch.', '')})"
             + (f", need {need_letters(plan.need)}" if plan.need else "") + (f", have {plan.have}" if plan.have else ""),
             "  " + ", ".join(f"{k}={v}" for k, v in plan.notes),
             f"  launch shape {cfg.rows} rows x {cfg.num_warps} warps, {cfg.num_stages} stage(s), tf32 "
             f"{_onoff(cfg.tf32)} ({'heuristic default' if plan.default else 'given'}); autotune "
             f"{'on: a tuned shape replaces it at launch time' if settings.get().autotune else 'off'}",
             f"  {len(plan.steps)} kernel(s):"]
    for i, st in enumerate(plan.steps, 1):
        c, lc = st.choice, st.launch
        parts = len(st.members)
        lines.append(f"  {i}. {st.name} [{c.generator}{f', {parts} parts' if parts > 1 else ''}]")
        lines.append(f"     computes {', '.join(st.outputs)} from {', '.join(st.inputs)}; "
                     f"{lc.rows} rows x {lc.num_warps} warps per program")
        if c.generator == UVW_ROWS:
            lines.append(f"     uvw chunks {c.uvw}")
        else:
            lines.append(f"     visit by {'first-input' if c.in1_major else 'output'} segment; lazy sums budget "
                         f"{c.lazy_budget}; partial sums {_onoff(c.partial)}; in1-outer {_onoff(c.in1_outer)}; "
                         f"prefetch {c.prefetch}; L2 prefetch {'off' if c.l2 is None else c.l2}; "
                         f"paths per kernel {c.part_paths}")
        extra = []
        if st.zero_filled:
            extra.append("zero-filled " + ", ".join(st.zero_filled))
        if st.row_partials:
            extra.append("row partials " + ", ".join(st.row_partials))
        if st.acc_outputs and acc_dtype(dtype) != dtype:
            extra.append("float32 accumulation " + ", ".join(sorted(st.acc_outputs)))
        extra.append("register cap considered" if dtype in cap_dtypes(c.cap_fp32) else "no register cap")
        lines.append("     " + "; ".join(extra))
    return "\n".join(lines)


class _Tables:
    """The static part of ``ops.tp.Plan`` that the generator reads (problem, layout, tables)."""

    def __init__(self, problem: TPProblem, layout: str):
        self.problem, self.layout = problem, layout
        self.table = tp_table(problem)
        self.grad_tables = {n: grad_table(self.table, n) for n in ("x", "y", "w")}


def check_direction_options(direction: str, need: Optional[str], have: Optional[str]) -> None:
    """``ValueError`` for ``need`` given with the forward or ``have`` outside the double backward
    (options of another direction would be dropped without a word)."""
    if need is not None and direction == "fwd":
        raise ValueError(f"need {need!r}: gradients are chosen for direction bwd or dbwd, not fwd")
    if have is not None and direction != "dbwd":
        raise ValueError(f"have {have!r}: cotangents are chosen for direction dbwd, not {direction}")


def _need_have(problem: TPProblem, direction: str, dtype: torch.dtype, layout: str, need: Optional[str],
               have: Optional[str]) -> tuple:
    """(need, have) with their defaults, after checking every option."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: expected one of {DIRECTIONS}, got {direction!r}")
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype: expected one of {tuple(DTYPES)}, got {dtype}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    check_direction_options(direction, need, have)
    weighted = problem.weight_numel > 0
    if direction == "fwd":
        return "", ""
    need = need if need is not None else ("xyw" if weighted else "xy") + ("g" if direction == "dbwd" else "")
    have = "" if direction == "bwd" else have if have is not None else ("abc" if weighted else "ab")
    allowed = "xyw" if direction == "bwd" else "xywg"
    if not need or any(n not in allowed for n in need) or len(set(need)) < len(need):
        raise ValueError(f"need: expected letters of {allowed!r} (the gradients asked for: at least one, each once), "
                         f"got {need!r}")
    # no cotangent at all launches no kernel: the double backward returns zeros
    if direction == "dbwd" and (not have or any(h not in "abc" for h in have) or len(set(have)) < len(have)):
        raise ValueError(f"have: expected letters of 'abc' (the cotangents present: at least one, each once), "
                         f"got {have!r}")
    return need, "".join(k for k in "abc" if k in have)  # the launcher names cotangents in this order


def plan_for(problem: TPProblem, direction: str = "fwd", dtype: torch.dtype = torch.float32,
             layout: str = "mul_ir", need: Optional[str] = None, have: Optional[str] = None) -> DirectionPlan:
    """The plan of ``direction`` (fwd / bwd / dbwd) for operands of ``dtype`` on a CUDA device.
    ``need``: gradients asked for (default every one: "xyw", dbwd "xywg"; without weights no "w");
    ``have``: the cotangents of the double backward, one or more of "abc" in any order, each once
    (default "abc", without weights "ab")."""
    need, have = _need_have(problem, direction, dtype, layout, need, have)
    math = math_dtype_of([torch.empty(0, dtype=dtype)])
    with settings.override(triton_interpret=False):  # the plan of a CUDA launch, wherever it is printed
        return Planner(_Tables(problem, layout)).plan(direction, need_bits(need), have, math)


def conv_plan_for(problem: TPProblem, dataflow: str = "atomic", direction: str = "fwd",
                  dtype: torch.dtype = torch.float32, layout: str = "mul_ir", need: Optional[str] = None,
                  have: Optional[str] = None) -> ConvPlan:
    """The fused convolution's plan of ``direction`` for ``dataflow`` ("atomic" or "deterministic")
    and operands of ``dtype`` on a CUDA device; ``need`` / ``have`` as ``plan_for``. Raises
    ``codegen.emit.Unsupported`` where the generator cannot express a kernel (the convolution then
    runs the PyTorch reference)."""
    if dataflow not in FLOWS:
        raise ValueError(f"dataflow: expected one of {FLOWS}, got {dataflow!r}")
    need, have = _need_have(problem, direction, dtype, layout, need, have)
    math = math_dtype_of([torch.empty(0, dtype=dtype)])
    with settings.override(triton_interpret=False):
        run = kernel_layout(problem, layout)  # mul_ir channel-wise: ir_mul kernels on permuted node rows
        return ConvPlanner(_Tables(problem, run)).plan(dataflow, direction, need_bits(need), have, math)


def conv_text(plan: ConvPlan, dtype: torch.dtype, problem: str = "") -> str:
    """The convolution plan as lines of text; ``dtype``: the operands'."""
    arr = ("node-parallel, source-side gradients added atomically" if plan.flow == "atomic" else
           "node-parallel, source-side gradients summed per node in edge order") if plan.arrangement == "nodes" \
        else "edge-parallel, node outputs added atomically"
    lines = [f"convolution {plan.direction}" + (f" of {problem}" if problem else "") + f", {plan.flow} dataflow",
             f"  dtype {str(dtype).replace('torch.', '')} (math {str(plan.math).replace('torch.', '')})"
             + (f", need {need_letters(plan.need)}" if plan.need else "") + (f", have {plan.have}" if plan.have else ""),
             "  " + ", ".join(f"{k}={v}" for k, v in plan.notes + (("arrangement", plan.arrangement),)) + f" ({arr})",
             "  launch shape " + ("per kernel: the heuristic default of its mode" if plan.launch is None
                                  else f"given: {plan.launch.rows} rows x {plan.launch.num_warps} warps"),
             f"  {len(plan.steps)} kernel(s):"]
    for i, st in enumerate(plan.steps, 1):
        lc, c = st.launch, st.choice
        where = f"owns {st.owner} nodes, edge loops {st.sections}" if st.mode == "nodes" else "rows are edges"
        lines.append(f"  {i}. {st.name} [{st.mode}: {where}]")
        lines.append(f"     computes {', '.join(st.outputs)} from {', '.join(st.inputs)}; {lc.rows} edge(s) x "
                     f"{lc.num_warps} warps per program step, {lc.num_stages} stage(s), tf32 {_onoff(lc.tf32)}; "
                     f"register cap {st.maxnreg or 'none'}")
        lines.append(f"     visit by {'first-input' if c.in1_major else 'output'} segment; in1-outer "
                     f"{_onoff(c.in1_outer)}; hoist {_onoff(st.hoist)}; prefetch {st.prefetch or 'off'}; "
                     f"edge loop staged {st.stages or 'off'}; atomics {', '.join(st.scatter) or 'none'}")
        extra = []
        if st.channels != (0, 0):
            extra.append(f"channels {st.channels[0]}:{st.channels[1]}"
                         + (f", into the buffers of the part before ({', '.join(st.continues)})" if st.continues else ""))
        if st.zero_filled:
            extra.append("zero-filled " + ", ".join(st.zero_filled))
        if st.row_partials:
            extra.append(f"row partials {', '.join(st.row_partials)} (at most {st.programs_per_sm} programs "
                         "per multiprocessor)")
        if st.per_edge:
            extra.append(f"{st.per_edge} written per edge, summed per source node")
        acc = [n for n in sorted(st.acc_outputs) if acc_dtype(dtype) != dtype]
        if acc:
            extra.append("float32 accumulation " + ", ".join(acc))
        if extra:
            lines.append("     " + "; ".join(extra))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The plan's options, shared by ``python -m equikernels.plan`` and ``equikernels plan``."""
    names = ", ".join(standard_problems())
    parser.add_argument("problem", nargs="?", default=None, help=f"a standard problem: {names}")
    parser.add_argument("--direction", default="fwd", choices=DIRECTIONS, help="fwd, bwd or dbwd (default fwd)")
    parser.add_argument("--dtype", default=None, choices=tuple(DTYPES),
                        help="math dtype (default float32; with --model, the model's)")
    parser.add_argument("--layout", default=None, choices=LAYOUTS, help="operand layout (default mul_ir)")
    parser.add_argument("--need", default=None, help="gradients asked for (letters of xyw, dbwd xywg; default all)")
    parser.add_argument("--have", default=None, help="double backward cotangents present (letters of abc; default all)")
    parser.add_argument("--conv", action="store_true",
                        help="the fused graph convolution's plan instead of the batched product's")
    parser.add_argument("--dataflow", default=None, choices=FLOWS,
                        help="the convolution's dataflow (implies --conv; default atomic)")


def plan_text(problem: TPProblem, args: argparse.Namespace, layout: Optional[str] = None,
              dataflow: Optional[str] = None) -> str:
    """``text`` of ``problem``'s plan with the options in ``args``; ``layout`` overrides a missing
    --layout; the convolution's plan (``conv_text``) with --conv, --dataflow or ``dataflow`` (used
    where --dataflow is not given)."""
    layout = args.layout or layout or "mul_ir"
    if args.dtype is None:
        args = argparse.Namespace(**dict(vars(args), dtype="float32"))
    what = f"{problem.describe()} [{layout}]"
    flow = getattr(args, "dataflow", None) or dataflow or ("atomic" if getattr(args, "conv", False) else None)
    if flow is not None:
        plan = conv_plan_for(problem, flow, args.direction, DTYPES[args.dtype], layout, args.need, args.have)
        run = kernel_layout(problem, layout)
        if run != layout:
            size = f" from {IR_MUL_MIN_EDGES:,} edges" if settings.get().conv_layout == "auto" else ""
            what += f", kernels in {run}{size} (x and out permuted)"
        return conv_text(plan, DTYPES[args.dtype], what)
    plan = plan_for(problem, args.direction, DTYPES[args.dtype], layout, args.need, args.have)
    return text(plan, DTYPES[args.dtype], what)


def run(args: argparse.Namespace) -> str:
    """The plan of the standard problem ``args.problem``; ``ValueError`` for an unknown name or option."""
    names = list(standard_problems())
    if args.problem not in names:
        raise ValueError(f"problem: expected one of {', '.join(names)}, got {args.problem!r}")
    return f"{args.problem}: " + plan_text(standard_problem(args.problem), args)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m equikernels.plan", description=__doc__.split("\n")[0])
    add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        out = run(args)
    except ValueError as exc:
        ap.error(str(exc))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
