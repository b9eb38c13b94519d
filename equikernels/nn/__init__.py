"""e3nn-compatible modules (same constructor arguments, weights and state_dict keys as e3nn's)."""
from .._compat import o3
from .conv import TensorProductConv
from .convert import from_e3nn
from .linear import Linear
from .spherical_harmonics import SphericalHarmonics
from .tensor_product import (ChannelWiseTensorProduct, ElementwiseTensorProduct, FullTensorProduct,
                             FullyConnectedTensorProduct, TensorProduct, TensorSquare)

__all__ = ["TensorProduct", "FullyConnectedTensorProduct", "ElementwiseTensorProduct", "FullTensorProduct",
           "ChannelWiseTensorProduct", "TensorProductConv", "Linear", "SphericalHarmonics", "from_e3nn"]
if hasattr(o3, "TensorSquare"):  # exported only where the installed e3nn has it
    __all__.append("TensorSquare")
else:
    del TensorSquare
