"""The error of a Linear with external weights called without them states the expected shape."""
import pytest
import torch

import equikernels as ek


@pytest.mark.parametrize("shared, shape", [(True, "(6,)"), (False, "(..., 6)")])
def test_missing_weight_message_gives_the_shape(shared, shape):
    lin = ek.Linear("3x0e+1x1o", "2x0e", shared_weights=shared, internal_weights=False)
    with pytest.raises(ValueError) as info:
        lin(torch.randn(5, 6))
    assert str(info.value).endswith(f"(expected shape {shape})"), str(info.value)
