"""A misspelt ``backend=`` of the tensor-product modules is refused when the module is built, not at its
first call, in one line naming the argument and the accepted values."""
import pytest

from equikernels import nn as ek
from equikernels.ops import BACKENDS

BUILDERS = {
    "TensorProduct": lambda **kw: ek.TensorProduct("2x0e", "1x0e", "2x0e", [(0, 0, 0, "uvw", True)], **kw),
    "FullyConnectedTensorProduct": lambda **kw: ek.FullyConnectedTensorProduct("2x0e+1x1o", "1x0e", "2x0e", **kw),
    "ElementwiseTensorProduct": lambda **kw: ek.ElementwiseTensorProduct("2x0e", "2x0e", **kw),
    "FullTensorProduct": lambda **kw: ek.FullTensorProduct("1x0e", "1x1o", **kw),
    "ChannelWiseTensorProduct": lambda **kw: ek.ChannelWiseTensorProduct("2x0e", "1x1o", "2x1o", **kw),
    "TensorProductConv": lambda **kw: ek.TensorProductConv("2x0e", "1x0e", "2x0e", [(0, 0, 0, "uvw", True)], **kw),
}
if hasattr(ek, "TensorSquare"):
    BUILDERS["TensorSquare"] = lambda **kw: ek.TensorSquare("2x0e", **kw)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_bad_backend_is_refused_at_construction(name):
    with pytest.raises(ValueError, match=r"^backend: expected None or one of .*'triton'.*, got 'tritn'$"):
        BUILDERS[name](backend="tritn")
    for backend in (None, *BACKENDS):
        assert BUILDERS[name](backend=backend).backend == backend
