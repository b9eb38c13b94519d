"""accelerate() on TorchScript modules (compiled code, which it cannot rewire): a scripted or loaded
model is refused in one line; scripted submodules holding e3nn modules (e3nn.util.jit.compile scripts
e3nn's example convolutions and gates) are listed as left alone, with what to do."""
import pytest
import torch

import equikernels as ek
from equikernels._compat import o3
from e3nn.util import jit  # noqa: E402  (after equikernels: e3nn 0.4.4 loads its constants)
from problems import e3nn_example_network


def test_scripted_model_is_refused_in_one_line():
    model = torch.jit.script(torch.nn.Sequential(o3.Linear("2x0e+1x1o", "2x0e+1x1o")))
    want = r"^model: a TorchScript module .* accelerate the Python model, then script it$"
    with pytest.raises(TypeError, match=want):
        ek.accelerate(model)


def test_scripted_submodule_is_reported_left_alone():
    model = torch.nn.ModuleDict({"eager": o3.Linear("2x0e+1x1o", "2x0e+1x1o"),
                                 "scripted": torch.jit.script(o3.Linear("2x0e+1x1o", "2x0e+1x1o"))})
    report = ek.accelerate(model)
    assert report.replaced_names == ["eager"], str(report)
    why = {name: (t, w) for name, t, w in report.left_alone}
    assert why["scripted"][0] == "Linear" and "accelerate the model before scripting it" in why["scripted"][1]


def test_e3nn_network_compiled_by_e3nn_says_why_nothing_was_replaced():
    net = e3nn_example_network()
    report = ek.accelerate(jit.compile(net))  # the root stays a Python module, its layers are scripted
    assert not report.replaced and not report.fused, str(report)
    (name, _, why), = report.left_alone
    assert name == "" and "3 submodule(s) inside it compiled by TorchScript" in why, str(report)
