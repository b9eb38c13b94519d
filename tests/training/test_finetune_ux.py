"""Fine-tuning as users meet it: standard ASE files, refused no-op losses, stale temporaries,
the starting model in the closing table, best and last models, replay, clean stop on signals."""
import json
import os
import signal

import numpy as np
import pytest

from equikernels.training import DataError, DataKeys, TrainConfig, Trainer, read_configs
from emt_data import write_emt_dataset


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ux")
    return (write_emt_dataset(str(d / "train.xyz"), 4, seed=11, elements=("Cu", "Ni"), max_atoms=3),
            write_emt_dataset(str(d / "valid.xyz"), 2, seed=12, elements=("Cu", "Ni"), max_atoms=3))


def _cfg(files, out, **kw):
    from equikernels.default_model import default_model_path

    base = dict(train_file=files[0], valid_file=files[1], model=default_model_path(), epochs=2, batch_size=2,
                lr=1e-2, out_dir=str(out), progress=False, plot=False, checkpoint_every=1, device="cpu")
    base.update(kw)
    return TrainConfig(**base)


def test_all_zero_loss_weights_are_refused(files, tmp_path):
    with pytest.raises(ValueError, match="all 0: the loss would be exactly 0"):
        _cfg(files, tmp_path, energy_weight=0, forces_weight=0.0, stress_weight=0).validate()


def test_calculator_results_are_read_when_ref_keys_are_absent(tmp_path):
    import ase.io
    from ase.build import bulk
    from ase.calculators.emt import EMT

    frames = []
    for k in range(2):
        a = bulk("Cu", "fcc", a=3.6 + 0.02 * k, cubic=True)
        a.calc = EMT()
        a.get_potential_energy(), a.get_forces(), a.get_stress()
        frames.append(a)
    path = str(tmp_path / "ase.xyz")
    ase.io.write(path, frames, format="extxyz")  # ASE writes energy/forces/stress of the calculator
    configs = read_configs(path, DataKeys())
    assert configs[1].energy == pytest.approx(frames[1].get_potential_energy())
    np.testing.assert_allclose(configs[0].forces, frames[0].get_forces(), atol=1e-6)
    assert configs[0].stress is not None
    from equikernels.training.data import check_labels, label_sources

    assert "energy from 'energy' (calculator results) in 2 of 2 frames" in label_sources(configs)
    # a key the user chose is taken literally; the error names the keys the file does have
    configs = read_configs(path, DataKeys(energy="DFT_energy"))
    with pytest.raises(DataError, match=r"no energy label \(looked for 'DFT_energy'\).*calculator results \['energies', 'energy'"):
        check_labels(configs, path, need_energy=True, need_forces=False, need_stress=False,
                     keys=DataKeys(energy="DFT_energy"))


def test_start_table_best_and_last_models_and_stale_temporaries(files, tmp_path, single_thread):
    out = tmp_path / "run"
    os.makedirs(out / "checkpoints")
    stale = [out / "model.pt.tmp999999999", out / "checkpoints" / ".checkpoint-000000002.pt.tmp999999999"]
    live = out / f"model.pt.tmp{os.getppid()}"  # a process that is still running
    for p in stale + [live]:
        p.write_bytes(b"partial")
    said = []
    trainer = Trainer(_cfg(files, out), log=said.append)
    losses = iter([0.5, 0.9])  # the first epoch is the best one
    real = trainer.evaluate
    trainer.evaluate = lambda ds, batch_size=None: (
        {**real(ds), "loss": next(losses)} if ds is trainer.valid_set and trainer.step > 0
        and len(trainer.history["valid"]) < 2 and trainer.best["step"] != trainer.step else real(ds))
    summary = trainer.fit()
    assert not any(p.exists() for p in stale) and live.exists()
    assert any("removed 2 unfinished file(s)" in s for s in said)
    assert summary["saved"] == "best" and summary["best_epoch"] == 1
    assert "valid_start" in summary and "valid_last" in summary
    assert os.path.isfile(summary["model_path"]) and os.path.isfile(summary["model_last_path"])
    table = said[-1]
    assert "valid, starting model" in table and "best validation epoch (1)" in table
    assert "valid, last weights" in table
    metrics = json.load(open(out / "metrics.json"))
    assert metrics["summary"]["valid_start"] == summary["valid_start"]


def test_sigterm_writes_checkpoint_and_metrics_and_exits_nonzero(files, tmp_path, capsys, monkeypatch,
                                                                 single_thread):
    from equikernels.cli import main
    from equikernels.training import trainer as trainer_mod

    real_step = trainer_mod.Trainer._train_step

    def step_then_signal(self, batch):
        result = real_step(self, batch)
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(trainer_mod.Trainer, "_train_step", step_then_signal)
    out = tmp_path / "run"
    code = main(["fine-tune", "--train", files[0], "--valid", files[1], "--out", str(out), "--epochs", "3",
                 "--batch-size", "2", "--checkpoint-every", "100", "--device", "cpu", "--no-progress", "--no-plot"])
    captured = capsys.readouterr()
    assert code == 128 + signal.SIGTERM
    assert "Traceback" not in captured.err
    assert [line for line in captured.out.splitlines() if line.startswith("stopped by SIGTERM at step 3")]
    assert os.path.isfile(out / "checkpoints" / "checkpoint-000000003.pt")  # the step under way finishes
    assert json.load(open(out / "metrics.json"))["summary"]["interrupted"] == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored


def test_replay_frames_are_mixed_in_weighted_and_labelled(files, tmp_path, single_thread):
    import ase.io

    frames = ase.io.read(files[1], ":")
    for a in frames:  # positions only: the starting model labels them
        a.info.pop("REF_energy", None)
        a.arrays.pop("REF_forces", None)
    replay = str(tmp_path / "replay.xyz")
    ase.io.write(replay, frames, format="extxyz")
    said = []
    t = Trainer(_cfg(files, tmp_path / "r", replay_file=replay, replay_weight=0.25,
                     head_weights={"Default": 2.0}), log=said.append)
    assert len(t.train_set) == 4 + len(frames)
    weights = [float(g.weight) for g in t.train_set.graphs]
    assert weights == [2.0] * 4 + [0.5] * len(frames)
    assert all(c.energy is not None and c.forces is not None for c in t.train_set.configs[4:])
    assert any("labelled by the starting model" in s for s in said)
    with pytest.raises(ValueError, match=r"head_weights: 'pt_head' is not one of the model's heads"):
        Trainer(_cfg(files, tmp_path / "r2", head_weights={"pt_head": 1.0}), log=None)


def test_fine_tune_help_documents_replay_and_head_weights(capsys):
    from equikernels.cli import main

    with pytest.raises(SystemExit):
        main(["fine-tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--replay FILE", "--replay-weight", "--head-weight HEAD=W", "model_last.pt", "calculator"):
        assert flag in text


def _cli_fine_tune(files, out, *extra):
    from equikernels.cli import main

    return main(["fine-tune", "--train", files[0], "--valid", files[1], "--out", str(out), "--epochs", "1",
                 "--batch-size", "2", "--device", "cpu", "--no-progress", "--no-plot", *extra])


def test_an_earlier_run_is_kept_unless_resumed_or_replaced(files, tmp_path, capsys, single_thread):
    from equikernels.training import fine_tune

    out = tmp_path / "run"
    assert _cli_fine_tune(files, out, "--epochs", "2") == 0
    kept = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert out / "checkpoints" / "checkpoint-000000004.pt" in kept
    capsys.readouterr()
    assert _cli_fine_tune(files, out) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "holds an earlier run (model.pt" in err and "1 checkpoint)" in err
    assert "--resume continues it, --overwrite replaces it" in err and "Traceback" not in err
    with pytest.raises(FileExistsError, match="resume=True continues it, overwrite=True replaces it"):
        fine_tune(_cfg(files, out))
    assert _cli_fine_tune(files, out, "--resume", "--overwrite") == 2
    assert "give one" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == kept
    # replaced: none of the earlier run's checkpoints is left for a later --resume to take
    assert _cli_fine_tune(files, out, "--overwrite") == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["checkpoint-000000002.pt"]
    assert (out / "model.pt").read_bytes() != kept[out / "model.pt"]


def test_resume_without_a_checkpoint_keeps_the_earlier_results(files, tmp_path, single_thread):
    from equikernels.training import fine_tune

    out = tmp_path / "run"
    fine_tune(_cfg(files, out, epochs=1))
    for p in (out / "checkpoints").iterdir():
        p.unlink()
    model = (out / "model.pt").read_bytes()
    with pytest.raises(FileExistsError, match="no checkpoint to continue from; overwrite=True replaces them"):
        fine_tune(_cfg(files, out, epochs=1), resume=True)
    assert (out / "model.pt").read_bytes() == model
