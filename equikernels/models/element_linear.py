"""The element-indexed linear map of MACE's skip connection.

mace-torch writes it as ``FullyConnectedTensorProduct(x, one_hot(element))``: with a one-hot
second input, every path (l, 0e -> l) reduces to ``x_block @ W[:, z, :]`` times a constant. Here
the weights keep e3nn's flat layout (checkpoints copy one to one) and are viewed as
[elements, mul_in, mul_out] blocks; nodes are grouped by element once per forward
(``ElementGroups``) and each group is one matmul per block, so no one-hot product is formed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import torch
from torch import nn

from ..ir import cg_entries
from ..problem import TPProblem, parse_irreps


@dataclass
class ElementGroups:
    """Nodes sorted by element: ``perm`` (sorted -> original), ``inverse`` and host-side
    (element, start, stop) runs of the sorted order. Built once per forward and shared."""
    element: torch.Tensor
    perm: torch.Tensor
    inverse: torch.Tensor
    runs: List[Tuple[int, int, int]]

    @staticmethod
    def build(element: torch.Tensor, num_elements: int) -> "ElementGroups":
        counts = torch.bincount(element, minlength=num_elements).tolist()  # one host sync per forward
        if len(counts) > num_elements:
            raise ValueError(f"node_attrs: element index {len(counts) - 1} >= num_elements ({num_elements})")
        perm = torch.sort(element, stable=True).indices
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.numel(), device=perm.device)
        runs, start = [], 0
        for z, n in enumerate(counts):
            if n:
                runs.append((z, start, start + n))
                start += n
        return ElementGroups(element, perm, inverse, runs)


class ElementLinear(nn.Module):
    """Same weights and result as e3nn ``FullyConnectedTensorProduct(irreps_in, f"{E}x0e",
    irreps_out)`` applied to (x, one_hot(element)); features in ``layout``."""

    def __init__(self, irreps_in, num_elements: int, irreps_out, layout: str = "ir_mul") -> None:
        super().__init__()
        self.irreps_in, self.irreps_out = parse_irreps(irreps_in, "irreps_in"), parse_irreps(irreps_out, "irreps_out")
        self.num_elements, self.layout = num_elements, layout
        instructions = [(i1, 0, io, "uvw", True) for i1, (_, l1, p1) in enumerate(self.irreps_in)
                        for io, (_, lo, po) in enumerate(self.irreps_out) if (l1, p1) == (lo, po)]
        problem = TPProblem.create(irreps_in, f"{num_elements}x0e", irreps_out, instructions)
        self.paths = []  # (i_in, i_out, weight offset, coefficient per component)
        off = 0
        for ins, coef in zip(problem.instructions, problem.path_coefficients):
            (m1, l, _), (mo, _, _) = self.irreps_in[ins.i_in1], self.irreps_out[ins.i_out]
            cg = torch.zeros(2 * l + 1, dtype=torch.float64)
            for i, _, k, c in cg_entries(l, 0, l):
                cg[k] += c * coef
            self.paths.append((ins.i_in1, ins.i_out, off, cg))
            off += m1 * num_elements * mo
        self.weight_numel = off
        self.weight = nn.Parameter(torch.randn(off))
        self._in_off = _offsets(self.irreps_in)
        self._out_off = _offsets(self.irreps_out)

    def _block(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """Input block i as [N, 2l+1, mul]."""
        mul, l, _ = self.irreps_in[i]
        b = x.narrow(1, self._in_off[i], mul * (2 * l + 1))
        return b.reshape(-1, 2 * l + 1, mul) if self.layout == "ir_mul" else b.reshape(-1, mul, 2 * l + 1).transpose(1, 2)

    def forward(self, x: torch.Tensor, groups: ElementGroups) -> torch.Tensor:
        if not groups.runs:  # no nodes
            return x.new_zeros(x.shape[0], sum(m * (2 * l + 1) for m, l, _ in self.irreps_out))
        single = len(groups.runs) == 1
        xs = x if single else x.index_select(0, groups.perm)
        outs = [None] * len(self.irreps_out)
        for i_in, i_out, off, cg in self.paths:
            m1, l, _ = self.irreps_in[i_in]
            mo = self.irreps_out[i_out][0]
            w = self.weight.narrow(0, off, m1 * self.num_elements * mo).view(m1, self.num_elements, mo)
            xb = self._block(xs, i_in)  # [N, 2l+1, m1]
            parts = [xb[a:b] @ w[:, z, :] for z, a, b in groups.runs]
            y = parts[0] if single else torch.cat(parts, 0)
            y = y * cg.to(dtype=y.dtype, device=y.device)[:, None]  # [N, 2l+1, mo]
            outs[i_out] = y if outs[i_out] is None else outs[i_out] + y
        flat = []
        for k, (mul, l, _) in enumerate(self.irreps_out):
            y = outs[k]
            if y is None:
                y = xs.new_zeros(xs.shape[0], 2 * l + 1, mul)
            flat.append((y if self.layout == "ir_mul" else y.transpose(1, 2)).reshape(xs.shape[0], -1))
        out = torch.cat(flat, 1) if len(flat) > 1 else flat[0]
        return out if single else out.index_select(0, groups.inverse)


def _offsets(irreps) -> List[int]:
    offs, o = [], 0
    for mul, l, _ in irreps:
        offs.append(o)
        o += mul * (2 * l + 1)
    return offs
