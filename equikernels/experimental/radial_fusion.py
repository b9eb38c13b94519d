"""The interaction blocks' opt-in message path: the convolution with the radial MLP's last layer
fused in (radial_conv) instead of writing the per-edge weights.

``radial_fusion`` (block attribute, not saved) or EQUIKERNELS_RADIAL_CONV: "0" never, "1" whenever
the kernels take the call (the memory-lean path), "auto" the autotuner's choice: with
``EQUIKERNELS_AUTOTUNE=1`` both ways of one block's per-edge part (MLP, cutoff, convolution) are
timed forward + backward to (node features, edge attributes, edge features), the energy + forces
shape, on the call's own tensors, and the choice is remembered per GPU, problem, layout, dtype and
graph-size bucket; without the tuner, ``DEFAULT_FUSED`` applies.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import settings, tune
from ..models.chunked import edge_chunk_setting
from ..ops.conv import ConvGraph, tensor_product_conv
from .radial_conv import fused_available, radial_conv

# heuristic without the tuner: the fused kernels measured slower than the unfused path on an H200
# (MACE-MP medium layer 2, 10,192 Cu atoms, E+F: 60.2 vs 13.6 ms)
DEFAULT_FUSED = False


def _split(block, edge_feats, cutoff) -> tuple:
    hidden, w_last = block.radial_mlp.split_last(edge_feats)
    if cutoff is not None:  # the last layer is linear: (hidden @ W) * cutoff == (hidden * cutoff) @ W
        hidden = hidden * cutoff
    return hidden, w_last


def _edge_part(block, h, edge_attrs, edge_feats, cutoff, graph: ConvGraph, fused: bool) -> torch.Tensor:
    if fused:
        hidden, w_last = _split(block, edge_feats, cutoff)
        return radial_conv(block.problem, h, edge_attrs, hidden, w_last, graph, layout=block.layout, fused=True)
    w = block.radial_mlp(edge_feats)
    if cutoff is not None:
        w = w * cutoff
    return tensor_product_conv(block.problem, h, edge_attrs, w, graph.src, graph.dst, graph.num_nodes, graph=graph,
                               layout=block.layout, validate=False)


def choose_radial_fusion(block, h: torch.Tensor, edge_attrs: torch.Tensor, edge_feats: torch.Tensor,
                         cutoff: Optional[torch.Tensor], graph: ConvGraph) -> bool:
    if not tune.active(h.device):
        return DEFAULT_FUSED
    key = (f"{tune.device_key(h.device)}|radial_conv|{block.problem.key()}|{block.layout}|{h.dtype}|"
           f"H{block.radial_mlp.hs[-2]}|E{tune.bucket(graph.num_edges)}")

    def step(fused: bool):
        with torch.enable_grad():
            ts = [t.detach().requires_grad_() for t in (h, edge_attrs, edge_feats)]
            out = _edge_part(block, *ts[:2], ts[2], cutoff, graph, fused)
            torch.autograd.grad(out, ts, torch.ones_like(out), allow_unused=True)

    cands = [{"fused": DEFAULT_FUSED}, {"fused": not DEFAULT_FUSED}]
    best = tune.choose(key, cands, lambda c: tune.time_ms(lambda: step(c["fused"]), h.device, reps=5),
                       {"fused": DEFAULT_FUSED})
    return bool(best["fused"])


def radial_fused(block, h: torch.Tensor, edge_attrs: torch.Tensor, edge_feats: torch.Tensor,
                 cutoff: Optional[torch.Tensor], graph: ConvGraph) -> bool:
    """Whether this call of ``block`` runs the fused convolution."""
    setting = block.radial_fusion or settings.get().radial_conv
    if setting not in ("auto", "0", "1"):
        raise ValueError(f"radial_fusion / EQUIKERNELS_RADIAL_CONV: expected 'auto', '0' or '1', got {setting!r}")
    if setting == "0" or block.radial_mlp.act is None or len(block.radial_mlp.layers) < 2:
        return False
    # an explicit edge chunk wins (unfused inside the chunks); "auto" counts per-edge weights that
    # the fused convolution never stores
    if edge_chunk_setting(block.edge_chunk) not in ("auto", 0):
        return False
    if h.dtype != block.radial_mlp.layers[0].weight.dtype or torch.is_autocast_enabled(h.device.type):
        return False
    if not fused_available(block.problem, block.radial_mlp.hs[-2], h, block.layout):
        return False
    if setting == "1":
        return True
    return choose_radial_fusion(block, h, edge_attrs, edge_feats, cutoff, graph)


def message(block, h: torch.Tensor, edge_attrs: torch.Tensor, edge_feats: torch.Tensor,
            cutoff: Optional[torch.Tensor], graph: ConvGraph) -> Optional[torch.Tensor]:
    """The hook of ``models.hooks.message``: the fused message, or None (the default path runs)."""
    if not radial_fused(block, h, edge_attrs, edge_feats, cutoff, graph):
        return None
    hidden, w_last = _split(block, edge_feats, cutoff)
    return radial_conv(block.problem, h, edge_attrs, hidden, w_last, graph, layout=block.layout, fused=True)
