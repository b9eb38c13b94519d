"""`equikernels tune`: problem names written with spaces after the commas are taken; a --structure
holding elements the model lacks is named before a GPU is looked for; without --structure a model
without copper tunes on the default crystal's graph with its own elements."""
import pytest
import torch
from ase.io import write

from cli_checks import one_line_error
from equikernels.cli import main
from equikernels.cli import tune as tune_cli
from equikernels.models import save


class _Reached(Exception):
    pass


@pytest.fixture
def stop_at_the_device(monkeypatch):
    """The command stops where it would look for the GPU; the tuning file is not checked."""
    import importlib

    cache = importlib.import_module("equikernels.tune.cache")  # the module: the package's cache() shadows it

    def reached(value):
        raise _Reached(value)
    monkeypatch.setattr(tune_cli, "_device", reached)
    monkeypatch.setattr(cache, "check_persistent", lambda path: None)


@pytest.fixture(scope="module")
def hco_model(tmp_path_factory):
    from random_models import small_random_model

    path = tmp_path_factory.mktemp("model") / "hco.pt"
    save(small_random_model([1, 6, 8], seed=2), str(path))
    return str(path)


def test_problem_names_with_spaces(stop_at_the_device):
    with pytest.raises(_Reached):
        main(["tune", "--problems", "mace-mp-medium-L2, nequip-water", "--debug"])


def test_commas_only(capsys):
    assert main(["tune", "--problems", ","]) == 2
    one_line_error(capsys, "--problems ','", "no problem name")


def test_structure_with_other_elements(hco_model, tmp_path, capsys, stop_at_the_device):
    import ase.build

    write(tmp_path / "cu.xyz", ase.build.bulk("Cu", "fcc", a=3.6, cubic=True))
    assert main(["tune", "--model", hco_model, "--structure", str(tmp_path / "cu.xyz")]) == 2
    one_line_error(capsys, "--structure", "[29]", "[1, 6, 8]")


def test_default_crystal_takes_the_models_elements(hco_model):
    from equikernels.models import load

    model = load(hco_model)
    structures = tune_cli._fit_elements(tune_cli._structures(None, 32), None, model.atomic_numbers.tolist())
    assert sorted(set(structures[0].numbers.tolist())) == [1, 6, 8]
    tune_cli._model_step(model, structures[0], torch.float64, torch.device("cpu"))  # a training step runs
