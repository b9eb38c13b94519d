"""The calculator's wiring of mace-torch's habits: ``model_paths`` patterns, both file-name arguments
refused together, committee spreads of stress, non-finite Hessians and descriptors named, and two
calculators on one model object (another dtype is followed, another precision refused)."""
import copy

import numpy as np
import pytest
from ase.build import bulk, molecule

from equikernels.calculators import MACECalculator
from equikernels.calculators.checks import NonFiniteError
from random_models import small_random_model

ELEMENTS = [1, 6, 8, 29]


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def model():
    return small_random_model(ELEMENTS, seed=3)


def test_model_paths_pattern_makes_a_committee(model, tmp_path):
    from equikernels.models import save

    for name in ("m_a.model", "m_b.model"):
        save(model, tmp_path / name)
    calc = MACECalculator(model_paths=str(tmp_path / "m_*.model"), device="cpu")
    assert calc.num_models == 2
    with pytest.raises(ValueError, match="model_path and model_paths: give one of them"):
        MACECalculator(model_paths=str(tmp_path / "m_a.model"), model_path=str(tmp_path / "m_b.model"), device="cpu")


def test_committee_stress_spread(model):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.rattle(0.05, seed=1)
    other = copy.deepcopy(model)
    for p in other.parameters():
        p.data.mul_(1.1)
    atoms.calc = MACECalculator(models=[copy.deepcopy(model), other], device="cpu", default_dtype="float64")
    assert atoms.calc.get_property("stress_var", atoms).shape == (3, 3)
    comm = atoms.calc.get_property("stress_comm", atoms)
    assert comm.shape == (2, 3, 3) and not np.allclose(comm[0], comm[1])


@pytest.mark.parametrize("what", ["hessian", "descriptors"])
def test_non_finite_hessian_and_descriptors_are_refused(model, what):
    calc = MACECalculator(copy.deepcopy(model), device="cpu", default_dtype="float64")
    atoms = molecule("H2O")
    atoms.positions[2] = atoms.positions[0]
    with pytest.raises(NonFiniteError, match=rf"non-finite {what}"):
        calc.get_hessian(atoms) if what == "hessian" else calc.get_descriptors(atoms)


def test_two_calculators_on_one_model(model):
    shared = copy.deepcopy(model)
    atoms = molecule("H2O")
    atoms.rattle(0.05, seed=2)
    first = MACECalculator(shared, device="cpu", default_dtype="float32")
    e32 = first.get_potential_energy(atoms.copy())
    second = MACECalculator(shared, device="cpu", default_dtype="float64")
    moved = atoms.copy()
    moved.positions[0, 0] += 0.01  # a new structure: both calculators evaluate it
    e64 = second.get_potential_energy(moved.copy())
    with pytest.warns(RuntimeWarning, match="dtype was changed to torch.float64"):
        again = first.get_potential_energy(moved.copy())
    assert again == e64 and abs(e32 - e64) < 1e-2 * abs(e64)
    MACECalculator(shared, device="cpu", precision="bf16-mixed")
    with pytest.raises(RuntimeError, match="precision was changed"):
        second.get_potential_energy(atoms.copy())
