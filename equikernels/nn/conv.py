"""``TensorProductConv``: a TensorProduct evaluated over graph edges and summed onto nodes."""
from __future__ import annotations

from typing import Optional

import torch

from ..ops.conv import DATAFLOWS, ConvGraph, tensor_product_conv
from .frozen import outside_inference_mode
from .tensor_product import TensorProduct


class TensorProductConv(TensorProduct):
    """out[n] = sum_{e: dst[e] = n} TP(x[src[e]], y[e], weight[e]).

    Same constructor as ``TensorProduct`` (and so the same problem and weight layout), plus
    ``dataflow`` ("auto", "atomic", "deterministic", "unfused") and ``deterministic``. The per-edge
    [E, dim_out] message tensor is never materialised by the fused dataflows.
    """

    def __init__(self, *args, dataflow: str = "auto", deterministic: Optional[bool] = None, **kwargs) -> None:
        if dataflow not in DATAFLOWS:
            raise ValueError(f"dataflow: expected one of {DATAFLOWS}, got {dataflow!r}")
        if deterministic and dataflow == "atomic":
            raise ValueError("dataflow='atomic' is not deterministic; use 'deterministic' or 'auto' with "
                             "deterministic=True")
        super().__init__(*args, **kwargs)
        self.dataflow = dataflow
        self.deterministic = deterministic

    def __prepare_scriptable__(self):
        """TorchScript cannot run the graph convolution (it takes a ConvGraph and custom ops)."""
        raise RuntimeError("TensorProductConv does not support TorchScript (torch.jit.script); use torch.export or "
                           "torch.compile, which keep the fused convolution")

    @outside_inference_mode
    def forward(self, x: torch.Tensor, y: torch.Tensor, weight=None, src: Optional[torch.Tensor] = None,
                dst: Optional[torch.Tensor] = None, num_nodes: Optional[int] = None,
                graph: Optional[ConvGraph] = None) -> torch.Tensor:
        """With ``graph``, ``src``/``dst`` may be omitted; if given they must be the graph's edges
        (see ``ops.tensor_product_conv``)."""
        if graph is None and (src is None or dst is None):
            raise ValueError("src and dst: required (or pass graph=ConvGraph.build(src, dst, num_nodes))")
        if torch.jit.is_tracing():  # a trace holds plain operations, not the fused kernels' Functions
            return self._traced_conv(x, y, weight, src, dst, num_nodes, graph)
        return tensor_product_conv(self.problem, x, y, self._get_weights(weight), src, dst, num_nodes, graph=graph,
                                   layout=self.layout, backend=self.backend, dataflow=self.dataflow,
                                   deterministic=self.deterministic, math_dtype=self.math_dtype,
                                   output_dtype=self.output_dtype)

    @torch.jit.unused
    def _traced_conv(self, x: torch.Tensor, y: torch.Tensor, weight, src: Optional[torch.Tensor],
                     dst: Optional[torch.Tensor], num_nodes: Optional[int], graph: Optional[ConvGraph]) -> torch.Tensor:
        """``forward`` under torch.jit.trace: gather, the product's plain form, ``index_add`` (the
        trace reads the edges it is given, any number of them, and the module's current weights)."""
        rows = x.shape[0] if num_nodes is None else num_nodes
        if graph is not None:
            if not isinstance(graph, ConvGraph):
                raise TypeError(f"graph: expected a ConvGraph (ConvGraph.build), got {type(graph).__name__}")
            if graph.num_nodes != rows:
                raise ValueError(f"graph: built for {graph.num_nodes} nodes, but num_nodes is {rows}")
            src, dst = graph.src, graph.dst
        msgs = self._traced_tp(x.index_select(0, src), y, self._get_weights(weight))
        return msgs.new_zeros(rows, msgs.shape[-1]).index_add(0, dst, msgs)
