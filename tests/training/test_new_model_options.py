"""mace-torch's num_channels / max_L shorthand of a new model's hidden_irreps."""
import numpy as np
import pytest

from equikernels.training import model_factory as mf
from equikernels.training.new_model_options import resolve_new_model

SMALL = dict(MLP_irreps="4x0e", num_interactions=2, correlation=2, max_ell=2, r_max=4.0, radial_MLP=[8],
             builder="equikernels")


@pytest.mark.parametrize("channels, top, irreps", [(128, 1, "128x0e+128x1o"), (4, 3, "4x0e+4x1o+4x2e+4x3o"),
                                                   (16, 0, "16x0e")])
def test_channels_and_max_L_give_hidden_irreps_as_mace_torch(channels, top, irreps):
    hp = resolve_new_model({"num_channels": channels, "max_L": top})
    assert hp["hidden_irreps"] == irreps
    assert "num_channels" not in hp and "max_L" not in hp


def test_a_new_model_is_built_with_the_channels_and_max_L_asked():
    model = mf.build_new_model({**SMALL, "num_channels": 4, "max_L": 1}, [28, 29], np.array([-1.0, -2.0]), 12.0,
                               1.0, 0.0, backend="equikernels")
    first = model.config["products"][0]
    assert first["channels"] == 4 and first["ls_out"] == [0, 1]


@pytest.mark.parametrize("values, message", [
    ({"num_channels": 8}, "num_channels given without max_L: give both"),
    ({"max_L": 1}, "max_L given without num_channels: give both"),
    ({"num_channels": 8, "max_L": 1, "hidden_irreps": "8x0e"}, "hidden_irreps and num_channels / max_L both given"),
    ({"num_channels": 0, "max_L": 1}, "new_model: num_channels must be an integer >= 1, got 0"),
    ({"num_channels": 8, "max_L": -1}, "new_model: max_L must be an integer >= 0, got -1"),
    ({"num_channels": "8", "max_L": 1}, "new_model: num_channels must be an integer >= 1, got '8'"),
])
def test_a_bad_shorthand_is_named(values, message):
    with pytest.raises(ValueError) as info:
        resolve_new_model(values)
    assert message in str(info.value)
