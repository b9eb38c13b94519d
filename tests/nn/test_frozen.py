"""Values derived from frozen weights are kept between calls under the weight's address and
version. A weight given new storage (``p.data = t``) keeps its version, so the cache holds the old
storage: no new storage can take its address and be served the old values."""
import pytest
import torch

from equikernels.nn import Linear
from frozen_checks import numpy_backed, swap_storage


def test_linear_holds_the_storage_its_cache_was_made_from():
    lin = Linear("8x0e+8x1o", "8x0e+8x1o").requires_grad_(False)
    x = torch.randn(3, lin.irreps_in.dim)
    old = numpy_backed(lin.weight)
    lin(x)
    lin.weight.data = torch.randn(lin.weight.shape)
    assert old() is not None  # held by the cache: its address cannot be reused
    lin(x)
    assert old() is None  # the cache moved on and let it go


@pytest.mark.parametrize("irreps", ["16x0e+16x1o", "32x0e+32x1o", "64x0e+64x1o"])
def test_linear_sees_new_storage(irreps):
    torch.manual_seed(0)
    lin, other = Linear(irreps, irreps).requires_grad_(False), Linear(irreps, irreps)
    x = torch.randn(6, lin.irreps_in.dim)
    lin(x)
    swap_storage(lin.weight, other.weight.detach())
    torch.testing.assert_close(lin(x), other(x).detach(), rtol=0, atol=0)
