"""The model object as PyTorch and mace-torch users handle it: a model saved whole with ``torch.save``
loads again through ``load`` (without mace-torch), a state dict saved alone is named as such,
``load_state_dict`` takes a mace-torch model's state dict, a torch_geometric batch object is taken
as mace-torch's loaders give it, and dtypes and output paths are checked with clear errors."""
import os

import pytest
import torch

from equikernels.models import from_mace, io as model_io, load, save
from mace_models import _batch, _molecule, _model
from mace_torch_cases import mace_batch, random_mace, rattled_atoms


@pytest.fixture(scope="module")
def model():
    return _model(num_interactions=1)


def test_a_model_saved_whole_loads_without_mace_torch(model, tmp_path, monkeypatch):
    path = tmp_path / "whole.pt"
    torch.save(model, path)
    monkeypatch.setattr(model_io, "_load_mace_file", lambda *a, **k: pytest.fail("took it for a mace-torch file"))
    with pytest.warns(model_io.CodeExecutionWarning, match="whole.pt"):
        loaded = load(str(path), dtype=torch.float32)
    assert type(loaded) is type(model) and loaded.atomic_energies.dtype == torch.float32 and not loaded.training
    assert model_io.load_mace_module(str(path)) is None  # not a mace-torch module to fill in
    data = _batch([_molecule()])
    ref = model(dict(data))["energy"]
    got = loaded.double()(dict(data))["energy"]
    assert torch.allclose(got, ref, rtol=1e-6)


def test_a_state_dict_file_is_named_as_one(model, tmp_path):
    path = tmp_path / "sd.pt"
    torch.save(model.state_dict(), path)
    with pytest.raises(ValueError, match="sd.pt: an equikernels state dict .*load_state_dict"):
        load(str(path))


def test_load_refuses_half_dtypes_naming_precision(model, tmp_path):
    path = tmp_path / "m.pt"
    save(model, str(path))
    with pytest.raises(ValueError, match="dtype: expected torch.float32 or torch.float64.*bf16-mixed"):
        load(str(path), dtype=torch.bfloat16)


def test_precision_of_a_model_converted_whole_to_a_half_type(model):
    assert model.precision == "fp64"
    half = _model(num_interactions=1).half()
    assert half.precision == "fp16"
    assert _model(num_interactions=1).to(torch.bfloat16).precision == "bf16"


def test_save_to_an_empty_path(model):
    with pytest.raises(ValueError, match="path: expected"):
        save(model, "")


def test_save_to_an_unwritable_path_names_it(model, tmp_path):
    blocker = tmp_path / "m.pt.tmp{}".format(os.getpid())
    blocker.mkdir()  # the temporary file cannot be created
    with pytest.raises(OSError, match="m.pt: cannot write the model there"):
        save(model, str(tmp_path / "m.pt"))


@pytest.mark.mace
def test_load_state_dict_takes_a_mace_torch_state_dict():
    pytest.importorskip("mace")
    torch.set_default_dtype(torch.float64)  # restored by conftest
    theirs = random_mace(seed=0, correlation=2)
    ours = from_mace(random_mace(seed=1, correlation=2))
    data = mace_batch(rattled_atoms())
    ref = theirs(dict(data))["energy"]
    assert not torch.allclose(ours(dict(data))["energy"], ref)
    result = ours.load_state_dict(theirs.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.allclose(ours(dict(data))["energy"], ref, rtol=1e-10)
    other = random_mace(seed=0, correlation=2, num_interactions=1)
    with pytest.raises(RuntimeError, match="another structure.*missing \\['interactions.1"):
        ours.load_state_dict(other.state_dict())


@pytest.mark.mace
def test_a_torch_geometric_batch_object_is_taken():
    pytest.importorskip("mace")
    from mace import data as mdata, tools  # noqa: PLC0415
    from mace.tools import torch_geometric  # noqa: PLC0415

    torch.set_default_dtype(torch.float64)  # restored by conftest
    theirs = random_mace(seed=0, correlation=2)
    ours = from_mace(theirs)
    cfg = mdata.config_from_atoms(rattled_atoms())
    graph = mdata.AtomicData.from_config(cfg, z_table=tools.AtomicNumberTable([1, 6, 8]), cutoff=3.0)
    batch = next(iter(torch_geometric.dataloader.DataLoader([graph, graph], batch_size=2)))
    out = ours(batch, compute_stress=True)
    ref = theirs(batch.to_dict(), compute_stress=True)
    for k in ("energy", "forces", "stress"):
        assert torch.allclose(out[k], ref[k], rtol=1e-10, atol=1e-12), k
