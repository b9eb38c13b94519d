"""The path table: one IR for every product equikernels evaluates.

A table is a sum of *paths*. Each path multiplies n component-carrying factors (segments of named
operands such as ``x``, ``y``, ``g``) and an optional weight factor, contracts their components
with a sparse coefficient list (CG entries with every normalisation constant folded in) and adds
the result into one segment of the output operand.

Channels are described by *labels* (``u``, ``v``, ``w``...): each factor's channel index is
``base + sum(stride[label] * index[label])``. Labels absent from the output are summed. This
covers all e3nn modes (uvw, uvu, uvv, uuw, uuu, uvuv and the triangular ones) and, because the
derivatives of a multilinear map are multilinear maps of the same shape, every gradient is just a
new table built by relabelling (``grad_table``). Nothing here knows about bilinearity: a path may
have any number of factors (the symmetric contraction is a degree-nu path).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from ._compat import o3
from .problem import TPProblem

CG_ZERO_TOL = 1e-10  # wigner_3j entries below this are numerical zeros


@dataclass(frozen=True)
class Segment:
    """``mul`` copies of a ``dim``-dimensional irrep, starting at ``offset`` of a feature row."""
    offset: int
    mul: int
    dim: int


@dataclass(frozen=True)
class Operand:
    """A named tensor argument. ``dim`` is the row length; ``segments`` its irrep blocks."""
    name: str
    dim: int
    segments: Tuple[Segment, ...]


@dataclass(frozen=True)
class Factor:
    operand: str
    segment: int
    base: int
    strides: Tuple[Tuple[str, int], ...]  # (label, stride) pairs


@dataclass(frozen=True)
class Path:
    factors: Tuple[Factor, ...]  # component-carrying factors, in entry order
    weight: Optional[Factor]     # component-free factor (segment dim 1), or None
    output: Factor
    labels: Tuple[Tuple[str, int], ...]  # label -> size
    entries: Tuple[Tuple[Tuple[int, ...], int, float], ...]  # (factor components, output component, coef)

    @property
    def label_sizes(self) -> Dict[str, int]:
        return dict(self.labels)


@dataclass(frozen=True)
class Table:
    operands: Tuple[Operand, ...]  # every operand a factor or the output refers to
    output: str
    paths: Tuple[Path, ...]

    def operand(self, name: str) -> Operand:
        for op in self.operands:
            if op.name == name:
                return op
        raise KeyError(name)


def _segments(irreps) -> Tuple[Segment, ...]:
    segs, off = [], 0
    for mul, l, _ in irreps:
        segs.append(Segment(off, mul, 2 * l + 1))
        off += mul * (2 * l + 1)
    return tuple(segs)


@functools.lru_cache(maxsize=None)
def cg_entries(l1: int, l2: int, l3: int) -> Tuple[Tuple[int, int, int, float], ...]:
    """Nonzero entries of e3nn's real wigner_3j(l1, l2, l3), computed in float64."""
    w = o3.wigner_3j(l1, l2, l3, dtype=torch.float64)
    nz = (w.abs() > CG_ZERO_TOL).nonzero().tolist()
    return tuple((i, j, k, float(w[i, j, k])) for i, j, k in nz)


def _labels_for(mode: str, m1: int, m2: int, mo: int, woff: int):
    """Yield (x labels, y labels, out labels, weight (base, strides), label sizes) sub-paths.

    The triangular modes are split into one sub-path per u so that every index stays linear.
    """
    L = lambda **kw: tuple(kw.items())  # noqa: E731
    if mode == "uvw":
        yield (0, L(u=1)), (0, L(v=1)), (0, L(w=1)), (woff, L(u=m2 * mo, v=mo, w=1)), L(u=m1, v=m2, w=mo)
    elif mode == "uvu":
        yield (0, L(u=1)), (0, L(v=1)), (0, L(u=1)), (woff, L(u=m2, v=1)), L(u=m1, v=m2)
    elif mode == "uvv":
        yield (0, L(u=1)), (0, L(v=1)), (0, L(v=1)), (woff, L(u=m2, v=1)), L(u=m1, v=m2)
    elif mode == "uuw":
        yield (0, L(u=1)), (0, L(u=1)), (0, L(w=1)), (woff, L(u=mo, w=1)), L(u=m1, w=mo)
    elif mode == "uuu":
        yield (0, L(u=1)), (0, L(u=1)), (0, L(u=1)), (woff, L(u=1)), L(u=m1)
    elif mode == "uvuv":
        yield (0, L(u=1)), (0, L(v=1)), (0, L(u=m2, v=1)), (woff, L(u=m2, v=1)), L(u=m1, v=m2)
    elif mode in ("uvu<v", "u<vw"):
        q0 = 0
        for u0 in range(m1 - 1):
            n = m1 - 1 - u0  # pairs (u0, v) with v > u0
            if mode == "uvu<v":
                yield (u0, ()), (u0 + 1, L(v=1)), (q0, L(v=1)), (woff + q0, L(v=1)), L(v=n)
            else:
                yield (u0, ()), (u0 + 1, L(v=1)), (0, L(w=1)), (woff + q0 * mo, L(v=mo, w=1)), L(v=n, w=mo)
            q0 += n
    else:  # pragma: no cover - validated in TPProblem
        raise ValueError(mode)


def tp_table(problem: TPProblem) -> Table:
    """Forward table of a TPProblem: operands ``x``, ``y``, ``w`` -> ``out``."""
    segs1, segs2, segso = (_segments(problem.irreps_in1), _segments(problem.irreps_in2),
                           _segments(problem.irreps_out))
    wnum = problem.weight_numel
    operands = (
        Operand("x", problem.dim_in1, segs1),
        Operand("y", problem.dim_in2, segs2),
        Operand("w", wnum, (Segment(0, wnum, 1),)),
        Operand("out", problem.dim_out, segso),
    )
    paths, woff = [], 0
    for ins, coef in zip(problem.instructions, problem.path_coefficients):
        m1, l1, _ = problem.irreps_in1[ins.i_in1]
        m2, l2, _ = problem.irreps_in2[ins.i_in2]
        mo, lo, _ = problem.irreps_out[ins.i_out]
        numel = math.prod(ins.path_shape(problem)) if ins.has_weight else 0
        if m1 and m2 and mo and coef != 0.0:
            entries = tuple(((i, j), k, c * coef) for i, j, k, c in cg_entries(l1, l2, lo))
            for (xb, xs), (yb, ys), (ob, os_), (wb, ws), sizes in _labels_for(ins.mode, m1, m2, mo, woff):
                out_strides = os_
                if ins.mode == "uuw" and not ins.has_weight:
                    out_strides = ()  # unweighted uuw sums u into its single output channel
                sizes = tuple((k, n) for k, n in sizes if n > 0)
                if any(n == 0 for _, n in sizes):
                    continue
                paths.append(Path(
                    factors=(Factor("x", ins.i_in1, xb, xs), Factor("y", ins.i_in2, yb, ys)),
                    weight=Factor("w", 0, wb, ws) if ins.has_weight else None,
                    output=Factor("out", ins.i_out, ob, out_strides),
                    labels=sizes,
                    entries=entries,
                ))
        woff += numel
    return Table(operands, "out", tuple(paths))


def grad_table(table: Table, wrt: str, cotangent: str = "g") -> Table:
    """Table of d<cotangent, table(...)>/d(wrt): the output becomes a factor named ``cotangent``.

    ``wrt`` may be a component-carrying operand (its components become the output components) or
    the weight operand (output components collapse to a single one).
    """
    out_op = table.operand(table.output)
    target = table.operand(wrt)
    operands = tuple(op for op in table.operands if op.name != table.output)
    operands += (Operand(cotangent, out_op.dim, out_op.segments),)
    paths = []
    for p in table.paths:
        g = Factor(cotangent, p.output.segment, p.output.base, p.output.strides)
        if p.weight is not None and p.weight.operand == wrt:
            factors = p.factors + (g,)
            entries = tuple((comps + (k,), 0, c) for comps, k, c in p.entries)
            paths.append(Path(factors, None, p.weight, p.labels, entries))
            continue
        hits = [n for n, f in enumerate(p.factors) if f.operand == wrt]
        for n in hits:  # product rule: one path per occurrence of the operand
            factors = p.factors[:n] + p.factors[n + 1:] + (g,)
            entries = tuple((comps[:n] + comps[n + 1:] + (k,), comps[n], c) for comps, k, c in p.entries)
            paths.append(Path(factors, p.weight, p.factors[n], p.labels, entries))
    return Table(operands, target.name, tuple(paths))


def rename(table: Table, mapping: Dict[str, str]) -> Table:
    """Same table with operands renamed (used to substitute arguments, e.g. in double backward)."""
    r = lambda n: mapping.get(n, n)  # noqa: E731
    fr = lambda f: None if f is None else Factor(r(f.operand), f.segment, f.base, f.strides)  # noqa: E731
    ops = tuple(Operand(r(o.name), o.dim, o.segments) for o in table.operands)
    paths = tuple(Path(tuple(fr(f) for f in p.factors), fr(p.weight), fr(p.output), p.labels, p.entries)
                  for p in table.paths)
    return Table(ops, r(table.output), paths)


def channel_label(table: Table, mul: int) -> Optional[str]:
    """The one label of size ``mul`` that every path of ``table`` has (the channel of a channel-wise
    product), or None when some path has none or several."""
    names = set()
    for p in table.paths:
        labels = [l for l, n in p.labels if n == mul]
        if len(labels) != 1:
            return None
        names.add(labels[0])
    return names.pop() if len(names) == 1 else None


def channel_slice(table: Table, label: str, lo: int, hi: int) -> Table:
    """``table`` restricted to channels [lo, hi) of ``label``: every factor reading the label starts
    ``lo`` channels further, the label has ``hi - lo`` values. Operand layouts are unchanged, so
    the slices of a table write disjoint parts of every output that carries the label and partial
    sums of every output that does not."""
    def shift(f):
        st = {} if f is None else dict(f.strides)
        return f if label not in st else Factor(f.operand, f.segment, f.base + st[label] * lo, f.strides)

    paths = []
    for p in table.paths:
        size = p.label_sizes.get(label)
        if size is None or not 0 <= lo < hi <= size:
            raise ValueError(f"channel_slice: channels [{lo}, {hi}) of {label!r} outside a path's {size}")
        labels = tuple((l, hi - lo if l == label else n) for l, n in p.labels)
        paths.append(Path(tuple(shift(f) for f in p.factors), shift(p.weight), shift(p.output), labels, p.entries))
    return Table(table.operands, table.output, tuple(paths))


def substitute(table: Table, old: str, new: str) -> Table:
    """Directional derivative of ``table`` along operand ``old``, the direction named ``new``: the
    paths that read ``old``, with ``new`` in its place. Paths without ``old`` (e.g. unweighted
    instructions when ``old`` is the weight) are constant in it and dropped.

    Each path must read ``old`` at most once (true of every tensor-product table); a repeated
    operand would need one term per occurrence.
    """
    keep = []
    for p in table.paths:
        n = sum(f.operand == old for f in p.factors + ((p.weight,) if p.weight is not None else ()))
        if n > 1:
            raise ValueError(f"substitute: a path reads operand {old!r} {n} times; expected at most once")
        if n:
            keep.append(p)
    return rename(Table(table.operands, table.output, tuple(keep)), {old: new})


def combine(tables) -> Table:
    """Sum of tables writing the same output (e.g. the three forward terms of a double backward)."""
    tables = [t for t in tables if t is not None]
    out = tables[0].output
    if any(t.output != out for t in tables):
        raise ValueError("combine: tables write different outputs")
    ops: Dict[str, Operand] = {}
    for t in tables:
        for o in t.operands:
            ops.setdefault(o.name, o)
    return Table(tuple(ops.values()), out, tuple(p for t in tables for p in t.paths))


def double_backward_tables(table: Table, have: str, need: str) -> Dict[str, Table]:
    """Tables of the double backward by trilinearity (docs/architecture.md).

    With cotangents a, b, c of (gx, gy, gw) and upstream g, S = <g, T(a,y,w) + T(x,b,w) + T(x,y,c)>,
    where each term keeps only the paths that read the substituted operand (T(x,y,c) has no
    unweighted path: those do not depend on w).
    ``have`` lists the cotangents present (subset of "abc"), ``need`` the outputs wanted (subset of
    "xywg"). Returns output name -> table; derivative tables read ``g`` as the cotangent operand.
    """
    sub = {"a": ("x", "a"), "b": ("y", "b"), "c": ("w", "c")}
    keys = [k for k in "abc" if k in have]
    terms = [substitute(table, *sub[k]) for k in keys]
    res = {}
    if "g" in need and any(t.paths for t in terms):
        res["g"] = combine(terms)
    for wrt, skip in (("x", "a"), ("y", "b"), ("w", "c")):
        if wrt in need:
            parts = [grad_table(t, wrt) for k, t in zip(keys, terms) if k != skip]
            parts = [p for p in parts if p.paths]
            if parts:
                res[wrt] = combine(parts)
    return res
