"""`equikernels export-lammps`: an unusable OUT is named before the model is read (converting a large
mace-torch model takes a while), in one line."""
import pytest

from equikernels.cli import main
from equikernels.default_model import default_model_path
from equikernels.models import io as model_io
from cli_checks import one_line_error


@pytest.mark.parametrize("out, needles", [
    ("", ["empty", "model-mliap.pt"]),
    ("no-such-folder/model-mliap.pt", ["no-such-folder", "does not exist"]),
    (".", ["is a directory"]),
])
def test_bad_output_is_named_before_the_model_is_read(out, needles, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def not_read(*args, **kwargs):
        raise AssertionError("the model was read before the output was checked")
    monkeypatch.setattr(model_io, "load", not_read)
    assert main(["export-lammps", default_model_path(), out]) == 2
    one_line_error(capsys, *needles)
    assert list(tmp_path.iterdir()) == []
