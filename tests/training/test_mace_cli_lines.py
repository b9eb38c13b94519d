"""A command line copied from mace-torch's ``mace_run_train`` given to ``equikernels fine-tune``:
underscore spellings, ``--flag=value``, bare switches and mace-torch's names are read as a YAML
file's are (translated, set aside with one warning, or refused by name in one line), and a
foundation model given without ``multiheads_finetuning false`` gets one note that fine-tuning here
trains on the given structures only."""
import argparse
import json
import re
import warnings

import pytest
import yaml

from emt_data import write_emt_dataset
from equikernels import settings
from equikernels.cli import fine_tune, main
from equikernels.cli.fine_tune import config_from_args
from equikernels.training.mace_options import REPLAY_NOTE, from_mace_options


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    d = tmp_path_factory.mktemp("cu")
    return write_emt_dataset(str(d / "train.xyz"), 4, seed=41, elements=("Cu",), max_atoms=2)


def _parsed(*argv):
    parser = argparse.ArgumentParser()
    fine_tune.register(parser.add_subparsers())
    args = parser.parse_args(["fine-tune", *argv])
    return config_from_args(args), args


def _said(*argv):
    """The config of a command line and the messages of the warnings it gives."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg, args = _parsed(*argv)
    return cfg, args, [str(w.message) for w in caught]


def _documented(model, train, out):
    """mace-torch's fine-tuning example, with a model file, a CPU and one epoch."""
    return ["fine-tune", "--name=MACE", f"--foundation_model={model}", f"--train_file={train}",
            "--valid_fraction=0.25", f"--test_file={train}", "--energy_weight=1.0", "--forces_weight=1.0",
            "--E0s=average", "--lr=0.01", "--scaling=rms_forces_scaling", "--batch_size=2", "--max_num_epochs=1",
            "--ema", "--ema_decay=0.99", "--amsgrad", "--default_dtype=float64", "--device=cpu", "--seed=3",
            "--multiheads_finetuning=False", f"--work_dir={out}", "--no-progress", "--no-plot"]


def test_the_documented_command_line_keeps_its_meaning(cu_model, train, tmp_path):
    cfg, _, said = _said(*_documented(cu_model, train, tmp_path / "out")[1:])
    assert (cfg.model, cfg.train_file, cfg.test_file, cfg.valid_fraction) == (cu_model, train, train, 0.25)
    assert (cfg.energy_weight, cfg.forces_weight, cfg.e0s, cfg.lr, cfg.batch_size, cfg.epochs) == (
        1.0, 1.0, "average", 0.01, 2, 1)
    assert (cfg.ema_decay, cfg.amsgrad, cfg.dtype, cfg.device, cfg.seed, cfg.out_dir) == (
        0.99, True, "float64", "cpu", 3, str(tmp_path / "out"))
    assert len(said) == 1 and said[0].startswith("command line: mace-torch options set aside")
    assert said[0].endswith(": name, scaling")


def test_the_documented_command_line_fine_tunes(cu_model, train, tmp_path, capsys, single_thread):
    with pytest.warns(UserWarning, match="set aside"):
        assert main(_documented(cu_model, train, tmp_path / "out")) == 0
    summary = json.loads((tmp_path / "out" / "metrics.json").read_text())["summary"]
    assert summary["epochs_completed"] == 1 and "test" in summary


@pytest.mark.parametrize("argv, expected", [
    (["--E0s={29:-3.5}"], {"e0s": {29: -3.5}}),             # mace-torch's form: no space after the colon
    (["--e0s", "{29:-3.5}"], {"e0s": {29: -3.5}}),          # as YAML this would be {'29:-3.5': None}
    (["--e0s", "{Cu: -3.5}"], {"e0s": {"Cu": -3.5}}),
    (["--config_type_weights={'Default':1.0,'bulk':2.0}"], {"config_type_weights": {"Default": 1.0, "bulk": 2.0}}),
    (["--clip_grad=None"], {"clip_grad_norm": None}),
    (["--keep_checkpoints"], {"keep_checkpoints": None}),
    (["--keep_checkpoints=3"], {"keep_checkpoints": 3}),
    (["--scheduler_patience=3", "--lr_factor=0.5"], {"lr_schedule": "plateau", "plateau_patience": 3,
                                                     "plateau_factor": 0.5}),
    (["--scheduler=ReduceLROnPlateau", "--eval_interval=2"], {"lr_schedule": "plateau", "eval_every_epochs": 2}),
    (["--loss=weighted", "--stress_weight=2"], {"loss": "mse", "stress_weight": 0.0}),
    (["--loss", "huber"], {"loss": "huber"}),
    (["--weight_decay=1e-6", "--plot=False"], {"weight_decay": 1e-6, "plot": False}),
    (["--swa=False", "--keep_isolated_atoms=f"], {}),
    (["--optimizer=adam"], {"optimizer": "adam"}),
    (["--lora=False", "--lbfgs=false", "--beta=0.9", "--foundation_model_readout=True"], {}),
    (["--batch_size=3", "--huber_delta=0.1", "--no_plot"], {"batch_size": 3, "huber_delta": 0.1, "plot": False}),
    (["--no-ema", "--ema_decay=0.5"], {"ema_decay": None}),
])
def test_mace_names_and_spellings_land_on_ours(train, argv, expected):
    cfg, _, said = _said("--train", train, *argv)
    assert {k: getattr(cfg, k) for k in expected} == expected and not said


def test_label_keys_restart_and_outputs(train, tmp_path):
    cfg, args, said = _said(f"--train_file={train}", "--energy_key=E", "--forces-key=F", "--restart_latest",
                            f"--work_dir={tmp_path}", "--model_dir=m", "--checkpoints_dir=c", "--results_dir=r",
                            "--save_cpu", "--num_workers=4", "--start_swa=10")
    assert (cfg.keys.energy, cfg.keys.forces, cfg.out_dir, args.resume) == ("E", "F", str(tmp_path), True)
    assert said == ["command line: mace-torch options set aside (the model file fixes the architecture, out_dir "
                    "holds the outputs, stage two needs swa): checkpoints_dir, model_dir, num_workers, results_dir, "
                    "save_cpu, start_swa"]


def test_e0s_from_mace_torchs_json_file(train, tmp_path):
    path = tmp_path / "e0s.json"
    path.write_text('{"29": -3.5}')
    assert _parsed("--train", train, f"--E0s={path}")[0].e0s == {"29": -3.5}
    with pytest.raises(ValueError, match=r"^command line: E0s: cannot read '.*missing.json'"):
        _parsed("--train", train, f"--E0s={tmp_path / 'missing.json'}")
    # our own option and YAML key take the file too
    assert _parsed("--train", train, "--e0s", str(path))[0].e0s == {"29": -3.5}
    with pytest.raises(ValueError, match=r"^--e0s: cannot read '.*missing.json'"):
        _parsed("--train", train, "--e0s", str(tmp_path / "missing.json"))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"train_file": train, "e0s": str(path),
                                      "heads": {"dft": {"train_file": train, "e0s": str(path)}}}))
    cfg = _parsed("--config", str(config))[0]
    assert cfg.e0s == {"29": -3.5} and cfg.heads["dft"]["e0s"] == {"29": -3.5}


@pytest.mark.parametrize("argv, needle", [
    (["--swa"], "command line: swa: True has no counterpart here"),
    (["--lora=True"], "command line: lora: True has no counterpart here"),
    (["--beta=0.95"], "command line: beta: 0.95 has no counterpart here"),
    (["--multiheads_finetuning=True"], "command line: multiheads_finetuning: True .*use replay_file \\(--replay\\)"),
    (["--multiheads_finetuning=maybe"], "--multiheads_finetuning: expected true or false, got 'maybe'"),
    (["--pt_train_file=mp.xyz"], "command line: pt_train_file: mace-torch's multi-head replay .* replay_file"),
    (["--E0s=estimated"], "command line: E0s: mace-torch's 'estimated' has no counterpart here"),
    (["--model=MACE"], "command line: model: 'MACE' is a mace-torch architecture"),
    (["--freeze=1"], "command line: freeze: expected a list of parameter-name prefixes \\(mace-torch's layer count"),
    (["--loss=ef"], "command line: loss: mace-torch's 'ef' has no counterpart here"),
    (["--distributed"], "command line: distributed: multi-GPU training here runs under torchrun"),
    (["--epochs", "2", "--max_num_epochs=3"], "command line: max_num_epochs \\(mace-torch's name\\) and epochs"),
    (["--work_dir=a", "--out", "b"], "command line: work_dir \\(mace-torch's name\\) and out_dir mean the same"),
    (["--out_dir=a", "--out", "b"], "--out_dir and --out mean the same option; give one"),
    (["--E0s=average", "--e0s", "foundation"], "command line: E0s \\(mace-torch's name\\) and e0s mean the same"),
    (["--max_num_epochs=x"], "--max_num_epochs: expected an integer, got 'x'"),
    (["--valid_file"], "--valid_file: expected a value \\(--valid_file=VALUE\\)"),
])
def test_values_without_a_counterpart_are_refused_in_one_line(train, tmp_path, capsys, monkeypatch, argv, needle):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    settings.reload()
    out = [] if "--out" in argv else ["--out", str(tmp_path / "o")]
    assert main(["fine-tune", "--train", train, *out, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert re.search(rf"error: {needle}", err[0]), err[0]


def test_distributed_under_torchrun_is_what_runs_there(train, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    settings.reload()
    try:
        assert _said("--train", train, "--distributed")[2] == []
    finally:
        monkeypatch.delenv("WORLD_SIZE")
        settings.reload()


def test_whole_names_only(train):
    """An abbreviation is no option: mace-torch's names must never be taken for one of ours by prefix."""
    parser = argparse.ArgumentParser()
    fine_tune.register(parser.add_subparsers())
    for argv in (["--epoch", "3"], ["--batch", "2"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["fine-tune", "--train", train, *argv])


# ---- the note on mace-torch's multi-head replay ---------------------------------------------------
def _notes(said):
    return [m for m in said if REPLAY_NOTE in m]


def test_a_foundation_model_gets_one_note(cu_model, train, tmp_path, monkeypatch):
    notes = _notes(_said("--train", train, f"--foundation_model={cu_model}")[2])
    assert len(notes) == 1 and notes[0].startswith("command line: foundation_model: ")
    assert "multiheads_finetuning is false" in notes[0] and "replay_file (--replay)" in notes[0]
    assert _notes(_said("--train", train, f"--foundation_model={cu_model}", "--multiheads_finetuning=False")[2]) == []
    assert _notes(_said("--train", train, "--model", cu_model)[2]) == []  # our own name: no mace-torch default
    options = tmp_path / "mace.yaml"
    options.write_text(yaml.safe_dump({"foundation_model": cu_model, "train_file": train}))
    said = _said("--config", str(options), f"--foundation_model={cu_model}")[2]
    assert len(_notes(said)) == 1 and _notes(said)[0].startswith(f"{options}: foundation_model: ")
    assert _notes(_said("--config", str(options), "--multiheads_finetuning=False")[2]) == []
    monkeypatch.setenv("RANK", "1")  # under torchrun the first process alone says it
    settings.reload()
    try:
        assert _said("--train", train, f"--foundation_model={cu_model}", "--name=x")[2] == []
    finally:
        monkeypatch.delenv("RANK")
        settings.reload()


def test_a_mace_yaml_gets_the_note_and_its_replay_options_are_refused():
    with pytest.warns(UserWarning, match=rf"^c.yaml: foundation_model: {REPLAY_NOTE} \(mace-torch adds replay"):
        assert from_mace_options({"foundation_model": "small"}, "c.yaml") == {"model": "small"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert from_mace_options({"foundation_model": "small", "multiheads_finetuning": False}) == {"model": "small"}
    with pytest.raises(ValueError, match=r"^c.yaml: pt_train_file: mace-torch's multi-head replay fine-tuning"):
        from_mace_options({"foundation_model": "small", "pt_train_file": "mp"}, "c.yaml")
