"""accelerate()'s report lists each module once, with a true reason: with fuse=False the layers a fusing
call would rewire are listed as not fused ("fuse=False"); a kept subclass of e3nn's FullyConnectedNet or
Gate is listed only as not fused, with why; the first line's counts are those of the listed lines."""
import copy
import re

import pytest
import torch

import equikernels as ek
from equikernels._compat import o3
from e3nn import nn as enn  # noqa: E402  (after equikernels: e3nn 0.4.4 loads its constants)
from message_layers import MessageConv as _Conv


class _ShiftedNet(enn.FullyConnectedNet):
    def forward(self, x):
        return super().forward(x) * 2 + 1


class _DoubledGate(enn.Gate):
    def __init__(self):
        super().__init__("2x0e", [torch.tanh], "1x0e", [torch.sigmoid], "1x1o")
        self.extra = torch.jit.script(o3.Linear("1x0e", "1x0e"))

    def forward(self, features):
        return super().forward(features) * 2


def _gate():
    return enn.Gate("2x0e", [torch.tanh], "1x0e", [torch.sigmoid], "1x1o")


def _model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"mlp": enn.FullyConnectedNet([3, 4, 2], torch.tanh), "gate": _gate(),
                                "conv": _Conv(), "shifted": _ShiftedNet([3, 4, 2], torch.tanh),
                                "doubled": _DoubledGate()})


def _lines(report):
    """Per section of the printed report, the names listed."""
    out = {}
    for line in str(report).splitlines()[1:]:
        m = re.match(r"  (fused|not fused|replaced|left alone|already)\s+(\S+?):", line)
        if m:
            out.setdefault(m.group(1), []).append("" if m.group(2) == "<root>" else m.group(2))
    return out


def _check_counts(report):
    head = str(report).splitlines()[0]
    lines = _lines(report)
    counts = {"replaced": r"replaced (\d+) module", "left alone": r"left (\d+) e3nn module",
              "fused": r"fused (\d+) layer", "not fused": r"left (\d+) recognised layer",
              "already": r"(\d+) layer\(s\) accelerated by an earlier call"}
    for section, pattern in counts.items():
        m = re.search(pattern, head)
        assert (int(m.group(1)) if m else 0) == len(lines.get(section, [])), (section, str(report))
    listed = [n for names in lines.values() for n in names]
    kinds = ("fused", "not fused", "left alone", "already")
    once = [n for k in kinds for n in lines.get(k, [])]
    assert len(once) == len(set(once)), str(report)  # each module under one of these headings at most
    assert len(listed) == len(report.replaced) + len(once)


_KEPT = {"shifted": "_ShiftedNet overrides forward(); its semantics are unknown",
         "doubled": "_DoubledGate overrides forward(); its semantics are unknown"}


@pytest.mark.parametrize("fuse", [True, False])
def test_kept_subclasses_are_listed_once_with_why(fuse):
    report = ek.accelerate(_model(), fuse=fuse)
    why = {n: w for n, _, w in report.not_fused}
    assert why["shifted"] == _KEPT["shifted"], str(report)
    assert why["doubled"].startswith(_KEPT["doubled"] + "; 1 submodule(s) inside it compiled by TorchScript")
    assert not {"shifted", "doubled"} & set(report.left_alone_names), str(report)
    assert "no equikernels equivalent" not in str(report)
    _check_counts(report)


def test_fuse_false_lists_what_fusing_would_rewire():
    model = _model()
    fused = ek.accelerate(copy.deepcopy(model)).fused_names
    assert sorted(fused) == ["conv", "gate", "mlp"]
    report = ek.accelerate(model, fuse=False)
    assert report.fused == [] and report.left_alone == [], str(report)
    why = {n: w for n, _, w in report.not_fused}
    assert {n: w for n, w in why.items() if n not in _KEPT} == {n: "fuse=False" for n in fused}, str(report)
    assert "not fused   mlp: FullyConnectedNet (fuse=False)" in str(report)
    assert type(model["mlp"]) is enn.FullyConnectedNet and type(model["gate"]) is enn.Gate
    _check_counts(report)


def test_fuse_false_after_fusing_lists_the_fused_root_as_already():
    net = enn.FullyConnectedNet([3, 4, 2], torch.tanh)
    assert ek.accelerate(net).fused_names == [""]
    for fuse in (False, True):
        again = ek.accelerate(net, fuse=fuse)
        assert again.already == [("", "FullyConnectedNet")] and again.left_alone == [] and again.not_fused == [], \
            str(again)
        _check_counts(again)


@pytest.mark.sevenn
def test_fuse_false_lists_sevenn_convolutions():
    pytest.importorskip("sevenn")
    from e3nn.o3 import Irreps  # noqa: PLC0415
    from sevenn.nn.convolution import IrrepsConvolution  # noqa: PLC0415

    def conv():  # silu: sevenn's default activation is a scripted function
        return IrrepsConvolution(Irreps("3x0e+1x1o"), Irreps("0e+1o"), Irreps("3x0e+1x1o"), [4, 8],
                                 weight_layer_act=torch.nn.functional.silu, lazy_layer_instantiate=False)

    fused = ek.accelerate(torch.nn.ModuleDict({"conv": conv()})).fused_names
    report = ek.accelerate(torch.nn.ModuleDict({"conv": conv()}), fuse=False)
    assert {n: w for n, _, w in report.not_fused} == {n: "fuse=False" for n in fused}, str(report)
    assert "conv" in fused and report.fused == [] and report.left_alone == [], str(report)
    _check_counts(report)
