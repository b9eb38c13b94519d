"""Generated Triton kernels for the fused graph convolution: build, cache, launch.

The kernels are the batched-TP kernels of ``emit.py`` with other row pointers:
- *nodes*: each program owns destination nodes and walks their edges in CSR order, carrying
  [ROWS, MUL] partial sums of the node outputs (out, dg) and reducing them once per node; per-edge
  outputs (gy, gw, dy, dw) are stored per edge. The source-side gradients (gx, dx) are either
  written per edge and summed per source node in sorted order (the ``deterministic`` dataflow: no
  atomics, a fixed order) or added into their rows atomically (the ``atomic`` dataflow).
- *edges*: rows are edges; node operands are read through src[e] / dst[e]; node outputs are added
  with atomics (the ``atomic`` dataflow with EQUIKERNELS_CONV_ATOMIC=edges; shared-weight gradients).
"""
from __future__ import annotations

import functools
import hashlib
from typing import Dict, Optional

import torch
import triton

from .. import settings
from ..dtypes import acc_dtype
from ..ir import double_backward_tables
from .cache import load_module
from .emit import Group, Rowing, generate
from .segment import segment_sum
from .plan_types import KernelChoice, LaunchConfig
from .planner import conv_config, conv_hoist, conv_in1_outer, conv_knob, conv_prefetch
from .tp import _DT, _alloc, _num_sms, math_of

# which graph side each operand / output lives on (everything else is per edge)
SRC_SIDE = ("x", "a", "gx", "dx")
DST_SIDE = ("out", "g", "dg")
EDGE_OUTPUTS = ("gy", "gw", "dy", "dw")


def _rowing(mode: str, operands, owner: Optional[str] = None, sections: str = "segment", hoist: bool = True,
            scatter_src: bool = False) -> Rowing:
    rowvar, index = {}, {}
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
                    or (scatter_src and n in ("gx", "dx")))
    return Rowing(mode, sections, rowvar, index, scatter, hoist)


class _ConvKernel:
    def __init__(self, name: str, groups, layout: str, row_operands, rowing: Rowing, describe: str, in1: bool,
                 owner: Optional[str], in1_outer: bool = False):
        self.owner = owner
        choice = KernelChoice(row_operands=frozenset(row_operands), in1_major=in1, in1_outer=in1_outer)
        body, self.meta = generate(name, groups, layout, choice, rowing)
        self.rowing = rowing
        header = f"# {describe}\nimport triton\nimport triton.language as tl\n\n\n"
        digest = hashlib.sha256((header + body).encode()).hexdigest()[:12]
        self.module = load_module(f"{name}_{digest}", header + body)
        self.fn = getattr(self.module, name)
        self.source_path = self.module.__file__

    def launch(self, tensors: Dict[str, torch.Tensor], outputs: Dict[str, torch.Tensor], graph, cfg: LaunchConfig,
               dtype: torch.dtype, programs: Optional[int] = None):
        idx = {"src": graph.src, "dst": graph.dst}
        if self.rowing.mode == "nodes":
            idx["perm"], idx["nptr"] = ((graph.perm_dst, graph.ptr_dst) if self.owner == "dst"
                                        else (graph.perm_src, graph.ptr_src))
            n = graph.num_nodes
            grid = (max(1, n),)
        else:
            n = graph.num_edges
            nblk = triton.cdiv(n, cfg.rows)
            grid = (max(1, min(nblk, programs)) if programs else max(1, nblk),)
        args = [tensors[k] for k in self.meta.inputs] + [outputs[k] for k in self.meta.outputs]
        args += [idx[k] for k in self.rowing.args]
        prec = "tf32" if cfg.tf32 and dtype != torch.float64 else "ieee"
        self.fn[grid](*args, n, triton.cdiv(n, cfg.rows), ROWS=cfg.rows, DT=_DT[dtype], PREC=prec,
                      num_warps=cfg.num_warps, num_stages=cfg.num_stages)


class ConvKernels:
    """Forward, backward and double-backward kernels of one Plan for one dataflow."""

    def __init__(self, plan, flow: str):
        if flow not in ("atomic", "deterministic"):
            raise ValueError(f"flow: expected 'atomic' or 'deterministic', got {flow!r}")
        self.plan, self.flow = plan, flow
        self.problem = plan.problem
        self._cache: Dict[tuple, object] = {}

    def _row_operands(self):
        rows = {"x", "y", "g", "a", "b"}
        if not self.problem.shared_weights:
            rows |= {"w", "c"}
        return rows

    def _in1_major(self) -> bool:
        segs = [p.output.segment for p in self.plan.table.paths]
        return len(segs) == len(set(segs))

    def _kernel(self, tag: str, groups, mode: str, owner: Optional[str] = None, sections: str = "segment",
                hoist: bool = True, in1_outer: bool = False, prefetch: str = "", maxnreg: int = 0,
                scatter_src: bool = False):
        key = (tag, mode, owner, sections, hoist, in1_outer, prefetch, maxnreg, scatter_src)
        if key not in self._cache:
            ops = set()
            for g in groups:
                ops.add(g.out_ptr)
                ops.update(o.name for o in g.table.operands if o.name != g.table.output)
            rowing = _rowing(mode, ops, owner, sections, hoist, scatter_src)
            rowing.prefetch = prefetch
            name = f"conv_{tag}_{mode}_{self.problem.key()}_{self.plan.layout}"
            self._cache[key] = _ConvKernel(name, groups, self.plan.layout, self._row_operands(), rowing,
                                           f"{tag} of the convolution of {self.problem.describe()} "
                                           f"[{self.plan.layout}, {mode}]", self._in1_major(), owner, in1_outer)
            if maxnreg:
                self._cache[key].fn = self._Capped(self._cache[key].fn, maxnreg)
        return self._cache[key]

    def _groups(self, kind: str, names, have: str = "", carry=()):
        """Groups computing ``names``; those in ``carry`` are node outputs of a node-parallel kernel
        (marked reduce_rows: summed over the node's edges), a shared weight's gradient is summed
        over all edges."""
        p, shared = self.plan, self.problem.shared_weights
        red = lambda n: n in carry or (n == "w" and shared)  # noqa: E731
        if kind == "fwd":
            return [Group(p.table, "out", reduce_rows=red("out"))]
        if kind == "bwd":
            return [Group(p.grad_tables[n], "g" + n, reduce_rows=red(n)) for n in names]
        tables = double_backward_tables(p.table, have, "".join(names))
        return [Group(tables[n], "d" + n, reduce_rows=red(n)) for n in names if n in tables]

    _knob = staticmethod(conv_knob)
    _prefetch = staticmethod(conv_prefetch)
    _hoist = staticmethod(conv_hoist)

    class _Capped:
        """A JIT function launched with a register cap (ptxas -maxrregcount): more resident warps
        per multiprocessor for the one-warp node-parallel programs."""

        def __init__(self, fn, maxnreg: int):
            self.fn, self.maxnreg = fn, maxnreg

        def __getitem__(self, grid):
            return functools.partial(self.fn[grid], maxnreg=self.maxnreg)

        def __getattr__(self, name):  # device_caches etc. (diagnostics)
            return getattr(self.fn, name)

    def _run(self, kind: str, names, tensors, like, graph, cfg, have: str = "", math=None) -> Dict[str, torch.Tensor]:
        """Launch the kernels computing outputs ``names`` (x, y, w, g / out) of one direction.
        Outputs take the dtype of ``like``; math is ``math`` (default: math_of the operands).
        Buffers added into more than once (atomics, per-edge gx/dx before their segment sum,
        row partials) are float32 for half-precision results, rounded once at the end."""
        math = math_of(*tensors.values(), math_dtype=math)
        plans = []  # (kernel tag, names, mode, owner, sections)
        tag = lambda ns: f"{kind}{have}_{''.join(ns)}"  # noqa: E731
        # atomic: edge-parallel kernels with every node output scattered (EQUIKERNELS_CONV_ATOMIC=edges),
        # or (default) the deterministic node-parallel kernels with the source-side gradients (gx,
        # dx) added atomically into their rows instead of written per edge and segment-summed
        nodes_atomic = self.flow == "atomic" and self._knob("ATOMIC", kind, "nodes") != "edges"
        if self.flow == "atomic" and not nodes_atomic:
            if kind == "dbwd":  # dg alone; dx, dy, dw together (fewer live tiles, as the batched TP)
                if "g" in names:
                    plans.append((tag("g"), ["g"], "edges", None, ""))
                rest = [n for n in names if n != "g"]
                if rest:
                    plans.append((tag(rest), rest, "edges", None, ""))
            else:
                plans.append((tag(names), list(names), "edges", None, ""))
        else:
            # Every kernel owns destination nodes and walks their edges in dst-sorted order.
            # out / dg (wide node outputs): carried per node, one edge loop per first-input segment
            # (few live accumulators, each x tile gathered once). Gradients: one pass in which the
            # node's g row is loaded once (not gathered per edge), the per-edge outputs (gy, gw,
            # dy, dw) are stored per edge, and gx / dx are written per edge and then summed per
            # source node in sorted order (segment_sum): no atomics, a fixed order.
            if "out" in names or "g" in names:
                n = "out" if "out" in names else "g"
                plans.append((tag(n), [n], "nodes", "dst", "in1"))
            shared_w = ["w"] if "w" in names and self.problem.shared_weights else []
            rest = [n for n in names if n in ("x", "y", "w") and n not in shared_w]
            if rest:
                # one edge loop per x segment: fewer live tiles, no spills;
                # EQUIKERNELS_CONV_GRAD_LOOPS=one restores the single loop
                loops = "one" if settings.get().conv_grad_loops == "one" else "in1all"
                plans.append((tag(rest), rest, "nodes", "dst", loops))
            if shared_w:
                plans.append((tag(shared_w), shared_w, "edges", None, ""))
        res = {}
        for tg, ns, mode, owner, sections in plans:
            carry = [n for n in ns if n in ("out", "g")] if mode == "nodes" else []
            per_edge_x = mode == "nodes" and "x" in ns and not nodes_atomic  # written per edge, summed after
            groups = self._groups(kind, [n for n in ns if n != "out"], have, carry)
            if per_edge_x:
                xo = "gx" if kind == "bwd" else "dx"
                groups = [Group(g.table, xo + "e", g.reduce_rows, g.accumulate) if g.out_ptr == xo else g
                          for g in groups]
                like = dict(like, **{xo + "e": like[xo].new_empty(graph.num_edges, like[xo].shape[1],
                                                                   dtype=acc_dtype(like[xo].dtype))})
            if not groups:
                continue
            # the double backward's gradient kernel holds twice the operands: its owned-node rows
            # (g) are re-read per edge from cache instead of held in registers
            nodes = mode == "nodes"
            hoist = self._hoist(kind, math) if nodes else kind != "dbwd"
            share = conv_in1_outer(self.problem, kind, math, nodes)
            k = self._kernel(tg, groups, mode, owner, sections or "segment", hoist=hoist,
                             in1_outer=share, prefetch=self._prefetch(kind, math) if nodes else "",
                             maxnreg=int(self._knob("MAXNREG", kind, "0")) if nodes else 0,
                             scatter_src=nodes_atomic and nodes)
            outs, wide = {}, {}
            for g in groups:
                t = like[g.out_ptr]
                if g.reduce_rows and mode == "edges":
                    outs[g.out_ptr] = None
                else:
                    scatter = g.out_ptr in k.rowing.scatter or g.accumulate
                    dt = acc_dtype(t.dtype) if scatter else t.dtype
                    if dt != t.dtype:
                        wide[g.out_ptr] = t.dtype
                    outs[g.out_ptr] = _alloc(t.shape, t, g.out_ptr in k.meta.zero_init or scatter, dt)
            res.update(self._launch(kind, k, tensors, outs, like, graph, cfg, math))
            for n, dt in wide.items():
                res[n] = res[n].to(dt)
            if per_edge_x and xo + "e" in res:
                res[xo] = segment_sum(res.pop(xo + "e"), graph.perm_src, graph.ptr_src, graph.num_nodes
                                      ).to(like[xo].dtype)
        return res

    def _launch(self, kind: str, k: _ConvKernel, tensors, outs, like, graph, cfg, math):
        cfg = cfg or conv_config(kind, k.rowing.mode, math)
        rows_needed = max(cfg.rows, k.meta.min_rows)
        if rows_needed != cfg.rows:
            cfg = LaunchConfig(rows_needed, cfg.num_warps, cfg.num_stages, cfg.tf32)
        dtype = math
        programs = None
        partial = [n for n, t in outs.items() if t is None]
        if partial:
            programs = min(triton.cdiv(max(graph.num_edges, 1), cfg.rows), 4 * _num_sms(tensors["y"].device))
            for n in partial:
                outs[n] = _alloc((programs, like[n].shape[-1]), like[n], True, acc_dtype(like[n].dtype))
        if graph.num_edges == 0 and k.rowing.mode == "edges":
            for n in partial:
                outs[n] = torch.zeros_like(like[n])
            return outs
        k.launch(tensors, outs, graph, cfg, dtype, programs)
        for n in partial:  # deterministic, no precision loss
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
