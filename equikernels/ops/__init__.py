"""Custom ops (torch.library) with autograd; Triton on CUDA, the reference elsewhere."""
from .conv import DATAFLOWS, ConvGraph, tensor_product_conv
from .conv_fused import conv_bwd, conv_dbwd, conv_fwd
from .tp import BACKENDS, LAYOUTS, Plan, plan_of, resolve_backend, spec_of, tensor_product, tp_bwd, tp_fwd

__all__ = ["DATAFLOWS", "ConvGraph", "tensor_product_conv", "conv_fwd", "conv_bwd", "conv_dbwd", "BACKENDS", "LAYOUTS",
           "Plan", "plan_of", "resolve_backend", "spec_of", "tensor_product", "tp_bwd", "tp_fwd"]
