"""A file written by `equikernels export-lammps` given where a model is expected (load, convert, plan)
is refused by name, without unpickling it and without asking for mace-torch."""
import pytest
import torch

from cli_checks import one_line_error
from equikernels.cli import main
from equikernels.models import load
from equikernels.models.io import load_mace_module


@pytest.fixture
def no_unpickling(monkeypatch):
    real = torch.load

    def safe_only(*args, **kwargs):
        assert kwargs.get("weights_only") is not False, "the file was unpickled"
        return real(*args, **kwargs)
    monkeypatch.setattr(torch, "load", safe_only)


@pytest.mark.parametrize("name", ["m.pt", "m.pkl"])
def test_load_names_the_mliap_file(mliap_files, name, no_unpickling):
    for read in (load, load_mace_module):
        with pytest.raises(ValueError, match="ML-IAP file written by equikernels export-lammps"):
            read(mliap_files / name)


@pytest.mark.parametrize("command", [["convert", "{f}", "{out}"], ["plan", "--model", "{f}"]])
def test_commands_name_the_mliap_file(mliap_files, tmp_path, capsys, command, no_unpickling):
    argv = [a.format(f=mliap_files / "m.pt", out=tmp_path / "out.pt") for a in command]
    assert main(argv) == 2
    one_line_error(capsys, "m.pt", "ML-IAP file", "not a model file")
    assert not (tmp_path / "out.pt").exists()
