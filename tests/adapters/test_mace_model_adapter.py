"""accelerate() on a whole mace-torch model: its forward runs an equikernels MACE whose parameters
and buffers are the mace-torch model's own tensors; training steps, state loaded in place and dtype
conversions act on both; a model whose structure cannot be read keeps the layer-by-layer path."""
import copy

import pytest
import torch

pytestmark = pytest.mark.mace
mace = pytest.importorskip("mace")

import equikernels as ek  # noqa: E402

from mace_torch_cases import TOL, mace_batch, random_mace, rattled_atoms, rel  # noqa: E402


def _energy_forces(model, batch):
    out = model({k: (v.clone() if torch.is_tensor(v) else v) for k, v in batch.items()}, training=True,
                compute_force=True)
    return out["energy"], out["forces"]


def test_whole_model_trains_the_mace_torch_parameters(single_thread):
    torch.set_default_dtype(torch.float64)
    model = random_mace(seed=6)
    plain = copy.deepcopy(model)
    batch = mace_batch(rattled_atoms())
    report = ek.accelerate(model)
    assert ("", "ScaleShiftMACE") in [(n, t) for n, t, _ in report.fused], str(report)
    opts = [torch.optim.SGD(m.parameters(), lr=1e-2) for m in (model, plain)]
    for _ in range(2):  # force-matching steps: the parameter gradient is the double backward
        for m, opt in zip((model, plain), opts):
            opt.zero_grad()
            e, f = _energy_forces(m, batch)
            (e.pow(2).sum() + f.pow(2).sum()).backward()
            opt.step()
        for a, b in zip(model.parameters(), plain.parameters()):
            assert a.grad is not None and rel(a.grad, b.grad) < TOL
    for a, b in zip(_energy_forces(model, batch), _energy_forces(plain, batch)):
        assert rel(a.detach(), b.detach()) < TOL
    twin = model.__dict__["_ek_twin"][0]
    assert {id(p) for p in twin.parameters()} == {id(p) for p in model.parameters()}


def test_whole_model_follows_buffers_and_dtype(single_thread):
    """A U tensor changed in place (our path tables derive from it) and a conversion to float32
    rebuild the equikernels model."""
    torch.set_default_dtype(torch.float64)
    model = random_mace(seed=7)
    plain = copy.deepcopy(model)
    batch = mace_batch(rattled_atoms())
    ek.accelerate(model)
    _energy_forces(model, batch)
    with torch.no_grad():
        for m in (model, plain):
            m.products[0].symmetric_contractions.contractions[0].U_matrix_2.mul_(1.7)
    for a, b in zip(_energy_forces(model, batch), _energy_forces(plain, batch)):
        assert rel(a.detach(), b.detach()) < TOL
    model.float()
    plain.float()
    batch32 = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in batch.items()}
    for a, b in zip(_energy_forces(model, batch32), _energy_forces(plain, batch32)):
        assert a.dtype == torch.float32 and rel(a.detach(), b.detach()) < 1e-5


def test_unreadable_model_keeps_the_layer_path(single_thread):
    from mace import modules  # noqa: PLC0415

    class Custom(modules.ScaleShiftMACE):
        pass

    torch.set_default_dtype(torch.float64)
    model = random_mace(seed=8)
    model.__class__ = Custom
    plain = copy.deepcopy(model)
    batch = mace_batch(rattled_atoms())
    report = ek.accelerate(model)
    why = dict(((n, t), w) for n, t, w in report.not_fused)
    assert "expected a mace-torch MACE or ScaleShiftMACE" in why[("", "Custom")], str(report)
    assert "interactions.0" in report.fused_names
    for a, b in zip(_energy_forces(model, batch), _energy_forces(plain, batch)):
        assert rel(a.detach(), b.detach()) < TOL
