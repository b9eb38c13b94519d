"""A fine-tuning YAML written for mace-torch's training script: renamed options land on ours, the
foundation model's architecture and the script's output options are set aside with one warning,
values without a counterpart are refused by name; then it fine-tunes end to end."""
import argparse
import json

import pytest
import yaml

from emt_data import write_emt_dataset
from equikernels.cli import fine_tune, main
from equikernels.cli.fine_tune import config_from_args
from equikernels.default_model import default_model_path
from equikernels.training.mace_options import from_mace_options


def mace_yaml(tmp_path, **extra):
    train = write_emt_dataset(str(tmp_path / "train.xyz"), 4, seed=11, elements=("Cu", "Ni"), max_atoms=3)
    values = {"name": "ft", "model": "MACE", "foundation_model": default_model_path(), "train_file": train,
              "valid_fraction": 0.25, "energy_key": "REF_energy", "forces_key": "REF_forces", "E0s": "average",
              "max_num_epochs": 1, "batch_size": 2, "lr": 0.01, "default_dtype": "float64", "ema": False,
              "scheduler": "ReduceLROnPlateau", "scheduler_patience": 3, "lr_factor": 0.5, "clip_grad": 5.0,
              "hidden_irreps": "32x0e", "r_max": 5.0, "work_dir": str(tmp_path / "out"), "device": "cpu",
              "seed": 3, **extra}
    path = tmp_path / "mace.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def parsed(path, *flags):
    parser = argparse.ArgumentParser()
    fine_tune.register(parser.add_subparsers())
    return config_from_args(parser.parse_args(["fine-tune", "--config", path, *flags]))


def test_mace_names_land_on_ours(tmp_path):
    with pytest.warns(UserWarning, match=r"mace-torch options set aside .*: hidden_irreps, model, name, r_max"):
        cfg = parsed(mace_yaml(tmp_path), "--lr", "0.002")
    assert (cfg.model, cfg.epochs, cfg.dtype, cfg.e0s, cfg.ema_decay) == (default_model_path(), 1, "float64", "average",
                                                                          None)
    assert (cfg.lr_schedule, cfg.plateau_patience, cfg.plateau_factor, cfg.clip_grad_norm) == ("plateau", 3, 0.5, 5.0)
    assert (cfg.keys.energy, cfg.keys.forces, cfg.out_dir, cfg.seed) == ("REF_energy", "REF_forces",
                                                                        str(tmp_path / "out"), 3)
    assert cfg.lr == 0.002  # a command-line flag still wins


def test_e0s_written_as_a_string_mapping():
    assert from_mace_options({"E0s": "{29: -3.5, 28: -4.1}"})["e0s"] == {29: -3.5, 28: -4.1}


@pytest.mark.parametrize("values, needle", [
    ({"model": "MACE"}, r"model: 'MACE' is a mace-torch architecture; give the model file"),
    ({"E0s": "estimated"}, r"E0s: mace-torch's 'estimated' has no counterpart here"),
    ({"E0s": "{29: -3.5"}, r"E0s: expected 'average', 'foundation' or a mapping"),
    ({"scheduler": "ExponentialLR"}, r"scheduler: only mace-torch's 'ReduceLROnPlateau'"),
    ({"freeze": 3}, r"freeze: expected a list of parameter-name prefixes"),
    ({"max_num_epochs": 2, "epochs": 3}, r"max_num_epochs \(mace-torch's name\) and epochs mean the same option"),
    ({"ema": "yes"}, r"ema: expected true or false"),
    ({"heads": {"a": {"test_dir": "tests/"}}}, r"heads: a: test_dir: mace-torch's folder"),
    ({"heads": {"a": {"E0s": "estimated"}}}, r"heads: a: E0s: mace-torch's 'estimated' has no counterpart here"),
    ({"heads": {"a": {"E0s": 1, "e0s": 1}}}, r"heads: a: E0s \(mace-torch's name\) and e0s mean the same option"),
    ({"heads": {"a": {"keep_isolated_atoms": True}}}, r"heads: a: keep_isolated_atoms: only false"),
])
def test_values_without_a_counterpart_are_refused(values, needle):
    with pytest.raises(ValueError, match=rf"^cfg.yaml: {needle}"):
        from_mace_options(values, "cfg.yaml")


def test_other_mace_options_are_named_by_the_trainer(tmp_path):
    with pytest.warns(UserWarning):
        with pytest.raises(ValueError, match=r"unknown training option\(s\) \['lr_sheduler_gamma'\]"):
            parsed(mace_yaml(tmp_path, lr_sheduler_gamma=0.99))  # misspelt: no option of mace-torch's


def test_switches_with_the_value_that_is_ours_are_accepted():
    values = {"swa": False, "stage_two": False, "multiheads_finetuning": False, "keep_isolated_atoms": False}
    assert from_mace_options(values) == {}


@pytest.mark.parametrize("values, needle", [
    ({"swa": True}, r"swa: True has no counterpart here \(only False"),
    ({"lbfgs": True}, r"lbfgs: True has no counterpart here \(only False.*AdamW and Adam \(optimizer\)"),
    ({"multiheads_finetuning": True}, r"multiheads_finetuning: True .*use replay_file \(--replay\)"),
    ({"loss": "universal"}, r"loss: mace-torch's 'universal' has no counterpart here"),
    ({"test_dir": "h5/"}, r"test_dir: mace-torch's folder of preprocessed \*_test.h5 files has no counterpart"),
])
def test_mace_switches_and_losses_without_a_counterpart_are_refused(values, needle):
    with pytest.raises(ValueError, match=rf"^cfg.yaml: {needle}"):
        from_mace_options(values, "cfg.yaml")


@pytest.mark.parametrize("loss, ours", [
    ("weighted", {"loss": "mse", "stress_weight": 0.0}),  # mace-torch's default: energy and forces only
    ("stress", {"loss": "mse", "stress_weight": 2.0}),
    ("huber", {"loss": "huber", "stress_weight": 2.0}),
    ("forces_only", {"loss": "mse", "energy_weight": 0.0, "stress_weight": 0.0}),
])
def test_mace_losses_map_onto_ours(loss, ours):
    out = from_mace_options({"loss": loss, "stress_weight": 2.0})
    assert {k: out[k] for k in ours} == ours


def test_fine_tunes_from_a_mace_yaml(tmp_path, capsys, single_thread):
    with pytest.warns(UserWarning):
        assert main(["fine-tune", "--config", mace_yaml(tmp_path), "--no-progress", "--no-plot"]) == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics and (tmp_path / "out" / "model.pt").is_file()


def test_restart_latest_continues_the_run(tmp_path, capsys, single_thread):
    with pytest.warns(UserWarning):
        assert main(["fine-tune", "--config", mace_yaml(tmp_path), "--no-progress", "--no-plot"]) == 0
    capsys.readouterr()
    with pytest.warns(UserWarning):
        assert main(["fine-tune", "--config", mace_yaml(tmp_path, restart_latest=True, max_num_epochs=2),
                     "--no-progress", "--no-plot"]) == 0
    assert "resumed from" in capsys.readouterr().out
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["summary"]["epochs_completed"] == 2 and metrics["history"]["valid"][-1]["epoch"] == 2
    refused = r"resume \(mace-torch's restart_latest\): expected true or false"
    with pytest.warns(UserWarning), pytest.raises(ValueError, match=refused):
        parsed(mace_yaml(tmp_path, restart_latest="yes"))
