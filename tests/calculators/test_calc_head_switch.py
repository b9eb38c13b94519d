"""A calculator's ``head`` set after it is made switches the head of the next calculation (mace-torch's
calculator reads its head at every call): energy, forces, stress and node energies (the head's E0s)."""
import copy

import numpy as np
import pytest

from equikernels.calculators import MACECalculator
from mace_models import _crystal, _model

PROPS = ("energy", "forces", "stress", "node_energy")


def _results(calc, atoms):
    atoms = atoms.copy()
    atoms.calc = calc
    return {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces(), "stress": atoms.get_stress(),
            "node_energy": calc.results["node_energy"]}


@pytest.fixture(scope="module")
def model():
    model = _model(heads=["pbe", "r2scan"])
    model.atomic_energies[1] += 0.25  # the heads' E0s differ, so node_energy tells them apart
    return model


@pytest.mark.parametrize("committee", [False, True])
def test_setting_head_switches_the_next_calculation(model, committee, single_thread):
    atoms = _crystal()
    models = [model, copy.deepcopy(model)] if committee else model
    want = {h: _results(MACECalculator(model, device="cpu", head=h), atoms) for h in ("pbe", "r2scan")}
    assert abs(want["pbe"]["energy"] - want["r2scan"]["energy"]) > 1e-3
    calc = MACECalculator(models=models, device="cpu", head="pbe")
    for head in ("pbe", "r2scan", "pbe", "R2SCAN"):
        atoms.calc = calc
        atoms.get_potential_energy()  # results of the head before: the switch must not return them
        calc.head = head
        assert calc.head == head.lower()
        got = _results(calc, atoms)
        for key in PROPS:
            np.testing.assert_allclose(got[key], want[head.lower()][key], rtol=1e-12, atol=1e-12, err_msg=key)


def test_a_head_the_model_lacks_is_refused(model):
    calc = MACECalculator(model, device="cpu", head="pbe")
    with pytest.raises(ValueError, match=r"^head 'hse' is not one of the model's heads \['pbe', 'r2scan'\]$"):
        calc.head = "hse"
    assert calc.head == "pbe"
