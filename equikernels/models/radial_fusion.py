"""When an interaction runs its convolution with the radial MLP's last layer fused in
(ops.radial_conv) instead of writing the per-edge weights (the autotuner decides).

With the autotuner on (``EQUIKERNELS_AUTOTUNE=1``), both ways of one block's per-edge part (MLP,
cutoff, convolution) are timed forward + backward to (node features, edge attributes, edge
features), the energy + forces shape, on the call's own tensors; the choice is remembered per GPU,
problem, layout, dtype and graph-size bucket. Without it, ``DEFAULT_FUSED`` applies.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import tune
from ..ops.conv import ConvGraph, tensor_product_conv
from ..ops.radial_conv import radial_conv

# heuristic without the tuner: the fused kernels measured slower than the unfused path on an H200
# (MACE-MP medium layer 2, 10,192 Cu atoms, E+F: 60.2 vs 13.6 ms)
DEFAULT_FUSED = False


def _edge_part(block, h, edge_attrs, edge_feats, cutoff, graph: ConvGraph, fused: bool) -> torch.Tensor:
    if fused:
        hidden, w_last = block.radial_mlp.split_last(edge_feats)
        if cutoff is not None:
            hidden = hidden * cutoff
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
