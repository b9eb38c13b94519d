"""A model of ours (fine-tuned or converted) written as a mace-torch model file that mace-torch
loads and that gives the same energies, forces and stress."""
import numpy as np
import pytest
import torch

from emt_data import write_emt_dataset

pytestmark = pytest.mark.mace


def _batch(model):
    from ase.build import bulk

    from equikernels.training.data import Config, collate, config_to_data

    a = bulk("Cu", "fcc", a=3.6) * (2, 2, 1)
    a[1].symbol = "Ni"
    a.rattle(0.05, seed=1)
    c = Config(np.array(a.numbers), a.positions, a.cell.array, a.pbc)
    d = config_to_data(c, [int(z) for z in model.atomic_numbers], float(model.r_max), ["Default"])
    return collate([d], torch.float64, "cpu")


def _same(ours, theirs):
    batch = _batch(ours)
    a = ours(dict(batch), training=False, compute_force=True, compute_stress=True)
    b = theirs(dict(batch), training=False, compute_force=True, compute_stress=True)
    for k in ("energy", "forces", "stress"):
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=1e-12, msg=k)


def test_convert_to_mace_writes_a_file_mace_torch_loads(tmp_path, single_thread):
    pytest.importorskip("mace")
    from equikernels import models
    from equikernels.cli import main
    from equikernels.default_model import default_model_path

    out = tmp_path / "default.model"
    assert main(["convert", default_model_path(), str(out), "--to", "mace"]) == 0
    theirs = torch.load(out, map_location="cpu", weights_only=False)
    assert type(theirs).__module__.startswith("mace.")
    _same(models.load(default_model_path()), theirs)


def test_fine_tune_writes_a_mace_torch_model_beside_ours(tmp_path, single_thread):
    pytest.importorskip("mace")
    from equikernels import models
    from equikernels.training import TrainConfig, Trainer

    train = write_emt_dataset(str(tmp_path / "t.xyz"), 4, seed=3, elements=("Cu", "Ni"), max_atoms=3)
    from equikernels.default_model import default_model_path

    summary = Trainer(TrainConfig(train_file=train, valid_fraction=0.0, model=default_model_path(), epochs=1,
                                  batch_size=2, out_dir=str(tmp_path / "o"), progress=False, plot=False,
                                  device="cpu"), log=None).fit()
    theirs = torch.load(summary["mace_model_path"], map_location="cpu", weights_only=False)
    _same(models.load(summary["model_path"]), theirs)


def test_to_mace_is_quiet(single_thread):
    pytest.importorskip("mace")
    import warnings

    from equikernels import models
    from equikernels.default_model import default_model_path
    from equikernels.training.mace_export import to_mace

    model = models.load(default_model_path())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        to_mace(model)
    assert not [w for w in caught if "TorchScript" in str(w.message) or "torch.jit.script" in str(w.message)]


def test_a_model_with_a_non_residual_first_interaction_goes_back_to_mace(single_thread):
    """mace-torch's RealAgnosticInteractionBlock first: its output irreps are not the hidden irreps."""
    pytest.importorskip("mace")
    from equikernels.models import from_mace
    from equikernels.training.mace_export import to_mace
    from random_models import small_random_mace_model

    m = small_random_mace_model([28, 29])
    assert type(m.interactions[0]).__name__ == "RealAgnosticInteractionBlock"
    ours = from_mace(m)
    _same(ours, to_mace(ours))
