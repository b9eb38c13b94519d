"""The batched tensor product on CPU for products with a one-channel second input, grouped by
first-input segment.

For a product whose instructions are all weighted ``uvu`` paths with a single-channel second input
(MACE's and NequIP's convolutions), every path reading first-input segment s is
``out_p[z, k, u] = w_p[z, u] * sum_i x_s[z, i, u] * A_p[z, i, k]`` with
``A_p[z, i, k] = sum_j C_p[i, j, k] y[z, j]``. All paths of a segment therefore share one matrix
product ``y @ C_s`` (their CG blocks side by side), one batched product with the segment's rows and
one weight multiply; the outputs are the parts of that result, summed where several paths write one
output segment. Fully connected (uvw) paths multiply their part by the path's [mul_in, mul_out]
weight matrix instead. A few large operations per first-input segment instead of several per
instruction (benchmarks/results/cpu/cpu_speed.md). Autograd differentiates it to any order.
"""
from __future__ import annotations

import functools
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..problem import TPProblem
from .chain import functorch_wrapped
from .cpu_assemble import assemble
from .cpu_tp import Instruction

DTYPES = (torch.float32, torch.float64)
# outputs assembled in place (ops.cpu_assemble) from this many channels, either layout: fwd+bwd,
# 500 rows, in one process: ir_mul 64 and 128 channels faster (nequip-revmd17-benzene float64
# 137 -> 84 ms, mace-large 51 -> 33 ms), 32 slower (nequip-lips float32 7.2 -> 8.1 ms), than split
# and concatenation; mul_ir (medians of 31 paired repetitions, 1 and 2 threads, both dtypes)
# mace-medium and mace-mp-medium-L2 1.08-1.32x faster, mace-large and nequip-revmd17-benzene 6-36 %
ASSEMBLE_MIN_MUL = 64


def eligible(problem: TPProblem) -> bool:
    """Every instruction a weighted path with a one-channel second input, nothing empty: channel-wise
    (uvu), or fully connected (uvw) with shared weights (one [mul_in, mul_out] matrix for all rows; per
    row, the dense contractions of ops.cpu_tp batch better: DiffDock-L2 fwd+bwd, 500 rows, float64,
    1 thread, 124 ms here against 46 there)."""
    ins = problem.instructions
    return bool(ins) and all(
        (i.mode == "uvu" or (i.mode == "uvw" and problem.shared_weights)) and i.has_weight
        and problem.irreps_in2[i.i_in2][0] == 1
        and problem.irreps_in1[i.i_in1][0] > 0 and problem.irreps_out[i.i_out][0] > 0 and c != 0.0
        for i, c in zip(ins, problem.path_coefficients))


def applicable(problem: TPProblem, x: Tensor, y: Tensor, w: Tensor, math_dtype: Optional[torch.dtype],
               out_dtype: Optional[torch.dtype]) -> bool:
    """Whether this call runs here: CPU rows x features, one dtype (float32 or float64) for every
    operand, math and output, an eligible problem."""
    dt = x.dtype
    return (x.device.type == "cpu" and dt in DTYPES and x.dim() == 2 and x.shape[0] > 0 and y.dtype == dt
            and w.dtype == dt and math_dtype in (None, dt) and out_dtype in (None, dt) and _eligible(problem))


@functools.lru_cache(maxsize=None)
def _eligible(problem: TPProblem) -> bool:
    return eligible(problem)


class _Group:
    """The paths of one first-input segment: its geometry, stacked CG blocks and index tensors."""

    def __init__(self, seg: Tuple[int, int, int], instrs: List[Instruction], dim_in2: int):
        self.offset, self.mul, self.d1 = seg
        dos = [it.segs["out"][2] for it in instrs]
        self.dos, self.k = dos, sum(dos)
        # [dim_in2, K * d1]: y @ C gives A transposed, [z, K, d1]
        c = torch.zeros(dim_in2, self.k, self.d1, dtype=torch.float64)
        k0 = 0
        for it, do in zip(instrs, dos):
            yo, _, dj = it.segs["y"]
            c[yo:yo + dj, k0:k0 + do, :] = it.consts["C"].permute(1, 2, 0)  # C[i, j, k] -> [j, k, i]
            k0 += do
        self.c64 = c.reshape(dim_in2, self.k * self.d1)
        self.path_of_k = torch.cat([torch.full((do,), n, dtype=torch.long) for n, do in enumerate(dos)])
        self.w_offs = offs = [it.w_off for it in instrs]
        self.w_first = offs[0] if all(b == a + self.mul for a, b in zip(offs, offs[1:])) else None
        self.w_cols = torch.cat([torch.arange(o, o + self.mul) for o in offs])
        self.out_segs = [it.segs["out"] for it in instrs]
        # fully connected paths: (weight offset, output channels) per path, None for channel-wise ones
        self.full = [(it.w_off, it.segs["out"][1]) if it.mode == "uvw" else None for it in instrs]
        self.channelwise = all(f is None for f in self.full)


class GroupedPlan:
    """The groups of one (problem, layout) with constants per dtype."""

    def __init__(self, problem: TPProblem, layout: str):
        if not eligible(problem):
            raise ValueError(f"{problem.describe()}: not a weighted channel-wise product with a one-channel "
                             "second input")
        self.layout, self.shared = layout, problem.shared_weights
        instrs, off = [], 0
        for ins, coef in zip(problem.instructions, problem.path_coefficients):
            it = Instruction(problem, ins, coef, off)
            off += it.w_numel
            instrs.append(it)
        by_seg: Dict[tuple, List[Instruction]] = {}
        for it in instrs:
            by_seg.setdefault(it.segs["x"], []).append(it)
        dim_in2 = sum(m * (2 * l + 1) for m, l, _ in problem.irreps_in2)
        self.groups = [_Group(seg, its, dim_in2) for seg, its in by_seg.items()]
        self.min_mul = min(g.mul for g in self.groups)
        self.out_segs, o = [], 0
        for m, l, _ in problem.irreps_out:
            self.out_segs.append((o, m, 2 * l + 1))
            o += m * (2 * l + 1)
        self.dim_out = o
        self.segments = self._sources()
        self._consts: Dict[torch.dtype, List[Tensor]] = {}

    def consts(self, dtype: torch.dtype) -> List[Tensor]:
        c = self._consts.get(dtype)
        if c is None:
            with torch.inference_mode(False):  # kept for later calls, which autograd may record
                c = self._consts[dtype] = [g.c64.to(dtype) for g in self.groups]
        return c

    def _sources(self) -> tuple:
        """The output segments with their sources (``ops.cpu_assemble``): a channel-wise segment's paths
        read one result [rows, K, mul] and its weights; each path of a segment with fully connected
        paths is a result of its own, weighted already."""
        by_out: Dict[tuple, list] = {}
        r = wi = 0
        for g in self.groups:
            if g.channelwise:
                k0 = 0
                for n, (do, seg) in enumerate(zip(g.dos, g.out_segs)):
                    by_out.setdefault(seg, []).append((r, k0, do, wi, n))
                    k0 += do
                r, wi = r + 1, wi + 1
            else:
                for do, seg in zip(g.dos, g.out_segs):
                    by_out.setdefault(seg, []).append((r, 0, do, -1, 0))
                    r += 1
        return tuple((o, m, d, tuple(by_out.get((o, m, d), ()))) for o, m, d in self.out_segs)

    def __call__(self, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        if self.min_mul >= ASSEMBLE_MIN_MUL and not torch.compiler.is_compiling() and not functorch_wrapped(x):
            return self._assembled(x, y, w)
        return self._concatenated(x, y, w)

    def _weight_rows(self, g: _Group, w: Tensor, z: int) -> Tensor:
        """[z or 1, paths, mul]: the channel weights of a channel-wise segment's paths."""
        paths = len(g.dos)
        if self.shared:
            return (w.narrow(0, g.w_first, paths * g.mul) if g.w_first is not None
                    else w.index_select(0, g.w_cols)).view(1, paths, g.mul)
        return (w.narrow(1, g.w_first, paths * g.mul) if g.w_first is not None
                else w.index_select(1, g.w_cols)).view(z, paths, g.mul)

    def _assembled(self, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """Each segment's path results [z, K, mul] and weights go to ``cpu_assemble``."""
        z = x.shape[0]
        results: List[Tensor] = []
        weights: List[Tensor] = []
        for g, c in zip(self.groups, self.consts(x.dtype)):
            xs = x.narrow(1, g.offset, g.mul * g.d1)
            xt = xs.view(z, g.d1, g.mul) if self.layout == "ir_mul" else xs.view(z, g.mul, g.d1).transpose(1, 2)
            at = (y @ c).view(z, g.k, g.d1)
            b = at * xt if g.d1 == 1 else torch.bmm(at, xt)  # [z, K, mul]
            if g.channelwise:
                results.append(b)
                weights.append(self._weight_rows(g, w, z))
            else:
                results.extend(self._mixed(g, b, w, z))
        return assemble(self.segments, self.dim_out, results, weights, self.layout)

    def _concatenated(self, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        """Weighted path results [z, K, mul], split per output segment (transposed in mul_ir) and
        concatenated."""
        z = x.shape[0]
        parts: Dict[tuple, List[Tensor]] = {}
        for g, c in zip(self.groups, self.consts(x.dtype)):
            xs = x.narrow(1, g.offset, g.mul * g.d1)
            # [z, d1, mul] in either layout (a strided view in mul_ir)
            xt = xs.view(z, g.d1, g.mul) if self.layout == "ir_mul" else xs.view(z, g.mul, g.d1).transpose(1, 2)
            at = (y @ c).view(z, g.k, g.d1)
            if not g.channelwise:
                b = at * xt if g.d1 == 1 else torch.bmm(at, xt)
                for part, seg in zip(self._mixed(g, b, w, z), g.out_segs):
                    parts.setdefault(seg, []).append(part)
                continue
            wp = self._weight_rows(g, w, z)
            if g.d1 == 1:  # scalar segment: weights times x first ([z, paths, mul]), one full-size product
                v = at * (xt * wp).index_select(1, g.path_of_k)
            else:
                v = torch.bmm(at, xt) * wp.index_select(1, g.path_of_k)  # [z, K, mul]
            # one split (its backward is one cat), not a slice per path (a zero-filled gradient each)
            for part, seg in zip(v.split(g.dos, dim=1), g.out_segs):
                parts.setdefault(seg, []).append(part)
        outs = []
        for seg in self.out_segs:
            ps = parts.get(seg)
            if ps is None:
                outs.append(x.new_zeros(z, seg[1] * seg[2]))
                continue
            v = ps[0] if len(ps) == 1 else torch.stack(ps).sum(0) if len(ps) > 2 else ps[0] + ps[1]  # [z, do, mul]
            outs.append(v.reshape(z, -1) if self.layout == "ir_mul" else v.transpose(1, 2).reshape(z, -1))
        return torch.cat(outs, 1) if len(outs) > 1 else outs[0]

    def _mixed(self, g: _Group, b: Tensor, w: Tensor, z: int) -> List[Tensor]:
        """A segment with fully connected paths, from its path results ``b`` [z, K, mul_in]: per path
        [z, do, mul_out], the part times its [mul_in, mul_out] weight matrix (one per row, or shared),
        or times its weight row for a channel-wise path."""
        parts = []
        for n, part in enumerate(b.split(g.dos, dim=1)):
            full = g.full[n]
            if full is None:
                off = g.w_offs[n]
                parts.append(part * (w.narrow(0, off, g.mul).view(1, 1, g.mul) if self.shared else
                                     w.narrow(1, off, g.mul).view(z, 1, g.mul)))
                continue
            off, mo = full
            wm = w.narrow(0, off, g.mul * mo).view(g.mul, mo) if self.shared else \
                w.narrow(1, off, g.mul * mo).view(z, g.mul, mo)
            parts.append(torch.matmul(part, wm))  # [z, do, mul_out]
        return parts


@functools.lru_cache(maxsize=None)
def grouped_plan(problem: TPProblem, layout: str) -> GroupedPlan:
    with torch.inference_mode(False):  # its index tensors serve later calls, which autograd may record
        return GroupedPlan(problem, layout)


def forward(problem: TPProblem, layout: str, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
    """[rows, dim_out] in x's dtype, differentiable to any order by autograd (``applicable`` holds)."""
    return grouped_plan(problem, layout)(x, y, w)
