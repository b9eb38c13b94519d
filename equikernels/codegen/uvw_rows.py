"""Backward and double-backward kernels for uvw products with per-row weights (DiffDock-L2).

Each row carries its own weight blocks W[u, w] (contiguous, w fastest), most of the row's bytes
(DiffDock: 7,128 weights against 156 outputs), so these kernels are a stream over W (and its
cotangent c, and the weight gradient) with a few multiply-adds per element. The generic generator
(emit.py) holds a whole path's block as one ``[ROWS, pow2(U), pow2(W)]`` tile (48 -> 64, 10 -> 16:
half of every tile is padding, 255 registers with spills at 4 rows) and forms every output
component's own product with the tile. Here:

* a block is streamed in ``[ROWS, UB, WB]`` chunks (48 = 3 x 16, no padding), each loaded once;
* the tile is contracted with the cotangent first, ``H_k[u] = sum_w W[u, w] g_k[w]`` (one reduction
  per component k of g), and both input gradients come from H:
  ``gx_i[u] += sum_jk C_ijk y_j H_k[u]``, ``gy_j += sum_ik C_ijk sum_u x_i[u] H_k[u]``;
* the weight gradient is an outer product per chunk, ``sum_k T_k[u] g_k[w]`` with
  ``T_k = sum_ij C_ijk x_i y_j`` (or ``sum_i x_i[u] S_i[w]`` when x has fewer components);
* the double backward's ``dg`` term ``sum_u P_k[u] W[u, w]`` is reduced over u per chunk.

One builder serves both directions: every output is a list of terms with operands substituted
(double backward by trilinearity: dx = gx(b, W) + gx(y, c), dy = gy(a, W) + gy(x, c),
dw = gw(a, y) + gw(x, b), dg = f(a, y, W) + f(x, b, W) + f(x, y, c)).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..ir import Table
from .emit import KernelMeta, Unsupported, _Writer
from .plan_types import KernelChoice, UvwOptions

# operand -> which argument of the forward product it stands for
ROLE = {"x": "x", "a": "x", "gx": "x", "dx": "x", "y": "y", "b": "y", "gy": "y", "dy": "y",
        "w": "w", "c": "w", "gw": "w", "dw": "w", "g": "g", "dg": "g"}


@dataclass(frozen=True)
class UPath:
    """One uvw path at a fixed channel v of y: out[w, k] += sum_u,ij C_ijk x_i[u] y_j W[u, w]."""
    xseg: int
    yseg: int
    v: int
    oseg: int
    woff: int      # W[u, w] = w_row[woff + u * ustride + w]
    ustride: int
    U: int
    W: int
    entries: Tuple[Tuple[int, int, int, float], ...]  # (i, j, k, coefficient)


def upaths(table: Table) -> Optional[List[UPath]]:
    """The table's paths as UPaths, or None when it is not a weighted uvw table."""
    out = []
    for p in table.paths:
        if len(p.factors) != 2 or p.weight is None:
            return None
        fx, fy = p.factors
        sizes = p.label_sizes
        if (fx.operand, fy.operand, p.weight.operand) != ("x", "y", "w") or set(sizes) != {"u", "v", "w"}:
            return None
        m2, mo = sizes["v"], sizes["w"]
        if (fx.strides, fy.strides, p.output.strides) != ((("u", 1),), (("v", 1),), (("w", 1),)) \
                or fx.base or fy.base or p.output.base \
                or dict(p.weight.strides) != {"u": m2 * mo, "v": mo, "w": 1}:
            return None
        ents = tuple((i, j, k, c) for (i, j), k, c in p.entries)
        for v in range(m2):
            out.append(UPath(fx.segment, fy.segment, v, p.output.segment, p.weight.base + v * mo, m2 * mo,
                             sizes["u"], mo, ents))
    return out


def eligible(problem, table: Table) -> bool:
    """Whether this generator expresses the product: per-row uvw weights, every path uvw
    (DiffDock-L2). Whether it is used is the planner's decision."""
    if problem.shared_weights:
        return False
    return bool(table.paths) and all(i.mode == "uvw" and i.has_weight for i in problem.instructions) \
        and upaths(table) is not None


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def pieces(n: int, block: int, exact: bool) -> List[Tuple[int, int, int]]:
    """(start, size, padded size) chunks of a channel range of size n: full blocks, then the rest
    padded to a power of two, or (``exact``) split into powers of two (10 = 8 + 2)."""
    out, s = [], 0
    while n - s >= block:
        out.append((s, block, block))
        s += block
    rest = n - s
    while rest:
        if not exact:
            out.append((s, rest, _pow2(rest)))
            break
        p = 1 << (rest.bit_length() - 1)
        out.append((s, p, p))
        s, rest = s + p, rest - p
    return out


Options = UvwOptions  # the chunking options (plan_types): the planner chooses them


class Builder:
    """Straight-line kernel over row blocks. ``terms``: output -> list of operand tuples
    (gx: (y-like, w-like); gy: (x-like, w-like); gw: (x-like, y-like); g: (x-like, y-like, w-like))."""

    def __init__(self, name: str, table: Table, layout: str, terms: Dict[str, List[tuple]], opts: Options):
        self.name, self.layout, self.opts = name, layout, opts
        self.paths = upaths(table)
        if self.paths is None:
            raise Unsupported("not a per-row uvw table")
        self.segs = {r: table.operand(r if r != "g" else "out").segments for r in ("x", "y", "g")}
        self.dims = {r: table.operand(r if r != "g" else "out").dim for r in ("x", "y", "w", "g")}
        self.terms = {o: ts for o, ts in terms.items() if ts}
        self.pre, self.body = _Writer(), _Writer()
        self.consts: Dict[str, str] = {}
        self.cache: Dict[tuple, str] = {}
        self.inputs: List[str] = []
        self.acc: Dict[tuple, str] = {}   # output accumulators
        self.stored_g: set = set()        # dg segments already stored

    # --- expressions ------------------------------------------------------------------------------
    def const(self, c: float) -> str:
        key = repr(float(c))
        if key not in self.consts:
            self.consts[key] = f"K{len(self.consts)}"
            self.pre.emit(f"{self.consts[key]} = tl.full([], {key}, DT)", 1)
        return self.consts[key]

    def _pre(self, key: tuple, expr: str, prefix: str) -> str:
        if key not in self.cache:
            self.cache[key] = self.pre.tmp(prefix)
            self.pre.emit(f"{self.cache[key]} = {expr}", 1)
        return self.cache[key]

    def idx(self, p: int, axis: int) -> str:
        sl = "[None, :, None]" if axis == 1 else "[None, None, :]"
        return self._pre(("idx", p, axis), f"tl.arange(0, {p}){sl}", f"i{'uw'[axis - 1]}{p}_")

    def cmask(self, p: int, n: int, axis: int) -> Optional[str]:
        if p == n:
            return None
        return self._pre(("mask", p, n, axis), f"{self.idx(p, axis)} < {n}", f"m{'uw'[axis - 1]}{p}_{n}_")

    def rowbase(self, op: str) -> str:
        key = ("row", op)
        if key not in self.cache:
            self.cache[key] = f"{op}_r"
            self.body.emit(f"{op}_r = r64[:, None, None] * {self.dims[ROLE[op]]}")
        return self.cache[key]

    def addr(self, role: str, seg: int, ch: int, comp: int) -> Tuple[int, int]:
        """(offset, channel stride) of component ``comp`` of channel ``ch`` of a segment."""
        s = self.segs[role][seg]
        if self.layout == "mul_ir" or s.dim == 1:
            return s.offset + ch * s.dim + comp, s.dim
        return s.offset + comp * s.mul + ch, 1

    def _use(self, op: str):
        if op not in self.inputs:
            self.inputs.append(op)

    def vec(self, op: str, seg: int, comp: int, piece, axis: int) -> str:
        """Channels ``piece`` of component ``comp`` of a segment of ``op``: [ROWS, P, 1] (axis 1)
        or [ROWS, 1, P] (axis 2)."""
        start, n, p = piece
        key = ("vec", op, seg, comp, start, n, p, axis)
        if key not in self.cache:
            self._use(op)
            off, cs = self.addr(ROLE[op], seg, start, comp)
            mask = " & ".join(m for m in ("rm", self.cmask(p, n, axis)) if m)
            v = self.body.tmp(f"{op}_")
            self.body.emit(f"{v} = tl.load({op}_ptr + {self.rowbase(op)} + {off} + {cs} * {self.idx(p, axis)}, "
                           f"mask={mask}, other=0.0).to(DT)")
            self.cache[key] = v
        return self.cache[key]

    def scalar(self, op: str, seg: int, v: int, comp: int) -> str:
        key = ("sc", op, seg, v, comp)
        if key not in self.cache:
            self._use(op)
            off, _ = self.addr(ROLE[op], seg, v, comp)
            s = self.body.tmp(f"{op}_")
            self.body.emit(f"{s} = tl.load({op}_ptr + {self.rowbase(op)} + {off}, mask=rm, other=0.0).to(DT)")
            self.cache[key] = s
        return self.cache[key]

    def tile_ptr(self, op: str, path: UPath, up, wp) -> Tuple[str, str]:
        (u0, un, upad), (w0, wn, wpad) = up, wp
        mask = " & ".join(m for m in ("rm", self.cmask(upad, un, 1), self.cmask(wpad, wn, 2)) if m)
        ptr = (f"{op}_ptr + {self.rowbase(op)} + {path.woff + u0 * path.ustride + w0} + "
               f"{path.ustride} * {self.idx(upad, 1)} + {self.idx(wpad, 2)}")
        return ptr, mask

    def lincomb(self, items: Sequence[Tuple[float, str]], key=None) -> Optional[str]:
        """sum c * v (v names), emitted once per distinct combination."""
        items = [(c, v) for c, v in items if c != 0.0]
        if not items:
            return None
        key = ("lc",) + tuple(sorted((repr(float(c)), v) for c, v in items))
        if key not in self.cache:
            # merge equal variables
            merged: Dict[str, float] = {}
            for c, v in items:
                merged[v] = merged.get(v, 0.0) + c
            s = self.body.tmp("s")
            self.body.emit(f"{s} = " + " + ".join(f"{self.const(c)} * {v}" for v, c in merged.items()))
            self.cache[key] = s
        return self.cache[key]

    def add_acc(self, key: tuple, expr: str):
        if key in self.acc:
            self.body.emit(f"{self.acc[key]} = {self.acc[key]} + {expr}")
        else:
            a = self.body.tmp("acc")
            self.body.emit(f"{a} = {expr}")
            self.acc[key] = a

    # --- per path ---------------------------------------------------------------------------------
    def _path(self, P: UPath):
        o = self.opts
        ks = sorted({k for *_, k, _ in P.entries})
        is_ = sorted({i for i, *_ in P.entries})
        gx_t, gy_t = self.terms.get("gx", []), self.terms.get("gy", [])
        gw_t, g_t = self.terms.get("gw", []), self.terms.get("g", [])
        # weight-like operands whose H_k = W . g_k is needed (by gx or gy terms)
        hw = list(dict.fromkeys([t[1] for t in gx_t] + [t[1] for t in gy_t]))
        fw = list(dict.fromkeys(t[2] for t in g_t))           # weight-like operands in dg terms
        tiles_of = list(dict.fromkeys(hw + fw))
        ysc = lambda op, j: self.scalar(op, P.yseg, P.v, j)  # noqa: E731
        # gw decomposition: per k (outer products T_k[u] g_k[w]) or per x-like operand and i
        gw_by_k = len(ks) <= len({t[0] for t in gw_t}) * len(is_)
        for up in pieces(P.U, o.ub, o.exact):
            xv = lambda op, i: self.vec(op, P.xseg, i, up, 1)  # noqa: E731
            # u vectors of the dg terms: Pk[wop][k] = sum over terms (xo, yo, wop) sum_ij C xo_i y_j
            pk = {(wop, k): self._bil(P, [(xo, yo) for xo, yo, w_ in g_t if w_ == wop], k, xv, ysc)
                  for wop in fw for k in ks}
            tk = {k: self._bil(P, gw_t, k, xv, ysc) for k in ks} if gw_t and gw_by_k else {}
            H: Dict[tuple, str] = {}
            for wp in pieces(P.W, o.wb, o.exact):
                gv = {k: self.vec("g", P.oseg, k, wp, 2) for k in ks}
                tiles = {}
                for op in tiles_of:
                    self._use(op)
                    ptr, mask = self.tile_ptr(op, P, up, wp)
                    t = tiles[op] = self.body.tmp(f"{op}_t")
                    self.body.emit(f"{t} = tl.load({ptr}, mask={mask}, other=0.0).to(DT)")
                for op in hw:
                    for k in ks:
                        prod = f"{tiles[op]} * {gv[k]}"
                        if o.lazy_h:  # one un-reduced sum per padded chunk width
                            self._hadd(H, (op, k, wp[2]), prod)
                        else:
                            self._hadd(H, (op, k), f"tl.sum({prod}, axis=2, keep_dims=True)")
                for k in ks:  # dg_k[w] += sum_u Pk[u] W[u, w]
                    parts = [f"{pk[(op, k)]} * {tiles[op]}" for op in fw if pk[(op, k)] is not None]
                    if parts:
                        # un-reduced over u until the last path writing this output segment
                        # (paths are visited by output segment): one u reduction per (k, w chunk)
                        self.add_acc(("gl", P.oseg, k, wp, up[2]), " + ".join(parts))
                if gw_t:
                    self._gw_tile(P, up, wp, ks, is_, gw_by_k, tk, gv, xv, ysc)
            if o.lazy_h:
                lazy, H = H, {}
                for (op, k, _), v in lazy.items():
                    self._hadd(H, (op, k), f"tl.sum({v}, axis=2, keep_dims=True)")
            for yo, wop in gx_t:  # gx_i[u] += sum_k (sum_j C y_j) H_k[u]
                for i in is_:
                    parts = []
                    for k in ks:
                        m = self.lincomb([(c, ysc(yo, j)) for ii, j, kk, c in P.entries if ii == i and kk == k])
                        if m is not None:
                            parts.append(f"{m} * {H[(wop, k)]}")
                    if parts:
                        self.add_acc(("x", P.xseg, i, up), " + ".join(parts))
            for xo, wop in gy_t:  # gy_j += sum_u sum_k (sum_i C x_i[u]) H_k[u]   (summed over u at the end)
                for j in sorted({j for _, j, *_ in P.entries}):
                    parts = []
                    for k in ks:
                        m = self.lincomb([(c, xv(xo, i)) for i, jj, kk, c in P.entries if jj == j and kk == k])
                        if m is not None:
                            parts.append(f"{m} * {H[(wop, k)]}")
                    if parts:
                        self.add_acc(("y", P.yseg, P.v, j, up[2]), " + ".join(parts))

    def _bil(self, P: UPath, pairs, k: int, xv, ysc) -> Optional[str]:
        """[ROWS, P, 1]: sum over (x-like, y-like) pairs of sum_ij C_ijk x_i[u] y_j."""
        parts = []
        for xo, yo in pairs:
            for i in sorted({i for i, _, kk, _ in P.entries if kk == k}):
                m = self.lincomb([(c, ysc(yo, j)) for ii, j, kk, c in P.entries if ii == i and kk == k])
                if m is not None:
                    parts.append(f"{m} * {xv(xo, i)}")
        if not parts:
            return None
        key = ("bil",) + tuple(parts)
        if key not in self.cache:
            s = self.body.tmp("t")
            self.body.emit(f"{s} = " + " + ".join(parts))
            self.cache[key] = s
        return self.cache[key]

    def _hadd(self, H, key, expr):
        s = self.body.tmp("h")
        self.body.emit(f"{s} = {H[key]} + {expr}" if key in H else f"{s} = {expr}")
        H[key] = s

    def _gw_tile(self, P, up, wp, ks, is_, by_k, tk, gv, xv, ysc):
        gw_t = self.terms["gw"]
        if by_k:
            parts = [f"{tk[k]} * {gv[k]}" for k in ks if tk[k] is not None]
        else:  # sum over x-like xo and i of xo_i[u] S_i[w], S_i = sum_jk C yo_j g_k[w]
            parts = []
            for xo, yo in gw_t:
                for i in is_:
                    sk = []
                    for k in ks:
                        m = self.lincomb([(c, ysc(yo, j)) for ii, j, kk, c in P.entries if ii == i and kk == k])
                        if m is not None:
                            sk.append(f"{m} * {gv[k]}")
                    if sk:
                        parts.append(f"{xv(xo, i)} * ({' + '.join(sk)})")
        op = self.out["gw"]
        ptr, mask = self.tile_ptr(op, P, up, wp)
        val = " + ".join(parts) if parts else f"tl.zeros([ROWS, {up[2]}, {wp[2]}], DT)"
        self.body.emit(f"tl.store({ptr}, ({val}).to({op}_ptr.dtype.element_ty), mask={mask})")

    def _flush_g(self, oseg: int):
        """Reduce the un-reduced dg blocks of an output segment over u and store the segment."""
        lazy = [(key, a) for key, a in self.acc.items() if key[:2] == ("gl", oseg)]
        for (_, _, k, wp, _), a in lazy:
            self.add_acc(("g", oseg, k, wp), f"tl.sum({a}, axis=1, keep_dims=True)")
        for key, _ in lazy:
            del self.acc[key]
        s = self.segs["g"][oseg]
        for k in range(s.dim):
            for wp in pieces(s.mul, self.opts.wb, self.opts.exact):
                self._store_vec("g", "g", oseg, k, wp, 2, self.acc.pop(("g", oseg, k, wp), None))
        self.stored_g.add(oseg)

    # --- stores -----------------------------------------------------------------------------------
    def _store_outputs(self):
        o = self.opts
        if "gx" in self.terms:
            for seg, s in enumerate(self.segs["x"]):
                for i in range(s.dim):
                    for up in pieces(s.mul, o.ub, o.exact):
                        self._store_vec("gx", "x", seg, i, up, 1, self.acc.get(("x", seg, i, up)))
        if "g" in self.terms:
            for seg, s in enumerate(self.segs["g"]):
                if seg in self.stored_g:
                    continue
                for k in range(s.dim):
                    for wp in pieces(s.mul, o.wb, o.exact):
                        self._store_vec("g", "g", seg, k, wp, 2, self.acc.get(("g", seg, k, wp)))
        if "gy" in self.terms:
            for seg, s in enumerate(self.segs["y"]):
                for v in range(s.mul):
                    for j in range(s.dim):
                        lazy = [a for key, a in self.acc.items() if key[:4] == ("y", seg, v, j)]
                        val = " + ".join(f"tl.sum({a}, axis=1, keep_dims=True)" for a in lazy) or "tl.zeros([ROWS, 1, 1], DT)"
                        off, _ = self.addr("y", seg, v, j)
                        self.body.emit(f"tl.store({self.out['gy']}_ptr + {self.rowbase(self.out['gy'])} + {off}, "
                                       f"({val}).to({self.out['gy']}_ptr.dtype.element_ty), mask=rm)")

    def _store_vec(self, key, role, seg, comp, piece, axis, acc):
        op = self.out[key]
        start, n, p = piece
        off, cs = self.addr(role, seg, start, comp)
        shape = "[ROWS, %d, 1]" % p if axis == 1 else "[ROWS, 1, %d]" % p
        val = acc if acc is not None else f"tl.zeros({shape}, DT)"
        mask = " & ".join(m for m in ("rm", self.cmask(p, n, axis)) if m)
        self.body.emit(f"tl.store({op}_ptr + {self.rowbase(op)} + {off} + {cs} * {self.idx(p, axis)}, "
                       f"{val}.to({op}_ptr.dtype.element_ty), mask={mask})")

    def build(self, out_names: Dict[str, str]) -> Tuple[str, KernelMeta]:
        """``out_names``: gx / gy / gw / g -> pointer argument name (e.g. dx for gx)."""
        self.out = out_names
        paths = sorted(self.paths, key=lambda P: P.oseg) if "g" in self.terms else self.paths
        for n, P in enumerate(paths):
            self._path(P)
            if "g" in self.terms and (n + 1 == len(paths) or paths[n + 1].oseg != P.oseg):
                self._flush_g(P.oseg)
        self._store_outputs()
        outs = tuple(out_names[k] for k in ("gx", "gy", "gw", "g") if k in self.terms)
        ins = tuple(self.inputs)
        args = ", ".join([f"{n}_ptr" for n in ins + outs]
                         + ["N", "NBLK", "ROWS: tl.constexpr", "DT: tl.constexpr", "PREC: tl.constexpr"])
        src = ["@triton.jit", f"def {self.name}({args}):",
               "    pid = tl.program_id(0)", "    nprog = tl.num_programs(0)", "    rr = tl.arange(0, ROWS)"]
        src += self.pre.lines
        src += ["    for blk in range(pid, NBLK, nprog):", "        r = blk * ROWS + rr",
                "        r64 = r.to(tl.int64)", "        rm = (r < N)[:, None, None]"]
        src += self.body.lines or ["        pass"]
        return "\n".join(src) + "\n", KernelMeta(self.name, ins, outs, (), (), 1)


def bwd_terms(need_x: bool, need_y: bool, need_w: bool) -> Dict[str, List[tuple]]:
    t = {}
    if need_x:
        t["gx"] = [("y", "w")]
    if need_y:
        t["gy"] = [("x", "w")]
    if need_w:
        t["gw"] = [("x", "y")]
    return t


def dbwd_terms(need: str, have: str) -> Dict[str, List[tuple]]:
    """need: subset of "xywg", have: subset of "abc" (cotangents of gx, gy, gw)."""
    a, b, c = ("a" in have), ("b" in have), ("c" in have)
    t = {}
    if "x" in need:
        t["gx"] = ([("b", "w")] if b else []) + ([("y", "c")] if c else [])
    if "y" in need:
        t["gy"] = ([("a", "w")] if a else []) + ([("x", "c")] if c else [])
    if "w" in need:
        t["gw"] = ([("a", "y")] if a else []) + ([("x", "b")] if b else [])
    if "g" in need:
        t["g"] = ([("a", "y", "w")] if a else []) + ([("x", "b", "w")] if b else []) + ([("x", "y", "c")] if c else [])
    return {k: v for k, v in t.items() if v}


def generate(name: str, table: Table, layout: str, kind: str, need: str, have: str,
             choice: KernelChoice) -> Optional[Tuple[str, KernelMeta]]:
    """Kernel for ``kind`` "bwd" (need: subset of "xyw") or "dbwd" (need: subset of "xywg") with
    the chunking of ``choice.uvw``, or None when no output has a term."""
    opts = choice.uvw or UvwOptions()
    if kind == "bwd":
        terms = bwd_terms("x" in need, "y" in need, "w" in need)
        names = {"gx": "gx", "gy": "gy", "gw": "gw"}
    else:
        terms = dbwd_terms(need, have)
        names = {"gx": "dx", "gy": "dy", "gw": "dw", "g": "dg"}
    if not terms:
        return None
    return Builder(name, table, layout, terms, opts).build(names)
