"""The models' caches of frozen-weight values (element linears, the symmetric contraction's
per-node weights) hold the storage they were made from, so a parameter given new storage
(``p.data = t`` keeps its version) is never served the old values; a saved or copied model carries
no cached values."""
import copy
import io

import pytest
import torch

from equikernels.models.builder import coupled_u_matrices
from equikernels.models.element_linear import ElementGroups, ElementLinear
from equikernels.models.symmetric_contraction import SymmetricContraction
from frozen_checks import numpy_backed, swap_storage
from mace_models import _batch, _crystal, _model


def _contraction(channels=8, elements=3):
    us = coupled_u_matrices(f"{channels}x0e+{channels}x1o+{channels}x2e", f"{channels}x0e+{channels}x1o", 3)
    return SymmetricContraction(channels, [0, 1, 2], [0, 1], [3, 3], elements, us, "ir_mul").requires_grad_(False)


def test_element_linear_holds_its_storage():
    lin = ElementLinear("4x0e+4x1o", 3, "4x0e+4x1o", "ir_mul").requires_grad_(False)
    element = torch.tensor([0, 2, 1, 2])
    x, groups = torch.randn(4, 16), ElementGroups.build(element, 3)
    old = numpy_backed(lin.weight)
    lin(x, groups)
    lin.weight.data = torch.randn(lin.weight.shape)
    assert old() is not None
    lin(x, groups)
    assert old() is None


def test_symmetric_contraction_holds_its_storage():
    sc = _contraction()
    x, element = torch.randn(5, 8 * 9), torch.tensor([0, 1, 2, 1, 0])
    p = next(iter(sc.parameters()))
    old = numpy_backed(p)
    sc(x, element)
    p.data = torch.randn(p.shape, dtype=p.dtype)
    assert old() is not None
    sc(x, element)
    assert old() is None


def _changed(module: torch.nn.Module) -> torch.nn.Module:
    other = copy.deepcopy(module)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(1.5).add_(0.01)
    return other


@pytest.mark.parametrize("channels", [48, 96])
def test_frozen_mace_model_sees_new_storage(channels):
    model = _model(seed=0, hidden_irreps=f"{channels}x0e+{channels}x1o").requires_grad_(False)
    other = _changed(model)
    data = _crystal()
    model(_batch([data]), compute_force=False)
    for p, q in zip(model.parameters(), other.parameters()):
        swap_storage(p, q.detach())
    got = model(_batch([data]), compute_force=False)["energy"]
    want = other(_batch([data]), compute_force=False)["energy"]
    torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-12)


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_saved_model_carries_no_per_call_values():
    """``torch.save`` of a whole frozen model after a call: it saves, loads back to the same
    energies, and carries none of the last system's graph or the weights' derived values."""
    model = _model(seed=0, hidden_irreps="32x0e+32x1o").requires_grad_(False)
    empty = len(_saved(model))
    data = _batch([_crystal().repeat((2, 2, 2))])
    energy = model(data, compute_force=False)["energy"]
    saved = _saved(model)
    assert len(saved) < 1.01 * empty
    for again in (torch.load(io.BytesIO(saved), weights_only=False), copy.deepcopy(model)):
        torch.testing.assert_close(again(data, compute_force=False)["energy"], energy, rtol=0, atol=0)
