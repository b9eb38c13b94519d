"""The scripted and traced tensor products accept an empty input irreps (a zero-width operand), as
e3nn's scripted and traced modules do, with e3nn's broadcasting of the batch dimensions."""
import pytest
import torch
from e3nn import o3

import equikernels

pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning",
                                        "ignore:`torch.jit:DeprecationWarning")


@pytest.mark.parametrize("irreps_in1, irreps_in2", [("", "0e"), ("1x0e", "")])
@pytest.mark.parametrize("shared", [True, False])
def test_empty_input_irreps_script_and_trace(irreps_in1, irreps_in2, shared):
    kw = dict(shared_weights=shared, internal_weights=shared)
    ours = equikernels.TensorProduct(irreps_in1, irreps_in2, "1x0e", [], **kw)
    ref = o3.TensorProduct(irreps_in1, irreps_in2, "1x0e", [], **kw)
    d1, d2 = ref.irreps_in1.dim, ref.irreps_in2.dim
    x, y = torch.randn(2, 1, d1), torch.randn(1, 3, d2)
    want = ref(x, y)
    assert want.shape == (2, 3, 1)
    torch.testing.assert_close(torch.jit.script(ours)(x, y), want)
    traced = torch.jit.trace(ours, (torch.randn(4, d1), torch.randn(4, d2)))
    torch.testing.assert_close(traced(torch.randn(5, d1), torch.randn(5, d2)), torch.zeros(5, 1))
