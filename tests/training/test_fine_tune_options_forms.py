"""fine_tune and Trainer take their options as a TrainConfig, a mapping or a YAML file, mace-torch's names
translated."""
import os

import pytest
import yaml

from emt_data import write_emt_dataset
from equikernels.default_model import default_model_path
from equikernels.training import Trainer, fine_tune


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("forms")
    return write_emt_dataset(str(d / "train.xyz"), 4, seed=37, elements=("Cu", "Ni"), max_atoms=3)


def _options(train_file, out):
    # mace-torch's names for the model, the epochs and the output folder
    return {"foundation_model": default_model_path(), "train_file": train_file, "max_num_epochs": 1,
            "batch_size": 2, "valid_fraction": 0.0, "work_dir": str(out), "device": "cpu", "progress": False,
            "plot": False}


def test_a_mapping_of_options_trains(train_file, tmp_path, single_thread):
    summary = fine_tune(_options(train_file, tmp_path / "run"))
    assert summary["step"] == 2 and os.path.isfile(tmp_path / "run" / "model.pt")


def test_a_yaml_file_of_options_trains_and_resumes(train_file, tmp_path, single_thread):
    path = tmp_path / "options.yaml"
    path.write_text(yaml.safe_dump(_options(train_file, tmp_path / "run")))
    assert fine_tune(str(path))["step"] == 2
    path.write_text(yaml.safe_dump({**_options(train_file, tmp_path / "run"), "max_num_epochs": 2,
                                    "restart_latest": True}))
    assert fine_tune(path)["step"] == 4  # continued from step 2, not refused as an earlier run


@pytest.mark.parametrize("cfg, error, message", [
    (5, TypeError, "cfg: expected a TrainConfig, a mapping of training options or the path of a YAML file of them, "
                   "got int"),
    ({"epochs": 1, "train_file": "x.xyz", "color": "red"}, ValueError, "unknown training option(s) ['color']"),
    ({"epochs": 1, "resume": 3}, ValueError, "cfg: resume (mace-torch's restart_latest): expected true or false, "
                                             "got 3"),
])
def test_other_forms_are_refused(cfg, error, message):
    with pytest.raises(error) as info:
        fine_tune(cfg)
    assert message in str(info.value)


def test_trainer_takes_a_mapping_or_a_yaml_file(train_file, tmp_path, single_thread):
    assert Trainer(_options(train_file, tmp_path / "a")).fit()["step"] == 2
    path = tmp_path / "options.yaml"
    path.write_text(yaml.safe_dump({**_options(train_file, tmp_path / "b"), "max_num_epochs": 2}))
    trainer = Trainer(path)
    assert trainer.cfg.epochs == 2 and trainer.fit()["step"] == 4


@pytest.mark.parametrize("cfg, error, message", [
    (5, TypeError, "cfg: expected a TrainConfig, a mapping of training options or the path of a YAML file of them, "
                   "got int"),
    ({"epochs": 1, "restart_latest": True}, ValueError,
     "cfg: resume (mace-torch's restart_latest) is an argument of Trainer.fit or of fine_tune, not a training option"),
    ({"epochs": 1, "train_file": "x.xyz", "color": "red"}, ValueError, "unknown training option(s) ['color']"),
])
def test_trainer_refuses_other_forms(cfg, error, message):
    with pytest.raises(error) as info:
        Trainer(cfg)
    assert message in str(info.value)
