"""A product whose first input has no irreps plans and runs (zeros, like e3nn), with per-edge weights too."""
import pytest
import torch

import equikernels


@pytest.mark.parametrize("shared", [True, False])
def test_empty_first_input_plans_on_the_triton_backend(shared):
    tp = equikernels.TensorProduct("", "0e", "", [], shared_weights=shared, internal_weights=shared,
                                   backend="triton")
    x1 = torch.randn(3, 0, dtype=torch.float64)
    x2 = torch.randn(3, 1, dtype=torch.float64, requires_grad=True)
    out = tp(x1, x2) if shared else tp(x1, x2, torch.randn(3, 0, dtype=torch.float64))
    assert out.shape == (3, 0)
    out.sum().backward()
    assert torch.equal(x2.grad, torch.zeros_like(x2))
