"""Fine-tuning one head of a multi-head model file (``model_head``, mace-torch's ``foundation_head``):
the run starts from that head alone, as a one-head model with that head's energies."""
import numpy as np
import pytest
import torch
import yaml

from cu_ni_frames import two_head_model as _two_head_model
from cu_ni_frames import write_cu_ni_frames as _frames


def _energies(model, path):
    from equikernels.training.config import DataKeys
    from equikernels.training.data import read_configs
    from equikernels.training.evaluate import predict

    preds, _ = predict(model, read_configs(path, DataKeys()), dtype=torch.float64, device="cpu")
    return np.array([p.energy for p in preds])


def _cfg(tmp_path, **kw):
    from equikernels.training import TrainConfig

    return TrainConfig(epochs=1, batch_size=2, out_dir=str(tmp_path / "out"), progress=False, plot=False, device="cpu",
                       valid_fraction=0.0, **kw)


def _tagged(path, out, head):
    import ase.io

    frames = ase.io.read(path, ":")
    for f in frames:
        f.info["head"] = head
    ase.io.write(out, frames)
    return out


@pytest.mark.parametrize("given, head", [("pt_head", "pt_head"), ("default", "Default")])
def test_the_run_starts_from_the_named_head_alone(tmp_path, given, head):
    from equikernels.models import load
    from equikernels.training import Trainer
    from equikernels.training import model_factory as mf

    path = _two_head_model(str(tmp_path / "two.pt"))
    train = _frames(str(tmp_path / "a.xyz"), 2, 0)
    t = Trainer(_cfg(tmp_path, model=path, train_file=train, model_head=given), log=None)
    assert mf.heads(t.model) == [head]
    want = _energies(load(path), _tagged(train, str(tmp_path / "tagged.xyz"), head))
    np.testing.assert_allclose(_energies(t.model, train), want, rtol=0, atol=1e-10)


@pytest.mark.mace
def test_a_mace_torch_model_keeps_its_kind(tmp_path):
    mace = pytest.importorskip("mace.modules")
    import ase.io
    from ase.build import molecule
    from ase.calculators.emt import EMT
    from mace_models import mace_torch_two_heads

    from equikernels.training import Trainer
    from equikernels.training import model_factory as mf

    path = mace_torch_two_heads(tmp_path / "two.model")
    frames = []
    for seed in range(2):
        m = molecule("CH3OH")
        m.rattle(0.05, seed=seed)
        m.calc = EMT()
        m.info["REF_energy"], m.arrays["REF_forces"] = m.get_potential_energy(), m.get_forces()
        m.calc = None
        frames.append(m)
    train = str(tmp_path / "a.xyz")
    ase.io.write(train, frames)
    t = Trainer(_cfg(tmp_path, model=path, train_file=train, model_head="pt_head", model_backend="mace"), log=None)
    assert isinstance(t.model, mace.ScaleShiftMACE) and list(t.model.heads) == ["pt_head"]
    two = mf.load_model(path, "mace")
    want = _energies(two, _tagged(train, str(tmp_path / "tagged.xyz"), "pt_head"))
    np.testing.assert_allclose(_energies(t.model, train), want, rtol=0, atol=1e-10)


def test_an_unknown_head_is_refused_in_one_line(tmp_path):
    from equikernels.training import Trainer

    path = _two_head_model(str(tmp_path / "two.pt"))
    train = _frames(str(tmp_path / "a.xyz"), 2, 0)
    with pytest.raises(ValueError, match=r"^model_head: 'mp' is not one of the model's heads \['pt_head', 'Default'\]$"):
        Trainer(_cfg(tmp_path, model=path, train_file=train, model_head="mp"), log=None)


def test_model_head_without_a_model_file_is_refused(tmp_path):
    train = _frames(str(tmp_path / "a.xyz"), 2, 0)
    with pytest.raises(ValueError, match=r"^model_head 'pt_head' names a head of the model file to fine-tune"):
        _cfg(tmp_path, new_model={}, train_file=train, model_head="pt_head").validate()


def test_mace_torchs_foundation_head_reads_as_model_head(tmp_path):
    from equikernels.cli import main
    from equikernels.training import model_factory as mf

    path = _two_head_model(str(tmp_path / "two.pt"))
    train = _frames(str(tmp_path / "a.xyz"), 2, 0)
    cfg = tmp_path / "ft.yaml"
    cfg.write_text(yaml.safe_dump({"foundation_model": path, "foundation_head": "pt_head", "multiheads_finetuning": False,
                                   "train_file": train, "max_num_epochs": 1, "batch_size": 2, "valid_fraction": 0.0,
                                   "device": "cpu", "work_dir": str(tmp_path / "run")}))
    assert main(["fine-tune", "--config", str(cfg), "--no-progress", "--no-plot"]) == 0
    assert mf.heads(mf.load_model(str(tmp_path / "run" / "model.pt"), "equikernels")) == ["pt_head"]
    assert main(["fine-tune", "--model", path, "--model-head", "Default", "--train", train, "--epochs", "1",
                 "--valid-fraction", "0", "--device", "cpu", "--out", str(tmp_path / "run2"), "--no-progress",
                 "--no-plot"]) == 0
    assert mf.heads(mf.load_model(str(tmp_path / "run2" / "model.pt"), "equikernels")) == ["Default"]
