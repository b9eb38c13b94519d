"""e3nn's Gate through accelerate: the same values and derivatives (float64, to second order) by
slices and one gating multiplication; e3nn's extraction is not called; the class name stays."""
import copy
import io

import pytest
import torch
from e3nn import nn as e3nn_nn
from e3nn.nn import _extract

import equikernels

CASES = {
    # scalars of both parities, gates, gated irreps given out of sorted order (e3nn sorts the input)
    "mixed": ("4x0e+3x0o", [torch.nn.functional.silu, torch.tanh], "2x0e+3x0o", [torch.sigmoid, torch.tanh],
              "2x2e+1x1o+2x1e"),
    "no gated": ("5x0e", [torch.nn.functional.silu], "", [], ""),
    "gates only": ("", [], "3x0e", [torch.sigmoid], "3x1o"),
}


def _gates(case):
    torch.manual_seed(0)
    gate = e3nn_nn.Gate(*CASES[case])
    model = torch.nn.Sequential(gate)
    acc = copy.deepcopy(model)
    report = equikernels.accelerate(acc)
    return gate, acc[0], report


@pytest.mark.parametrize("case", list(CASES))
def test_same_function_to_second_order(case, monkeypatch):
    gate, acc, report = _gates(case)
    assert type(acc).__name__ == "Gate" and "0" in report.fused_names, str(report)
    assert not [n for n, *_ in report.left_alone if n == "0"], str(report)
    monkeypatch.setattr(_extract.Extract, "forward", lambda *a: (_ for _ in ()).throw(AssertionError("extracted")))
    x = torch.randn(9, gate.irreps_in.dim, dtype=torch.float64, requires_grad=True)
    g = torch.randn(9, gate.irreps_out.dim, dtype=torch.float64)

    def second_order(m):
        out = m(x)
        (gx,) = torch.autograd.grad(out, x, g, create_graph=True)
        (ggx,) = torch.autograd.grad(gx.pow(2).sum(), x)
        return out, gx, ggx

    got = second_order(acc)
    monkeypatch.undo()
    want = second_order(gate)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.autograd.gradgradcheck(acc, (x,))


def test_pickles_and_keeps_its_submodules():
    gate, acc, _ = _gates("mixed")
    assert list(acc.state_dict()) == list(gate.state_dict())
    buf = io.BytesIO()
    torch.save(acc, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    x = torch.randn(4, gate.irreps_in.dim)
    torch.testing.assert_close(loaded(x), gate(x))


def test_a_gate_subclass_with_its_own_forward_is_left_alone():
    class Custom(e3nn_nn.Gate):
        def forward(self, features):
            return super().forward(features) * 2

    model = torch.nn.Sequential(Custom("2x0e", [torch.tanh], "1x0e", [torch.sigmoid], "1x1o"))
    report = equikernels.accelerate(model)
    assert any(n == "0" and "overrides forward" in why for n, _, why in report.not_fused), str(report)


def _backward_nodes(out):
    names, stack, seen = [], [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(node.name())
        stack.extend(f for f, _ in node.next_functions)
    return names


@pytest.mark.parametrize("case", list(CASES))
def test_groups_and_activation_blocks_are_one_split(case):
    """The backward concatenates the groups' gradients once: no slice whose backward zero-fills a
    copy of the whole input."""
    _, acc, _ = _gates(case)
    x = torch.randn(5, acc.irreps_in.dim, dtype=torch.float64, requires_grad=True)
    names = _backward_nodes(acc(x))
    assert "SliceBackward0" not in names, names
    assert names.count("SplitWithSizesBackward0") >= 1, names


def test_a_plan_pickled_by_an_earlier_version_is_rebuilt():
    gate, acc, _ = _gates("mixed")
    del acc.__dict__["_ek_gate"].split  # as pickled before the plan had a split
    x = torch.randn(4, gate.irreps_in.dim)
    torch.testing.assert_close(acc(x), gate(x))
