"""Fine-tuning workflows of mace-torch users: config_type_weights (YAML, flag, Python), E0s given as
a mapping, a resumed run's outputs, and the mace-torch copy of a model mace-torch cannot express."""
import argparse

import pytest

from emt_data import write_emt_dataset
from equikernels.cli import fine_tune as fine_tune_cli
from equikernels.cli.fine_tune import config_from_args
from equikernels.training import TrainConfig, Trainer
from equikernels.training.mace_options import from_mace_options
from equikernels.training.statistics import parse_given_e0s


@pytest.fixture(scope="module")
def cu_train(tmp_path_factory):
    """Two Cu frames, one of config_type 'surface'."""
    import ase.io

    d = tmp_path_factory.mktemp("workflows")
    frames = ase.io.read(write_emt_dataset(str(d / "all.xyz"), 2, seed=5, elements=("Cu",), max_atoms=4), ":")
    frames[0].info["config_type"] = "surface"
    path = str(d / "train.xyz")
    ase.io.write(path, frames, format="extxyz")
    return path


def _cfg(cu_model, train, out, **kw):
    return TrainConfig(**{**dict(model=cu_model, train_file=train, valid_fraction=0, batch_size=1, epochs=1,
                                 out_dir=str(out), progress=False, plot=False, device="cpu"), **kw})


def test_config_type_weights_scale_their_frames(cu_model, cu_train, tmp_path, single_thread):
    said = []
    trainer = Trainer(_cfg(cu_model, cu_train, tmp_path, config_type_weights={"surface": 3.0, "bulkk": 2.0}),
                      log=said.append)
    weights = {c.config_type: float(g.weight) for c, g in zip(trainer.train_set.configs, trainer.train_set.graphs)}
    assert weights["surface"] == 3.0 and list(weights.values()).count(1.0) == 1
    assert any("no training frame has config_type 'bulkk'" in s for s in said)
    # a checkpoint written before an option existed resumes with that option at its default
    saved = trainer.cfg.to_dict()
    saved.pop("config_type_weights")
    trainer.cfg.config_type_weights = {}
    assert trainer._check_resumable(saved) == []


def test_config_type_weights_from_a_mace_yaml_and_the_flag(cu_model, cu_train, tmp_path):
    assert from_mace_options({"config_type_weights": '{"Default": 1.0, "surface": 2.0}'}) == {
        "config_type_weights": {"Default": 1.0, "surface": 2.0}}
    with pytest.raises(ValueError, match=r"^c.yaml: config_type_weights: expected a mapping"):
        from_mace_options({"config_type_weights": "[1, 2]"}, "c.yaml")
    path = tmp_path / "c.yaml"
    path.write_text(f"model: {cu_model}\ntrain_file: {cu_train}\nconfig_type_weights: '{{\"Default\": 1.0}}'\n")
    parser = argparse.ArgumentParser()
    fine_tune_cli.register(parser.add_subparsers())
    cfg = config_from_args(parser.parse_args(["fine-tune", "--config", str(path),
                                              "--config-type-weights", "{surface: 2}"]))
    assert cfg.config_type_weights == {"Default": 1.0, "surface": 2}
    with pytest.raises(ValueError, match=r"^--config-type-weights: expected a YAML mapping"):
        config_from_args(parser.parse_args(["fine-tune", "--config", str(path), "--config-type-weights", "[1, 2]"]))
    with pytest.raises(ValueError, match=r"config_type_weights\['surface'\] must be a number >= 0"):
        TrainConfig(model=cu_model, train_file=cu_train, config_type_weights={"surface": -1}).validate()


@pytest.mark.parametrize("energy", ["abc", float("nan"), True])
def test_an_e0_that_is_not_a_finite_number_is_named(energy):
    with pytest.raises(ValueError, match=r"^e0s: the energy of 'Cu' must be a finite number"):
        parse_given_e0s({"Cu": energy}, [29])


@pytest.mark.filterwarnings("ignore:could not also save a mace-torch model file")
def test_a_resumed_run_leaves_no_earlier_last_weights(cu_model, cu_train, tmp_path, single_thread):
    from equikernels.training import fine_tune

    out = tmp_path / "run"
    fine_tune(_cfg(cu_model, cu_train, out, max_steps=1, checkpoint_every=1))
    # what an interrupted earlier part of the run had written when its best and last weights differed
    for name in ("model_last.pt", "mace_last.model", "mace.model"):
        (out / name).write_bytes(b"earlier")
    summary = fine_tune(_cfg(cu_model, cu_train, out, max_steps=2), resume=True)
    assert summary["saved"] == "last" and summary["step"] == 2
    assert not (out / "model_last.pt").exists() and not (out / "mace_last.model").exists()
    assert (out / "mace.model").exists() == ("mace_model_path" in summary)


def test_an_earlier_mace_torch_file_removed_for_want_of_mace_torch_is_said(cu_model, cu_train, tmp_path,
                                                                           monkeypatch, single_thread):
    from equikernels.training import fine_tune, trainer

    monkeypatch.setattr(trainer.mf, "have_mace", lambda: False)
    out = tmp_path / "run"
    fine_tune(_cfg(cu_model, cu_train, out, max_steps=1, checkpoint_every=1))
    (out / "mace.model").write_bytes(b"earlier")  # as a run with mace-torch installed wrote it
    with pytest.warns(UserWarning, match=r"^removed .*mace\.model, written by an earlier part of this run: mace-torch is "
                      r"not installed to write it for these weights \(with mace-torch, `equikernels convert "):
        summary = fine_tune(_cfg(cu_model, cu_train, out, max_steps=2), resume=True)
    assert not (out / "mace.model").exists() and "mace_model_path" not in summary


@pytest.mark.mace
def test_a_model_mace_torch_cannot_express_says_why(cu_model, monkeypatch):
    pytest.importorskip("mace")
    from equikernels.models import load
    from equikernels.training import mace_export
    from equikernels.training.mace_export import to_mace

    # with cuequivariance installed, mace-torch's reduced basis has our basis's shapes and takes its tensors
    monkeypatch.setattr(mace_export, "_cuet_available", lambda: False)
    with pytest.raises(ValueError, match=r"different products; its symmetric contractions use another basis"):
        to_mace(load(cu_model))
