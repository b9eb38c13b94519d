"""``equikernels fine-tune`` as met on the first day: a stop asked for in any phase of a run ends it
with status 128 + signal after saving what it can, a training checkpoint given as the model is
refused naming ``--resume``, and mace-torch's options for quantities not trained here are set
aside with one warning (or refused by name where they would change what is trained)."""
import json
import os
import signal
import warnings

import pytest

from emt_data import write_emt_dataset
from equikernels.cli import main
from equikernels.training import TrainConfig, Trainer
from equikernels.training import trainer as trainer_mod
from equikernels.training.mace_options import from_mace_options


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("dayone")
    return (write_emt_dataset(str(d / "train.xyz"), 4, seed=21, elements=("Cu", "Ni"), max_atoms=3),
            write_emt_dataset(str(d / "valid.xyz"), 2, seed=22, elements=("Cu", "Ni"), max_atoms=3))


def _run(files, out, *extra):
    return main(["fine-tune", "--train", files[0], "--valid", files[1], "--out", str(out), "--epochs", "2",
                 "--batch-size", "2", "--device", "cpu", "--no-progress", "--no-plot", *extra])


def _signal_after(monkeypatch, name, when=lambda self: True):
    """``Trainer.<name>`` sends this process SIGINT once it has run (and ``when(self)`` holds)."""
    real = getattr(trainer_mod.Trainer, name)

    def then_signal(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        if when(self):
            os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(trainer_mod.Trainer, name, then_signal)


@pytest.mark.parametrize("phase, name, when, model_written", [
    ("starting evaluation", "_evaluate_start", lambda self: True, False),
    ("last epoch's evaluation", "_end_of_epoch", lambda self: self.epoch == 1, False),
    ("final evaluation", "load_final_weights", lambda self: True, False),
    ("final export", "_save_models", lambda self: True, True),
])
def test_a_stop_in_any_phase_exits_130(files, tmp_path, capsys, monkeypatch, single_thread, phase, name, when,
                                       model_written):
    _signal_after(monkeypatch, name, when)
    out = tmp_path / "run"
    assert _run(files, out) == 128 + signal.SIGINT, phase
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    said = [line for line in captured.out.splitlines() if line.startswith("stopped by SIGINT")]
    assert len(said) == 1, captured.out
    if name == "_evaluate_start":  # no step is taken once asked to stop
        assert "before the first step" in said[0]
    assert os.listdir(out / "checkpoints")
    assert (out / "model.pt").is_file() == model_written
    if not model_written:  # the metrics so far, and the run continues from its checkpoint
        assert json.load(open(out / "metrics.json"))["summary"]["interrupted"] == "SIGINT"
        monkeypatch.undo()
        assert _run(files, out, "--resume") == 0
        assert (out / "model.pt").is_file()
        assert json.load(open(out / "metrics.json"))["summary"]["epochs_completed"] == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored


def test_a_training_checkpoint_given_as_the_model_names_resume(files, tmp_path, capsys, single_thread):
    from equikernels.default_model import default_model_path
    from equikernels.training.checkpoint import is_checkpoint

    out = tmp_path / "run"
    cfg = TrainConfig(train_file=files[0], valid_file=files[1], model=default_model_path(), out_dir=str(out),
                      batch_size=2, device="cpu", progress=False, plot=False)
    trainer = Trainer(cfg, log=None)
    os.makedirs(trainer.ckpt_dir)
    trainer.save_checkpoint()
    (path,) = [str(p) for p in (out / "checkpoints").iterdir()]
    assert is_checkpoint(path) and not is_checkpoint(default_model_path()) and not is_checkpoint(files[0])
    assert _run(files, tmp_path / "other", "--model", path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"model: {path} is a training checkpoint, not a model file" in err[0], err
    assert f"--resume --out {os.path.relpath(out)}" in err[0]
    assert not (tmp_path / "other").exists()
    with pytest.raises(ValueError, match="is a training checkpoint.*--resume --out"):
        TrainConfig(train_file=files[0], model=path).validate()


def test_mace_torch_keys_of_untrained_quantities_are_set_aside(files, tmp_path, capsys):
    from equikernels.cli.fine_tune import config_from_args, register
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    aside = ["--dipole_key=REF_dipole", "--charges_key=REF_charges", "--polarizability_key=REF_pol",
             "--total_charge_key=charge", "--total_spin_key=spin", "--elec_temp_key=T", "--dipole_weight=2",
             "--polarizability_weight=2", "--virials_weight=3", "--swa_dipole_weight=1", "--compute_atomic_dipole=False"]
    args = parser.parse_args(["fine-tune", "--train", files[0], "--out", str(tmp_path / "o"), *aside])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = config_from_args(args)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "energies, forces and stress are what is trained here" in said[0], said
    assert said[0].endswith("charges_key, dipole_key, dipole_weight, elec_temp_key, polarizability_key, "
                            "polarizability_weight, swa_dipole_weight, total_charge_key, total_spin_key, "
                            "virials_weight")
    assert cfg.keys == TrainConfig().keys and cfg.stress_weight == TrainConfig().stress_weight
    with pytest.warns(UserWarning, match=r"set aside .*: charges_key, dipole_key$"):
        assert from_mace_options({"dipole_key": "d", "charges_key": "q", "epochs": 2}, "f.yaml") == {"epochs": 2}
    # a switch that would train another quantity is refused by name, in one line
    assert main(["fine-tune", "--train", files[0], "--out", str(tmp_path / "p"), "--compute_atomic_dipole=True"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "compute_atomic_dipole: True has no counterpart here" in err[0], err


@pytest.mark.parametrize("options, needle", [
    (dict(lr_schedule="plateau", warmup_steps=5), "warmup_steps 5: the plateau schedule has no warm-up here"),
    (dict(replay_weight=0.5), r"replay_weight 0.5 given without replay_file \(--replay\)"),
])
def test_options_without_effect_are_refused(files, options, needle):
    with pytest.raises(ValueError, match=needle):
        TrainConfig(train_file=files[0], model="m", **options).validate()


@pytest.mark.parametrize("options, needle", [
    (dict(patience=2), "patience 2 needs a validation set"),
    (dict(lr_schedule="plateau"), "lr_schedule 'plateau' needs a validation set"),
])
def test_what_acts_at_evaluations_needs_a_validation_set(files, tmp_path, options, needle):
    from equikernels.default_model import default_model_path

    cfg = TrainConfig(train_file=files[0], valid_fraction=0.0, model=default_model_path(), out_dir=str(tmp_path),
                      device="cpu", **options)
    with pytest.raises(ValueError, match=needle):
        Trainer(cfg, log=None)
    # said before any structure is read: a train file ASE cannot read is not what stops the run
    unreadable = tmp_path / "unreadable.xyz"
    unreadable.write_text("not a structure\n")
    cfg.train_file = str(unreadable)
    with pytest.raises(ValueError, match=needle):
        Trainer(cfg, log=None)
    # an empty validation set given in memory is found once the frames are in
    cfg.train_file = files[0]
    with pytest.raises(ValueError, match=needle):
        Trainer(cfg, valid_configs=[], log=None)


def test_a_failed_plot_keeps_the_earlier_figure(tmp_path, monkeypatch):
    import matplotlib.figure

    from equikernels.training.plot import plot_history

    history = {"train": [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}], "valid": []}
    path = tmp_path / "training.png"
    path.write_bytes(b"earlier")

    def torn(self, fname, **kw):
        open(fname, "wb").write(b"\x89PNG partial")
        raise OSError("No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", torn)
    with pytest.raises(OSError, match="No space left"):
        plot_history(history, str(path))
    assert os.listdir(tmp_path) == ["training.png"] and path.read_bytes() == b"earlier"
