"""MACE's symmetric contraction (the product basis) as an n-ary path table.

For every channel c, element z and output irrep component m,

    B[c, m] = sum_nu sum_{i1..inu, k} U_nu[m, i1, .., inu, k] W_nu[z, k, c] A[c, i1] ... A[c, inu]

where A[c, :] are the components of all input irreps of channel c (MACE's "coupling" irreps, e.g.
0e+1o+2e+3o) and U_nu are the generalised Clebsch-Gordan tensors a checkpoint carries as buffers.

In the IR (``equikernels.ir``) this is, for each (output irrep, nu, multiset of input segments),
one path with nu factors of ``x`` (the features) and one factor of ``w`` (per-row weights whose
"components" are the k index), all sharing the channel label ``u``; its entries are U's nonzeros.
Permutations of the same input segments are merged into one path (the factors are one operand),
which divides the number of degree-3 paths by up to six. The per-row weights are W[z] gathered by
each node's element. The table's op (``ops.table_chain``) is differentiable to any order (forces,
and force-trained parameters) through its gradient tables.

This module provides the contraction's implementation of those tables on CUDA (backend "triton"):
the forward and every gradient table go through the project's Triton generator
(``equikernels.codegen``) unchanged, each table as unrolled kernels (at most
``EQUIKERNELS_MAX_PATHS`` paths each, adding into one output). A table the generator cannot express
falls back to the reference, with a warning.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .. import settings
from ..dtypes import HALF, acc_dtype, math_dtype_of
from ..ir import Factor, Operand, Path, Segment, Table
from ..ops.chain import in_transform
from ..ops.table_chain import TableOp
from ..ops.tp import check_backend
from ..nn.frozen import frozen_key, held, state_without, version
from .cpu_contraction import MonomialContraction

U_ZERO_TOL = 0.0  # U entries are kept exactly (a checkpoint's zeros are exact zeros)


def _segments(irreps: Sequence[Tuple[int, int]]) -> Tuple[Segment, ...]:
    segs, off = [], 0
    for mul, l in irreps:
        segs.append(Segment(off, mul, 2 * l + 1))
        off += mul * (2 * l + 1)
    return tuple(segs)


def contraction_table(channels: int, ls_in: Sequence[int], ls_out: Sequence[int],
                      u_matrices: Sequence[Sequence[torch.Tensor]]) -> Tuple[Table, List[List[int]]]:
    """Path table of the symmetric contraction.

    ``ls_in``: the l of each input segment (each ``channels`` copies); ``ls_out``: the l of each
    output segment; ``u_matrices[o][nu-1]``: U of output o and degree nu, shaped
    [2l_out+1, d, .., d, K] (the leading axis absent when l_out = 0), d = sum(2l+1 for ls_in).
    Returns the table (operands ``x``, ``w`` -> ``out``) and the weight sizes K[o][nu-1].
    """
    seg_x = _segments([(channels, l) for l in ls_in])
    seg_out = _segments([(channels, l) for l in ls_out])
    comp_seg = [(s, c) for s, l in enumerate(ls_in) for c in range(2 * l + 1)]  # U axis -> (segment, component)
    sizes = [[int(u.shape[-1]) for u in us] for us in u_matrices]
    w_segs, off = [], 0
    for ks in sizes:
        for k in ks:
            w_segs.append(Segment(off, channels, k))
            off += channels * k
    operands = (Operand("x", seg_x[-1].offset + seg_x[-1].mul * seg_x[-1].dim if seg_x else 0, seg_x),
                Operand("w", off, tuple(w_segs)),
                Operand("out", seg_out[-1].offset + seg_out[-1].mul * seg_out[-1].dim, seg_out))
    lab = (("u", 1),)
    paths, w_index = [], 0
    for o, (l_out, us) in enumerate(zip(ls_out, u_matrices)):
        for nu, u in enumerate(us, start=1):
            u = u.detach().to("cpu", torch.float64)
            if l_out == 0 and u.dim() == nu + 1:
                u = u.unsqueeze(0)
            if u.shape[0] != 2 * l_out + 1 or u.dim() != nu + 2:
                raise ValueError(f"u_matrices[{o}][{nu - 1}]: expected shape [{2 * l_out + 1}]"
                                 f"{[len(comp_seg)] * nu}[K], got {tuple(u.shape)}")
            # group nonzeros by the sorted multiset of input segments, permuting components along
            groups: Dict[Tuple[int, ...], Dict[Tuple[Tuple[int, ...], int], float]] = defaultdict(
                lambda: defaultdict(float))
            for idx in (u != 0).nonzero().tolist():
                m, comps, k = idx[0], idx[1:-1], idx[-1]
                pairs = sorted(comp_seg[i] for i in comps)
                key = tuple(s for s, _ in pairs)
                groups[key][(tuple(c for _, c in pairs) + (k,), m)] += float(u[tuple(idx)])
            for key in sorted(groups):
                entries = tuple((comps, m, c) for (comps, m), c in sorted(groups[key].items()) if c != 0.0)
                if not entries:
                    continue
                factors = tuple(Factor("x", s, 0, lab) for s in key) + (Factor("w", w_index, 0, lab),)
                paths.append(Path(factors, None, Factor("out", o, 0, lab), (("u", channels),), entries))
            w_index += 1
    return Table(operands, "out", tuple(paths)), sizes


def contraction_op(table: Table, layout: str, backend: Optional[str] = None) -> TableOp:
    """The contraction's table as a differentiable op (``ops.table_chain``): generated Triton
    kernels (``_Generated``) on the triton backend, the reference elsewhere."""
    return TableOp(table, layout, backend=backend, build=_Generated, label="symmetric contraction")


class _Generated:
    """A table as generated Triton kernels (``equikernels.codegen``), split into runs of at most
    ``EQUIKERNELS_MAX_PATHS`` paths that add into one zero-filled output."""

    def __init__(self, table: Table, layout: str, dtype: torch.dtype, name: str) -> None:
        from ..codegen.emit import Group  # noqa: PLC0415 (Triton only when a CUDA kernel is built)
        from ..codegen.tp import LaunchConfig, Kernel  # noqa: PLC0415

        limit = settings.get().max_paths
        chunks = [table.paths[i:i + limit] for i in range(0, len(table.paths), limit)] or [()]
        rows_ops = {o.name for o in table.operands}
        self.out = table.operand(table.output)
        self.kernels = [Kernel(f"{name}_{k}", [Group(Table(table.operands, table.output, paths), table.output,
                                                      accumulate=len(chunks) > 1)],
                                layout, rows_ops, f"symmetric contraction table part {k + 1}/{len(chunks)}")
                        for k, paths in enumerate(chunks)]
        self.accumulate = len(chunks) > 1
        self.zero = self.accumulate or any(k.meta.zero_init for k in self.kernels)
        # one row per program: a contraction keeps every component of x and of the per-row weights
        # live (16 + 86 [rows, channels] tiles for MACE-MP medium), more rows would spill registers
        rows = settings.get().rows_contraction
        self.cfg, self.dtype = LaunchConfig(rows=rows, num_warps=4), dtype
        self.compiled = False

    def __call__(self, named: Dict[str, torch.Tensor], rows: int, out_dtype: torch.dtype) -> torch.Tensor:
        like = next(iter(named.values()))
        # chunks add into one output: a half result is summed in a float32 buffer, rounded once
        buf_dtype = acc_dtype(out_dtype) if self.accumulate else out_dtype
        alloc = torch.zeros if self.zero else torch.empty
        out = alloc(rows, self.out.dim, dtype=buf_dtype, device=like.device)
        if rows:
            for k in self.kernels:  # self.dtype is the math dtype (kernels cast on load and store)
                k.launch(named, {self.out.name: out}, rows, self.cfg, self.dtype)
        return out.to(out_dtype)


class SymmetricContraction(nn.Module):
    """Element-indexed symmetric contraction of MACE (one ``Contraction`` per output irrep).

    ``weights[o][nu-1]``: [num_elements, K, channels] parameters (mace-torch's shapes);
    ``U_{o}_{nu}`` buffers hold the U tensors. ``forward(x, element)``: x [N, channels * d] in
    ``layout``, element [N] int64 -> [N, channels * sum(2l_out+1)] in ``layout``.
    """

    def __init__(self, channels: int, ls_in: Sequence[int], ls_out: Sequence[int], correlation: Sequence[int],
                 num_elements: int, u_matrices=None, layout: str = "ir_mul", backend: Optional[str] = None) -> None:
        super().__init__()
        if len(correlation) != len(ls_out):
            raise ValueError(f"correlation: expected one degree per output irrep ({len(ls_out)}), got {correlation}")
        self.channels, self.ls_in, self.ls_out = channels, list(ls_in), list(ls_out)
        self.correlation, self.num_elements, self.layout = list(correlation), num_elements, layout
        check_backend(backend)  # said at construction, not at the first call
        self.backend = backend  # None: EQUIKERNELS_BACKEND / automatic (triton on CUDA)
        d = sum(2 * l + 1 for l in ls_in)
        self.weights = nn.ModuleList()
        for o, (l_out, corr) in enumerate(zip(ls_out, correlation)):
            per_nu = nn.ParameterList()
            for nu in range(1, corr + 1):
                if u_matrices is None:
                    raise ValueError("u_matrices: required to build a SymmetricContraction (take them from a "
                                     "mace-torch checkpoint with from_mace, or from a saved model with load)")
                u = u_matrices[o][nu - 1]
                self.register_buffer(f"U_{o}_{nu}", u.detach().clone())
                k = int(u.shape[-1])
                per_nu.append(nn.Parameter(torch.randn(num_elements, k, channels) / k))
            self.weights.append(per_nu)
        del d
        self._build_table()

    def __getstate__(self):
        return state_without(self, ("_node_w", "_cpu_w", "_mono"))

    def u_matrices(self) -> List[List[torch.Tensor]]:
        return [[getattr(self, f"U_{o}_{nu}") for nu in range(1, c + 1)] for o, c in enumerate(self.correlation)]

    def _build_table(self) -> None:
        self.table, self.weight_sizes = contraction_table(self.channels, self.ls_in, self.ls_out, self.u_matrices())
        self.op = contraction_op(self.table, self.layout, self.backend)

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        self._build_table()  # the table is derived from the U buffers just loaded

    def weight_table(self) -> torch.Tensor:
        """[num_elements, w.dim]: every W[z] flattened in the order the table's ``w`` reads it."""
        parts = []
        for per_nu in self.weights:
            for w in per_nu:
                w = w if self.layout == "ir_mul" else w.transpose(1, 2)  # ir_mul: k-major, as W[z, k, c]
                parts.append(w.reshape(w.shape[0], -1))
        return torch.cat(parts, dim=1)

    def node_weights(self, element: torch.Tensor) -> torch.Tensor:
        """W[element] [N, w.dim]. With frozen weights (inference) it is kept between calls on the same
        element tensor (same object, unmodified): an MD step then gathers nothing."""
        params = [w for per_nu in self.weights for w in per_nu]
        if any(p.requires_grad for p in params) or torch.compiler.is_compiling():
            return self._gather(element)
        key = (version(element), frozen_key(params))
        cached = self.__dict__.get("_node_w")
        if cached is None or cached[0] is not element or cached[1] != key:
            # the element tensor itself is held, so its id cannot be reused by another tensor
            cached = self.__dict__["_node_w"] = (element, key, self._gather(element), held(params))
        return cached[2]

    def _gather(self, element: torch.Tensor) -> torch.Tensor:
        table = self.weight_table()
        if table.dtype in HALF:  # half weights: gathered in float32 so the per-element gradient sums
            return table.float().index_select(0, element).to(table.dtype)  # (index_add) are float32
        return table.index_select(0, element)

    def forward(self, x: torch.Tensor, element: torch.Tensor) -> torch.Tensor:
        from ..ops.tp import resolve_backend  # noqa: PLC0415

        if resolve_backend(self.backend, x.device) == "cpu":
            return self._forward_cpu(x, element)
        w = self.node_weights(element)
        if self.op.layout != self.layout:  # layout changed after construction
            self.op = contraction_op(self.table, self.layout, self.backend)
        return self.op({"x": x, "w": w})

    def _forward_cpu(self, x: torch.Tensor, element: torch.Tensor) -> torch.Tensor:
        """The monomial-basis evaluation (models.cpu_contraction), computed in float32 for half
        features and in float64 for float64 ones."""
        mono = self.__dict__.get("_mono")
        if mono is None or mono[0] is not self.table:  # rebuilt with the table (U loaded)
            mono = self.__dict__["_mono"] = (self.table, MonomialContraction(
                self.channels, self.ls_in, self.ls_out, self.u_matrices()))
        params = [w for per_nu in self.weights for w in per_nu]
        math = math_dtype_of([x] + params)
        # transformed (torch.func) weights have no storage to key a cache on: never frozen there
        frozen = not (any(p.requires_grad for p in params) or torch.compiler.is_compiling() or in_transform())
        key = (version(element), math, frozen_key(params)) if frozen else None
        cached = self.__dict__.get("_cpu_w")
        if frozen and cached is not None and cached[0] is element and cached[1] == key:
            ws = cached[2]
        else:  # per output: [K, N, channels], the degrees concatenated along k
            ws = [torch.cat(list(per_nu), 1).to(math).index_select(0, element).transpose(0, 1)
                  for per_nu in self.weights]
            if frozen:
                self.__dict__["_cpu_w"] = (element, key, ws, held(params))
        out = mono[1](x.to(math), ws, self.layout)
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        return (f"channels={self.channels}, ls_in={self.ls_in}, ls_out={self.ls_out}, correlation={self.correlation},"
                f" paths={len(self.table.paths)}")
