"""The example scripts run as their docstrings show, at their smallest settings, and print what they
promise; bad sizes are refused with a one-line argparse error."""
import json
import re
import runpy
import sys
from pathlib import Path

import pytest

from emt_data import write_emt_dataset

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(monkeypatch, name, *argv):
    path = EXAMPLES / name
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    monkeypatch.syspath_prepend(str(EXAMPLES))  # as when run as a script: its folder comes first
    runpy.run_path(str(path), run_name="__main__")


def test_swap_e3nn_agrees_with_e3nn(monkeypatch, capsys, single_thread):
    _run(monkeypatch, "swap_e3nn.py", "--rows", "16", "--repeat", "1")
    out = capsys.readouterr().out
    assert "-> equikernels.FullyConnectedTensorProduct, holding the same weight Parameter" in out
    assert "replaced 3 module(s)" in out
    relative = float(re.search(r"model output: \S+ \(relative (\S+)\)", out).group(1))
    assert relative < 1e-5


def test_md_crystal_writes_its_run(monkeypatch, capsys, tmp_path, single_thread):
    _run(monkeypatch, "md_crystal.py", "--steps", "2", "--repeat", "1", "--out", str(tmp_path / "md"))
    out = capsys.readouterr().out
    assert "4 Cu atoms" in out and "final temperature" in out and "ns/day on cpu" in out
    assert {p.name for p in (tmp_path / "md").iterdir()} >= {"md.traj", "md.log", "summary.json"}
    assert json.loads((tmp_path / "md" / "summary.json").read_text())["steps_done"] == 2


def test_geometry_optimisation_quick_look(monkeypatch, capsys, single_thread):
    _run(monkeypatch, "geometry_optimisation.py", "--steps", "1")
    out = capsys.readouterr().out
    assert "bulk: 1 BFGS steps" in out and "Cu(111) slab: 1 BFGS steps" in out


@pytest.mark.parametrize("name,argv", [("geometry_optimisation.py", ["--steps", "-1"]),
                                       ("swap_e3nn.py", ["--rows", "0"]),
                                       ("train_default_model.py", ["--n-train", "0"])])
def test_bad_sizes_are_refused(monkeypatch, capsys, tmp_path, name, argv):
    # never the default --data / --out / install of the training script, whatever happens
    safe = ["--no-install", "--data", str(tmp_path), "--out", str(tmp_path / "run")] if name.startswith("train") else []
    with pytest.raises(SystemExit) as exc:
        _run(monkeypatch, name, *argv, *safe)
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_train_default_model_refuses_kept_data_of_another_size(monkeypatch, capsys, tmp_path):
    for split, seed in (("train", 1001), ("valid", 1002), ("test", 1003)):
        write_emt_dataset(str(tmp_path / f"emt_{split}.xyz"), 2, seed=seed, max_atoms=4)
    with pytest.raises(SystemExit) as exc:  # --n-train 3 would otherwise train on the 2 kept structures
        _run(monkeypatch, "train_default_model.py", "--no-install", "--epochs", "1", "--n-train", "3",
             "--n-valid", "2", "--n-test", "2", "--data", str(tmp_path), "--out", str(tmp_path / "run"))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "emt_train.xyz holds 2 structures, --n-train asks for 3: pass --data DIR" in err
    assert not (tmp_path / "run").exists()
