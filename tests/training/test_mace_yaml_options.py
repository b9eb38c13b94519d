"""Options of mace-torch training YAMLs that fine-tuning users bring: a held-out test set
(test_file, --test) reported next to the validation set, AdamW's amsgrad, and mace-torch's boolean
keep_checkpoints."""
import argparse
import json
import os

import pytest
import torch
import yaml

from ddp_runs import exit_rank, init_rank, run_ranks
from emt_data import write_emt_dataset
from equikernels.cli import fine_tune, main
from equikernels.cli.fine_tune import config_from_args
from equikernels.training import TrainConfig
from equikernels.training.data import DataError
from equikernels.training.mace_options import from_mace_options


@pytest.fixture(scope="module")
def cu_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cu")
    return {name: write_emt_dataset(str(d / f"{name}.xyz"), n, seed=seed, elements=("Cu",), max_atoms=2)
            for name, n, seed in (("train", 4, 31), ("valid", 2, 32), ("test", 3, 33))}


def _cfg(cu_model, cu_files, out, **kw):
    base = dict(model=cu_model, train_file=cu_files["train"], valid_file=cu_files["valid"], epochs=1,
                batch_size=2, lr=1e-2, out_dir=str(out), progress=False, plot=False, device="cpu")
    return TrainConfig(**{**base, **kw})


def _parsed(*argv):
    parser = argparse.ArgumentParser()
    fine_tune.register(parser.add_subparsers())
    return config_from_args(parser.parse_args(["fine-tune", *argv]))


# ---- test_file ---------------------------------------------------------------------------------
def test_test_file_is_reported_like_the_validation_set(cu_model, cu_files, tmp_path, capsys, single_thread):
    """The starting, the saved (best epoch) and the last model on the test set: closing table rows
    and metrics.json. Evaluating at epoch 2 of 3 makes the saved weights differ from the last ones."""
    options = tmp_path / "options.yaml"
    options.write_text("eval_every_epochs: 2\n")
    argv = ["fine-tune", "--config", str(options), "--model", cu_model, "--train", cu_files["train"],
            "--valid", cu_files["valid"], "--test", cu_files["test"], "--epochs", "3", "--batch-size", "2",
            "--lr", "0.01", "--device", "cpu", "--out", str(tmp_path / "out"), "--no-progress", "--no-plot"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for row in ("test, starting model", "test, saved = best validation epoch (2)", "test, last weights"):
        assert row in out
    summary = json.loads((tmp_path / "out" / "metrics.json").read_text())["summary"]
    assert summary["saved"] == "best"
    for key in ("test", "test_start", "test_last"):
        assert summary[key]["rmse_forces"] > 0 and summary[key]["rmse_energy_per_atom"] >= 0
    assert summary["test"] != summary["valid"] and summary["test"] != summary["test_last"]


def test_test_set_errors_are_those_of_equikernels_eval(cu_model, cu_files, tmp_path, single_thread):
    """The test row holds the saved model's errors on the test file, as `equikernels eval` computes them."""
    from equikernels.training import Trainer
    from equikernels.training.evaluate import predict

    t = Trainer(_cfg(cu_model, cu_files, tmp_path / "out", test_file=cu_files["test"], max_steps=1), log=None)
    summary = t.fit()
    _, metrics = predict(t.model, t.test_configs, dtype=t.dtype, device=t.device)
    for key in ("rmse_forces", "mae_forces", "rmse_energy_per_atom", "rmse_stress"):
        assert summary["test"][key] == pytest.approx(metrics[key], rel=1e-9, abs=1e-12)


def test_test_file_from_a_mace_yaml(cu_model, cu_files, tmp_path):
    path = tmp_path / "mace.yaml"
    path.write_text(yaml.safe_dump({"foundation_model": cu_model, "train_file": cu_files["train"],
                                    "test_file": cu_files["test"], "amsgrad": True, "keep_checkpoints": True,
                                    "work_dir": str(tmp_path / "out")}))
    cfg = _parsed("--config", str(path))
    assert (cfg.test_file, cfg.amsgrad, cfg.keep_checkpoints) == (cu_files["test"], True, None)
    assert _parsed("--config", str(path), "--no-amsgrad").amsgrad is False  # a flag still wins


def _ddp_worker(rank, world, init_file, cfg_dict, out_dir):
    import torch.distributed as dist

    from equikernels.training import Trainer

    init_rank(rank, world, init_file)
    try:
        summary = Trainer(TrainConfig.from_dict(cfg_dict), log=None).fit()
        torch.save(summary, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    exit_rank()


def test_test_set_under_ddp(cu_model, cu_files, tmp_path, single_thread):
    """Two gloo processes, a test set that does not split evenly between them: both finish, with the
    same test errors, those of the saved model on the whole test file."""
    from equikernels.training import model_factory as mf
    from equikernels.training.data import read_configs
    from equikernels.training.evaluate import predict

    cfg = _cfg(cu_model, cu_files, tmp_path / "out", test_file=cu_files["test"], max_steps=1).to_dict()
    a, b = run_ranks(_ddp_worker, cfg, tmp_path)
    assert a["test"] == b["test"] and a["test_start"] == b["test_start"]
    model = mf.load_model(str(tmp_path / "out" / "model.pt"), "auto").double()
    _, metrics = predict(model, read_configs(cu_files["test"], TrainConfig().keys), dtype=torch.float64, device="cpu")
    assert a["test"]["rmse_forces"] == pytest.approx(metrics["rmse_forces"], rel=1e-9)


def test_missing_or_unlabelled_test_file_is_refused(cu_model, cu_files, tmp_path):
    from ase.build import bulk
    from ase.io import write

    with pytest.raises(FileNotFoundError, match=r"^test_file: no such file"):
        _cfg(cu_model, cu_files, tmp_path / "o", test_file=str(tmp_path / "nope.xyz")).validate()
    bare = str(tmp_path / "bare.xyz")
    write(bare, [bulk("Cu", "fcc", a=3.6)])
    from equikernels.training import Trainer

    with pytest.raises(DataError, match=r"^test_file: .*bare.xyz: no frame has an energy, forces or stress label"):
        Trainer(_cfg(cu_model, cu_files, tmp_path / "o", test_file=bare), log=None)


# ---- amsgrad -----------------------------------------------------------------------------------
def test_amsgrad_reaches_the_optimiser(cu_model, cu_files, tmp_path, single_thread):
    from equikernels.training import Trainer

    assert TrainConfig().amsgrad is True  # mace-torch's default
    t = Trainer(_cfg(cu_model, cu_files, tmp_path / "a", amsgrad=True, max_steps=1), log=None)
    assert all(g["amsgrad"] for g in t.optimizer.param_groups)
    t.fit()
    assert any("max_exp_avg_sq" in s for s in t.optimizer.state.values())
    with pytest.raises(ValueError, match=r"^amsgrad must be true or false, got 'yes'"):
        _cfg(cu_model, cu_files, tmp_path / "b", amsgrad="yes").validate()


def test_checkpoint_written_before_amsgrad_and_test_file_resumes(cu_model, cu_files, tmp_path, single_thread):
    """Options missing from an older checkpoint count as their defaults: resuming it works, a test
    set may be added, and switching amsgrad off is refused (the optimiser state would not match)."""
    from equikernels.training import Trainer
    from equikernels.training import checkpoint as ckpt

    out = tmp_path / "out"
    Trainer(_cfg(cu_model, cu_files, out, max_steps=1), log=None).fit()
    path = ckpt.latest(os.path.join(out, "checkpoints"))
    state = ckpt.load(path)
    for key in ("amsgrad", "test_file"):
        del state["config"][key]
    torch.save(state, path)
    t = Trainer(_cfg(cu_model, cu_files, out, max_steps=2, test_file=cu_files["test"]), log=None)
    summary = t.fit(resume=True)
    assert t.step == 2 and "test" in summary
    with pytest.raises(ValueError, match=r"cannot resume with changed amsgrad True -> False"):
        Trainer(_cfg(cu_model, cu_files, out, max_steps=3, amsgrad=False), log=None).resume()


# ---- keep_checkpoints --------------------------------------------------------------------------
@pytest.mark.parametrize("given, ours", [(True, None), (False, 1), (3, 3)])
def test_mace_keep_checkpoints_switch_becomes_a_count(given, ours):
    assert from_mace_options({"keep_checkpoints": given})["keep_checkpoints"] == ours


def test_keep_checkpoints_none_keeps_every_one(cu_model, cu_files, tmp_path, single_thread):
    from equikernels.training import Trainer
    from equikernels.training import checkpoint as ckpt

    cfg = _cfg(cu_model, cu_files, tmp_path / "out", valid_file=None, valid_fraction=0.0, epochs=2,
               checkpoint_every=1, keep_checkpoints=None)
    Trainer(cfg, log=None).fit()
    kept = ckpt.list_checkpoints(str(tmp_path / "out" / "checkpoints"))
    assert [ckpt.checkpoint_step(p) for p in kept] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"^keep_checkpoints must be >= 1 \(or null: keep every checkpoint\)"):
        _cfg(cu_model, cu_files, tmp_path / "b", keep_checkpoints=0).validate()
