"""The command line as a mace-torch / ASE user drives it: ASE's FILE@INDEX frame selection and
mace_eval_configs' option names in `eval`, non-finite predictions said aloud, an --out that takes
no file named before evaluating, one line (status 1) for an unexpected failure, misspelt
EQUIKERNELS_* variables in `settings`, bench files replaced whole, and export-lammps errors naming
the command's arguments."""
import json
import pathlib

import ase.io
import pytest
from ase import Atoms
from ase.build import bulk

from equikernels.cli import main
from cli_checks import one_line_error


def _cu_frames(n):
    frames = []
    for seed in range(n):
        a = bulk("Cu", "fcc", a=3.6, cubic=True)
        a.rattle(0.05, seed=seed)
        a.info["tag"] = seed
        frames.append(a)
    return frames


@pytest.fixture
def cu_file(tmp_path):
    path = tmp_path / "cu.xyz"
    ase.io.write(str(path), _cu_frames(4), format="extxyz")
    return str(path)


def _eval(*argv):
    return main(["eval", *argv, "--no-progress", "--device", "cpu"])


def test_eval_honours_ases_frame_selection_and_mace_eval_configs_options(cu_file, cu_model, tmp_path, capsys):
    out = str(tmp_path / "last.xyz")
    # mace_eval_configs' spellings: --output, --info_prefix, --batch_size, --default_dtype
    assert _eval(cu_file + "@-1", "--model", cu_model, "--output", out, "--info_prefix", "X_", "--batch_size", "2",
                 "--default_dtype", "float64") == 0
    assert "1 structure (4 atoms)" in capsys.readouterr().out
    frames = ase.io.read(out, ":")
    assert [f.info["tag"] for f in frames] == [3] and "X_energy" in frames[0].info and "X_forces" in frames[0].arrays
    assert _eval(cu_file + "@1:3", "--model", cu_model, "--out", out, "--overwrite") == 0
    assert [f.info["tag"] for f in ase.io.read(out, ":")] == [1, 2]


@pytest.mark.parametrize("suffix, needles", [("@7", ["@7'", "selects no frame", "holds 4"]),
                                             ("@abc", ["@abc'", "no such file", "not a frame selection"])])
def test_eval_refuses_a_selection_that_picks_nothing(suffix, needles, cu_file, cu_model, tmp_path, capsys):
    out = tmp_path / "o.xyz"
    assert _eval(cu_file + suffix, "--model", cu_model, "--out", str(out)) == 2
    one_line_error(capsys, *needles)
    assert not out.exists()


def test_eval_warns_of_non_finite_predictions(cu_model, tmp_path, capsys):
    path = tmp_path / "overlap.xyz"
    ase.io.write(str(path), Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 0]], cell=[3, 3, 3], pbc=True))
    with pytest.warns(UserWarning, match="non-finite .* 1 structure.*overlap.xyz, frame 0"):
        assert _eval(str(path), "--model", cu_model, "--out", str(tmp_path / "o.xyz")) == 0


def test_eval_names_an_out_it_cannot_create_before_evaluating(cu_file, cu_model, tmp_path, capsys, monkeypatch):
    from equikernels.training import evaluate

    monkeypatch.setattr(evaluate, "predict", lambda *a, **k: pytest.fail("evaluated before --out was checked"))
    out = tmp_path / ("x" * 300 + ".xyz")  # a name the file system refuses
    assert _eval(cu_file, "--model", cu_model, "--out", str(out)) == 2
    one_line_error(capsys, "--out", "cannot write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cu.xyz"]


def test_an_unexpected_failure_is_one_line_with_status_1(monkeypatch, capsys):
    from equikernels.cli import show_settings

    def broken():
        raise ZeroDivisionError("float division by zero")
    monkeypatch.setattr(show_settings, "text", broken)
    assert main(["settings"]) == 1
    one_line_error(capsys, "equikernels settings: internal error: ZeroDivisionError: float division by zero",
                   "--debug")
    with pytest.raises(ZeroDivisionError):
        main(["settings", "--debug"])


def test_settings_names_misspelt_variables(monkeypatch, capsys):
    monkeypatch.setenv("EQUIKERNELS_AUTOTUNES", "1")
    assert main(["settings"]) == 0
    err = capsys.readouterr().err
    assert "EQUIKERNELS_AUTOTUNES is set but is no equikernels setting" in err
    assert "did you mean EQUIKERNELS_AUTOTUNE?" in err


def test_bench_merge_interrupted_while_writing_keeps_the_earlier_file(tmp_path, monkeypatch):
    from equikernels.bench.compare import SCHEMA

    run = {"schema": SCHEMA, "gpu_kind": "nvidia-h200", "env": {"torch": "2.11.0"},
           "cells": [{"id": "tp/mace-large/float32/50000/fwd", "group": "tp", "impl": "equikernels", "status": "ok",
                      "ms": 0.8}], "scope": {"groups": ["tp"], "problems": ["mace-large"]}}
    src = tmp_path / "run.json"
    src.write_text(json.dumps(run))
    out = tmp_path / "out"
    out.mkdir()
    earlier = out / "nvidia-h200.json"
    earlier.write_text('{"earlier": true}')
    real = pathlib.Path.write_text

    def cut_short(self, text, *args, **kwargs):
        real(self, text[: len(text) // 2], *args, **kwargs)
        raise KeyboardInterrupt
    monkeypatch.setattr(pathlib.Path, "write_text", cut_short)
    assert main(["bench", "--merge", str(src), "--out", str(out), "--overwrite"]) == 130
    assert earlier.read_text() == '{"earlier": true}'
    assert sorted(p.name for p in out.iterdir()) == ["nvidia-h200.json"]


def test_export_lammps_errors_name_the_commands_arguments(cu_model, tmp_path, capsys):
    assert main(["export-lammps", cu_model, str(tmp_path / "m.pkl"), "--head", "nope"]) == 2
    one_line_error(capsys, "--head: 'nope' is not one of the model's heads")
    assert main(["export-lammps", cu_model, str(tmp_path)]) == 2
    one_line_error(capsys, f"OUT: '{tmp_path}' is a directory")
