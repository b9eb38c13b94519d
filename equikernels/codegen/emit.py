"""Path table -> Triton source: one fully unrolled, register-resident kernel.

A kernel evaluates one or more *groups* (a table and the pointer its output goes to) over blocks of
ROWS rows. For each path, at most two channel labels become block dimensions (each irrep
component of a factor is a ``[ROWS, MUL]`` or ``[ROWS, MUL1, MUL2]`` block in registers), every
other label is unrolled. The CG contraction is a straight line of multiply-adds with literal
coefficients; every (operand, component) block is loaded once and reused by all paths that read
it; outputs are accumulated in registers and stored once. Groups whose output is summed over rows
(gradients of shared weights) accumulate across a grid-stride loop and write one partial per
program, which the launcher sums in float64.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

from ..ir import Factor, Path, Table
from .plan_types import KernelChoice
from .terms import Combo, merge


# Scatter atomics need no ordering: their sums are read only after the kernel ends. Triton's default
# (acq_rel) adds a GPU-wide fence before every atomic and makes it a returning ATOM; relaxed ones
# compile to fire-and-forget vector reductions (REDG.E.ADD.F32x4 on sm_90).
RELAXED = 'sem="relaxed"'


class Unsupported(Exception):
    """The generator cannot express this table (the dispatcher then uses the reference)."""


@dataclass(frozen=True)
class Group:
    table: Table
    out_ptr: str          # kernel argument the output goes to
    reduce_rows: bool = False
    accumulate: bool = False  # add into the output (a problem split over several kernels)


@dataclass
class KernelMeta:
    name: str
    inputs: Tuple[str, ...]      # pointer arguments read, in order
    outputs: Tuple[str, ...]     # pointer arguments written, in order
    zero_init: Tuple[str, ...]   # outputs the kernel does not fully cover (launcher zero-fills)
    reduce_rows: Tuple[str, ...]  # outputs written as per-program partials [programs, dim]
    min_rows: int = 1             # rows per program the kernel needs (tl.dot over rows: 16)


@dataclass
class Rowing:
    """How kernel rows map to tensor rows (a sparse kernel is the dense one with other
    row pointers).

    ``mode``: "rows" (row i of every row operand), "edges" (rows are edges; an operand named in
    ``rowvar`` is addressed through an index loaded per edge, e.g. x through src[e]) or "nodes"
    (each program owns nodes; a node's edges, found through ``perm``/``nptr`` CSR arrays, are
    visited ROWS at a time; groups marked ``reduce_rows`` are the node's outputs, carried across
    the edge loop and reduced once per node in a fixed order; other groups are per-edge outputs
    stored as in rows mode). With ``sections="segment"`` every output segment gets its own edge
    loop (few live accumulators: wide node outputs), with "one" a single loop computes everything
    (each edge operand read once), with "in1all" one loop per first-input segment for all groups
    (per-edge outputs written by several loops are added into). ``index``: row variable -> pointer argument it is
    loaded from (per edge). ``scatter``: outputs added with atomics (edge-parallel node outputs).
    """
    mode: str = "rows"
    sections: str = "segment"  # nodes mode: one edge loop per output "segment", or "one" loop
    rowvar: Dict[str, str] = field(default_factory=dict)
    index: Dict[str, str] = field(default_factory=dict)
    scatter: Tuple[str, ...] = ()
    hoist: bool = True  # nodes mode: load the owned node's operands once per node (registers)
    # nodes mode: software pipelining of the edge loop. "idx": edge ids (perm) and gathered node
    # ids (src) are loaded ahead, so a step's loads no longer wait on a chain of index loads;
    # "all": also every per-edge load of the next step is issued before this step's arithmetic
    # (more bytes in flight per warp, more registers). See KernelBuilder._pipelined.
    prefetch: str = ""
    # nodes mode: stages of Triton's loop pipeliner on the edge loop (tl.range num_stages: loads
    # copied asynchronously into shared memory ahead of use, no registers held); 0: a plain loop
    stages: int = 0

    @property
    def edge_range(self) -> str:
        """The node's edge loop: ``for k0 in <this>:``."""
        return f"tl.range(e0, e1, ROWS, num_stages={self.stages})" if self.stages else "range(e0, e1, ROWS)"

    @property
    def args(self) -> Tuple[str, ...]:
        extra = ("perm", "nptr") if self.mode == "nodes" else ()
        return extra + tuple(dict.fromkeys(self.index.values()))

    def prologue(self, indent: str) -> List[str]:
        return [f"{indent}{var} = tl.load({ptr}_ptr + r64, mask=rmask, other=0).to(tl.int64)"
                for var, ptr in self.index.items()]


def path_segment(p: Path, in1: bool = False) -> int:
    """The segment a path is visited and split by: the forward output segment (for derivative
    tables: the cotangent g's), or with ``in1`` the first input's (x or a; for its gradient, whose
    table outputs operand x: the output's). -1 when the path has none."""
    if in1:
        return next((f.segment for f in p.factors if f.operand in ("x", "a")),
                    p.output.segment if p.output.operand == "x" else -1)
    return next((f.segment for f in p.factors if f.operand == "g"), p.output.segment)


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _lit(c: float) -> str:
    return repr(float(c))


class _Writer:
    def __init__(self):
        self.lines: List[str] = []
        self.n = 0

    def tmp(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def emit(self, s: str, indent: int = 2):
        self.lines.append("    " * indent + s)


class KernelBuilder:
    def __init__(self, name: str, groups: Sequence[Group], layout: str, choice: KernelChoice,
                 rowing: Optional["Rowing"] = None, lazy: bool = True):
        self.name, self.groups, self.layout = name, list(groups), layout
        self.rowing = rowing or Rowing()
        self.row_operands = set(choice.row_operands)  # operands with a row dimension (others are shared)
        self.pre = _Writer()    # before the row loop (constants, aranges, loop-carried accumulators)
        self.body = _Writer()   # inside the row loop
        self.post = _Writer()   # after the loop
        self.index = _Writer()  # prefetch "all": per-edge row offsets and masks of a loop step
        self.fetch = _Writer()  # prefetch "all": per-edge loads of a loop step (issued a step early)
        self.fetches: List[Tuple[List[str], List[str]]] = []  # (index, fetch) lines per node section
        self.consts: Dict[str, str] = {}
        self.aranges: Dict[Tuple[int, int, int], str] = {}
        self.masks: Dict[Tuple[int, int, int, int], str] = {}
        self.rowexpr: Dict[Tuple[str, int], str] = {}
        self.rowmask: Dict[int, str] = {}
        self.loads: Dict[tuple, str] = {}
        self.tiles: Dict[tuple, List[str]] = {}
        self.store_info: Dict[tuple, Optional[tuple]] = {}
        self.split = choice.split
        self.dot = choice.dot
        self.in1_major = choice.in1_major
        self.min_rows = 1
        self.norows: Set[str] = set()  # row-free loop accumulators (tl.dot weight gradients)
        self.accpre = self.pre          # where loop-carried accumulators are initialised
        self.only: Optional[tuple] = None  # emit only this assignment of a path's unrolled labels
        self.bounds: Dict[str, Tuple[int, int]] = {}  # label -> [lo, hi) of the path being emitted
        self.accumulate = {g.out_ptr for g in self.groups if g.accumulate and not g.reduce_rows}
        self.acc_keys: Set[tuple] = set()  # output blocks an earlier edge loop already stored (add into)
        self.exprs: Dict[str, str] = {}
        self.lazy: Dict[str, tuple] = {}  # accumulator -> padded sizes of its not yet summed axes
        self.lazy_sums = lazy
        self.lazy_live = self.lazy_peak = 0  # padded elements per row of live un-reduced accumulators
        self.partial_sums = choice.partial
        self.prefetch = choice.prefetch
        self.l2 = choice.l2
        self.in1_outer = choice.in1_outer
        self.merge = choice.merge
        self.inputs: List[str] = []
        self.operand_dims: Dict[str, int] = {}
        for g in self.groups:
            for op in g.table.operands:
                if op.name != g.table.output:
                    self.operand_dims[op.name] = op.dim

    # --- small shared expressions ---------------------------------------------------------------
    def const(self, c: float) -> str:
        key = _lit(c)
        if key not in self.consts:
            name = f"K{len(self.consts)}"
            self.consts[key] = name
            self.pre.emit(f"{name} = tl.full([], {key}, DT)", 1)
        return self.consts[key]

    def arange(self, p: int, nd: int, pos: int, rows: bool = True) -> str:
        """arange(0, p) shaped for a ([ROWS] + nd)-dim block, varying along block position ``pos``."""
        key = (p, nd, pos, rows)
        if key not in self.aranges:
            name = f"i{p}_{nd}{pos}{'' if rows else 'n'}"
            idx = ["None"] * (nd + rows)
            idx[pos + rows] = ":"
            self.pre.emit(f"{name} = tl.arange(0, {p})[{', '.join(idx)}]", 1)
            self.aranges[key] = name
        return self.aranges[key]

    def colmask(self, p: int, size: int, nd: int, pos: int, rows: bool = True, lo: int = 0) -> str:
        key = (p, size, nd, pos, rows, lo)
        if key not in self.masks:
            name = f"m{p}_{size}_{nd}{pos}{'' if rows else 'n'}{f'_{lo}' if lo else ''}"
            i = self.arange(p, nd, pos, rows)
            self.pre.emit(f"{name} = {i} < {size}" if not lo else f"{name} = ({i} >= {lo}) & ({i} < {size})", 1)
            self.masks[key] = name
        return self.masks[key]

    @staticmethod
    def _row_axis(nd: int) -> str:
        """Index expression giving a [ROWS] vector ``nd`` trailing unit axes."""
        return "" if nd == 0 else "[:, " + ", ".join(["None"] * nd) + "]"

    def rows(self, operand: str, dim: int, nd: int) -> str:
        key = (operand, nd)
        if key not in self.rowexpr:
            name = f"{operand}_r{nd}"
            var = self.rowing.rowvar.get(operand, "r64")
            (self.index if self._fetching() else self.body).emit(f"{name} = {var}{self._row_axis(nd)} * {dim}")
            self.rowexpr[key] = name
        return self.rowexpr[key]

    def rmask(self, nd: int) -> str:
        if nd not in self.rowmask:
            name = f"rm{nd}"
            (self.index if self._fetching() else self.body).emit(f"{name} = rmask{self._row_axis(nd)}")
            self.rowmask[nd] = name
        return self.rowmask[nd]

    # --- addressing -------------------------------------------------------------------------------
    def _address(self, table: Table, f: Factor, comp: int, assign: Dict[str, int], block: Sequence[str]):
        """(constant offset, [(coef, block position)]) of factor ``f`` component ``comp``."""
        seg = table.operand(f.operand).segments[f.segment]
        st = dict(f.strides)
        ch = f.base + sum(st[l] * assign[l] for l in st if l in assign)
        if self.layout == "mul_ir" or seg.dim == 1:
            const, scale = seg.offset + ch * seg.dim + comp, seg.dim
        else:
            const, scale = seg.offset + comp * seg.mul + ch, 1
        terms = [(st[l] * scale, pos) for pos, l in enumerate(block) if l in st]
        return const, tuple(terms)

    def _split_info(self, table: Table, f: Factor, comp: int, assign, block):
        """(segment offset, dim, channel base, comp) when a mul_ir block can move as one
        [ROWS, MUL, DIM] tile (one contiguous access instead of one strided access per component)."""
        if not self.split or self.layout != "mul_ir" or len(block) != 1 or self.bounds:
            return None
        seg = table.operand(f.operand).segments[f.segment]
        st = dict(f.strides)
        if seg.dim == 1 or st.get(block[0]) != 1 or f.operand not in self.row_operands | {"out", "gx", "gy"}:
            return None
        ch = f.base + sum(st[l] * assign[l] for l in st if l in assign)
        return seg.offset, seg.dim, ch, comp

    def _split(self, name: str, p: int, n: int) -> List[str]:
        """Components of a [ROWS, p, n] tile by repeated tl.split (n a power of two)."""
        if n == 1:
            v = self.body.tmp("c")
            self.body.emit(f"{v} = tl.reshape({name}, [ROWS, {p}])")
            return [v]
        r, a, b = self.body.tmp("p"), self.body.tmp("e"), self.body.tmp("o")
        self.body.emit(f"{r} = tl.reshape({name}, [ROWS, {p}, {n // 2}, 2])")
        self.body.emit(f"{a}, {b} = tl.split({r})")
        even, odd = self._split(a, p, n // 2), self._split(b, p, n // 2)
        return [c for pair in zip(even, odd) for c in pair]

    def _join(self, names: List[Optional[str]], p: int) -> str:
        """Inverse of _split: [ROWS, p] components (None = zero padding) -> [ROWS, p, n] tile."""
        if len(names) == 1:
            v = self.body.tmp("j")
            src = (f"tl.zeros([ROWS, {p}], DT)" if names[0] is None
                   else f"tl.broadcast_to({names[0]}, [ROWS, {p}])")
            self.body.emit(f"{v} = {src}[:, :, None]")
            return v
        e, o = self._join(names[0::2], p), self._join(names[1::2], p)
        v = self.body.tmp("j")
        self.body.emit(f"{v} = tl.reshape(tl.join({e}, {o}), [ROWS, {p}, {len(names)}])")
        return v

    def _tile_ptr(self, operand: str, off: int, d: int, ch: int, p: int, size: int):
        dd = _pow2(d)
        ptr = (f"{operand}_ptr + {self.rows(operand, self.operand_dims.get(operand, 0) or self.out_dims[operand], 2)}"
               f" + {off + ch * d} + {d} * {self.arange(p, 2, 0)} + {self.arange(dd, 2, 1)}")
        mask = [self.rmask(2)]
        if p != size:
            mask.append(self.colmask(p, size, 2, 0))
        if dd != d:
            mask.append(self.colmask(dd, d, 2, 1))
        return ptr, " & ".join(mask)

    def _fetching(self) -> bool:
        return self.rowing.mode == "nodes" and self.rowing.prefetch == "all"

    def _edge_load(self, name: str, expr: str, operand: str):
        """Emit ``name = expr``, a load of a per-edge row: into the prefetched part of the step when
        pipelining (the owned node's rows are the same every step: they stay in the body)."""
        edge = self.rowing.rowvar.get(operand) != "noderow"
        (self.fetch if self._fetching() and edge else self.body).emit(f"{name} = {expr}")

    def _old(self, ptr: str, mask: str, operand: str) -> str:
        """The current value of an output block that is added into (read-modify-write)."""
        expr = f"tl.load({ptr}, mask={mask}, other=0.0).to(DT)"
        if not self._fetching():
            return expr
        v = self.body.tmp(f"{operand}_o")
        self._edge_load(v, expr, operand)
        return v

    def _hoisted(self, operand: str) -> bool:
        """An operand of the node a node-parallel program owns: loaded once per node, before the
        edge loop (e.g. g[dst] in the backward over a destination's edges)."""
        return self.rowing.hoist and self.rowing.mode == "nodes" and self.rowing.rowvar.get(operand) == "noderow"

    def _load_hoisted(self, f: Factor, const: int, terms, sizes, block, nd: int) -> str:
        name = self.body.tmp(f"{f.operand}_n")
        addr = [str(const)] + [f"{coef} * {self.arange(_pow2(sizes[block[pos]]), nd, pos)}" for coef, pos in terms]
        mask = [self.colmask(_pow2(sizes[block[pos]]), sizes[block[pos]], nd, pos) for _, pos in terms
                if _pow2(sizes[block[pos]]) != sizes[block[pos]]]
        used = {pos for _, pos in terms}
        shape = ["ROWS"] + [str(_pow2(sizes[block[pos]])) if pos in used else "1" for pos in range(nd)]
        ptr = f"{f.operand}_ptr + noderow{self._row_axis(nd)} * {self.operand_dims[f.operand]} + " + " + ".join(addr)
        mask_s = f", mask={' & '.join(mask)}, other=0.0" if mask else ""
        self.accpre.emit(f"{name} = tl.broadcast_to(tl.load({ptr}{mask_s}).to(DT), [{', '.join(shape)}])", 1)
        return name

    def load(self, table: Table, f: Factor, comp: int, assign, block, sizes) -> str:
        if isinstance(f, Combo):
            return self._combo(table, f, comp, assign, block, sizes)
        nd = len(block)
        hoist = self._hoisted(f.operand)
        info = None if hoist else self._split_info(table, f, comp, assign, block)
        if info is not None:
            off, d, ch, _ = info
            size = sizes[block[0]]
            p = _pow2(size)
            tkey = (f.operand, off, ch, p, size)
            if tkey not in self.tiles:
                if f.operand not in self.inputs:
                    self.inputs.append(f.operand)
                name = self.body.tmp(f"{f.operand}_t")
                ptr, mask = self._tile_ptr(f.operand, off, d, ch, p, size)
                self._edge_load(name, f"tl.load({ptr}, mask={mask}, other=0.0).to(DT)", f.operand)
                self.tiles[tkey] = self._split(name, p, _pow2(d))
            return self.tiles[tkey][comp]
        const, terms = self._address(table, f, comp, assign, block)
        has_rows = f.operand in self.row_operands
        bounds = tuple(self.bounds.get(block[pos]) for _, pos in terms)
        key = (f.operand, const, terms, tuple(sizes[block[pos]] for _, pos in terms), nd, has_rows, bounds)
        if key in self.loads:
            return self.loads[key]
        if f.operand not in self.inputs:
            self.inputs.append(f.operand)
        if hoist and not self.bounds:
            self.loads[key] = self._load_hoisted(f, const, terms, sizes, block, nd)
            return self.loads[key]
        name = self.body.tmp(f"{f.operand}_")
        addr = [str(const)] + [f"{coef} * {self.arange(_pow2(sizes[block[pos]]), nd, pos)}" for coef, pos in terms]
        mask = [self.colmask(_pow2(sizes[block[pos]]), sizes[block[pos]], nd, pos) for _, pos in terms
                if _pow2(sizes[block[pos]]) != sizes[block[pos]] and block[pos] not in self.bounds]
        mask += [self.colmask(_pow2(sizes[block[pos]]), self.bounds[block[pos]][1], nd, pos, lo=self.bounds[block[pos]][0])
                 for _, pos in terms if block[pos] in self.bounds]
        ptr = f"{f.operand}_ptr + " + " + ".join(addr)
        if has_rows:
            ptr = f"{f.operand}_ptr + {self.rows(f.operand, self.operand_dims[f.operand], nd)} + " + " + ".join(addr)
            mask = [self.rmask(nd)] + mask
        elif nd == 0:
            ptr += " + r64 * 0"  # keep a row-shaped scalar so broadcasting stays uniform
        mask_s = f", mask={' & '.join(mask)}, other=0.0" if mask else ""
        if has_rows:
            self._edge_load(name, f"tl.load({ptr}{mask_s}).to(DT)", f.operand)
        else:
            self.body.emit(f"{name} = tl.load({ptr}{mask_s}).to(DT)")
        self.loads[key] = name
        return name

    def _combo(self, table: Table, f: Combo, comp: int, assign, block, sizes) -> str:
        """Component ``comp`` of a weighted-factor sum (terms.Combo), computed once per block."""
        parts = []
        for fac, wt in f.terms:
            v = self.load(table, fac, comp, assign, block, sizes)
            parts.append(v if wt is None else f"{v} * {self.load(table, wt, 0, assign, block, sizes)}")
        expr = " + ".join(parts)
        if expr not in self.exprs:
            v = self.body.tmp("m")
            self.body.emit(f"{v} = {expr}")
            self.exprs[expr] = v
        return self.exprs[expr]

    # --- one path ---------------------------------------------------------------------------------
    def _dot_form(self, g: Group, p: Path, sizes, out_st) -> Tuple[Optional[str], Optional[List[str]]]:
        """Whether channel mixing by a shared weight tile can go through ``tl.dot``.

        Forms (a, b the two block labels, both larger than 8 so the padded tile is >= 16 wide):
        ``fwd``: out[r, a] = A[r, b] @ W[b, a]  (a an output label no other factor carries);
        ``red2``: out[r] = sum_a F[r, a] (P[r, b] @ W[b, a])  (both labels summed);
        ``outer``: gW[a, b] += A[r, a]^T @ B[r, b]  (gradient of shared weights, summed over rows).
        """
        if not self.dot or self.bounds:
            return None, None
        fl = [dict(f.strides) for f in p.factors]
        w = p.weight
        if w is not None and w.operand not in self.row_operands:
            big = sorted((l for l, _ in w.strides if sizes[l] > 8), key=lambda l: -sizes[l])[:2]
            if len(big) == 2 and not any(big[0] in st and big[1] in st for st in fl):
                a, b = sorted(big, key=lambda l: l not in out_st)
                if a in out_st and b not in out_st and not any(a in st for st in fl):
                    return "fwd", [a, b]
                if a not in out_st and b not in out_st:
                    if not any(b in st for st in fl):
                        a, b = b, a  # b (the dot's inner label) must be carried by a factor
                    if any(b in st for st in fl):
                        return "red2", [a, b]
        if w is None and g.reduce_rows and p.output.operand not in self.row_operands:
            big = sorted((l for l, _ in p.output.strides if sizes[l] > 8), key=lambda l: -sizes[l])[:2]
            if len(big) == 2 and not any(big[0] in st and big[1] in st for st in fl) \
                    and any(big[1] in st for st in fl):
                return "outer", big
        return None, None

    def path(self, g: Group, p: Path, accs: Dict[tuple, str], order: List[tuple], bounds=None):
        self.bounds = bounds or {}
        try:
            self._path(g, p, accs, order)
        finally:
            self.bounds = {}

    def _path(self, g: Group, p: Path, accs: Dict[tuple, str], order: List[tuple]):
        t = g.table
        sizes = p.label_sizes
        out_st = dict(p.output.strides)
        cand = [l for l, n in p.labels if n > 1]
        cand.sort(key=lambda l: (l not in out_st, -out_st.get(l, 0), -sizes[l]))
        block = cand[:2]
        # every path writing an output segment must use the same block shape for it: a dot form
        # keeps the generic output labels, unrolled ones re-enter as one-hot columns (_add)
        self.out_block = [l for l in block if l in out_st]
        form, dblock = self._dot_form(g, p, sizes, out_st)
        if form == "outer":
            self.out_block = dblock  # the weight gradient of one path is written by that path only
        if form is not None:
            ob = [l for l in dblock if l in out_st]
            if [l for l in self.out_block if l in ob] == ob:
                block = dblock
            else:
                form = None
        unrolled = [l for l, _ in p.labels if l not in block]
        nd = len(block)
        # factor order for the nested sum: smallest broadcast shape innermost. With ``in1_outer``
        # the first input (x or a) goes outermost among equals, so a weight gradient
        # sum_k x_k * (...)_k reuses the inner sums (...)_k already formed for gx / dx (CSE through
        # self.exprs): fewer multiply-adds, longer-lived values (see generate)
        fsize = []
        for n, f in enumerate(p.factors):
            st = dict(f.strides)
            fsize.append((sum(1 for l in block if l in st) + (f.operand in self.row_operands),
                          self.in1_outer and f.operand in ("x", "a"), n))
        order_f = [n for *_, n in sorted(fsize)]
        by_k: Dict[int, list] = {}
        for comps, k, c in p.entries:
            by_k.setdefault(k, []).append((comps, c))
        for values in itertools.product(*[range(sizes[l]) for l in unrolled]):
            if self.only is not None and values != self.only:
                continue
            assign = dict(zip(unrolled, values))
            if form is not None:
                self._dot_path(form, g, p, block, order_f, by_k, assign, sizes, accs, order)
                continue
            w = self.load(t, p.weight, 0, assign, block, sizes) if p.weight is not None else None
            for k, ents in sorted(by_k.items()):
                s = self._nested(t, p, ents, order_f, assign, block, sizes)
                if s is None:
                    continue
                if w is not None:
                    v = self.body.tmp("t")
                    self.body.emit(f"{v} = {s} * {w}")
                    s = v
                if self.lazy_sums and nd and not self.out_block and not g.reduce_rows:
                    # every block label is summed: add the un-reduced block and reduce once per
                    # output component, after all paths writing it (one tl.sum, not one per path)
                    s, lazy = self._partial(s, tuple(_pow2(sizes[l]) for l in block))
                    self._add(g, p, k, s, assign, [], sizes, accs, order, lazy=lazy)
                    continue
                # reduce block labels that are not output labels (last axis first)
                for pos in reversed(range(nd)):
                    if block[pos] not in out_st:
                        v = self.body.tmp("t")
                        self.body.emit(f"{v} = tl.sum({s}, axis={pos + 1})")
                        s = v
                self._add(g, p, k, s, assign, self.out_block, sizes, accs, order)

    def _partial(self, s: str, shape: tuple) -> Tuple[str, tuple]:
        """A channel block to be summed later, first summed over groups of 4 neighbouring channels.
        Those 4 sit in one thread (16-byte vectors along a channel axis of >= 128, 32 lanes), so
        this needs no shuffles, and the accumulator holds a quarter of the registers; the final
        tl.sum shuffles once per output component instead of once per path (mace-large backward:
        355 -> 80 shuffles per thread, sm_90 SASS). Only where the caller asks (``partial``)."""
        if not self.partial_sums or len(shape) != 1 or shape[0] < 128:
            return s, shape
        v = self.body.tmp("t")
        self.body.emit(f"{v} = tl.sum(tl.reshape({s}, ({s}.shape[0], {shape[0] // 4}, 4)), axis=2)")
        return v, (shape[0] // 4,)

    def _reduce(self, name: str, shape: Optional[tuple] = None) -> str:
        """The channel-summed value of ``name``: an accumulator (identity unless it is un-reduced)
        or a block with summed axes of padded sizes ``shape``."""
        if shape is None:
            shape = self.lazy.pop(name, None)
            if shape is None:
                return name
            self.lazy_live -= math.prod(shape)
        for pos in reversed(range(len(shape))):
            v = self.body.tmp("t")
            self.body.emit(f"{v} = tl.sum({name}, axis={pos + 1})")
            name = v
        return name

    def _add(self, g: Group, p: Path, k: int, s: str, assign, have, sizes, accs, order, norows=False,
             lazy: Optional[tuple] = None):
        """Add block ``s`` (block labels ``have``) into the accumulator of output component ``k``,
        shaped by ``self.out_block`` (created on first use). ``lazy``: ``s`` still carries summed
        block axes of these padded sizes (reduced by _reduce before the store, or here when blocks
        of another shape meet)."""
        t = g.table
        out_block = self.out_block
        if list(have) != list(out_block):
            nd = len(out_block)
            idx = ", ".join([":"] + [":" if l in have else "None" for l in out_block])
            hot = [f"({self.arange(_pow2(sizes[l]), nd, pos)} == {assign[l]})"
                   for pos, l in enumerate(out_block) if l not in have]
            v = self.body.tmp("h")
            self.body.emit(f"{v} = tl.where({' & '.join(hot)}, {s}[{idx}], 0.0)")
            s = v
            assign = {l: i for l, i in assign.items() if l not in out_block}
        const, terms = self._address(t, p.output, k, assign, out_block)
        key = (g.out_ptr, const, terms, tuple(sizes[out_block[pos]] for _, pos in terms), len(out_block))
        self.store_info[key] = self._split_info(t, p.output, k, assign, out_block)
        if key in accs and self.lazy.get(accs[key]) != lazy:
            cur = self._reduce(accs[key])
            if lazy:
                s = self._reduce(s, lazy)
            v = self.body.tmp("acc")
            self.body.emit(f"{v} = {cur} + {s}")
            accs[key] = v
        elif key in accs:
            self.body.emit(f"{accs[key]} = {accs[key]} + {s}")
        elif lazy:
            name = self.body.tmp("acc")
            self.body.emit(f"{name} = {s}")
            self.lazy[name] = lazy
            self.lazy_live += math.prod(lazy)
            self.lazy_peak = max(self.lazy_peak, self.lazy_live)
            accs[key] = name
            order.append(key)
        elif g.reduce_rows:
            # keep the row axis in the loop; one cross-row reduction after it
            name = self.pre.tmp("racc")
            shape = ([] if norows else ["ROWS"]) + [str(_pow2(sizes[l])) for l in out_block]
            self.accpre.emit(f"{name} = tl.zeros([{', '.join(shape)}], DT)", 1)
            self.body.emit(f"{name} = {name} + {s}")
            if norows:
                self.norows.add(name)
            accs[key] = name
            order.append(key)
        else:
            name = self.body.tmp("acc")
            self.body.emit(f"{name} = {s}")
            accs[key] = name
            order.append(key)

    def _tile(self, t: Table, f: Factor, assign, block, sizes) -> str:
        """A shared (row-free) operand as a 2-D ``[P(block[0]), P(block[1])]`` tile, zero-padded."""
        const, terms = self._address(t, f, 0, assign, block)
        key = ("tile", f.operand, const, terms, tuple(sizes[l] for l in block))
        if key not in self.loads:
            if f.operand not in self.inputs:
                self.inputs.append(f.operand)
            name = self.body.tmp(f"{f.operand}_w")
            addr = [str(const)] + [f"{coef} * {self.arange(_pow2(sizes[block[pos]]), 2, pos, rows=False)}"
                                   for coef, pos in terms]
            mask = [self.colmask(_pow2(sizes[l]), sizes[l], 2, pos, rows=False) for pos, l in enumerate(block)
                    if _pow2(sizes[l]) != sizes[l]]
            mask_s = f", mask={' & '.join(mask)}, other=0.0" if mask else ""
            self.body.emit(f"{name} = tl.load({f.operand}_ptr + {' + '.join(addr)}{mask_s}).to(DT)")
            self.loads[key] = name
        return self.loads[key]

    def _rowblock(self, s: str, n: int) -> str:
        v = self.body.tmp("b")
        self.body.emit(f"{v} = tl.broadcast_to({s}, [ROWS, {n}])")
        return v

    def _dot(self, lhs: str, rhs: str) -> str:
        v = self.body.tmp("d")
        self.body.emit(f"{v} = tl.dot({lhs}, {rhs}, input_precision=PREC)")
        return v

    def _dot_path(self, form, g, p, block, order_f, by_k, assign, sizes, accs, order):
        t = g.table
        a, b = block
        pa, pb = _pow2(sizes[a]), _pow2(sizes[b])
        fl = [dict(f.strides) for f in p.factors]
        if form == "fwd":  # out_k[r, a] = (sum_e c prod F)[r, b] @ W[b, a]
            wt = self._tile(t, p.weight, assign, [b, a], sizes)
            for k, ents in sorted(by_k.items()):
                s = self._nested(t, p, ents, order_f, assign, [b], sizes)
                if s is not None:
                    self._add(g, p, k, self._dot(self._rowblock(s, pb), wt), assign, [a], sizes, accs, order)
            return
        # red2 / outer: split the factors by which of the two labels they carry
        on_b = [n for n in order_f if b in fl[n]]
        on_a = [n for n in order_f if b not in fl[n]]
        groups: Dict[tuple, Dict[int, list]] = {}
        for k, ents in by_k.items():
            for comps, c in ents:
                groups.setdefault(tuple(comps[n] for n in on_b), {}).setdefault(k, []).append((comps, c))
        if form == "red2":  # out_k[r] = sum_a F_a[r, a] * (P_b[r, b] @ W[b, a])
            wt = self._tile(t, p.weight, assign, [b, a], sizes)
            per_k: Dict[int, List[str]] = {}
            for bc, ks in sorted(groups.items()):
                pbk = self._nested(t, p, [(next(iter(ks.values()))[0][0], 1.0)], on_b, assign, [b], sizes)
                d = self._dot(self._rowblock(pbk, pb), wt)
                for k, ents in ks.items():
                    inner = self._nested(t, p, ents, on_a, assign, [a], sizes) if on_a else \
                        self.const(sum(c for _, c in ents))
                    per_k.setdefault(k, []).append(f"{d} * {inner}")
            for k, terms in sorted(per_k.items()):
                v = self.body.tmp("t")
                self.body.emit(f"{v} = tl.sum({' + '.join(terms)}, axis=1)")
                self._add(g, p, k, v, assign, [], sizes, accs, order)
            return
        # outer: gW[a, b] += (sum_e c prod F_a)[r, a]^T @ P_b[r, b], accumulated over row blocks
        for bc, ks in sorted(groups.items()):
            pbk = self._nested(t, p, [(next(iter(ks.values()))[0][0], 1.0)], on_b, assign, [b], sizes)
            pbk = self._rowblock(pbk, pb)
            for k, ents in sorted(ks.items()):
                inner = self._nested(t, p, ents, on_a, assign, [a], sizes) if on_a else \
                    f"({self.const(sum(c for _, c in ents))} * tl.full([ROWS, 1], 1.0, DT))"
                self.min_rows = 16  # the row axis is this dot's inner (K) dimension
                lhs = self.body.tmp("l")
                self.body.emit(f"{lhs} = tl.trans({self._rowblock(inner, pa)})")
                self._add(g, p, k, self._dot(lhs, pbk), assign, [a, b], sizes, accs, order, norows=True)

    def _nested(self, t, p, ents, order_f, assign, block, sizes) -> Optional[str]:
        """sum_e c_e * prod_f F_f[comp_f], factored so the largest factor multiplies last."""
        if not order_f:
            return None
        last, rest = order_f[-1], order_f[:-1]
        groups: Dict[int, list] = {}
        for comps, c in ents:
            groups.setdefault(comps[last], []).append((comps, c))
        terms = []
        for comp, sub in sorted(groups.items()):
            f = self.load(t, p.factors[last], comp, assign, block, sizes)
            if rest:
                inner = self._nested(t, p, sub, rest, assign, block, sizes)
                terms.append(f"{f} * {inner}")
            else:
                c = sum(cc for _, cc in sub)
                terms.append(f"{self.const(c)} * {f}")
        expr = " + ".join(terms)
        if expr in self.exprs:
            return self.exprs[expr]
        v = self.body.tmp("s")
        self.body.emit(f"{v} = {expr}")
        self.exprs[expr] = v
        return v

    # --- stores -------------------------------------------------------------------------------
    def store(self, key, name: str, reduce_rows: bool, dims: Dict[str, int], to: _Writer, indent: int):
        out_ptr, const, terms, tsizes, nd = key
        addr = [str(const)] + [f"{coef} * {self.arange(_pow2(sz), nd, pos)}" for (coef, pos), sz in zip(terms, tsizes)]
        cmask = [self.colmask(_pow2(sz), sz, nd, pos) for (coef, pos), sz in zip(terms, tsizes) if _pow2(sz) != sz]
        if reduce_rows:
            # partials: one row per program; the aranges carry a leading row axis we drop
            addr = [str(const)] + [f"{coef} * {self.arange(_pow2(sz), nd, pos, rows=False)}"
                                   for (coef, pos), sz in zip(terms, tsizes)]
            cm = [self.colmask(_pow2(sz), sz, nd, pos, rows=False)
                  for (coef, pos), sz in zip(terms, tsizes) if _pow2(sz) != sz]
            prow = "noderow" if self.rowing.mode == "nodes" else "pid64"
            ptr = f"{out_ptr}_ptr + {prow} * {dims[out_ptr]} + " + " + ".join(addr)
            mask = f", mask={' & '.join(cm)}" if cm else ""
            val = name if name in self.norows else f"tl.sum({name}, axis=0)"
            if out_ptr in self.accumulate or key in self.acc_keys:
                val = f"({val} + tl.load({ptr}{mask}{', other=0.0' if cm else ''}).to(DT))"
            to.emit(f"tl.store({ptr}, {val}.to({out_ptr}_ptr.dtype.element_ty){mask})", indent)
        else:
            rows = self.rows(out_ptr, dims[out_ptr], nd)
            ptr = f"{out_ptr}_ptr + {rows} + " + " + ".join(addr)
            mask = " & ".join([self.rmask(nd)] + cmask)
            if out_ptr in self.rowing.scatter:  # a row other programs also add into: atomics
                for ln in self._atomic(ptr, name, out_ptr, mask):
                    to.emit(ln, indent)
                return
            if out_ptr in self.accumulate or key in self.acc_keys:
                name = f"({name} + {self._old(ptr, mask, out_ptr)})"
            to.emit(f"tl.store({ptr}, {name}.to({out_ptr}_ptr.dtype.element_ty), mask={mask})", indent)

    def _atomic(self, ptr: str, val: str, out_ptr: str, mask: str) -> List[str]:
        """Lines adding ``val`` into ``ptr`` atomically. The mask is materialised at the pointer's
        shape: Triton 3.6's interpreter reads a broadcast mask's memory as if it were full-size (a
        [1, 1] row mask with ROWS = 1 added one element of a row); compiled code folds the extra and."""
        p = self.body.tmp("ap")
        return [f"{p} = {ptr}",
                f"tl.atomic_add({p}, {val}.to({out_ptr}_ptr.dtype.element_ty), "
                f"mask=({mask}) & tl.full({p}.shape, 1, tl.int1), {RELAXED})"]

    def _store_segment(self, keys, accs, out_dims):
        for key in keys:
            accs[key] = self._reduce(accs[key])
        tiles: Dict[tuple, Dict[int, tuple]] = {}
        for key in keys:
            info = self.store_info.get(key)
            if info is not None:
                off, d, ch, comp = info
                tiles.setdefault((key[0], off, d, ch, key[3]), {})[comp] = key
        done = set()
        for (out_ptr, off, d, ch, tsizes), comps in tiles.items():
            if sorted(comps) != list(range(d)):
                continue
            size = tsizes[0]
            p = _pow2(size)
            names = [accs[comps[c]] for c in range(d)] + [None] * (_pow2(d) - d)
            tile = self._join(names, p)
            ptr, mask = self._tile_ptr(out_ptr, off, d, ch, p, size)
            if out_ptr in self.rowing.scatter:
                for ln in self._atomic(ptr, tile, out_ptr, mask):
                    self.body.emit(ln)
                done.update(comps.values())
                continue
            if out_ptr in self.accumulate or self.acc_keys & set(comps.values()):
                tile = f"({tile} + {self._old(ptr, mask, out_ptr)})"
            self.body.emit(f"tl.store({ptr}, {tile}.to({out_ptr}_ptr.dtype.element_ty), mask={mask})")
            done.update(comps.values())
        for key in keys:
            if key not in done:
                self.store(key, accs[key], False, out_dims, self.body, 2)

    @staticmethod
    def _ranges(t: Table) -> Dict[int, Set[Tuple[int, int]]]:
        """Output segment -> (base, size) of the channel ranges its single-label paths write."""
        res: Dict[int, Set[Tuple[int, int]]] = {}
        for q in t.paths:
            if len(q.output.strides) == 1 and q.output.strides[0][1] == 1:
                res.setdefault(q.output.segment, set()).add((q.output.base, q.label_sizes[q.output.strides[0][0]]))
        return res

    def _widen(self, t: Table, p: Path, ranges) -> Tuple[Path, Dict[str, Tuple[int, int]]]:
        """Give a path whose output channels are a sub-range [b, b+n) of its segment (the per-u
        sub-paths of the triangular modes, seen from y) a block over the whole segment, masked to
        [b, b+n), when another path writes an overlapping range of another width: every path
        writing that segment then uses one block shape. Returns the path and its label bounds."""
        seg = t.operand(p.output.operand).segments[p.output.segment]
        if len(p.output.strides) != 1 or p.output.strides[0][1] != 1:
            return p, {}
        (l, _), = p.output.strides
        b, n = p.output.base, p.label_sizes[l]
        # (weight slices never overlap, so weight gradients keep their own blocks)
        if (b == 0 and n == seg.mul) or not any(ob < b + n and b < ob + on and (ob, on) != (b, n)
                                                for ob, on in ranges[p.output.segment]):
            return p, {}

        def shift(f):
            st = {} if f is None else dict(f.strides)
            return f if l not in st else Factor(f.operand, f.segment, f.base - st[l] * b, f.strides)

        q = Path(tuple(shift(f) for f in p.factors), shift(p.weight), shift(p.output),
                 tuple((k, seg.mul if k == l else m) for k, m in p.labels), p.entries)
        return q, {l: (b, b + n)}

    def build(self) -> Tuple[str, KernelMeta]:
        accs: Dict[tuple, str] = {}
        order: List[tuple] = []
        out_dims = {g.out_ptr: g.table.operand(g.table.output).dim for g in self.groups}
        self.out_dims = out_dims
        reduce = {g.out_ptr: g.reduce_rows for g in self.groups}
        coverage: Dict[str, Dict[int, tuple]] = {g.out_ptr: {} for g in self.groups}
        # Visit paths grouped by the segment of the cotangent / output they read or write, all groups
        # interleaved: a backward then uses each g tile for gx, gy and gw while it is in registers,
        # and every output block is stored (and dies) right after the last path that writes it.
        items = []
        for gi, g in enumerate(self.groups):
            ranges = self._ranges(g.table)
            items += [(gi,) + self._widen(g.table, p, ranges) for p in g.table.paths]

        def visit_key(item):
            gi, p, _ = item
            # first-input-major: a segment's x (or a) tiles and its gx (or dx) accumulators live
            # only while its paths run; with one forward path per output segment every g tile is
            # still loaded once
            gseg = path_segment(p)
            return (path_segment(p, True), gseg, gi) if self.in1_major else (gseg, gi)

        def unit(gi, p):  # weights: every path owns its slice, so each path is its own unit
            seg = self.groups[gi].table.operand(p.output.operand).segments[p.output.segment]
            return (gi, p.output.segment, p.output.base if seg.dim == 1 else None)

        items.sort(key=visit_key)
        if self.merge:
            items = merge(items, frozenset(self.row_operands))
        if self.rowing.mode == "nodes":
            if self.rowing.sections in ("segment", "in1", "in1all"):
                return self._assemble(*self._node_sections(items, accs, order, out_dims), accs, order, out_dims,
                                      reduce, coverage)
            self.accpre = _Writer()  # carried node accumulators start at zero for every node
        last = {unit(gi, p): n for n, (gi, p, _) in enumerate(items)}
        pending: Dict[tuple, List[tuple]] = {}
        stored: Set[tuple] = set()
        deferred = []
        for n, (gi, p, bounds) in enumerate(items):
            g = self.groups[gi]
            form, dblock = self._dot_form(g, p, p.label_sizes, dict(p.output.strides)) if not bounds else (None, None)
            if form == "outer":
                deferred.append((gi, p, dblock))  # its [A, B] accumulator gets a row loop of its own
                continue
            before = set(accs)
            self.path(g, p, accs, order, bounds)
            if stored & set(accs):
                raise Unsupported("an output block is written again after it was stored")
            u = unit(gi, p)
            pending.setdefault(u, []).extend(k for k in accs if k not in before)
            if last[u] == n and not g.reduce_rows:
                keys = pending.pop(u, [])
                self._store_segment(keys, accs, out_dims)
                stored.update(keys)
                for k in keys:  # stored blocks are dead; a later write must start a new block
                    del accs[k]
        main, sections = self.body.lines, []
        if self.rowing.mode == "nodes" and deferred:
            raise Unsupported("row-summed weight-gradient tiles in a node-parallel kernel")
        units: Dict[tuple, list] = {}
        for gi, p, block in deferred:  # paths writing the same weight slice (e.g. two double-backward terms)
            sizes = p.label_sizes
            labels = [l for l, _ in p.labels if l not in block]
            for values in itertools.product(*[range(sizes[l]) for l in labels]):
                units.setdefault((unit(gi, p), values), []).append((gi, p, values))
        for paths in units.values():
            # one row loop per [A, B] weight-gradient tile: only its accumulator is live
            self.body.lines, self.accpre = [], _Writer()
            self.loads, self.tiles, self.rowexpr, self.rowmask, self.exprs = {}, {}, {}, {}, {}
            start = len(order)
            for gi, p, values in paths:
                self.only = values
                self.path(self.groups[gi], p, accs, order)
            self.only = None
            post = _Writer()
            for key in order[start:]:
                self.store(key, accs[key], True, out_dims, post, 1)
            sections.append((self.accpre.lines, self.body.lines, post.lines))
        return self._assemble(main, sections, set(), accs, order, out_dims, reduce, coverage)

    def _node_sections(self, items, accs, order, out_dims):
        """Node-parallel kernels: one edge loop per output segment, so only that segment's carried
        accumulators are live; each is reduced over its ROWS edge slots once per node."""
        units: Dict[tuple, list] = {}
        if self.rowing.sections == "in1all":
            # one edge loop per first-input segment for all groups: only that segment's x tiles,
            # owned-node tiles and outputs are live; per-edge outputs that several loops write
            # (gy) are added into by the later loops
            for gi, p, bounds in items:
                units.setdefault(path_segment(p, True), []).append((gi, p, bounds))
            return self._sections(units, accs, order, out_dims)
        by_in1 = self.rowing.sections == "in1"
        if by_in1:  # only when every output segment is written from one first-input segment
            owner: Dict[tuple, int] = {}
            by_in1 = all(owner.setdefault((gi, p.output.segment), path_segment(p, True)) == path_segment(p, True)
                         for gi, p, _ in items)
        for gi, p, bounds in items:
            seg = path_segment(p, True) if by_in1 else p.output.segment
            units.setdefault((gi, seg), []).append((gi, p, bounds))
        return self._sections(units, accs, order, out_dims)

    def _sections(self, units, accs, order, out_dims):
        sections, stored = [], set()
        for paths in units.values():
            self.body.lines, self.accpre = [], _Writer()
            self.index, self.fetch = _Writer(), _Writer()
            self.loads, self.tiles, self.rowexpr, self.rowmask, self.exprs = {}, {}, {}, {}, {}
            start = len(order)
            for gi, p, bounds in paths:
                self.path(self.groups[gi], p, accs, order, bounds)
            post = _Writer()
            keys = order[start:]
            carried = {g.out_ptr for g in self.groups if g.reduce_rows}
            self._store_segment([k for k in keys if k[0] not in carried], accs, out_dims)
            for key in keys:
                if key[0] in carried:
                    self.store(key, accs[key], True, out_dims, post, 1)
            stored.update(keys)
            self.acc_keys.update(keys)
            for key in keys:  # a later loop writing the same block starts a new accumulator
                del accs[key]
            sections.append((self.accpre.lines, self.body.lines, post.lines))
            self.fetches.append((self.index.lines, self.fetch.lines))
        return [], sections, stored

    def _assemble(self, main, sections, stored, accs, order, out_dims, reduce, coverage):
        done = {k for k in order if accs.get(k) in self.norows} | stored
        for key in order:
            if reduce[key[0]] and key not in done:
                self.store(key, accs[key], True, out_dims, self.post, 1)
            self._cover(key, coverage)
        zero_init = tuple(g.out_ptr for g in self.groups if len(coverage[g.out_ptr]) < out_dims[g.out_ptr])
        outs = tuple(g.out_ptr for g in self.groups)
        ins = tuple(self.inputs)
        args = ", ".join([f"{n}_ptr" for n in ins + outs + self.rowing.args]
                         + ["N", "NBLK", "ROWS: tl.constexpr", "DT: tl.constexpr", "PREC: tl.constexpr"])
        src = ["@triton.jit", f"def {self.name}({args}):"]
        src.append("    pid = tl.program_id(0)")
        src.append("    pid64 = pid.to(tl.int64)")
        src.append("    nprog = tl.num_programs(0)")
        src.append("    rr = tl.arange(0, ROWS)")
        src += self.pre.lines
        loop = ["    for blk in range(pid, NBLK, nprog):", "        r = blk * ROWS + rr", "        rmask = r < N",
                "        r64 = r.to(tl.int64)"] + self.rowing.prologue("        ")
        if self.rowing.mode == "nodes":
            # N nodes; node n's edges are perm[nptr[n]:nptr[n+1]] (r64 = edge id in the loop)
            src += ["    for node in range(pid, N, nprog):", "        noderow = tl.full([1], 0, tl.int64) + node",
                    "        e0 = tl.load(nptr_ptr + node)", "        e1 = tl.load(nptr_ptr + node + 1)"]
            inner = [f"        for k0 in {self.rowing.edge_range}:", "            r = k0 + rr", "            rmask = r < e1",
                     "            r64 = tl.load(perm_ptr + r, mask=rmask, other=0).to(tl.int64)"]
            inner += self.rowing.prologue("            ")
            if main:  # sections == "one": carried accumulators initialised per node, stored after
                sections = [(self.accpre.lines, main, self.post.lines)]
                self.fetches = [(self.index.lines, self.fetch.lines)]
                self.post.lines = []
            for n, (init, body, post) in enumerate(sections):
                loop = (self._pipelined(body, *self.fetches[n]) if self.rowing.prefetch
                        else inner + ["    " + ln for ln in body])
                src += ["    " + ln for ln in init] + loop + ["    " + ln for ln in post]
            if not sections:
                src.append("        pass")
        else:
            if main or not sections:
                src += loop + (main or ["        pass"])
            for init, body, post in sections:
                src += init + loop + body + post
        src += self.post.lines
        if self.rowing.mode == "rows" and not self.rowing.index:
            if self.prefetch > 0:
                src = _prefetched(src, self.prefetch)
            if self.l2 is not None:
                src = l2_prefetched(src, self.l2)
        meta = KernelMeta(self.name, ins, outs, zero_init, tuple(g.out_ptr for g in self.groups if g.reduce_rows),
                          self.min_rows)
        return "\n".join(src) + "\n", meta

    def _pipelined(self, body: List[str], index: List[str], fetch: List[str]) -> List[str]:
        """A node's edge loop, software-pipelined (Rowing.prefetch): step k loads the edge ids of
        step k + D + 2 and the gathered node ids of step k + D + 1 (values carried across
        iterations), so no load waits on another issued in the same step; with "all" (D = 1) the
        per-edge operands of step k + 1 are also loaded before step k's arithmetic. Every step
        beyond the node's last edge is masked: it moves no data."""
        d = 1 if self.rowing.prefetch == "all" else 0
        ids, gathered = d + 2, d + 1   # steps ahead: perm, src / dst
        defined = [m.group(1) for ln in index + fetch for m in [re.match(r"\s*(\w+) = ", ln)] if m]
        data = [m.group(1) for ln in fetch for m in [re.match(r"\s*(\w+) = ", ln)] if m]
        pat = re.compile(r"\b(" + "|".join(["r64", "rmask"] + list(self.rowing.index) + defined) + r")\b")

        def at(lines, j, ind):  # the step-k lines rewritten for step k + j
            sfx = f"__{j}" if j else ""
            return [ind + pat.sub(lambda m: m.group(1) + sfx, ln.strip()) for ln in lines]

        def ids_at(j, start, ind):
            return [f"{ind}rmask__{j} = ({start} + {j} * ROWS + rr) < e1",
                    f"{ind}r64__{j} = tl.load(perm_ptr + {start} + {j} * ROWS + rr, mask=rmask__{j}, other=0).to(tl.int64)"]

        o, i = "        ", "            "
        src = [f"{o}rmask = (e0 + rr) < e1", f"{o}r64 = tl.load(perm_ptr + e0 + rr, mask=rmask, other=0).to(tl.int64)"]
        for j in range(1, ids):
            src += ids_at(j, "e0", o)
        for j in range(gathered):
            src += at(self.rowing.prologue(""), j, o)
        for j in range(d):
            src += at(index + fetch, j, o)
        src += [f"{o}for k0 in {self.rowing.edge_range}:", f"{i}rmask = (k0 + rr) < e1"] + ids_at(ids, "k0", i)
        src += [f"{i}rmask__{gathered} = (k0 + {gathered} * ROWS + rr) < e1"] + at(self.rowing.prologue(""), gathered, i)
        if d:
            src += [f"{i}rmask__{d} = (k0 + {d} * ROWS + rr) < e1"] + at(index + fetch, d, i) + at(index, 0, i)
        src += ["    " + ln for ln in body]
        for j in range(ids):  # shift the carried values one step
            src.append(f"{i}r64{f'__{j}' if j else ''} = r64__{j + 1}")
        for var in self.rowing.index:
            src += [f"{i}{var}{f'__{j}' if j else ''} = {var}__{j + 1}" for j in range(gathered)]
        for name in data:
            src += [f"{i}{name}{f'__{j}' if j else ''} = {name}__{j + 1}" for j in range(d)]
        return src

    def _cover(self, key, coverage):
        out_ptr, const, terms, tsizes, nd = key
        cov = coverage[out_ptr]
        addrs = [const]
        for (coef, _), sz in zip(terms, tsizes):
            addrs = [a + coef * i for a in addrs for i in range(sz)]
        sig = (terms, tsizes)
        for a in addrs:
            if a in cov and cov[a] != sig:
                raise Unsupported(f"output {out_ptr}: element {a} written by blocks of different shapes")
            cov[a] = sig


_LOAD = re.compile(r"^(\s+)(\w+) = (tl\.load\(.*\))\.to\(DT\)$")
_ADDR = re.compile(r"^\s+(\w+_r\d+ = r64\b|rm\d+ = rmask\b)")


def _row_loops(src: List[str], rewrite) -> List[str]:
    """``src`` with the body of every row-block loop (``for blk in range(...)``) replaced by
    ``rewrite(body)``."""
    out, i = [], 0
    while i < len(src):
        out.append(src[i])
        i += 1
        if not src[i - 1].startswith("    for blk in range("):
            continue
        j = i
        while j < len(src) and src[j].startswith("        "):
            j += 1
        out += rewrite(src[i:j])
        i = j
    return out


def _prefetched(src: List[str], ahead: int) -> List[str]:
    """``src`` with every row-block loop's loads issued ``ahead`` loads early: load i moves, still
    in the stored dtype, to where load i - ``ahead`` is; its conversion to DT stays where it was.
    Row addresses and masks (pure functions of r64) go to the top of the loop body."""
    def rewrite(body):
        head = body[:3]  # r, rmask, r64
        addr = [ln for ln in body[3:] if _ADDR.match(ln)]
        rest = [ln for ln in body[3:] if not _ADDR.match(ln)]
        loads = [n for n, ln in enumerate(rest) if _LOAD.match(ln)]
        moved: Dict[int, List[str]] = {}
        new = list(rest)
        for k, n in enumerate(loads):
            to = loads[max(0, k - ahead)]
            if to == n:
                continue
            ind, name, expr = _LOAD.match(rest[n]).groups()
            moved.setdefault(to, []).append(f"{ind}{name}__raw = {expr}")
            new[n] = f"{ind}{name} = {name}__raw.to(DT)"
        out = head + addr
        for n, ln in enumerate(new):
            out += moved.get(n, []) + [ln]
        return out
    return _row_loops(src, rewrite)


_ROWADDR = re.compile(r"^(\s+)(\w+)_r1 = r64\[:, None\] \* (\d+)$")
_TILE = re.compile(r"tl\.load\((\w+)_ptr \+ \1_r1 \+ (\d+)(?: \+ (\d+) \* i(\d+)_\d+)?")
L2_CHUNK = 1024  # elements per prefetched chunk: 32 addresses 32 elements apart (one 128-byte line each in float32)


def l2_prefetched(src: List[str], ahead: int = 0) -> List[str]:
    """``src`` with the half-precision row operands each row-block loop reads asked into L2
    (``prefetch.global.L2``, no registers held) in chunks of L2_CHUNK elements, one instruction per
    thread per chunk: every chunk at the top of the loop (``ahead`` 0), or ``ahead`` loads before
    the first load that reads it. A half-precision warp moves half the bytes per load, so its loads
    alone keep too few bytes in flight; float32 builds (the test on the pointer's element width is
    resolved at compile time) get no prefetch: there they made the kernels slower (H200, mace-large
    backward 0.75 -> 0.86-1.0 ms). Not for the interpreter
    (inline asm)."""
    def rewrite(body):
        dims = {m.group(2): int(m.group(3)) for ln in body for m in [_ROWADDR.match(ln)] if m}
        loads, first = [], {}
        for n, ln in enumerate(body):
            m = _TILE.search(ln)
            if not m or m.group(1) not in dims:
                continue
            op, off = m.group(1), int(m.group(2))
            last = off + (int(m.group(3)) * (int(m.group(4)) - 1) if m.group(3) else 0)
            for c in range(off // L2_CHUNK, last // L2_CHUNK + 1):
                first.setdefault((op, c), len(loads))
            loads.append(n)
        if not loads:
            return body
        at: Dict[int, List[str]] = {}
        for (op, c), k in first.items():
            at.setdefault(loads[max(0, k - ahead)] if ahead else loads[0], []).extend([
                f"        if {op}_ptr.dtype.element_ty.primitive_bitwidth <= 16:",
                f'            tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.b32 $0, 0;", "=r,l", '
                f"[{op}_ptr + {op}__pfr + tl.minimum({c * L2_CHUNK} + pfi, {dims[op] - 1})], dtype=tl.int32, "
                f"is_pure=False, pack=1)"])
        at[loads[0]] = (["        pfi = tl.arange(0, 32)[None, :] * 32"]
                        + [f"        {op}__pfr = tl.minimum(r64, N - 1)[:, None] * {dims[op]}"
                           for op in dict.fromkeys(o for o, _ in first)] + at.get(loads[0], []))
        return [x for n, ln in enumerate(body) for x in at.get(n, []) + [ln]]
    return _row_loops(src, rewrite)


def generate(name: str, groups: Sequence[Group], layout: str, choice: KernelChoice,
             rowing: Optional[Rowing] = None) -> Tuple[str, KernelMeta]:
    """Kernel source and metadata of ``groups`` built as ``choice`` says (plan_types.KernelChoice).
    Where the un-reduced channel accumulators (KernelBuilder._add) would exceed
    ``choice.lazy_budget`` padded elements per row, the kernel is generated with a reduction per
    path instead (those accumulators cost registers)."""
    b = KernelBuilder(name, groups, layout, choice, rowing)
    res = b.build()
    if choice.lazy_budget is not None and b.lazy_peak > choice.lazy_budget:
        res = KernelBuilder(name, groups, layout, choice, rowing, lazy=False).build()
    return res
