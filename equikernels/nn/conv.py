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
        return tensor_product_conv(self.problem, x, y, self._get_weights(weight), src, dst, num_nodes, graph=graph,
                                   layout=self.layout, backend=self.backend, dataflow=self.dataflow,
                                   deterministic=self.deterministic, math_dtype=self.math_dtype,
                                   output_dtype=self.output_dtype)
