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
from ..nn.blocks import rows_by_component
from ..nn.frozen import frozen_key, held, state_without
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

    def __getstate__(self):
        return state_without(self, ("_scaled", "_half", "_plan_cache"))

    def _plan(self):
        """Per output block: (input block, mul_in, ir dim, weight offset, mul_out) of its paths, and the
        per-weight coefficient (the path's Clebsch-Gordan value, the same for every component)."""
        plan = self.__dict__.get("_plan_cache")
        if plan is None:
            blocks = [[] for _ in self.irreps_out]
            scale = torch.zeros(self.weight_numel, dtype=torch.float64)
            for i_in, i_out, off, cg in self.paths:
                m1, l, _ = self.irreps_in[i_in]
                mo = self.irreps_out[i_out][0]
                blocks[i_out].append((i_in, m1, 2 * l + 1, off, mo))
                scale[off:off + m1 * self.num_elements * mo] = float(cg[0])
            plan = self.__dict__["_plan_cache"] = (blocks, {"cpu64": scale})
        return plan

    def _scaled_weight(self, scale) -> torch.Tensor:
        """weight * coefficients: one op, kept between calls while the weight is frozen and unchanged."""
        w = self.weight
        key = (w.device, w.dtype)
        if key not in scale:
            scale[key] = scale["cpu64"].to(device=w.device, dtype=w.dtype)
        if w.requires_grad or torch.compiler.is_compiling():
            return w * scale[key]
        vkey = frozen_key((w,))
        cached = self.__dict__.get("_scaled")
        if cached is None or cached[0] != vkey:
            cached = self.__dict__["_scaled"] = (vkey, w * scale[key], held((w,)))
        return cached[1]

    def forward(self, x: torch.Tensor, groups: ElementGroups) -> torch.Tensor:
        if not groups.runs:  # no nodes: an empty result that stays in the graph of x and the weight
            link = (x.sum() + self.weight.sum().to(x.dtype)) * 0
            return x.new_zeros(x.shape[0], sum(m * (2 * l + 1) for m, l, _ in self.irreps_out)) + link
        blocks, scale = self._plan()
        w = self._scaled_weight(scale)
        if w.dtype != x.dtype:
            # half features, float32 weights (mixed precision): matmuls in the features' type, as
            # autocast runs them; per-element weight gradients are summed by the matmul (float32
            # accumulation) and come back to the float32 weight through the cast
            if not (x.dtype in (torch.float16, torch.bfloat16) and w.dtype == torch.float32):
                raise TypeError(f"ElementLinear: features dtype {x.dtype} does not match the weight ({w.dtype}); "
                                "only float16/bfloat16 features with float32 weights mix")
            if w.requires_grad or torch.compiler.is_compiling():
                w = w.to(x.dtype)
            else:  # frozen: the rounded copy is kept while the scaled weight is the same tensor
                cached = self.__dict__.get("_half")
                if cached is None or cached[0] is not w or cached[1] != x.dtype:
                    cached = self.__dict__["_half"] = (w, x.dtype, w.to(x.dtype))
                w = cached[2]
        single = len(groups.runs) == 1
        xs = x if single else x.index_select(0, groups.perm)  # nodes sorted by element
        n, ne, ir_mul = xs.shape[0], self.num_elements, self.layout == "ir_mul"
        xparts = xs.split([m * (2 * l + 1) for m, l, _ in self.irreps_in], dim=1)  # backward: one cat
        flat = []
        for k, terms in enumerate(blocks):
            mul, l, _ = self.irreps_out[k]
            d = 2 * l + 1
            acc = None
            for i_in, m1, _, off, mo in terms:
                wv = w.narrow(0, off, m1 * ne * mo).view(m1, ne, mo)
                xb = xparts[i_in]
                if d > 1:  # [N*d, m1]: one matrix product over the channel axis per element run
                    xb = rows_by_component(xb, n, d, m1, ir_mul)
                parts = [torch.mm(xb[a * d:b * d], wv[:, z, :]) for z, a, b in groups.runs]
                y = parts[0] if single else torch.cat(parts, 0)
                acc = y if acc is None else acc + y
            if acc is None:
                flat.append(xs.new_zeros(n, mul * d))
            elif d == 1:
                flat.append(acc)
            else:  # acc [N*d, mul]
                flat.append(acc.view(n, d * mul) if ir_mul else acc.view(n, d, mul).transpose(1, 2).reshape(n, mul * d))
        out = torch.cat(flat, 1) if len(flat) > 1 else flat[0]
        return out if single else out.index_select(0, groups.inverse)


def _offsets(irreps) -> List[int]:
    offs, o = [], 0
    for mul, l, _ in irreps:
        offs.append(o)
        o += mul * (2 * l + 1)
    return offs
