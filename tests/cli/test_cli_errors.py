"""The command line with bad files and arguments: one line on stderr naming the file or argument and
what was expected, exit status 2, no traceback (a traceback with --debug); a model directory
written by `convert` runs in `md`; a pickle is never unpickled when the format check fails, and
only after a warning that it runs code from the file."""
import datetime
import json
import os
import sys
import types

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk
from ase.io import write

from equikernels.cli import main
from equikernels.models import io as model_io
from cli_checks import one_line_error


@pytest.fixture
def cu_file(tmp_path):
    path = tmp_path / "cu.extxyz"
    write(str(path), bulk("Cu", "fcc", a=3.61, cubic=True))
    return str(path)


def _md(*args):
    return main(["md", *args, "--steps", "2", "--no-progress", "--device", "cpu"])


def test_md_runs_the_directory_that_convert_writes(cu_model, cu_file, tmp_path, capsys):
    out_dir = tmp_path / "converted"
    out_dir.mkdir()
    assert main(["convert", cu_model, str(out_dir)]) == 0
    assert _md(cu_file, "--model", str(out_dir), "--out", str(tmp_path / "run")) == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"


@pytest.mark.parametrize("kind", ["truncated", "empty", "random", "text"])
def test_bad_model_files(cu_model, cu_file, tmp_path, capsys, kind):
    data = open(cu_model, "rb").read()
    content = {"truncated": data[:len(data) // 2], "empty": b"", "random": os.urandom(4096),
               "text": b"this is not a model\n"}[kind]
    bad = tmp_path / f"{kind}.model"
    bad.write_bytes(content)
    assert _md(cu_file, "--model", str(bad), "--out", str(tmp_path / "run")) == 2
    one_line_error(capsys, str(bad), "expected")
    assert main(["convert", str(bad), str(tmp_path / "x.model")]) == 2
    one_line_error(capsys, str(bad), "expected")


def test_bad_model_file_traceback_with_debug(tmp_path, cu_file):
    bad = tmp_path / "empty.model"
    bad.write_bytes(b"")
    with pytest.raises(ValueError, match="is empty"):
        main(["--debug", "md", cu_file, "--model", str(bad), "--device", "cpu", "--out", str(tmp_path / "out")])


def test_convert_missing_input_and_missing_output_folder(cu_model, tmp_path, capsys):
    assert main(["convert", str(tmp_path / "nope.model"), str(tmp_path / "out.model")]) == 2
    one_line_error(capsys, "nope.model", "expected")
    assert main(["convert", cu_model, str(tmp_path / "missing" / "out.model")]) == 2
    one_line_error(capsys, "missing", "does not exist")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without a usable CUDA device")
def test_cuda_device_without_cuda(cu_model, cu_file, tmp_path, capsys):
    assert main(["md", cu_file, "--model", cu_model, "--device", "cuda", "--out", str(tmp_path)]) == 2
    one_line_error(capsys, "device 'cuda'", "cpu")


def test_periodic_structure_without_a_cell(cu_model, tmp_path, capsys):
    path = tmp_path / "nocell.extxyz"
    write(str(path), Atoms("Cu2", positions=[[0, 0, 0], [2.5, 0, 0]], cell=np.zeros((3, 3)), pbc=True))
    assert _md(str(path), "--model", cu_model, "--out", str(tmp_path / "run")) == 2
    one_line_error(capsys, "periodic", "cell")


def test_unreadable_structure_file(cu_model, tmp_path, capsys):
    path = tmp_path / "garbage.xyz"
    path.write_bytes(b"\x00\x01garbage")
    assert _md(str(path), "--model", cu_model, "--out", str(tmp_path / "run")) == 2
    one_line_error(capsys, "garbage.xyz", "expected a structure file")


def test_pickle_only_after_the_format_check_and_a_warning(tmp_path, monkeypatch):
    full_loads = []
    real = torch.load

    def spy(*args, **kwargs):
        if kwargs.get("weights_only") is False:
            full_loads.append(args[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(torch, "load", spy)
    monkeypatch.setitem(sys.modules, "mace", types.ModuleType("mace"))  # as if mace-torch were installed
    pickled = tmp_path / "module.model"
    torch.save({"when": datetime.datetime(2020, 1, 1)}, str(pickled))  # needs a full unpickle
    truncated = tmp_path / "truncated.model"
    truncated.write_bytes(pickled.read_bytes()[:-200])
    with pytest.raises(ValueError, match="truncated"):
        model_io.load(str(truncated))
    assert full_loads == []
    with pytest.warns(model_io.CodeExecutionWarning, match="runs code stored in the file"):
        with pytest.raises(ValueError, match="holds a dict"):
            model_io.load(str(pickled))
    assert full_loads == [str(pickled)]
    import warnings
    with warnings.catch_warnings():  # warned once per file and process: a second load is quiet
        warnings.simplefilter("error", model_io.CodeExecutionWarning)
        with pytest.raises(ValueError, match="holds a dict"):
            model_io.load(str(pickled))
    assert full_loads == [str(pickled)] * 2


def test_md_arguments_checked_before_the_run(cu_model, cu_file, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert _md(cu_file, "--model", cu_model, "--out", str(blocker)) == 2
    one_line_error(capsys, "--out", "expected a directory")
    assert _md(cu_file, "--model", cu_model, "--threads", "0", "--out", str(tmp_path / "run")) == 2
    one_line_error(capsys, "--threads")


def test_malformed_setting_is_one_line(monkeypatch, capsys):
    from equikernels import settings

    monkeypatch.setenv("EQUIKERNELS_AUTOTUNE", "banana")
    settings.reload()
    try:
        assert main(["md", "--steps", "1"]) == 2
        one_line_error(capsys, "EQUIKERNELS_AUTOTUNE", "expected 0 or 1", "'banana'")
        with pytest.raises(settings.SettingsError):
            main(["--debug", "md", "--steps", "1"])
        for argv in (["--help"], ["md", "-h"]):  # still answered
            with pytest.raises(SystemExit) as stop:
                main(argv)
            assert stop.value.code == 0, argv
        assert "usage: equikernels md" in capsys.readouterr().out
        assert main(["--version"]) == 0 and capsys.readouterr().out.startswith("equikernels ")
    finally:
        monkeypatch.delenv("EQUIKERNELS_AUTOTUNE")
        settings.reload()


def test_debug_after_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a file nor a built-in"):
        main(["md", str(tmp_path / "missing.xyz"), "--debug"])


def test_md_errors_name_the_flag(cu_model, cu_file, tmp_path, capsys):
    assert _md(cu_file, "--model", cu_model, "--timestep", "-1", "--out", str(tmp_path / "run")) == 2
    line = one_line_error(capsys, "--timestep must be positive")
    assert "timestep_fs" not in line


def _fine_tune(*args):
    return main(["fine-tune", *args, "--no-progress", "--no-plot"])


def test_fine_tune_bad_config_and_flags(cu_model, cu_file, tmp_path, capsys, monkeypatch):
    common = ["--model", cu_model, "--train", cu_file, "--out", str(tmp_path / "ft")]
    bad = tmp_path / "bad.yaml"
    bad.write_text("epochs: [1\n")
    assert _fine_tune("--config", str(bad), *common) == 2
    one_line_error(capsys, "bad.yaml", "not valid YAML")
    assert _fine_tune("--config", str(tmp_path / "none.yaml"), *common) == 2
    one_line_error(capsys, "none.yaml", "no such file")
    assert _fine_tune("--config", str(tmp_path), *common) == 2
    one_line_error(capsys, "is a directory")
    assert _fine_tune("--e0s", "{Cu: -3.5", *common) == 2
    one_line_error(capsys, "--e0s", "YAML mapping")
    for text, needle in (("epochs: one\n", "error: epochs must be an integer"), ("lr: fast\n", "error: lr must be a number"),
                         ("batch_size: 2.5\n", "error: batch_size must be an integer"),
                         ("valid_fraction: 1.5\n", "error: valid_fraction must be in [0, 1)"),
                         ("max_num_epochs: 0\n", "error: max_num_epochs must be >= 1")):
        bad.write_text(text)
        assert _fine_tune("--config", str(bad), *common) == 2
        one_line_error(capsys, needle)
    assert _fine_tune(*common, "--valid", str(tmp_path / "v.xyz")) == 2
    one_line_error(capsys, "--valid: no such file")
    assert _fine_tune(*common, "--replay", str(tmp_path / "r.xyz")) == 2
    one_line_error(capsys, "--replay: no such file")
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert _fine_tune("--model", cu_model, "--train", cu_file, "--out", str(blocker)) == 2
    one_line_error(capsys, "--out: ", "not a directory")
    assert _fine_tune(*common, "--max_num_epochs", "0") == 2
    one_line_error(capsys, "error: --max_num_epochs must be >= 1")
    assert _fine_tune(*common, "--valid-fraction", "1.5") == 2
    one_line_error(capsys, "--valid-fraction must be in [0, 1)")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _fine_tune(*common, "--device", "cuda") == 2
    one_line_error(capsys, "--device: 'cuda' asked", "no CUDA device")


def test_training_options_from_yaml_numbers(cu_model, cu_file):
    from equikernels.training.config import TrainConfig

    # YAML reads 1e-3 (no dot) as a string: a number-like string is taken as the number
    cfg = TrainConfig.from_dict({"lr": "1e-3", "valid_fraction": 0, "train_file": cu_file, "model": cu_model}).validate()
    assert cfg.lr == 1e-3 and cfg.valid_fraction == 0


def test_export_lammps_to_a_directory(cu_model, tmp_path, capsys):
    out = tmp_path / "adir"
    out.mkdir()
    assert main(["export-lammps", cu_model, str(out)]) == 2
    one_line_error(capsys, "is a directory", "model-mliap.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]  # no temporary file left behind


def test_warnings_name_the_library_they_come_from(cu_model, tmp_path, capsys, monkeypatch):
    import warnings

    from equikernels.cli import fine_tune

    shown = []

    def warn_and_stop(args):  # how the command formats warnings while it runs
        shown.append(warnings.formatwarning("foreign\nmore", UserWarning,
                                            "/env/lib/python3.12/site-packages/torch/jit/_script.py", 1))
        shown.append(warnings.formatwarning("ours", UserWarning, fine_tune.__file__, 1))
        shown.append(warnings.formatwarning("stdlib", UserWarning, "/usr/lib/python3.12/ast.py", 1))
        raise ValueError("stop")

    monkeypatch.setattr(fine_tune, "config_from_args", warn_and_stop)
    assert main(["fine-tune", "--model", cu_model]) == 2
    assert shown == ["torch: warning: foreign\n", "equikernels: warning: ours\n", "python: warning: stdlib\n"]


def test_negative_number_in_exponent_form_is_a_value(tmp_path, capsys):
    """``--pressure -1e9``: argparse alone reads ``-1e9`` as an unknown option ("expected one argument")."""
    missing = str(tmp_path / "absent.xyz")
    assert _md(missing, "--ensemble", "npt", "--pressure", "-1e9") == 2
    one_line_error(capsys, "absent.xyz")
    assert _md(missing, "--pressure", "-2.5E-3") == 2
    one_line_error(capsys, "absent.xyz")
