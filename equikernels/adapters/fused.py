"""The fused replacement of gather -> tensor product with per-edge weights -> scatter-sum."""
from __future__ import annotations

import torch

from ..nn.tensor_product import TensorProduct
from ..ops.conv import tensor_product_conv
from ..ops.tp import resolve_backend
from .graph_cache import shared_graph


def fusable_tp(tp) -> str:
    """'' if ``tp`` (an equikernels TensorProduct) can run as a fused convolution, else why not."""
    if not isinstance(tp, TensorProduct):
        return f"its tensor product is a {type(tp).__name__}, not an equikernels TensorProduct"
    if tp.weight_numel and tp.shared_weights:
        return "its tensor product has shared (not per-edge) weights"
    return ""


def message_passing(tp: TensorProduct, x: torch.Tensor, y: torch.Tensor, weight, src: torch.Tensor,
                    dst: torch.Tensor, num_nodes) -> torch.Tensor:
    """out[n] = sum over edges e with dst[e] == n of tp(x[src[e]], y[e], weight[e]): the same numbers
    as the unfused layer, through ``tensor_product_conv`` on the graph shared by every layer. On
    the CPU backend no fused kernel runs, so the layer gathers and scatters as the original did,
    without sorting a graph."""
    if not isinstance(tp, TensorProduct) or resolve_backend(tp.backend, x.device) == "cpu":
        # (a product replaced since the layer was fused, e.g. by a scripted one: computed as it was)
        msg = tp(x.index_select(0, src), y, weight)
        rows = int(num_nodes) if isinstance(num_nodes, torch.Tensor) else num_nodes  # (a traced size stays symbolic)
        return msg.new_zeros(rows, msg.shape[1]).index_add_(0, dst, msg)
    graph = shared_graph(src, dst, num_nodes)
    return tensor_product_conv(tp.problem, x, y, tp._get_weights(weight), graph.src, graph.dst, graph.num_nodes,
                               graph=graph, layout=tp.layout, backend=tp.backend, validate=False,
                               math_dtype=tp.math_dtype, output_dtype=tp.output_dtype)
