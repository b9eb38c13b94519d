"""equikernels: fast e3nn-compatible equivariant tensor products.

Light at import: Triton is imported only when a CUDA kernel is first built.
"""
from . import nn
from .nn import (AccelerateReport, ChannelWiseTensorProduct, ElementwiseTensorProduct, FullTensorProduct,
                 FullyConnectedTensorProduct, Linear, TensorProductConv, SphericalHarmonics, TensorProduct, accelerate, from_e3nn)
from .ops.conv import ConvGraph
from ._version import __version__
from .problem import TPProblem

__all__ = ["TensorProduct", "FullyConnectedTensorProduct", "ElementwiseTensorProduct", "FullTensorProduct",
           "ChannelWiseTensorProduct", "TensorProductConv", "Linear", "SphericalHarmonics", "from_e3nn", "accelerate",
           "AccelerateReport", "ConvGraph", "TPProblem", "__version__"]
if "TensorSquare" in nn.__all__:
    from .nn import TensorSquare  # noqa: F401
    __all__.append("TensorSquare")
