"""accelerate() on single SevenNet layers: what the report says about layers it keeps (SevenNet's own
accelerators, lazy layers, an unreadable source), the LAMMPS parallel mode switched on after
acceleration, and torch.inference_mode."""
import inspect

import pytest
import torch

pytest.importorskip("sevenn")

import sevenn._keys as KEY  # noqa: E402
from e3nn.o3 import Irreps  # noqa: E402
from sevenn.nn.convolution import IrrepsConvolution, IrrepsScatterGatterFusedConvolution  # noqa: E402
from sevenn.nn.self_connection import SelfConnectionIntro  # noqa: E402

import equikernels as ek  # noqa: E402

pytestmark = pytest.mark.sevenn


class ChannelWiseTensorProduct(torch.nn.Module):
    """Stands in for cuequivariance_torch's product (not installed here): only its package matters."""

    def __init__(self, **kwargs):
        super().__init__()


ChannelWiseTensorProduct.__module__ = "cuequivariance_torch.operations.tp_channel_wise"


def _conv(lazy=False, **kwargs):
    # silu: sevenn's default activation is a scripted function, which does not deepcopy
    return IrrepsConvolution(Irreps("3x0e+1x1o"), Irreps("0e+1o"), Irreps("3x0e+1x1o"), [4, 8],
                             weight_layer_act=torch.nn.functional.silu, lazy_layer_instantiate=lazy, **kwargs)


def _data(n=4, ghosts=0):
    g = torch.Generator().manual_seed(0)
    edges = torch.tensor([[1, 0, 3, 1, 2, 0], [0, 1, 2, 2, 3, n + ghosts - 1]])
    data = {KEY.NODE_FEATURE: torch.randn(n, 6, generator=g), KEY.EDGE_ATTR: torch.randn(6, 4, generator=g),
            KEY.EDGE_EMBEDDING: torch.randn(6, 4, generator=g), KEY.EDGE_IDX: edges}
    if ghosts:
        data[KEY.NODE_FEATURE_GHOST] = torch.randn(ghosts, 6, generator=g)
        data[KEY.NLOCAL] = torch.tensor([n])
    return data


def _not_fused(report):
    return {name: why for name, _, why in report.not_fused}


def test_sevenn_accelerator_layers_are_reported_as_kept(single_thread):
    cueq = _conv(lazy=True)
    cueq.convolution_cls = ChannelWiseTensorProduct
    cueq.instantiate()
    fused = IrrepsScatterGatterFusedConvolution.from_irreps_convolution(_conv(lazy=True))
    fused.convolution_cls = ChannelWiseTensorProduct
    fused.instantiate()
    sc = SelfConnectionIntro("4x0e", "3x0e", "5x0e", lazy_layer_instantiate=False)
    sc.fc_tensor_product = ChannelWiseTensorProduct()
    report = ek.accelerate(torch.nn.ModuleDict({"cueq": cueq, "fused": fused, "sc": sc}))
    why = _not_fused(report)
    assert "cuequivariance_torch's ChannelWiseTensorProduct" in why["cueq"], str(report)
    assert "sevenn's own fused convolution" in why["fused"], str(report)
    assert "cuequivariance_torch's ChannelWiseTensorProduct" in why["sc.fc_tensor_product"], str(report)
    assert type(cueq).__name__ == "IrrepsConvolution" and getattr(type(cueq), "_ek_adapter", None) is None


def test_lazy_convolution_says_it_is_not_instantiated(single_thread):
    report = ek.accelerate(torch.nn.ModuleDict({"conv": _conv(lazy=True)}))
    assert "not built yet" in _not_fused(report)["conv"], str(report)


def test_unreadable_sevenn_source_is_reported_not_raised(monkeypatch, single_thread):
    real = inspect.getsource

    def no_source(obj):
        if getattr(obj, "__module__", "").startswith("sevenn."):
            raise OSError("could not get source code")
        return real(obj)

    monkeypatch.setattr(inspect, "getsource", no_source)
    conv = _conv()
    report = ek.accelerate(torch.nn.ModuleDict({"conv": conv}))
    assert "cannot be read" in _not_fused(report)["conv"], str(report)
    assert getattr(type(conv), "_ek_adapter", None) is None


def test_parallel_mode_switched_on_later_runs_sevenn_forward(monkeypatch, single_thread):
    monkeypatch.setenv("EQUIKERNELS_BACKEND", "reference")
    torch.manual_seed(0)
    plain, acc = _conv(), _conv()
    acc.load_state_dict(plain.state_dict())
    assert "conv" in ek.accelerate(torch.nn.ModuleDict({"conv": acc})).fused_names
    plain.is_parallel = acc.is_parallel = True
    data = _data(ghosts=2)
    want = plain(dict(data))[KEY.NODE_FEATURE]
    assert want.shape[0] == 4
    torch.testing.assert_close(acc(dict(data))[KEY.NODE_FEATURE], want)


def test_accelerated_convolution_under_inference_mode(monkeypatch, single_thread):
    monkeypatch.setenv("EQUIKERNELS_BACKEND", "reference")  # the fused convolution on the shared graph
    torch.manual_seed(0)
    plain, acc = _conv(), _conv()
    acc.load_state_dict(plain.state_dict())
    ek.accelerate(torch.nn.ModuleDict({"conv": acc}))
    with torch.inference_mode():
        data = {k: v.clone() for k, v in _data().items()}  # inference tensors
        want = plain(dict(data))[KEY.NODE_FEATURE]
        got = acc(dict(data))[KEY.NODE_FEATURE]
    torch.testing.assert_close(got, want)
