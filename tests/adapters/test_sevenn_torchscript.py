"""SevenNet's deploy (e3nn.util.jit.script) of accelerated layers: the self connection on one-hot species
(SelfConnectionIntro, the "nequip" self connection of 7net-omat, 7net-mf-ompa and 7net-omni), whose product
runs per element, scripts as the original product and gives its numbers, alone and inside a model."""
import copy

import pytest
import torch

pytest.importorskip("sevenn")

import e3nn.util.jit  # noqa: E402
import sevenn._keys as KEY  # noqa: E402
from sevenn.nn.self_connection import SelfConnectionIntro  # noqa: E402

import equikernels as ek  # noqa: E402

pytestmark = pytest.mark.sevenn


def test_accelerated_self_connection_scripts_as_sevenn_deploy_does(single_thread):
    torch.manual_seed(0)
    layer = SelfConnectionIntro("4x0e+2x1e+1x2e", "3x0e", "5x0e+2x1e", lazy_layer_instantiate=False)
    plain = copy.deepcopy(layer)
    assert ek.accelerate(layer).fused_names == ["fc_tensor_product"]
    data = {KEY.NODE_FEATURE: torch.randn(6, 4 + 6 + 5),
            KEY.NODE_ATTR: torch.nn.functional.one_hot(torch.tensor([0, 2, 2, 1, 0, 2]), 3).float()}
    want = plain(dict(data))[KEY.SELF_CONNECTION_TEMP]
    scripted = e3nn.util.jit.script(copy.deepcopy(layer))
    torch.testing.assert_close(scripted(dict(data))[KEY.SELF_CONNECTION_TEMP], want)
    torch.testing.assert_close(layer(dict(data))[KEY.SELF_CONNECTION_TEMP], want)
