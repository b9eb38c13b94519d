"""accelerate() on SevenNet-0 (the pretrained model shipped in the sevenn wheel): its five
IrrepsConvolution layers run as fused convolutions; energy, forces and stress through sevenn's own
calculator equal the unmodified model's within float32 noise (SevenNet runs in float32 as shipped)."""
import numpy as np
import pytest
import torch

sevenn_calc = pytest.importorskip("sevenn.calculator")

import equikernels as ek  # noqa: E402

pytestmark = pytest.mark.sevenn


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_sevenn0_fused_matches(backend, monkeypatch, single_thread):
    monkeypatch.setenv("EQUIKERNELS_BACKEND", backend)  # reference: the fused convolution; cpu: gather/scatter
    import ase.build  # noqa: PLC0415

    plain = sevenn_calc.SevenNetCalculator("7net-0", device="cpu")
    fast = sevenn_calc.SevenNetCalculator("7net-0", device="cpu")
    keys = list(fast.model.state_dict())
    report = ek.accelerate(fast.model)
    assert [n for n, t, _ in report.fused if t == "IrrepsConvolution"] == [f"{i}_convolution" for i in range(5)]
    assert not report.not_fused and list(fast.model.state_dict()) == keys
    assert type(fast.model._modules["0_convolution"]).__name__ == "IrrepsConvolution"

    atoms = ase.build.bulk("Si", "diamond", a=5.43) * (1, 1, 2)
    atoms.numbers[1] = 8
    atoms.rattle(0.05, seed=0)
    res = {}
    for name, calc in (("plain", plain), ("fast", fast)):
        a = atoms.copy()
        a.calc = calc
        res[name] = (a.get_potential_energy(), a.get_forces(), a.get_stress())
    assert abs(res["fast"][0] - res["plain"][0]) / len(atoms) <= 5e-6
    assert np.abs(res["fast"][1] - res["plain"][1]).max() <= 1e-5
    assert np.abs(res["fast"][2] - res["plain"][2]).max() <= 1e-5 * max(1.0, np.abs(res["plain"][2]).max())


def test_sevenn_self_connection_runs_per_element(monkeypatch, single_thread):
    """SevenNet's SelfConnectionIntro (node features x one-hot attributes) runs as ElementLinear on its
    own weight, equal to the original product to second order in the features and weight."""
    import copy  # noqa: PLC0415

    import sevenn._keys as KEY  # noqa: PLC0415
    from sevenn.nn.self_connection import SelfConnectionIntro  # noqa: PLC0415

    torch.manual_seed(0)
    layer = SelfConnectionIntro("4x0e+2x1e+1x2e", "3x0e", "5x0e+2x1e", lazy_layer_instantiate=False).double()
    plain = copy.deepcopy(layer)
    report = ek.accelerate(layer)
    assert report.fused_names == ["fc_tensor_product"], str(report)
    x = torch.randn(6, 4 + 6 + 5, dtype=torch.float64)
    attrs = torch.nn.functional.one_hot(torch.tensor([0, 2, 2, 1, 0, 2]), 3).double()

    def second_order(module):
        xs = x.clone().requires_grad_()
        out = module({KEY.NODE_FEATURE: xs, KEY.NODE_ATTR: attrs})[KEY.SELF_CONNECTION_TEMP]
        w = module.fc_tensor_product.weight
        gx, gw = torch.autograd.grad(out.pow(2).sum(), [xs, w], create_graph=True)
        return [out.detach(), *torch.autograd.grad(gx.pow(2).sum() + gw.pow(3).sum(), [xs, w])]

    base = type(layer.fc_tensor_product).__mro__[1]
    original = base.forward
    monkeypatch.setattr(base, "forward", lambda *a, **k: (_ for _ in ()).throw(AssertionError("original product called")))
    fast = second_order(layer)
    monkeypatch.setattr(base, "forward", original)
    for a, b in zip(fast, second_order(plain)):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_accelerated_convolution_scripts_as_sevenn_deploy_does(single_thread):
    """sevenn's deploy scripts the model with e3nn.util.jit.script: an accelerated IrrepsConvolution
    scripts as sevenn's own forward and gives the same numbers."""
    import e3nn.util.jit  # noqa: PLC0415
    import sevenn._keys as KEY  # noqa: PLC0415
    from e3nn.o3 import Irreps  # noqa: PLC0415
    from sevenn.nn.convolution import IrrepsConvolution  # noqa: PLC0415

    def build():  # (its activation is a scripted function: the layer does not deepcopy)
        return IrrepsConvolution(Irreps("3x0e+1x1o"), Irreps("0e+1o"), Irreps("3x0e+1x1o"), [4, 8],
                                 lazy_layer_instantiate=False)

    torch.manual_seed(0)
    conv, acc, copied = build(), build(), build()
    acc.load_state_dict(conv.state_dict())
    copied.load_state_dict(conv.state_dict())
    assert "" in ek.accelerate(acc).fused_names and "" in ek.accelerate(copied).fused_names
    n = 4
    edges = torch.tensor([[1, 0, 3, 1, 2], [0, 1, 2, 2, 3]])
    data = {KEY.NODE_FEATURE: torch.randn(n, 6), KEY.EDGE_ATTR: torch.randn(5, 4),
            KEY.EDGE_EMBEDDING: torch.randn(5, 4), KEY.EDGE_IDX: edges}
    want = conv(dict(data))[KEY.NODE_FEATURE]
    scripted = e3nn.util.jit.script(copied)
    torch.testing.assert_close(scripted(dict(data))[KEY.NODE_FEATURE], want)
    torch.testing.assert_close(acc(dict(data))[KEY.NODE_FEATURE], want)
