"""Generated Triton kernels for the fused graph convolution: load and launch the steps of a
``ConvPlan`` (every decision is the convolution planner's, conv_planner.py).

The kernels are the batched-TP kernels of ``emit.py`` with other row pointers:
- *nodes*: each program owns destination nodes and walks their edges in CSR order, carrying
  [ROWS, MUL] partial sums of the node outputs (out, dg) and reducing them once per node; per-edge
  outputs (gy, gw, dy, dw) are stored per edge. The source-side gradients (gx, dx) are either
  written per edge and summed per source node in sorted order (the ``deterministic`` dataflow: a
  fixed order) or added into their rows atomically (the ``atomic`` dataflow). A later double-backward
  channel part adds its partial dy atomically in either: one addend per element.
- *edges*: rows are edges; node operands are read through src[e] / dst[e]; node outputs are added
  with atomics (the ``atomic`` dataflow with EQUIKERNELS_CONV_ATOMIC=edges; shared-weight gradients).
"""
from __future__ import annotations

import functools
import hashlib
from typing import Dict, Optional

import torch
import triton

from ..dtypes import acc_dtype, math_dtype_of
from .cache import load_module
from .conv_planner import ConvPlanner, FLOWS
from .plan_types import NEED_LETTERS, ConvKernelStep, ConvPlan, LaunchConfig, need_bits
from .segment import segment_sum
from .recipe import KERNEL_DT
from .launch import rescue_options
from .tp import _alloc, num_sms


class _Capped:
    """A JIT function launched with a register cap (ptxas -maxrregcount): more resident warps per
    multiprocessor for the one-warp node-parallel programs."""

    def __init__(self, fn, maxnreg: int):
        self.fn, self.maxnreg = fn, maxnreg

    def __getitem__(self, grid):
        return functools.partial(self.fn[grid], maxnreg=self.maxnreg)

    def __getattr__(self, name):  # device_caches etc. (diagnostics)
        return getattr(self.fn, name)


class _ConvKernel:
    """The loaded Triton kernel of one plan step."""

    def __init__(self, step: ConvKernelStep):
        self.step = step
        header = f"# {step.describe}\nimport triton\nimport triton.language as tl\n\n\n"
        digest = hashlib.sha256((header + step.body).encode()).hexdigest()[:12]
        self.module = load_module(f"{step.name}_{digest}", header + step.body)
        fn = getattr(self.module, step.name)
        self.fn = _Capped(fn, step.maxnreg) if step.maxnreg else fn
        self.source_path = self.module.__file__
        self.opts = None  # compile options after the first launch (launch.rescue_options)

    def launch(self, tensors: Dict[str, torch.Tensor], outputs: Dict[str, torch.Tensor], graph, cfg: LaunchConfig,
               dtype: torch.dtype, programs: Optional[int] = None):
        st = self.step
        idx = {"src": graph.src, "dst": graph.dst}
        if st.mode == "nodes":
            idx["perm"], idx["nptr"] = ((graph.perm_dst, graph.ptr_dst) if st.owner == "dst"
                                        else (graph.perm_src, graph.ptr_src))
            n = graph.num_nodes
            grid = (max(1, n),)
        else:
            n = graph.num_edges
            nblk = triton.cdiv(n, cfg.rows)
            grid = (max(1, min(nblk, programs)) if programs else max(1, nblk),)
        args = [tensors[k] for k in st.inputs] + [outputs[k] for k in st.outputs]
        args += [idx[k] for k in st.index_args]
        prec = "tf32" if cfg.tf32 and dtype != torch.float64 else "ieee"
        compiled = self.fn[grid](*args, n, triton.cdiv(n, cfg.rows), ROWS=cfg.rows, DT=KERNEL_DT[dtype], PREC=prec,
                                 num_warps=cfg.num_warps, num_stages=cfg.num_stages, **(self.opts or {}))
        if self.opts is None:
            self.opts = rescue_options(compiled)


def _bits(kind: str, names) -> int:
    letters = NEED_LETTERS if kind == "dbwd" else NEED_LETTERS[:3]
    if any(n not in letters for n in names):
        raise ValueError(f"names: expected letters of {letters!r}, got {''.join(names)!r}")
    return need_bits(names)


def planner_of(tables) -> ConvPlanner:
    """The convolution planner of ``tables`` (an ``ops.tp.Plan``), one per tables object."""
    planner = tables.__dict__.get("_conv_planner")
    if planner is None:
        planner = tables.__dict__["_conv_planner"] = ConvPlanner(tables)
    return planner


class ConvKernels:
    """Runs the convolution plans of one Plan (problem, layout, tables) for one dataflow: loads each
    step's generated kernel once, allocates its buffers and launches it as the plan says."""

    def __init__(self, plan, flow: str):
        if flow not in FLOWS:
            raise ValueError(f"flow: expected 'atomic' or 'deterministic', got {flow!r}")
        self.plan, self.flow = plan, flow
        self.problem = plan.problem
        self.planner = planner_of(plan)
        self._cache: Dict[tuple, _ConvKernel] = {}

    def conv_plan(self, kind: str, names=(), have: str = "", math: torch.dtype = torch.float32,
                  cfg: Optional[LaunchConfig] = None) -> ConvPlan:
        """The plan this launcher runs for direction ``kind`` computing ``names``."""
        need = 0 if kind == "fwd" else _bits(kind, names)
        return self.planner.plan(self.flow, kind, need, have, math, cfg)

    def _kernel(self, step: ConvKernelStep) -> _ConvKernel:
        k = self._cache.get(step.key)
        if k is None:
            k = self._cache[step.key] = _ConvKernel(step)
        return k

    def _run(self, kind: str, names, tensors, like, graph, cfg, have: str = "", math=None) -> Dict[str, torch.Tensor]:
        """Launch the kernels computing outputs ``names`` (x, y, w, g / out) of one direction.
        Outputs take the dtype of ``like``; math is ``math`` (default: dtypes.math_dtype_of the operands).
        Buffers the plan adds into (atomics, per-edge gx/dx before their segment sum, row partials)
        are float32 for half-precision results, rounded once at the end."""
        math = math_dtype_of(tensors.values(), math)
        plan = self.conv_plan(kind, names, have, math, cfg)
        res, wide, per_edge = {}, {}, []
        for st in plan.steps:
            k = self._kernel(st)
            if st.per_edge and st.per_edge + "e" not in like:
                pe = like[st.per_edge]
                like = dict(like, **{st.per_edge + "e": pe.new_empty(graph.num_edges, pe.shape[1],
                                                                      dtype=acc_dtype(pe.dtype))})
                per_edge.append(st.per_edge)
            outs = {}
            for n in st.outputs:
                t = like[n]
                if n in st.continues:  # a later channel part: the first part's buffer
                    outs[n] = res[n]
                    continue
                if n in st.row_partials:
                    outs[n] = None
                    continue
                dt = acc_dtype(t.dtype) if n in st.acc_outputs else t.dtype
                if dt != t.dtype:
                    wide[n] = t.dtype
                outs[n] = _alloc(t.shape, t, n in st.zero_filled, dt)
            res.update(self._launch(st, k, tensors, outs, like, graph, math))
        for n, dt in wide.items():
            res[n] = res[n].to(dt)
        for xo in per_edge:
            if xo + "e" in res:
                res[xo] = segment_sum(res.pop(xo + "e"), graph.perm_src, graph.ptr_src, graph.num_nodes
                                      ).to(like[xo].dtype)
        return res

    @staticmethod
    def _launch(st: ConvKernelStep, k: _ConvKernel, tensors, outs, like, graph, math):
        cfg = st.launch
        programs = None
        if st.row_partials:
            programs = min(triton.cdiv(max(graph.num_edges, 1), cfg.rows),
                           st.programs_per_sm * num_sms(tensors["y"].device))
            for n in st.row_partials:
                outs[n] = _alloc((programs, like[n].shape[-1]), like[n], True, acc_dtype(like[n].dtype))
        if graph.num_edges == 0 and st.mode == "edges":
            for n in st.row_partials:
                outs[n] = torch.zeros_like(like[n])
            return outs
        k.launch(tensors, outs, graph, cfg, math, programs)
        for n in st.row_partials:  # deterministic, no precision loss
            outs[n] = outs[n].sum(0, dtype=torch.float64).to(like[n].dtype)
        return outs

    # --- directions -------------------------------------------------------------------------------
    # dtypes as the batched TP (codegen/tp.py): the output in ``out_dtype`` (default x's), each
    # gradient in its operand's dtype, math in float32 unless float64 is involved
    def forward(self, x, y, w, graph, cfg: Optional[LaunchConfig] = None, out_dtype=None, math=None):
        like = {"out": x.new_empty(graph.num_nodes, self.problem.dim_out, dtype=out_dtype or x.dtype)}
        return self._run("fwd", ["out"], {"x": x, "y": y, "w": w}, like, graph, cfg, math=math)["out"]

    def backward(self, x, y, w, g, graph, names, cfg: Optional[LaunchConfig] = None, math=None):
        """Gradients ``names`` (subset of "xyw") as a dict gx/gy/gw."""
        like = {"gx": x, "gy": y, "gw": w}
        return self._run("bwd", list(names), {"x": x, "y": y, "w": w, "g": g}, like, graph, cfg, math=math)

    def double_backward(self, x, y, w, g, a, b, c, graph, names, cfg: Optional[LaunchConfig] = None, math=None):
        """dx/dy/dw/dg of the trilinear identity for ``names`` (subset of "xywg"); a, b, c may be None."""
        have = "".join(k for k, t in zip("abc", (a, b, c)) if t is not None)
        tensors = {"x": x, "y": y, "w": w, "g": g, "a": a, "b": b, "c": c}
        like = {"dx": x, "dy": y, "dw": w, "dg": g}
        return self._run("dbwd", list(names), tensors, like, graph, cfg, have, math)
