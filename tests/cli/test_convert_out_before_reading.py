"""`equikernels convert`: an OUT that cannot be written (a folder name that does not exist, a place
that takes no new file) and `--to mace` without mace-torch are named in one line before the model is
read; a missing IN says how foundation-model names are found."""
import importlib.util
import os

import pytest

from cli_checks import one_line_error
from equikernels.cli import main
from equikernels.default_model import default_model_path
from equikernels.models import io as model_io

HAS_MACE = importlib.util.find_spec("mace") is not None


@pytest.fixture
def not_read(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the model was read before OUT was checked")
    monkeypatch.setattr(model_io, "load", fail)


@pytest.mark.parametrize("to", [[], ["--to", "mace"]])
def test_missing_folder_with_a_trailing_slash(tmp_path, capsys, monkeypatch, not_read, to):
    monkeypatch.chdir(tmp_path)
    assert main(["convert", default_model_path(), "newdir/", *to]) == 2
    one_line_error(capsys, "OUT 'newdir/'", "no such directory")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs a folder that refuses new files")
@pytest.mark.parametrize("to", [[], ["--to", "mace"]])
def test_a_place_that_takes_no_file(capsys, not_read, to):
    assert main(["convert", default_model_path(), "/proc/m.model", *to]) == 2
    one_line_error(capsys, "OUT '/proc/m.model'", "cannot write the model there")


@pytest.mark.skipif(HAS_MACE, reason="needs an environment without mace-torch")
def test_to_mace_without_mace_torch(tmp_path, capsys, not_read):
    assert main(["convert", default_model_path(), str(tmp_path / "m.model"), "--to", "mace"]) == 2
    one_line_error(capsys, "--to mace", "pip install mace-torch")


def test_missing_in_names_the_foundation_models(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "medium-typo"), str(tmp_path / "m.pt")]) == 2
    one_line_error(capsys, "medium-typo", "no such file", "foundation-model name")


@pytest.mark.mace
def test_to_mace_write_failure_is_one_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("mace")
    import torch

    from equikernels.training import model_factory

    def full_disk(obj, path, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:1] . unexpected pos 64 vs 0")
    monkeypatch.setattr(model_factory.torch, "save", full_disk)
    out = tmp_path / "m.model"
    assert main(["convert", default_model_path(), str(out), "--to", "mace"]) == 2
    one_line_error(capsys, f"OUT {str(out)!r}: cannot write the model there", "unexpected pos")
    assert list(tmp_path.iterdir()) == []
