"""A calculation that fails leaves no results of the structure calculated before it: ASE's cache
would otherwise hand those to the failed structure (its check_state finds it unchanged)."""
import numpy as np
import pytest
from ase.build import bulk

from equikernels.calculators import MACECalculator


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def _bad(kind):
    atoms = bulk("Cu", "fcc", a=3.6)
    if kind == "unknown-element":
        atoms.numbers[0] = 8
    else:
        atoms.positions[0] = np.nan
    return atoms


@pytest.mark.parametrize("committee", [False, True], ids=["one-model", "committee"])
@pytest.mark.parametrize("kind", ["unknown-element", "nan-position"])
def test_a_failed_calculate_leaves_no_results_of_the_previous_structure(cu_model, kind, committee):
    calc = MACECalculator(model_paths=[cu_model] * 2 if committee else cu_model, device="cpu")
    calc.calculate(bulk("Cu", "fcc", a=3.6, cubic=True), ["energy", "forces"])
    assert "energy" in calc.results
    bad = _bad(kind)
    with pytest.raises(ValueError):
        calc.calculate(bad, ["energy", "forces"])
    assert calc.results == {}
    bad.calc = calc
    with pytest.raises(ValueError):  # again the error, not the earlier structure's energy
        bad.get_potential_energy()


def test_results_of_the_same_structure_stay_after_a_refused_property(cu_model):
    atoms = bulk("Cu", "fcc", a=3.6)
    atoms.pbc, atoms.cell = False, None
    atoms.calc = MACECalculator(cu_model, device="cpu")
    energy = atoms.get_potential_energy()
    with pytest.raises(ValueError, match="stress"):
        atoms.get_stress()
    assert atoms.calc.results["energy"] == energy
