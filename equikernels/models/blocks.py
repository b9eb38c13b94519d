"""MACE layers built from equikernels components: interaction blocks (message passing through
``tensor_product_conv``), the product-basis block (symmetric contraction + linear + skip) and the
readouts. Node features stay in one ``layout`` (``ir_mul`` by default) from layer to layer."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..nn.linear import Linear
from ..ops.conv import ConvGraph, tensor_product_conv
from ..problem import TPProblem
from .data import both_halves
from .chunked import EdgeChunk, chunked_edge_conv, edge_weights, parse_edge_chunk, resolve_edge_chunk
from . import hooks
from .element_linear import ElementGroups, ElementLinear
from .radial import GATES, RadialMLP
from .symmetric_contraction import SymmetricContraction
from .._compat import e3nn  # noqa: F401
from e3nn.math import normalize2mom  # noqa: E402

INTERACTIONS = {
    # name: (residual skip on the input features, density normalisation instead of avg_num_neighbors)
    "RealAgnosticInteractionBlock": (False, False),
    "RealAgnosticResidualInteractionBlock": (True, False),
    "RealAgnosticDensityInteractionBlock": (False, True),
    "RealAgnosticDensityResidualInteractionBlock": (True, True),
}


class InteractionBlock(nn.Module):
    """One MACE interaction: linear_up, the edge convolution (uvu TP, weights from the radial MLP,
    messages gathered from senders and summed onto receivers), linear, normalisation, and the
    element-indexed skip (on the input for the residual kinds, on the message otherwise).

    ``edge_chunk`` (attribute, not saved): None = ``EQUIKERNELS_EDGE_CHUNK`` / "auto", or "auto" /
    edges per chunk / 0 (never) for this block: the per-edge part (radial MLP, cutoff, convolution)
    then runs a chunk of destination nodes at a time, recomputed in the backward (models.chunked).
    ``radial_fusion`` (attribute, not saved): the experimental fused radial convolution for this
    block (``equikernels.experimental``; None = ``EQUIKERNELS_RADIAL_CONV``)."""

    edge_chunk: Optional[EdgeChunk] = None  # class default: modules pickled before it existed
    radial_fusion: Optional[str] = None

    def __init__(self, cfg: dict, num_elements: int, sh_irreps: str, num_radial: int, layout: str) -> None:
        super().__init__()
        kind = cfg["type"]
        if kind not in INTERACTIONS:
            raise ValueError(f"interaction type: expected one of {tuple(INTERACTIONS)}, got {kind!r}")
        self.kind, self.layout = kind, layout
        self.residual, self.density = INTERACTIONS[kind]
        self.avg_num_neighbors = float(cfg["avg_num_neighbors"])
        self.linear_up = Linear(cfg["node_feats_irreps"], cfg["edge_irreps"], layout=layout)
        self.problem = TPProblem.create(cfg["edge_irreps"], sh_irreps, cfg["irreps_mid"],
                                        [tuple(i) for i in cfg["instructions"]], shared_weights=False,
                                        internal_weights=False)
        self.radial_mlp = RadialMLP([num_radial] + list(cfg["radial_mlp"]) + [self.problem.weight_numel], "silu")
        self.linear = Linear(cfg["irreps_mid"], cfg["target_irreps"], layout=layout)
        if self.residual:
            self.skip = ElementLinear(cfg["node_feats_irreps"], num_elements, cfg["hidden_irreps"], layout)
        else:
            self.skip = ElementLinear(cfg["target_irreps"], num_elements, cfg["target_irreps"], layout)
        if self.density:
            self.density_fn = RadialMLP([num_radial, 1], "silu")

    def forward(self, node_feats: torch.Tensor, groups: ElementGroups, edge_attrs: torch.Tensor,
                edge_feats: torch.Tensor, cutoff: Optional[torch.Tensor], graph: ConvGraph,
                num_out: Optional[int] = None, out_groups: Optional[ElementGroups] = None, paired: bool = False
                ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``num_out``: only the first ``num_out`` rows of the message and skip are computed (the rows
        that receive edges); ``out_groups``: the element groups of those rows (built if None).
        ``paired``: edges E/2 + p are edges p reversed, and ``edge_feats`` / ``cutoff`` hold the
        first half's rows only."""
        if num_out is not None:
            groups = out_groups if out_groups is not None else ElementGroups.build(groups.element[:num_out],
                                                                                   self.skip.num_elements)
        sc = self.skip(node_feats if num_out is None else node_feats[:num_out], groups) if self.residual else None
        h = self.linear_up(node_feats)
        msg = None
        if hooks.message is not None:  # opt-in: equikernels.experimental (None: it leaves the call here)
            full_feats, full_cut = (both_halves(edge_feats), both_halves(cutoff)) if paired else (edge_feats, cutoff)
            msg = hooks.message(self, h, edge_attrs, full_feats, full_cut, graph)
        else:
            hooks.check_message_unrequested(self.radial_fusion)
        if msg is None:
            msg = self._message(h, edge_attrs, edge_feats, cutoff, graph, paired)
        if num_out is not None:  # the other rows receive no edges: linear and skip would map zeros
            msg = msg[:num_out]
        if self.density:
            d = torch.tanh(self.density_fn(edge_feats) ** 2)
            if cutoff is not None:
                d = d * cutoff
            if paired:
                d = both_halves(d)
            density = d.new_zeros(graph.num_nodes, 1).index_add(0, graph.dst, d)  # edge_feats' dtype
            if num_out is not None:
                density = density[:num_out]
            msg = self.linear(msg)
            msg = msg / (density + 1).to(msg.dtype)
        else:
            msg = self.linear(msg) / self.avg_num_neighbors
        if not self.residual:
            msg = self.skip(msg, groups)
        return msg, sc

    def _message(self, h: torch.Tensor, edge_attrs: torch.Tensor, edge_feats: torch.Tensor,
                 cutoff: Optional[torch.Tensor], graph: ConvGraph, paired: bool = False) -> torch.Tensor:
        """The convolution of ``h`` with per-edge weights from the radial MLP; on large graphs a chunk
        of destinations at a time, recomputed in the backward (models.chunked). ``paired``: as
        ``forward``."""
        chunk = resolve_edge_chunk(self.edge_chunk, graph.num_edges, self.problem.weight_numel, h.element_size(),
                                   h.device)
        if chunk:
            if paired:  # chunks are destination ranges: an edge's reverse lies in another chunk
                edge_feats, cutoff = both_halves(edge_feats), both_halves(cutoff)
            return chunked_edge_conv(self.problem, self.radial_mlp, h, edge_attrs, edge_feats, cutoff, graph, chunk,
                                     self.layout)
        # per-edge weights in the node features' dtype (mixed precision: the MLP runs in the half type,
        # as autocast would; edge_feats, cutoff and the spherical harmonics stay full precision)
        w = edge_weights(self.radial_mlp, edge_feats, cutoff, h.dtype, paired)
        return tensor_product_conv(self.problem, h, edge_attrs, w, graph.src, graph.dst, graph.num_nodes,
                                   graph=graph, layout=self.layout, validate=False)


def set_edge_chunk(model: nn.Module, value: Optional[EdgeChunk]) -> nn.Module:
    """Sets ``edge_chunk`` on every interaction block of ``model`` (None: back to the environment /
    default); returns the model. Not saved with the model."""
    if value is not None:
        value = parse_edge_chunk(value)
    for m in model.modules():
        if isinstance(m, InteractionBlock):
            m.edge_chunk = value
    return model


class ProductBlock(nn.Module):
    """Symmetric contraction (element-indexed weights) -> linear (+ skip)."""

    def __init__(self, cfg: dict, layout: str, u_matrices=None) -> None:
        super().__init__()
        self.use_sc = bool(cfg["use_sc"])
        self.symmetric_contraction = SymmetricContraction(
            cfg["channels"], cfg["ls_in"], cfg["ls_out"], cfg["correlation"], cfg["num_elements"],
            u_matrices if u_matrices is not None else _zeros_like_shapes(cfg["u_shapes"]), layout)
        self.linear = Linear(cfg["hidden_irreps"], cfg["hidden_irreps"], layout=layout)

    def forward(self, x: torch.Tensor, sc: Optional[torch.Tensor], element: torch.Tensor) -> torch.Tensor:
        out = self.linear(self.symmetric_contraction(x, element))
        return out + sc if self.use_sc and sc is not None else out


def _zeros_like_shapes(shapes: Sequence[Sequence[Sequence[int]]]) -> List[List[torch.Tensor]]:
    return [[torch.zeros(s) for s in per_out] for per_out in shapes]


class LinearReadout(nn.Module):
    def __init__(self, cfg: dict, layout: str) -> None:
        super().__init__()
        self.linear = Linear(cfg["irreps_in"], cfg["irreps_out"], layout=layout)

    def forward(self, x: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class NonLinearReadout(nn.Module):
    """linear -> normalised gate on the scalars -> (keep each node's head block) -> linear."""

    def __init__(self, cfg: dict, layout: str) -> None:
        super().__init__()
        gate = cfg["gate"]
        if gate not in GATES:
            raise ValueError(f"readout gate: expected one of {tuple(GATES)}, got {gate!r}")
        self.num_heads = int(cfg["num_heads"])
        self.linear_1 = Linear(cfg["irreps_in"], cfg["mlp_irreps"], layout=layout)
        self.act = normalize2mom(GATES[gate]) if GATES[gate] is not None else None
        self.linear_2 = Linear(cfg["mlp_irreps"], cfg["irreps_out"], layout=layout)

    def forward(self, x: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        x = self.linear_1(x)
        if self.act is not None:
            x = self.act(x)
        if self.num_heads > 1:
            keep = torch.arange(self.num_heads, device=x.device)[None, :] == heads[:, None]  # [N, heads]
            x = (x.view(x.shape[0], self.num_heads, -1) * keep[:, :, None].to(x.dtype)).view(x.shape)
        return self.linear_2(x)
