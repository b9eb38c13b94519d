"""MACE's symmetric contraction on CPU in the monomial basis: one matrix product per call.

For every node b and channel c the contraction is a polynomial in the components A[b, c, :] of
the node's features. Its degree-nu part only sees the *sorted* monomials A_i1 A_i2 .. A_inu
(i1 <= .. <= inu), so each U_nu is folded once into U_sym[s, (o, m, k)] (the sum of U over every
ordering of monomial s); monomials no U entry reaches are dropped. A call then forms the needed
monomials by products of gathered rows (degree nu from degree nu - 1), contracts them with every
U_sym in one GEMM and multiplies in the node's weights W[element][k, c]:

    B[b, c, (o, m)] = sum_k W_o[z_b, k, c] sum_s U_sym[s, (o, m, k)] M[s, b, c]

Everything is plain differentiable torch ops (index_select, mul, mm, sum), so forces and
force-trained parameters come from autograd to any order. Same result as the path table
(``symmetric_contraction.contraction_table``), which stays the oracle in the tests.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor


class MonomialContraction:
    """Static part of one contraction: monomial recipes and the folded U (float64 master copy)."""

    def __init__(self, channels: int, ls_in: Sequence[int], ls_out: Sequence[int],
                 u_matrices: Sequence[Sequence[Tensor]]):
        self.channels, self.ls_in, self.ls_out = channels, list(ls_in), list(ls_out)
        d = sum(2 * l + 1 for l in ls_in)
        self.d = d
        cols: List[Tuple[int, int, int, int]] = []  # (o, m, nu, k) per column of U_sym
        blocks: Dict[int, Dict[Tuple[int, ...], Dict[int, float]]] = {}  # nu -> monomial -> column -> value
        self.k_sizes = []
        for o, (l_out, us) in enumerate(zip(ls_out, u_matrices)):
            ks = []
            for nu, u in enumerate(us, start=1):
                u = u.detach().to("cpu", torch.float64)
                if u.dim() == nu + 1:
                    u = u.unsqueeze(0)
                if u.shape[0] != 2 * l_out + 1 or u.dim() != nu + 2 or any(s != d for s in u.shape[1:-1]):
                    raise ValueError(f"u_matrices[{o}][{nu - 1}]: expected shape [{2 * l_out + 1}]{[d] * nu}[K], "
                                     f"got {tuple(u.shape)}")
                ks.append(int(u.shape[-1]))
            self.k_sizes.append(ks)
            k_off = [sum(ks[:n]) for n in range(len(ks))]
            for m in range(2 * l_out + 1):
                base = len(cols)
                for nu, (u, ko, kn) in enumerate(zip(us, k_off, ks), start=1):
                    for k in range(kn):
                        cols.append((o, m, nu, k))
                    u = u.detach().to("cpu", torch.float64)
                    u = u.unsqueeze(0) if u.dim() == nu + 1 else u
                    for idx in (u[m] != 0).nonzero().tolist():
                        s = tuple(sorted(idx[:-1]))
                        col = base + ko + idx[-1]
                        blk = blocks.setdefault(nu, {}).setdefault(s, {})
                        blk[col] = blk.get(col, 0.0) + float(u[(m,) + tuple(idx)])
        self.num_cols = len(cols)
        # the monomials needed, degree by degree (a degree-nu monomial is built from its prefix)
        max_nu = max((len(us) for us in u_matrices), default=0)
        need: Dict[int, set] = {nu: {s for s, vals in blocks.get(nu, {}).items() if any(v != 0.0 for v in vals.values())}
                                for nu in range(1, max_nu + 1)}
        for nu in range(max_nu, 1, -1):
            need[nu - 1] |= {s[:-1] for s in need[nu]}
        self.monomials: List[Tuple[int, ...]] = []
        self.steps = []  # per degree >= 2: (row of the prefix in the previous degree, last component)
        prev: Dict[Tuple[int, ...], int] = {}
        for nu in range(1, max_nu + 1):
            mons = sorted(need.get(nu, ()))
            if nu == 1:
                mons = [(i,) for i in range(d)]  # degree 1 is A itself
            else:
                self.steps.append((torch.tensor([prev[s[:-1]] for s in mons], dtype=torch.long),
                                   torch.tensor([s[-1] for s in mons], dtype=torch.long)))
            prev = {s: n for n, s in enumerate(mons)}
            self.monomials.extend(mons)
        row = {s: n for n, s in enumerate(self.monomials)}
        u_sym = torch.zeros(self.num_cols, len(self.monomials), dtype=torch.float64)
        for nu, blk in blocks.items():
            for s, vals in blk.items():
                for col, v in vals.items():
                    if v != 0.0:  # (entries of a monomial may cancel: it is then not formed)
                        u_sym[col, row[s]] += v
        self.u_sym = u_sym  # [columns (o, m, k), monomials]
        self._consts: Dict[tuple, Tensor] = {}

    def u(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        key = (dtype, device)
        t = self._consts.get(key)
        if t is None:
            t = self._consts[key] = self.u_sym.to(device=device, dtype=dtype)
        return t

    def layout_index(self, layout: str, device) -> Tensor:
        """Columns of an ir_mul-ordered [d, c] feature row in a row of ``layout``."""
        key = ("perm", layout, device)
        t = self._consts.get(key)
        if t is None:
            idx, off = [], 0
            for l in self.ls_in:
                dim = 2 * l + 1
                for i in range(dim):
                    for c in range(self.channels):
                        idx.append(off + (i * self.channels + c if layout == "ir_mul" else c * dim + i))
                off += dim * self.channels
            t = self._consts[key] = torch.tensor(idx, dtype=torch.long, device=device)
        return t

    def __call__(self, x: Tensor, weights: Sequence[Tensor], layout: str) -> Tensor:
        """x [N, channels * d] in ``layout``; weights[o]: [K_o, N, channels] (each node's W, the degrees
        of output o concatenated along k) -> [N, channels * sum(2 l_out + 1)] in ``layout``."""
        n, c = x.shape[0], self.channels
        a = (x.view(n, self.d, c) if layout == "ir_mul" else x.index_select(1, self.layout_index(layout, x.device))
             .view(n, self.d, c)).transpose(0, 1)  # [d, N, c]
        mons, prev = [a], a
        for prefix, last in self.steps:
            prev = prev.index_select(0, prefix.to(x.device)) * a.index_select(0, last.to(x.device))
            mons.append(prev)
        m = torch.cat(mons, 0) if len(mons) > 1 else a
        r = torch.mm(self.u(x.dtype, x.device), m.reshape(m.shape[0], n * c))  # [columns, N * c]
        outs, col = [], 0
        for l_out, ks, w in zip(self.ls_out, self.k_sizes, weights):
            dim, kt = 2 * l_out + 1, sum(ks)
            blk = r.narrow(0, col, dim * kt).view(dim, kt, n, c)
            col += dim * kt
            outs.append((blk * w.unsqueeze(0)).sum(1))  # [dim, N, c]
        if layout == "ir_mul":
            out = torch.cat([o.permute(1, 0, 2).reshape(n, -1) for o in outs], 1)
        else:
            out = torch.cat([o.permute(1, 2, 0).reshape(n, -1) for o in outs], 1)
        return out
