"""``Linear.weight_index_slices``: the attribute newer e3nn versions define, with e3nn's values
(built, and converted with ``from_e3nn``)."""
import pytest
from e3nn import o3

import equikernels


@pytest.mark.parametrize("kw", [{}, {"biases": True}, {"f_in": 2, "f_out": 3}])
def test_weight_index_slices_as_e3nn(kw):
    ref = o3.Linear("2x0e+1x0e+2x1o", "3x0e+1x1o", **kw)
    if not hasattr(ref, "weight_index_slices"):
        pytest.skip("this e3nn has no Linear.weight_index_slices")
    ours = equikernels.Linear("2x0e+1x0e+2x1o", "3x0e+1x1o", **kw)
    assert ours.weight_index_slices == ref.weight_index_slices
    assert equikernels.from_e3nn(ref).weight_index_slices == ref.weight_index_slices
