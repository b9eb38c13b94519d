"""Training tiny MACE models end to end: fine-tuning lowers the validation error, resume is exact,
bad data stops with file and frame, early stopping, CLI. The foundation model is a mace-torch
file when mace-torch is installed (the fine-tuning path users take), else one of ours; the model
trained is equikernels' either way. The backend-parity test needs mace-torch."""
import json
import os

import pytest
import torch

from emt_data import write_emt_dataset

TINY = dict(hidden_irreps="4x0e+4x1o", MLP_irreps="4x0e", max_ell=1, correlation=2, num_bessel=4,
            radial_MLP=[8], r_max=3.6)


def _have_mace():
    import importlib.util

    return importlib.util.find_spec("mace") is not None


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    pytest.importorskip("equikernels.models")

    d = tmp_path_factory.mktemp("emt")
    train = write_emt_dataset(str(d / "train.xyz"), 16, seed=11, elements=("Cu", "Ni"), max_atoms=4)
    valid = write_emt_dataset(str(d / "valid.xyz"), 6, seed=12, elements=("Cu", "Ni"), max_atoms=4)
    return train, valid


@pytest.fixture(scope="module")
def foundation(tmp_path_factory, data_files):
    """A 'foundation' model file, trained briefly: mace-torch's format when mace-torch is here."""
    from equikernels.training import TrainConfig, fine_tune

    out = str(tmp_path_factory.mktemp("foundation"))
    torch.set_num_threads(1)
    backend = "mace" if _have_mace() else "equikernels"
    fine_tune(TrainConfig(train_file=data_files[0], valid_fraction=0.0, new_model=TINY, epochs=2,
                          batch_size=4, lr=5e-3, model_backend=backend, out_dir=out, progress=False,
                          plot=False, e0s="average"), log=None)
    return os.path.join(out, "mace.model" if backend == "mace" else "model.pt")


def _cfg(data_files, model, out, **kw):
    from equikernels.training import TrainConfig

    base = dict(train_file=data_files[0], valid_file=data_files[1], model=model,
                epochs=3, batch_size=4, lr=1e-2, out_dir=str(out), progress=False, plot=False,
                checkpoint_every=2)
    base.update(kw)
    return TrainConfig(**base)


def test_fine_tune_lowers_validation_force_error(data_files, foundation, tmp_path, single_thread):
    from equikernels.training import Trainer

    trainer = Trainer(_cfg(data_files, foundation, tmp_path, epochs=8, lr=0.05, plot=True,
                           freeze=["node_embedding"]), log=None)
    before = trainer.evaluate(trainer.valid_set)
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if n.startswith("node_embedding.")}
    assert frozen
    summary = trainer.fit()
    after = summary["valid"]
    assert after["rmse_forces"] < 0.7 * before["rmse_forces"], (before, after)
    now = dict(trainer.model.named_parameters())
    assert all(torch.equal(now[n], p) for n, p in frozen.items())  # the frozen layer is unchanged
    assert os.path.isfile(summary["model_path"]) and os.path.isfile(summary["plot_path"])
    hist = json.load(open(tmp_path / "metrics.json"))["history"]
    assert len(hist["train"]) == 8 * trainer.steps_per_epoch and len(hist["valid"]) == 8


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_resume_reproduces_uninterrupted_run(data_files, foundation, tmp_path, single_thread):
    """Stop mid-epoch, resume from the checkpoint: identical weights, EMA, history, metrics.
    Bit-exact on CPU; on CUDA the scatter-adds (atomics) of the model itself are not
    deterministic, so two uninterrupted runs already differ in the last bits there."""
    from equikernels.training import Trainer

    kw = dict(epochs=3, ema_decay=0.9, lr_schedule="cosine", warmup_steps=2, patience=5, device="cpu")
    full = Trainer(_cfg(data_files, foundation, tmp_path / "full", **kw), log=None)
    full_summary = full.fit()
    assert full.steps_per_epoch == 4  # 16 structures / 4: step 6 below is mid-epoch 2

    part = Trainer(_cfg(data_files, foundation, tmp_path / "part", max_steps=6, **kw), log=None)
    part.fit()
    assert part.step == 6 and part.batch_in_epoch == 2
    resumed = Trainer(_cfg(data_files, foundation, tmp_path / "part", **kw), log=None)
    summary = resumed.fit(resume=True)

    assert resumed.step == full.step == 12
    a, b = _params(full.model), _params(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(x, y) for x, y in zip(full.ema.shadow, resumed.ema.shadow))
    assert full.history == resumed.history
    assert summary["valid"] == full_summary["valid"]


def test_unknown_element_and_missing_labels_stop_training(data_files, foundation, tmp_path):
    import ase.io
    from ase.build import bulk

    from equikernels.training import DataError, Trainer

    frames = ase.io.read(data_files[0], ":")
    gold = bulk("Au", "fcc", a=4.08, cubic=True)
    gold.info["REF_energy"] = 1.0
    gold.arrays["REF_forces"] = torch.zeros(4, 3).numpy()
    path = str(tmp_path / "with_gold.xyz")
    ase.io.write(path, frames[:3] + [gold], format="extxyz")
    with pytest.raises(DataError, match=r"with_gold.xyz, frame 3: element\(s\) Au \(Z=79\) unknown"):
        Trainer(_cfg(data_files, foundation, tmp_path, train_file=path), log=None)
    with pytest.raises(DataError, match=r"train.xyz, frame 0: no forces label"):
        Trainer(_cfg(data_files, foundation, tmp_path, keys={"forces": "DFT_forces"}), log=None)


def test_cli_yaml_flags_resume(data_files, foundation, tmp_path, capsys, single_thread):
    import yaml

    from equikernels.cli import main

    conf = tmp_path / "ft.yaml"
    conf.write_text(yaml.safe_dump({"batch_size": 4, "lr": 0.01,
                                    "checkpoint_every": 3, "e0s": "average"}))
    out = tmp_path / "run"
    args = ["fine-tune", "--config", str(conf), "--model", foundation, "--train", data_files[0],
            "--valid-fraction", "0.25", "--out", str(out), "--no-progress", "--no-plot"]
    assert main(args + ["--epochs", "1"]) == 0
    text = capsys.readouterr().out
    assert "RMSE F" in text and "valid" in text
    assert os.path.isfile(out / "model.pt") and os.listdir(out / "checkpoints")
    assert main(args + ["--epochs", "2", "--resume"]) == 0
    history = json.load(open(out / "metrics.json"))["history"]
    assert [r["epoch"] for r in history["valid"]] == [1, 2]  # epoch 1 kept, only epoch 2 trained
    assert "continuing with epoch 2" in capsys.readouterr().out  # numbered as the epoch lines


@pytest.mark.mace
def test_equikernels_and_mace_torch_train_alike(data_files, foundation, tmp_path, single_thread):
    """The same fine-tuning run with equikernels' MACE and with mace-torch's gives the same
    losses and weights (float64), and the saved model is in equikernels' format."""
    pytest.importorskip("mace")
    from equikernels import models
    from equikernels.training import Trainer

    runs = {}
    for backend in ("equikernels", "mace"):
        t = Trainer(_cfg(data_files, foundation, tmp_path / backend, epochs=2, model_backend=backend), log=None)
        runs[backend] = (t, t.fit())
    (ours, s_ours), (theirs, s_theirs) = runs["equikernels"], runs["mace"]
    assert type(ours.model).__module__.startswith("equikernels.models")
    assert type(theirs.model).__module__.startswith("mace.")
    for a, b in zip(ours.history["train"], theirs.history["train"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-8)
    assert s_ours["valid"]["rmse_forces"] == pytest.approx(s_theirs["valid"]["rmse_forces"], rel=1e-7)
    converted = models.from_mace(theirs.model)
    mine = dict(ours.model.state_dict())
    for k, v in converted.state_dict().items():
        torch.testing.assert_close(mine[k], v, rtol=1e-6, atol=1e-9)
    for s in (s_ours, s_theirs):  # both shipped in our format, loadable without mace-torch
        assert type(models.load(s["model_path"])).__module__.startswith("equikernels.models")
    assert os.path.isfile(s_theirs["mace_model_path"])


def test_early_stopping_huber_plateau(data_files, foundation, tmp_path, single_thread):
    """Validation loss that stops improving ends the run after `patience` evaluations; the best
    (first) weights are the ones shipped."""
    from equikernels.training import Trainer

    trainer = Trainer(_cfg(data_files, foundation, tmp_path, epochs=6, patience=2, loss="huber",
                           lr_schedule="plateau", plateau_patience=0, plateau_factor=0.5), log=None)
    losses = iter([1.0, 1.5, 2.0, 0.5, 0.1, 0.1])  # improves only at the first evaluation
    real = trainer.evaluate
    in_epoch_end = trainer._end_of_epoch

    def end_of_epoch():  # only the evaluations that decide early stopping see the scripted losses
        trainer.evaluate = lambda ds, batch_size=None: {**real(ds), "loss": next(losses)}
        try:
            in_epoch_end()
        finally:
            trainer.evaluate = real
    trainer._end_of_epoch = end_of_epoch
    summary = trainer.fit()
    assert summary["stopped_early"] and summary["epochs_completed"] == 3
    assert summary["best_step"] == trainer.steps_per_epoch
    assert [r["loss"] for r in trainer.history["valid"]] == [1.0, 1.5, 2.0]
    lrs = [r["lr"] for r in trainer.history["train"]]
    # halved after each evaluation without improvement (ReduceLROnPlateau, patience 0)
    assert lrs[0] == 1e-2 and lrs[-1] == pytest.approx(5e-3)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(2.5e-3)
