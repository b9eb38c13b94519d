"""``export_mliap`` / ``equikernels export-lammps`` on output paths it cannot write and on model paths
that are not models: one-line errors naming the argument, checked before the model is read, and
no file left behind."""
import os
import re

import pytest
import torch

from equikernels.cli import main
from equikernels.default_model import default_model_path
from equikernels.lammps import export_mliap


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs a folder that refuses new files")
def test_unwritable_output_is_named_before_the_model_is_read(tmp_path):
    for out in ("/proc/model-mliap.pt", "/proc/model-mliap.pkl"):
        with pytest.raises(OSError, match="^path: cannot write " + re.escape(repr(out))):
            export_mliap(tmp_path / "missing.model", out)  # the output is checked first


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(torch, "save", fail)
    with pytest.raises(OSError, match=r"cannot write .*out\.pt' \(disk full\)"):
        export_mliap(default_model_path(), tmp_path / "out.pt")
    assert os.listdir(tmp_path) == []


def test_folder_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        export_mliap(default_model_path(), tmp_path / "f" / "out.pt")


@pytest.mark.parametrize("name", ["m.pt", "m.pkl"])
def test_mliap_file_as_model(mliap_files, tmp_path, name, capsys):
    with pytest.raises(ValueError, match=r"^model: .* is an ML-IAP file written by export-lammps, not a model"):
        export_mliap(mliap_files / name, tmp_path / "again.pkl")
    assert main(["export-lammps", str(mliap_files / name), str(tmp_path / "again.pkl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is an ML-IAP file" in err and "Traceback" not in err
    assert not (tmp_path / "again.pkl").exists()


def test_output_over_the_model_is_refused(tmp_path):
    model = tmp_path / "mace.model"
    model.write_bytes(open(default_model_path(), "rb").read())
    before = model.read_bytes()
    with pytest.raises(ValueError, match="is the model file itself"):
        export_mliap(model, str(tmp_path / "." / "mace.model"))
    assert model.read_bytes() == before
