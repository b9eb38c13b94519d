"""An e3nn message-passing layer as NequIP-style models write it, for the tests of accelerate's fused layers."""
import torch

import equikernels  # noqa: F401  (before e3nn: e3nn 0.4.4 loads its constants)
from equikernels._compat import o3


class MessageConv(torch.nn.Module):
    """Message passing as NequIP-style layers write it: gather, per-edge weighted product, scatter-sum."""

    def __init__(self):
        super().__init__()
        self.tp = o3.FullyConnectedTensorProduct("2x0e+1x1o", "0e+1o", "2x0e+1x1o", shared_weights=False,
                                                 internal_weights=False)

    def forward(self, x, y, w, src, dst):
        msg = self.tp(x[src], y, w)
        return torch.zeros(x.shape[0], msg.shape[1], dtype=msg.dtype).index_add(0, dst, msg)
