"""The batched tensor product on CPU as dense per-instruction contractions.

Each instruction of a ``TPProblem`` is one multilinear contraction of strided views of its
operands' segments ([rows, mul, 2l+1]) with its dense Clebsch-Gordan block (normalisation folded
in): ``out[z,w,k] = sum C[i,j,k] x[z,u,i] y[z,v,j] W[(z),u,v,w]`` with the labels of its
connection mode. A gradient of a multilinear contraction is the contraction of the other operands
and the cotangent, so the backward is the same machinery with relabelled subscripts, and the double
backward is composed from both by trilinearity. The contraction order of every term is chosen once
(opt_einsum) and kept with the constants per (problem, layout, dtype); a call runs a few pairwise
``torch.einsum``/``bmm`` per instruction, with no per-coefficient Python work.

``equikernels.reference`` (the path-table evaluator) stays the oracle this is tested against.
"""
from __future__ import annotations

import functools
import math
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..dtypes import math_dtype_of
from ..ir import cg_entries
from ..problem import TPProblem

# channel labels and operand subscripts of each mode (x, y, weight, output); "q" is a pair index of
# the triangular modes, selected by the constant one-hot matrices P (q -> u) and Q (q -> v)
_MODES = {
    "uvw": ("ui", "vj", "uvw", "wk"), "uvu": ("ui", "vj", "uv", "uk"), "uvv": ("ui", "vj", "uv", "vk"),
    "uuw": ("ui", "uj", "uw", "wk"), "uuu": ("ui", "uj", "u", "uk"), "uvuv": ("ui", "vj", "uv", "uvk"),
    "uvu<v": ("ui", "vj", "q", "qk"), "u<vw": ("ui", "vj", "qw", "wk"),
}
_ROWS_FOR_ORDER = 4096  # the row count a contraction order is chosen for


class _Term:
    """One contraction: operand names with subscripts -> output subscripts, and its pairwise steps."""
    __slots__ = ("names", "subs", "out", "steps", "missing", "sizes")

    def __init__(self, names, subs, out, sizes: Dict[str, int]):
        self.names, self.subs, self.sizes = tuple(names), tuple(subs), sizes
        present = set("".join(subs))
        self.missing = tuple(c for c in out if c not in present)  # labels only the output carries: broadcast
        self.out = "".join(c for c in out if c in present)
        self.steps = _steps(",".join(subs) + "->" + self.out,
                            tuple(tuple(_ROWS_FOR_ORDER if c == "z" else sizes[c] for c in s) for s in subs))

    def run(self, ops: List[Tensor]) -> Tensor:
        if self.steps is None:
            return _pair(",".join(self.subs) + "->" + self.out, *ops) if len(ops) == 2 else \
                torch.einsum(",".join(self.subs) + "->" + self.out, *ops)
        ops = list(ops)
        for inds, eq in self.steps:
            args = [ops.pop(i) for i in inds]
            ops.append(_pair(eq, *args) if len(args) == 2 else torch.einsum(eq, *args))
        return ops[0]


def _pair(eq: str, a: Tensor, b: Tensor) -> Tensor:
    """One pairwise contraction. Both operands per row (label z): one bmm over rows with the smaller
    operand on the left where a row is a real matrix product, else a broadcast product summed over
    the contracted labels (torch.einsum's own bmm orientation can be several times slower on CPU).
    Otherwise einsum, whose GEMM then spans all rows."""
    rec = _pair_recipe(eq)
    if rec is None:
        return torch.einsum(eq, a, b)
    pa, ea, pb, eb, red = rec
    bm = _bmm_recipe(eq) if red else None
    if bm is not None:
        r = _batched_matmul(bm, a, b)
        if r is not None:
            return r
    r = torch.mul(_align(a, pa, ea), _align(b, pb, eb))
    if not red:
        return r
    if all(r.shape[d] == 1 for d in red):  # nothing to sum: a view, not a reduction's copy
        return r.view(r.shape[:red[0]])
    return r.sum(red)


@functools.lru_cache(maxsize=None)
def _bmm_recipe(eq: str):
    """For a pairwise contraction whose only label kept from both operands is the row label z:
    (labels of a, of b, kept from a, kept from b, contracted, output); None otherwise."""
    ins, out = eq.split("->")
    sa, sb = ins.split(",")
    shared_kept = [c for c in out if c in sa and c in sb]
    contracted = [c for c in sa if c in sb and c not in out]
    if shared_kept != ["z"] or not contracted or any(c not in out and c not in contracted for c in sa + sb):
        return None
    fa = [c for c in sa if c in out and c != "z"]
    fb = [c for c in sb if c in out and c != "z"]
    return sa, sb, tuple(fa), tuple(fb), tuple(contracted), out


def _batched_matmul(rec, a: Tensor, b: Tensor) -> Optional[Tensor]:
    """The contraction as one bmm over rows, the smaller operand on the left: on CPU a product whose
    rows are few and long runs several times faster than one of many short rows. None where a row
    is a single dot product or sums nothing (the broadcast product is then cheaper)."""
    sa, sb, fa, fb, ks, out = rec
    size = dict(zip(sa, a.shape))
    if any(size.setdefault(c, n) != n for c, n in zip(sb, b.shape)):
        return None  # a label broadcast on one side
    nk, na, nb = (math.prod(size[c] for c in labels) for labels in (ks, fa, fb))
    if nk < 2 or na * nb < 2:
        return None
    if a.numel() > b.numel():
        (a, sa, fa, na), (b, sb, fb, nb) = (b, sb, fb, nb), (a, sa, fa, na)
    z = size["z"]
    left = a.permute([sa.index(c) for c in ("z", *fa, *ks)]).reshape(z, na, nk)
    right = b.permute([sb.index(c) for c in ("z", *ks, *fb)]).reshape(z, nk, nb)
    r = torch.bmm(left, right).view([z] + [size[c] for c in fa] + [size[c] for c in fb])
    have = ("z", *fa, *fb)
    return r.permute([have.index(c) for c in out])


def _align(t: Tensor, perm, expand_at) -> Tensor:
    t = t.permute(perm)
    for d in expand_at:
        t = t.unsqueeze(d)
    return t


@functools.lru_cache(maxsize=None)
def _pair_recipe(eq: str):
    """(permute a, unsqueeze positions a, permute b, unsqueeze positions b, summed dims) aligning
    both operands on the union of their labels, output labels first; None: not both per row."""
    ins, out = eq.split("->")
    sa, sb = ins.split(",")
    if "z" not in sa or "z" not in sb or len(set(sa)) != len(sa) or len(set(sb)) != len(sb):
        return None
    kept = [c for c in out]
    summed = [c for c in dict.fromkeys(sa + sb) if c not in out]
    order = kept + summed  # union of labels: output first, then the contracted ones
    if any(c not in sa + sb for c in out):
        return None

    def plan(sub):
        present = [c for c in order if c in sub]
        perm = tuple(sub.index(c) for c in present)
        expand_at = tuple(n for n, c in enumerate(order) if c not in sub)
        return perm, expand_at
    pa, ea = plan(sa)
    pb, eb = plan(sb)
    red = tuple(range(len(kept), len(order)))
    return pa, ea, pb, eb, red


@functools.lru_cache(maxsize=None)
def _steps(eq: str, shapes: tuple):
    """Pairwise einsums of the cheapest order (None: a single step, or opt_einsum missing)."""
    if len(shapes) < 3:
        return None
    try:
        import opt_einsum  # noqa: PLC0415 (a dependency of e3nn)
    except ImportError:  # pragma: no cover
        return None
    _, info = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize="optimal" if len(shapes) <= 5 else "auto")
    return tuple((tuple(sorted(step[0], reverse=True)), step[2]) for step in info.contraction_list)


class Instruction:
    """Static data of one instruction: segment geometry, subscripts, constants (float64 master copies)."""

    def __init__(self, p: TPProblem, ins, coef: float, w_off: int):
        (m1, l1, _), (m2, l2, _), (mo, lo, _) = (p.irreps_in1[ins.i_in1], p.irreps_in2[ins.i_in2],
                                                p.irreps_out[ins.i_out])
        self.mode, self.has_weight = ins.mode, ins.has_weight
        self.segs = {"x": (_offset(p.irreps_in1, ins.i_in1), m1, 2 * l1 + 1),
                     "y": (_offset(p.irreps_in2, ins.i_in2), m2, 2 * l2 + 1),
                     "out": (_offset(p.irreps_out, ins.i_out), mo, 2 * lo + 1)}
        d1, d2, do = 2 * l1 + 1, 2 * l2 + 1, 2 * lo + 1
        cg = torch.zeros(d1, d2, do, dtype=torch.float64)
        for i, j, k, c in cg_entries(l1, l2, lo):
            cg[i, j, k] = c * coef
        self.consts = {"C": cg}
        xs, ys, ws, os_ = _MODES[ins.mode]
        tri = m1 * (m2 - 1) // 2
        self.sizes = {"u": m1, "v": m2, "w": mo, "q": tri, "i": d1, "j": d2, "k": do}
        if ins.mode in ("uvu<v", "u<vw"):
            pairs = [(u, v) for u in range(m1) for v in range(u + 1, m2)]
            P = torch.zeros(len(pairs), m1, dtype=torch.float64)
            Q = torch.zeros(len(pairs), m2, dtype=torch.float64)
            for q, (u, v) in enumerate(pairs):
                P[q, u] = Q[q, v] = 1.0
            self.consts.update(P=P, Q=Q)
        if ins.mode == "uuw" and not ins.has_weight:
            os_ = "k"  # unweighted uuw sums u into its single output channel
        self.w_off = w_off
        self.w_shape = tuple(self.sizes[c] for c in ws)
        self.w_numel = int(torch.Size(self.w_shape).numel()) if ins.has_weight else 0
        self.subs = {"x": "z" + xs, "y": "z" + ys, "C": "ijk", "P": "qu", "Q": "qv", "out": "z" + os_}
        self.ws = ws
        self.empty = m1 == 0 or m2 == 0 or mo == 0 or coef == 0.0 or (ins.mode in ("uvu<v", "u<vw") and tri == 0)
        self._terms: Dict[tuple, _Term] = {}

    def term(self, target: str, w_rows: bool) -> _Term:
        """The contraction giving ``target`` ("out", "x", "y" or "w"); "g" is the output's cotangent."""
        key = (target, w_rows)
        t = self._terms.get(key)
        if t is None:
            subs = dict(self.subs)
            if self.has_weight:
                subs["w"] = ("z" if w_rows else "") + self.ws
            names = ["x", "y", "C"] + (["P", "Q"] if "P" in self.consts else []) + (["w"] if self.has_weight else [])
            if target == "out":
                t = _Term(names, [subs[n] for n in names], subs["out"], self.sizes)
            else:
                names = [n for n in names if n != target] + ["g"]
                subs["g"] = subs["out"]
                t = _Term(names, [subs[n] for n in names], subs[target], self.sizes)
            self._terms[key] = t
        return t


def _offset(irreps, idx: int) -> int:
    return sum(m * (2 * l + 1) for m, l, _ in irreps[:idx])


def _seg_view(t: Tensor, seg, layout: str) -> Tensor:
    """[rows, mul, dim] strided view of a segment of the [rows, D] tensor t."""
    off, mul, dim = seg
    s = t.narrow(1, off, mul * dim)
    if layout == "mul_ir":
        return s.unflatten(1, (mul, dim))
    return s.unflatten(1, (dim, mul)).transpose(1, 2)


class CpuPlan:
    """Every instruction of one (problem, layout), with constants per (dtype, device)."""

    def __init__(self, problem: TPProblem, layout: str):
        self.problem, self.layout = problem, layout
        instrs, off = [], 0
        for ins, coef in zip(problem.instructions, problem.path_coefficients):
            it = Instruction(problem, ins, coef, off)
            off += it.w_numel
            instrs.append(it)
        self.instrs = [it for it in instrs if not it.empty]
        self._consts: Dict[tuple, List[Dict[str, Tensor]]] = {}

    def consts(self, dtype: torch.dtype, device: torch.device) -> List[Dict[str, Tensor]]:
        key = (dtype, device)
        c = self._consts.get(key)
        if c is None:
            c = self._consts[key] = [{k: v.to(device=device, dtype=dtype) for k, v in it.consts.items()}
                                     for it in self.instrs]
        return c

    # --- operand views ------------------------------------------------------------------------------
    def _ops(self, it: Instruction, const: Dict[str, Tensor], t: Dict[str, Tensor], names) -> List[Tensor]:
        out = []
        for n in names:
            if n in const:
                out.append(const[n])
            elif n == "w":
                w = t["w"]
                if w.dim() == 1:
                    out.append(w.narrow(0, it.w_off, it.w_numel).view(it.w_shape))
                else:
                    out.append(w.narrow(1, it.w_off, it.w_numel).view((w.shape[0],) + it.w_shape))
            elif n == "g":  # the cotangent shaped as the mode's output subscripts (uvuv: [z, u, v, k])
                g = _out_view(it, t["g"], self.layout)
                out.append(g.reshape((g.shape[0],) + tuple(it.sizes[c] for c in it.subs["out"][1:])))
            else:
                out.append(_seg_view(t[n], it.segs[n], self.layout))
        return out

    def forward(self, x: Tensor, y: Tensor, w: Tensor, math: torch.dtype, weighted_only: bool = False) -> Tensor:
        """[rows, dim_out] in ``math``; operands already in ``math``. ``weighted_only``: the
        instructions with weights alone (the part of T that depends on w)."""
        z = x.shape[0]
        out = _new((z, self.problem.dim_out), x.dtype, x.device)
        spans: Dict[int, int] = {}
        t = {"x": x, "y": y, "w": w}
        w_rows = w.dim() == 2
        for it, const in zip(self.instrs, self.consts(math, x.device)):
            if weighted_only and not it.has_weight:
                continue
            term = it.term("out", w_rows)
            r = _broadcast(term, term.run(self._ops(it, const, t, term.names)), it.subs["out"], z, it.sizes)
            _write(_out_view(it, out, self.layout), r.reshape(_out_shape(it, z)), spans, it.segs["out"])
        _zero_gaps(out, 1, spans)
        return out

    def grad(self, target: str, t: Dict[str, Tensor], like: Tensor, math: torch.dtype,
             weighted_only: bool = False) -> Tensor:
        """d<g, T(x, y, w)>/d(target) in ``math``, shaped like ``like`` (a shared w: summed over rows);
        ``weighted_only`` as in ``forward``."""
        z = t["g"].shape[0]
        res = _new(like.shape, math, like.device)
        spans: Dict[int, int] = {}
        w_rows = t["w"].dim() == 2
        for it, const in zip(self.instrs, self.consts(math, like.device)):
            if (target == "w" or weighted_only) and not it.has_weight:
                continue
            term = it.term(target, w_rows)
            r = term.run(self._ops(it, const, t, term.names))
            if target == "w":
                r = _broadcast(term, r, ("z" if w_rows else "") + it.ws, z, it.sizes)
                seg = (it.w_off, it.w_numel, 1)
                if not w_rows:
                    _write(res.narrow(0, it.w_off, it.w_numel), r.reshape(-1), spans, seg)
                else:
                    _write(res.narrow(1, it.w_off, it.w_numel), r.reshape(z, it.w_numel), spans, seg)
            else:
                r = _broadcast(term, r, it.subs[target], z, it.sizes)
                _write(_seg_view(res, it.segs[target], self.layout), r, spans, it.segs[target])
        _zero_gaps(res, 1 if target != "w" or w_rows else 0, spans)
        return res


def _new(shape, dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised result; every element is written by ``_write`` or ``_zero_gaps``."""
    return torch.empty(shape, dtype=dtype, device=device)


def _write(view: Tensor, r: Tensor, spans: Dict[int, int], seg) -> None:
    """The first result for a segment is copied into it, later ones added: the result tensor is
    touched once instead of zero-filled first (large fresh buffers cost page faults per pass)."""
    off, mul, dim = seg
    if off in spans:
        view.add_(r)
    else:
        view.copy_(r)
        spans[off] = mul * dim


def _zero_gaps(res: Tensor, dim: int, spans: Dict[int, int]) -> None:
    """Zero the columns (along ``dim``) that no segment in ``spans`` (offset -> width) covers."""
    pos = 0
    for off, n in sorted(spans.items()):
        if off > pos:
            res.narrow(dim, pos, off - pos).zero_()
        pos = max(pos, off + n)
    if res.shape[dim] > pos:
        res.narrow(dim, pos, res.shape[dim] - pos).zero_()


def _out_shape(it: Instruction, z: int) -> Tuple[int, int, int]:
    return (z, it.segs["out"][1], it.segs["out"][2])


def _out_view(it: Instruction, t: Tensor, layout: str) -> Tensor:
    return _seg_view(t, it.segs["out"], layout)


def _broadcast(term: _Term, r: Tensor, full: str, z: int, sizes: Dict[str, int]) -> Tensor:
    """r (subscripts term.out) expanded to ``full`` (labels no operand carries: the contraction does
    not depend on them); term.out lists its labels in the order of ``full``."""
    if not term.missing:
        return r
    shape = []
    for c in full:
        shape.append(r.shape[term.out.index(c)] if c in term.out else 1)
    return r.reshape(shape).expand(*[z if c == "z" else sizes[c] for c in full])


@functools.lru_cache(maxsize=None)
def cpu_plan(problem: TPProblem, layout: str) -> CpuPlan:
    return CpuPlan(problem, layout)


# --- entry points (the CPU implementations of tp_fwd / tp_bwd / tp_dbwd) ------------------------------
def _cast(ts, math):
    return [t if t is None or t.dtype == math else t.to(math) for t in ts]


def forward(problem: TPProblem, layout: str, x: Tensor, y: Tensor, w: Tensor, math_dtype: Optional[torch.dtype],
            out_dtype: torch.dtype) -> Tensor:
    math = math_dtype_of((x, y, w), math_dtype)
    x, y, w = _cast((x, y, w), math)
    return cpu_plan(problem, layout).forward(x, y, w, math).to(out_dtype)


def backward(problem: TPProblem, layout: str, x: Tensor, y: Tensor, w: Tensor, g: Tensor, need: int,
             math_dtype: Optional[torch.dtype]) -> Tuple[Tensor, Tensor, Tensor]:
    """(gx, gy, gw) for the bits of ``need`` (1 x, 2 y, 4 w), empty placeholders for the others."""
    math = math_dtype_of((x, y, w, g), math_dtype)
    t = dict(zip("xywg", _cast((x, y, w, g), math)))
    plan = cpu_plan(problem, layout)
    return tuple(plan.grad(n, t, like, math).to(like.dtype) if need & bit else like.new_empty(0)
                 for bit, n, like in ((1, "x", x), (2, "y", y), (4, "w", w)))


def double_backward(problem: TPProblem, layout: str, x, y, w, g, a, b, c, need: int,
                    math_dtype: Optional[torch.dtype]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dy, dw, dg) of S = <g, T(a,y,w) + T(x,b,w) + T(x,y,c)> (a, b, c: None where absent) for
    the bits of ``need`` (1 x, 2 y, 4 w, 8 g); zeros where no term contributes, placeholders for the
    others."""
    math = math_dtype_of((x, y, w, g, a, b, c), math_dtype)
    xm, ym, wm, gm, am, bm, cm = _cast((x, y, w, g, a, b, c), math)
    plan = cpu_plan(problem, layout)
    res = []
    # each result: the terms of S that contain the operand, with the cotangent in place of its partner
    terms = {"x": ((bm, lambda: {"x": xm, "y": bm, "w": wm, "g": gm}), (cm, lambda: {"x": xm, "y": ym, "w": cm, "g": gm})),
             "y": ((am, lambda: {"x": am, "y": ym, "w": wm, "g": gm}), (cm, lambda: {"x": xm, "y": ym, "w": cm, "g": gm})),
             "w": ((am, lambda: {"x": am, "y": ym, "w": wm, "g": gm}), (bm, lambda: {"x": xm, "y": bm, "w": wm, "g": gm}))}
    for bit, n, like in ((1, "x", x), (2, "y", y), (4, "w", w)):
        if not need & bit:
            res.append(like.new_empty(0))
            continue
        acc = None
        for k, (cot, ops) in enumerate(terms[n]):
            if cot is not None:
                # the term with c in place of w: unweighted instructions do not depend on w
                r = plan.grad(n, ops(), like, math, weighted_only=n != "w" and k == 1)
                acc = r if acc is None else acc.add_(r)
        res.append(torch.zeros_like(like) if acc is None else acc.to(like.dtype))
    if need & 8:
        acc = None
        for k, args in enumerate(((am, ym, wm), (xm, bm, wm), (xm, ym, cm))):
            if all(v is not None for v in args):
                r = plan.forward(*args, math, weighted_only=k == 2)
                acc = r if acc is None else acc.add_(r)
        res.append(torch.zeros_like(g) if acc is None else acc.to(g.dtype))
    else:
        res.append(g.new_empty(0))
    return tuple(res)
