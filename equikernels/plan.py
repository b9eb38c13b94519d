"""What the generated kernels of one batched tensor product do, as data: ``KernelPlan``.

``plan_for(problem, direction, dtype)`` asks the generator's own decision functions
(``codegen.tp.default_config``, ``weights_dominate`` and the other problem classes, the
``TPKernels`` methods behind every launch, ``codegen.launch.cap_dtypes``) and the kernels they
build, so the plan is a read-out of what a launch on a CUDA device would do with the settings in
force; it decides nothing itself. It shows the heuristic launch shapes: with autotuning on, a
tuned shape from the tuning cache replaces rows / warps at launch time. Needs Triton (not a GPU).

    python -m equikernels.plan mace-large --direction dbwd --dtype float32
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Dict, List, Optional, Tuple

import torch

from . import settings
from .catalog import problem as standard_problem
from .catalog import standard_problems
from .ir import grad_table, tp_table
from .problem import TPProblem

DIRECTIONS = ("fwd", "bwd", "dbwd")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
LAYOUTS = ("mul_ir", "ir_mul")
_NAMES = "xywg"  # need bits 1, 2, 4, 8


@dataclasses.dataclass(frozen=True)
class KernelLaunch:
    """One kernel the direction launches, in order."""
    name: str
    generator: str             # "emit" (path tables) or "uvw_rows" (per-row uvw weights)
    computes: Tuple[str, ...]  # outputs written
    reads: Tuple[str, ...]     # operands read
    parts: int                 # kernels it is split into (at most max_paths forward paths each)
    rows: int                  # rows per program (at least the kernel's min_rows)
    warps: int
    zero_filled: Tuple[str, ...]   # outputs the launcher zero-fills (written partly or added into)
    row_partials: Tuple[str, ...]  # outputs written as per-program partials, summed after the launch
    float32_accumulators: bool     # outputs added into more than once are float32 for half results
    register_cap: bool             # capped at compile time when the build sits just above an occupancy step
    source: str                    # path of the generated source


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """Every decision the generator and launcher take for one (problem, direction, dtype, layout)."""
    problem: str
    direction: str
    dtype: str
    math_dtype: str
    layout: str
    need: str       # gradients asked for (bwd: of x, y, w; dbwd: of x, y, w, g)
    have: str       # cotangents present (dbwd: a, b, c of x, y, w)
    classes: Dict[str, bool]  # the problem classes the heuristics test
    visit: str                # path order: by output segment or by first-input segment
    lazy_sum_budget: Optional[int]  # padded elements per row of deferred channel sums (None: always defer)
    partial_sums: bool
    prefetch: int             # loads issued this many loads early (0: none)
    l2_prefetch: Optional[int]  # half-precision operands asked into L2 this many loads ahead (0: all at once)
    in1_outer: bool           # gx/dx inner sums shared with the weight gradient
    max_paths: int
    dbwd_one_kernel: Optional[bool]
    dbwd_part_paths: Optional[int]
    autotune: bool            # on: rows / warps come from the tuning cache at launch time
    kernels: Tuple[KernelLaunch, ...]

    def text(self) -> str:
        lines = [f"{self.direction} of {self.problem}",
                 f"  dtype {self.dtype} (math {self.math_dtype}), layout {self.layout}"
                 + (f", need {self.need}" if self.need else "") + (f", have {self.have}" if self.have else ""),
                 "  classes: " + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in self.classes.items()),
                 f"  visit by {self.visit}; lazy sums budget {self.lazy_sum_budget}; partial sums "
                 f"{'on' if self.partial_sums else 'off'}; in1-outer {'on' if self.in1_outer else 'off'}",
                 f"  prefetch {self.prefetch}; L2 prefetch {'off' if self.l2_prefetch is None else self.l2_prefetch}; "
                 f"max paths per kernel {self.max_paths}"]
        if self.direction == "dbwd":
            lines.append(f"  double backward: one kernel {self.dbwd_one_kernel}, paths per part {self.dbwd_part_paths}")
        lines.append(f"  autotune {'on: rows / warps below are the defaults it starts from' if self.autotune else 'off'}")
        lines.append(f"  {len(self.kernels)} kernel(s):")
        for i, k in enumerate(self.kernels, 1):
            lines.append(f"  {i}. {k.name} [{k.generator}{f', {k.parts} parts' if k.parts > 1 else ''}]")
            lines.append(f"     computes {', '.join(k.computes)} from {', '.join(k.reads)}; "
                         f"{k.rows} rows x {k.warps} warps per program")
            extra = []
            if k.zero_filled:
                extra.append("zero-filled " + ", ".join(k.zero_filled))
            if k.row_partials:
                extra.append("row partials " + ", ".join(k.row_partials))
            if k.float32_accumulators:
                extra.append("float32 accumulation")
            extra.append("register cap considered" if k.register_cap else "no register cap")
            lines.append("     " + "; ".join(extra))
            lines.append(f"     source {k.source}")
        return "\n".join(lines)


class _Tables:
    """The static part of ``ops.tp.Plan`` that the generator reads (problem, layout, tables)."""

    def __init__(self, problem: TPProblem, layout: str):
        self.problem, self.layout = problem, layout
        self.table = tp_table(problem)
        self.grad_tables = {n: grad_table(self.table, n) for n in ("x", "y", "w")}


def _bits(names: str) -> int:
    return sum(1 << _NAMES.index(n) for n in names)


def plan_for(problem: TPProblem, direction: str = "fwd", dtype: torch.dtype = torch.float32,
             layout: str = "mul_ir", need: Optional[str] = None, have: Optional[str] = None) -> KernelPlan:
    """The plan of ``direction`` (fwd / bwd / dbwd) for operands of ``dtype`` on a CUDA device.
    ``need``: gradients asked for (default every one: "xyw", dbwd "xywg"; without weights no "w");
    ``have``: the cotangents of the double backward (default "abc", without weights "ab")."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: expected one of {DIRECTIONS}, got {direction!r}")
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype: expected one of {tuple(DTYPES)}, got {dtype}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    weighted = problem.weight_numel > 0
    if direction == "fwd":
        need, have = "", ""
    else:
        need = need if need is not None else ("xyw" if weighted else "xy") + ("g" if direction == "dbwd" else "")
        have = "" if direction == "bwd" else have if have is not None else ("abc" if weighted else "ab")
        allowed = "xyw" if direction == "bwd" else "xywg"
        if not need or any(n not in allowed for n in need):
            raise ValueError(f"need: expected letters of {allowed!r}, got {need!r}")
        if any(h not in "abc" for h in have):
            raise ValueError(f"have: expected letters of 'abc', got {have!r}")
    with settings.override(triton_interpret=False):  # the plan of a CUDA launch, wherever it is printed
        return _read_out(problem, direction, dtype, layout, need, have)


def _read_out(problem: TPProblem, direction: str, dtype: torch.dtype, layout: str, need: str, have: str) -> KernelPlan:
    from .codegen import tp as ct  # Triton is imported with the generator
    from .codegen.launch import cap_dtypes
    from .dtypes import acc_dtype, math_dtype_of

    ks = ct.TPKernels(_Tables(problem, layout))
    math = math_dtype_of([torch.empty(0, dtype=dtype)])
    cfg = ks._cfg(direction, math)
    bits = _bits(need)
    if direction == "fwd":
        parts = (0,)
    elif direction == "bwd":
        parts = ks.bwd_parts(bits, cfg)
    else:
        parts = ks.dbwd_parts(bits)
    kernels: List[KernelLaunch] = []
    for part in parts:
        if direction != "fwd" and not part:
            continue
        k = ks.kernel(direction, part, have)
        if k is None:
            continue
        pcfg = ks._uvw_cfg(direction, part, bits, cfg, math) if direction != "fwd" and ks._uvw_rows() else cfg
        rows = max(pcfg.rows, k.meta.min_rows)
        members = getattr(k, "parts", [k])
        kernels.append(KernelLaunch(
            name=k.meta.name, generator="uvw_rows" if direction != "fwd" and ks._uvw_rows() else "emit",
            computes=k.meta.outputs, reads=k.meta.inputs, parts=len(members), rows=rows, warps=pcfg.num_warps,
            zero_filled=k.meta.zero_init, row_partials=k.meta.reduce_rows,
            float32_accumulators=bool(k.acc_outputs) and acc_dtype(dtype) != dtype,
            register_cap=dtype in cap_dtypes(members[0].launcher.cap_fp32), source=members[0].source_path))
    s = settings.get()
    return KernelPlan(
        problem=problem.describe(), direction=direction, dtype=str(dtype).replace("torch.", ""),
        math_dtype=str(math).replace("torch.", ""), layout=layout, need=need, have=have,
        classes={"weights_dominate": ct.weights_dominate(problem), "channelwise_rows": ct.channelwise_rows(problem),
                 "narrow_channelwise": ct.narrow_channelwise(problem),
                 "wide_channelwise": ct.wide_channelwise(problem), "per_row_uvw": ks._uvw_rows()},
        visit="first-input segment" if ks._in1_major() else "output segment",
        lazy_sum_budget=ks._lazy_budget(direction), partial_sums=ks._partial_sums(direction),
        prefetch=ks._prefetch(direction), l2_prefetch=ks._l2(direction), in1_outer=ks._in1_outer(direction),
        max_paths=ct.max_paths(),
        dbwd_one_kernel=ks._dbwd_one() if direction == "dbwd" else None,
        dbwd_part_paths=ks._dbwd_part_paths() if direction == "dbwd" else None,
        autotune=s.autotune, kernels=tuple(kernels))


def main(argv: Optional[List[str]] = None) -> int:
    names = list(standard_problems())
    ap = argparse.ArgumentParser(prog="python -m equikernels.plan", description=__doc__.split("\n")[0])
    ap.add_argument("problem", help=f"a standard problem: {', '.join(names)}")
    ap.add_argument("--direction", default="fwd", choices=DIRECTIONS)
    ap.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    ap.add_argument("--layout", default="mul_ir", choices=LAYOUTS)
    ap.add_argument("--need", default=None, help="gradients asked for (letters of xyw, dbwd xywg; default all)")
    ap.add_argument("--have", default=None, help="double backward cotangents present (letters of abc; default all)")
    args = ap.parse_args(argv)
    if args.problem not in names:
        ap.error(f"problem: expected one of {', '.join(names)}, got {args.problem!r}")
    try:
        plan = plan_for(standard_problem(args.problem), args.direction, DTYPES[args.dtype], args.layout,
                        args.need, args.have)
    except ValueError as exc:
        ap.error(str(exc))
    print(f"{args.problem}: " + plan.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
