"""Fine-tuning options as a mace-torch user expects them: AMSGrad on by default with an off switch
(flag, YAML, resumed runs), mace-torch's Adam as an option, mace-torch's plateau-scheduler options,
--ema / --no-ema, and the help naming mace-torch's default wherever ours differs."""
import argparse
import os
import re

import pytest
import torch

from emt_data import write_emt_dataset
from equikernels.cli import fine_tune, main
from equikernels.cli.fine_tune import config_from_args
from equikernels.training import TrainConfig, Trainer
from equikernels.training import checkpoint as ckpt
from equikernels.training import config
from equikernels.training.mace_options import from_mace_options


@pytest.fixture(scope="module")
def cu_train(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity")
    return write_emt_dataset(str(d / "train.xyz"), 4, seed=41, elements=("Cu",), max_atoms=2)


def _cfg(cu_model, train, out, **kw):
    base = dict(model=cu_model, train_file=train, valid_fraction=0.0, epochs=1, batch_size=2, lr=1e-2,
                out_dir=str(out), progress=False, plot=False, device="cpu")
    return TrainConfig(**{**base, **kw})


def _parsed(*argv):
    parser = argparse.ArgumentParser()
    fine_tune.register(parser.add_subparsers())
    return config_from_args(parser.parse_args(["fine-tune", *argv]))


def _amsgrad_of(trainer):
    return {g["amsgrad"] for g in trainer.optimizer.param_groups}


# ---- amsgrad -----------------------------------------------------------------------------------
def test_amsgrad_is_on_by_default_as_in_mace_torch(cu_model, cu_train, tmp_path):
    assert TrainConfig().amsgrad is True
    assert _amsgrad_of(Trainer(_cfg(cu_model, cu_train, tmp_path / "a"), log=None)) == {True}
    assert _amsgrad_of(Trainer(_cfg(cu_model, cu_train, tmp_path / "b", amsgrad=False), log=None)) == {False}


@pytest.mark.parametrize("yaml_text, flags, expected", [
    ("", [], True),
    ("", ["--no-amsgrad"], False),
    ("amsgrad: false\n", [], False),
    ("amsgrad: false\n", ["--amsgrad"], True),   # a flag wins over the file
    ("amsgrad: true\n", ["--no-amsgrad"], False),
])
def test_amsgrad_switch_from_the_command_line_and_yaml(cu_model, cu_train, tmp_path, yaml_text, flags, expected):
    options = tmp_path / "options.yaml"
    options.write_text(yaml_text + f"model: {cu_model}\ntrain_file: {cu_train}\n")
    cfg = _parsed("--config", str(options), "--out", str(tmp_path / "out"), "--device", "cpu", *flags)
    assert cfg.amsgrad is expected
    assert _amsgrad_of(Trainer(cfg, log=None)) == {expected}


def _plain_adamw_checkpoint(cu_model, cu_train, out, drop_key):
    Trainer(_cfg(cu_model, cu_train, out, max_steps=1, amsgrad=False), log=None).fit()
    path = ckpt.latest(os.path.join(out, "checkpoints"))
    state = ckpt.load(path)
    if drop_key:  # written before the option existed: its optimiser's state still says what ran
        del state["config"]["amsgrad"]
    torch.save(state, path)


@pytest.mark.parametrize("drop_key", [False, True])
def test_a_plain_adamw_run_resumes_with_the_off_switch(cu_model, cu_train, tmp_path, drop_key, single_thread):
    out = tmp_path / "out"
    _plain_adamw_checkpoint(cu_model, cu_train, out, drop_key)
    with pytest.raises(ValueError, match=r"cannot resume with changed amsgrad False -> True: .*restore them "
                                         r"\(amsgrad defaults to true, as in mace-torch: a run of plain AdamW "
                                         r"continues with --no-amsgrad or amsgrad: false\)"):
        Trainer(_cfg(cu_model, cu_train, out, max_steps=2), log=None).resume()
    t = Trainer(_cfg(cu_model, cu_train, out, max_steps=2, amsgrad=False), log=None)
    t.fit(resume=True)
    assert t.step == 2 and _amsgrad_of(t) == {False}


def test_an_amsgrad_checkpoint_without_the_option_resumes_with_the_default(cu_model, cu_train, tmp_path,
                                                                           single_thread):
    out = tmp_path / "out"
    Trainer(_cfg(cu_model, cu_train, out, max_steps=1), log=None).fit()
    path = ckpt.latest(os.path.join(out, "checkpoints"))
    state = ckpt.load(path)
    del state["config"]["amsgrad"]
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"cannot resume with changed amsgrad True -> False: .*restore them, or"):
        Trainer(_cfg(cu_model, cu_train, out, max_steps=2, amsgrad=False), log=None).resume()
    t = Trainer(_cfg(cu_model, cu_train, out, max_steps=2), log=None)
    t.fit(resume=True)
    assert t.step == 2 and _amsgrad_of(t) == {True}


# ---- mace-torch's scheduler options ------------------------------------------------------------
@pytest.mark.parametrize("values, expected", [
    ({"scheduler_patience": 3}, {"lr_schedule": "plateau", "plateau_patience": 3}),
    ({"lr_factor": 0.5}, {"lr_schedule": "plateau", "plateau_factor": 0.5}),
    ({"scheduler": "ReduceLROnPlateau", "lr_factor": 0.5}, {"lr_schedule": "plateau", "plateau_factor": 0.5}),
    ({"scheduler_patience": 3, "lr_schedule": "constant"}, {"lr_schedule": "constant", "plateau_patience": 3}),
    ({"plateau_patience": 3}, {"plateau_patience": 3}),  # our own names: the schedule stays as given
])
def test_mace_plateau_options_select_mace_torchs_default_scheduler(values, expected):
    assert from_mace_options(values) == expected


# ---- EMA ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("yaml_text, flags, expected", [
    ("", [], 0.99),
    ("", ["--no-ema"], None),
    ("ema: false\n", ["--ema"], 0.99),              # mace-torch's switch, from the command line
    ("ema: false\n", ["--ema", "--ema-decay", "0.9"], 0.9),
    ("ema: true\nema_decay: 0.95\n", [], 0.95),
    ("ema: true\n", ["--no-ema"], None),
])
def test_ema_switch(cu_model, cu_train, tmp_path, yaml_text, flags, expected):
    options = tmp_path / "options.yaml"
    options.write_text(yaml_text + f"model: {cu_model}\ntrain_file: {cu_train}\n")
    assert _parsed("--config", str(options), "--out", str(tmp_path / "out"), *flags).ema_decay == expected


# ---- defaults and their documentation ----------------------------------------------------------
# options whose default differs from mace-torch's: (flag, our default as the help states it, mace-torch's)
# ---- optimizer ---------------------------------------------------------------------------------
def test_adamw_by_default_and_adam_as_mace_torchs_default(cu_model, cu_train, tmp_path):
    assert type(Trainer(_cfg(cu_model, cu_train, tmp_path / "a"), log=None).optimizer) is torch.optim.AdamW
    t = Trainer(_cfg(cu_model, cu_train, tmp_path / "b", optimizer="adam", weight_decay=1e-3, amsgrad=False), log=None)
    assert type(t.optimizer) is torch.optim.Adam  # AdamW is a subclass: the exact type
    assert {(g["weight_decay"], g["amsgrad"]) for g in t.optimizer.param_groups} == {(1e-3, False)}


@pytest.mark.parametrize("yaml_text, flags, expected", [
    ("optimizer: adam\n", [], "adam"),
    ("", ["--optimizer", "adam"], "adam"),
    ("optimizer: adam\n", ["--optimizer", "adamw"], "adamw"),   # a flag wins over the file
    ("optimizer: adamw\n", [], "adamw"),
])
def test_optimizer_from_the_command_line_and_yaml(cu_model, cu_train, tmp_path, yaml_text, flags, expected):
    options = tmp_path / "options.yaml"
    options.write_text(yaml_text + f"model: {cu_model}\ntrain_file: {cu_train}\n")
    assert _parsed("--config", str(options), "--out", str(tmp_path / "out"), *flags).optimizer == expected


def test_mace_torchs_optimizer_names_and_the_one_without_counterpart():
    assert from_mace_options({"optimizer": "adam"}) == {"optimizer": "adam"}
    with pytest.raises(ValueError, match=r"^cfg.yaml: optimizer: 'schedulefree' has no counterpart here "
                                         r"\(adamw or adam; mace-torch's schedulefree is not offered\)$"):
        from_mace_options({"optimizer": "schedulefree"}, "cfg.yaml")
    with pytest.raises(ValueError, match=r"optimizer must be one of \('adamw', 'adam'\), got 'sgd'"):
        TrainConfig(model="m.model", train_file="t.xyz", optimizer="sgd").validate()


def test_a_run_resumes_only_with_its_optimizer(cu_model, cu_train, tmp_path, single_thread):
    out = tmp_path / "out"
    Trainer(_cfg(cu_model, cu_train, out, max_steps=1, optimizer="adam"), log=None).fit()
    with pytest.raises(ValueError, match=r"cannot resume with changed optimizer 'adam' -> 'adamw'"):
        Trainer(_cfg(cu_model, cu_train, out, max_steps=2), log=None).resume()
    t = Trainer(_cfg(cu_model, cu_train, out, max_steps=2, optimizer="adam"), log=None)
    t.fit(resume=True)
    assert t.step == 2 and type(t.optimizer) is torch.optim.Adam


DIFFERENT = [("--lr", "default 1e-3", "0.01"), ("--epochs", "default 10", "2048"), ("--batch-size", "default 4", "10"),
             ("--forces-weight", "default 10", "100"), ("--seed", "default 0", "123"),
             ("--dtype", "the model's own", "float64"), ("--ema", "default on", "off unless --ema"),
             ("--lr-schedule", "default cosine", "ReduceLROnPlateau, mace-torch's default"),
             ("--stress-weight", "default 1", "weighted, leaves stress out"),
             ("--optimizer", "default adamw", "adam: mace-torch's default")]


def _help(flag):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    fine_tune.register(sub)
    action = next(a for a in sub.choices["fine-tune"]._actions if flag in a.option_strings)
    return action.help


@pytest.mark.parametrize("flag, ours, theirs", DIFFERENT)
def test_help_names_mace_torchs_default_where_ours_differs(flag, ours, theirs):
    text = _help(flag)
    assert ours in text and theirs in text and "mace-torch" in text, text


def test_help_documents_the_amsgrad_off_switch(capsys):
    assert "default on, as in mace-torch; --no-amsgrad" in _help("--amsgrad")
    with pytest.raises(SystemExit):
        main(["fine-tune", "--help"])
    assert "--amsgrad, --no-amsgrad" in capsys.readouterr().out


@pytest.mark.mace
def test_shared_defaults_are_mace_torchs():
    """The defaults that mean the same as mace-torch's are its values (its parser, as installed)."""
    pytest.importorskip("mace")
    from mace.tools import build_default_arg_parser

    theirs = build_default_arg_parser().parse_args(["--name", "x", "--train_file", "t.xyz"])
    ours = TrainConfig()
    for mine, their in (("amsgrad", "amsgrad"), ("weight_decay", "weight_decay"), ("ema_decay", "ema_decay"),
                        ("clip_grad_norm", "clip_grad"), ("plateau_factor", "lr_factor"),
                        ("energy_weight", "energy_weight"), ("stress_weight", "stress_weight"),
                        ("huber_delta", "huber_delta"), ("valid_fraction", "valid_fraction"),
                        ("eval_every_epochs", "eval_interval")):
        assert getattr(ours, mine) == getattr(theirs, their), (mine, their)
    doc = " ".join(config.__doc__.split())
    for mine, their in (("lr", "lr"), ("epochs", "max_num_epochs"), ("batch_size", "batch_size"),
                        ("forces_weight", "forces_weight"), ("seed", "seed")):
        value = getattr(theirs, their)
        assert getattr(ours, mine) != value, f"{mine}: now mace-torch's default; the docstring says it differs"
        assert re.search(rf"``{mine}`` \S+ \({value:g}\)", doc), f"{mine}: mace-torch's {value:g} not stated"
