"""An accelerated mace-torch model compiles with e3nn.util.jit.compile, as mace-torch's training script
does to save its ``_compiled.model`` (and its LAMMPS export to build the deployed model): it scripts as
mace-torch's own forward, through the whole-model path and through the layer-by-layer path, and the
saved and reloaded script gives the unmodified model's energy and forces."""
import copy
import io

import pytest
import torch

pytestmark = pytest.mark.mace
mace = pytest.importorskip("mace")

import equikernels as ek  # noqa: E402
from e3nn.util import jit  # noqa: E402

from mace_torch_cases import TOL, mace_batch, random_mace, rattled_atoms, rel  # noqa: E402


def _energy_forces(model, batch):
    out = model({k: (v.clone() if torch.is_tensor(v) else v) for k, v in batch.items()}, False, True)
    return out["energy"].detach(), out["forces"].detach()


def _scripted(model):
    buf = io.BytesIO()
    torch.jit.save(jit.compile(copy.deepcopy(model)), buf)
    buf.seek(0)
    return torch.jit.load(buf)


@pytest.mark.parametrize("path", ["whole model", "layers"])
def test_accelerated_mace_model_compiles_as_mace_torch_saves_it(path, single_thread):
    from mace import modules  # noqa: PLC0415

    class Custom(modules.ScaleShiftMACE):  # a structure from_mace does not read: the layers are rewired
        pass

    torch.set_default_dtype(torch.float64)
    model = random_mace(seed=4, correlation=2, num_interactions=2)
    if path == "layers":
        model.__class__ = Custom
    plain = copy.deepcopy(model)
    batch = mace_batch(rattled_atoms())
    report = ek.accelerate(model)
    assert ("" in report.fused_names) == (path == "whole model"), str(report)
    assert {"interactions.0", "products.0.symmetric_contractions", "interactions.0.skip_tp"} <= set(report.fused_names)
    want = _energy_forces(plain, batch)
    for got, ref in zip(_energy_forces(_scripted(model), batch), want):
        assert rel(got, ref) < TOL
    for got, ref in zip(_energy_forces(model, batch), want):  # the eager model is unchanged by it
        assert rel(got, ref) < TOL


def test_unknown_keyword_names_mace_torch_forward(single_thread):
    torch.set_default_dtype(torch.float64)
    model = random_mace(seed=4, correlation=2, num_interactions=1)
    ek.accelerate(model)
    with pytest.raises(TypeError, match=r"ScaleShiftMACE\.forward\(\) got an unexpected keyword argument 'bogus'"):
        model(mace_batch(rattled_atoms()), bogus=True)
