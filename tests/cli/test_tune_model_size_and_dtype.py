"""`equikernels tune --model`: the default crystal holds the --atoms asked for (or the fewest above it),
so its tunings land in that size's bucket, and the model is tuned in its own dtype unless --dtype says
otherwise (equikernels md and eval run it in that dtype: tunings of another go unused)."""
import importlib

import pytest
import torch

from equikernels.cli import main
from equikernels.cli import tune as tune_cli
from equikernels.default_model import default_model_path
from equikernels.tune import bucket


@pytest.mark.parametrize("atoms", [1008, 10192, 2100, 500, 37])
def test_the_default_crystal_holds_the_atoms_asked_for(atoms):
    """1,008 atoms gave 864 and 2,100 gave 2,048, a smaller bucket than the system's."""
    n = len(tune_cli._structures(None, atoms)[0])
    assert n >= atoms and bucket(n) == bucket(atoms)
    if atoms in (1008, 10192):  # the crystals of equikernels bench
        assert n == atoms


@pytest.fixture
def tuned(monkeypatch):
    """Runs ``equikernels tune`` up to the GPU work; returns the (atoms, dtype) of each model step."""
    cache = importlib.import_module("equikernels.tune.cache")  # the module: the package's cache() shadows it
    monkeypatch.setattr(cache, "check_persistent", lambda path: None)
    monkeypatch.setattr(tune_cli, "_device", lambda value: "cpu")
    steps = []
    monkeypatch.setattr(tune_cli, "_model_step", lambda model, at, dtype, device: steps.append((len(at), dtype)))
    monkeypatch.setattr(tune_cli, "_problem_step",
                        lambda name, rows, dtype, layout, device: steps.append((name, dtype)))

    class _Stop(Exception):
        pass

    def stop():
        raise _Stop

    monkeypatch.setattr(tune_cli.torch.cuda, "synchronize", stop)

    def run(*argv):
        steps.clear()
        with pytest.raises(_Stop):
            main(["tune", *argv, "--debug"])
        return list(steps)
    return run


def test_the_model_is_tuned_in_its_own_dtype_unless_asked(tuned):
    model = default_model_path()  # a float64 model
    assert tuned("--model", model) == [(1008, torch.float64)]
    assert tuned("--model", model, "--dtype", "float32") == [(1008, torch.float32)]
    assert tuned("--model", model, "--problems", "nequip-water") == [("nequip-water", torch.float32),
                                                                      (1008, torch.float64)]
    assert tuned("--model", model, "--atoms", "2100") == [(2112, torch.float64)]
