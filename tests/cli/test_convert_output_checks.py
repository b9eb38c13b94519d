"""`equikernels convert` and its OUT: an existing file or model directory is kept unless --overwrite
(IN itself included), an empty name, a parent that is a file, a directory for --to mace and a path that
cannot be written end in one line naming OUT; a whole pickled equikernels model converts."""
import os

import pytest
import torch

from cli_checks import one_line_error
from equikernels.cli import main
from equikernels.models import load, save


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    from random_models import small_random_model

    path = tmp_path_factory.mktemp("model") / "cu.pt"
    save(small_random_model([29], seed=4), str(path))
    return str(path)


def test_existing_out_file_is_kept_without_overwrite(model_file, tmp_path, capsys):
    out = tmp_path / "notes.txt"
    out.write_text("mine")
    assert main(["convert", model_file, str(out)]) == 2
    one_line_error(capsys, "notes.txt", "already exists", "--overwrite")
    assert out.read_text() == "mine"
    assert main(["convert", model_file, str(out), "--overwrite"]) == 0
    assert load(str(out)).atomic_numbers.tolist() == [29]


def test_out_directory_holding_a_model_is_kept_without_overwrite(model_file, tmp_path, capsys):
    out = tmp_path / "converted"
    out.mkdir()
    assert main(["convert", model_file, str(out)]) == 0
    capsys.readouterr()
    assert main(["convert", model_file, str(out)]) == 2
    one_line_error(capsys, "converted", "config.json and weights.pt", "--overwrite")
    assert main(["convert", model_file, str(out), "--overwrite"]) == 0


def test_out_is_in(model_file, tmp_path, capsys):
    path = tmp_path / "m.pt"
    path.write_bytes(open(model_file, "rb").read())
    assert main(["convert", str(path), str(path)]) == 2
    one_line_error(capsys, "m.pt", "is IN itself")


@pytest.mark.parametrize("case", ["empty", "parent-is-a-file", "directory-for-mace", "unwritable"])
def test_unusable_out(model_file, tmp_path, capsys, case):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = {"empty": "", "parent-is-a-file": str(blocker / "m.pt"), "directory-for-mace": str(tmp_path),
           "unwritable": str(tmp_path / "m.pt")}[case]
    extra = ["--to", "mace"] if case == "directory-for-mace" else []
    if case == "unwritable":
        (tmp_path / f"m.pt.tmp{os.getpid()}").mkdir()  # the temporary file cannot be created
    assert main(["convert", model_file, out, *extra]) == 2
    needle = {"empty": "OUT ''", "parent-is-a-file": "is a file, not a folder", "directory-for-mace": "is a directory",
              "unwritable": "cannot write the model there"}[case]
    one_line_error(capsys, needle)


def test_a_whole_pickled_model_converts(model_file, tmp_path, capsys):
    whole = tmp_path / "whole.pt"
    torch.save(load(model_file), whole)
    with pytest.warns(UserWarning, match="runs code"):
        assert main(["convert", str(whole), str(tmp_path / "out.pt")]) == 0
    assert "converted" in capsys.readouterr().out
    assert load(str(tmp_path / "out.pt")).atomic_numbers.tolist() == [29]
