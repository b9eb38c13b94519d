"""The calculator's extras as a mace-torch user calls them: descriptors with a layer count of any
integer type, non-finite Hessians, descriptors and per-atom results named, what a committee's members
compute for ``*_comm`` / ``*_var``, mace-torch's model-file patterns (``model_paths="mace_*.model"``)
and both file-name arguments refused together, and two calculators on one model object (another
dtype is followed, another precision refused)."""
import copy

import numpy as np
import pytest
import torch
from ase.build import bulk, molecule

from equikernels.calculators import MACECalculator
from equikernels.calculators.checks import NonFiniteError, check_finite
from equikernels.calculators.committee import member_properties
from equikernels.calculators.mace_args import model_files
from random_models import small_random_model

ELEMENTS = [1, 6, 8, 29]
SINGLE = ["energy", "free_energy", "energies", "node_energy", "forces", "stress"]


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def model():
    return small_random_model(ELEMENTS, seed=3)


def water():
    atoms = molecule("H2O")
    atoms.rattle(0.05, seed=2)
    return atoms


@pytest.mark.parametrize("kind", ["numpy", "tensor", "model attribute"])
def test_descriptor_layers_of_any_integer_type(model, kind):
    """mace-torch's calculator takes NumPy and torch integers (e.g. the model's ``num_interactions``)."""
    calc = MACECalculator(model, device="cpu")
    atoms = water()
    value = {"numpy": np.int64(1), "tensor": torch.tensor(1), "model attribute": calc.model.num_interactions}[kind]
    want = calc.get_descriptors(atoms, num_layers=int(value))
    np.testing.assert_array_equal(calc.get_descriptors(atoms, num_layers=value), want)
    for bad in (torch.tensor(True), torch.tensor(1.0), torch.tensor([1, 2]), np.float64(1.0)):
        with pytest.raises(ValueError, match=r"num_layers: expected -1 \(all\) or 1\.\.2"):
            calc.get_descriptors(atoms, num_layers=bad)


@pytest.mark.parametrize("key", ["hessian", "descriptors", "virials", "stresses"])
def test_non_finite_hessian_and_per_atom_results_are_named(key):
    atoms = water()
    atoms.positions[2] = atoms.positions[0]
    value = np.ones((len(atoms), 3, 3))
    value[1, 0, 0] = np.nan
    with pytest.raises(NonFiniteError, match=rf"non-finite {key} \(NaN or infinite\); atoms coincide: 0 and 2"):
        check_finite({"energy": -1.0, "forces": np.zeros((len(atoms), 3)), key: value}, atoms)
    check_finite({key: np.ones(3)}, atoms)


def test_committee_members_compute_what_its_spreads_need():
    """``get_property("stress_var")`` and the like need the members' stress, as mace-torch's
    committee always has it."""
    assert member_properties(["stress_var"], SINGLE) == ["stress"]
    assert member_properties(["stress_comm", "forces_var", "stress"], SINGLE) == ["stress", "forces"]
    assert member_properties(["energy_var"], SINGLE) == ["energy"]
    assert member_properties(["dipole_var", "magmom"], SINGLE) == ["energy"]
    assert member_properties(["virials"], SINGLE + ["virials"]) == ["virials"]


def test_model_file_patterns(model, tmp_path):
    from equikernels.models import save

    for name in ("mace_b.model", "mace_a.model"):
        save(model, tmp_path / name)
    pattern = str(tmp_path / "mace_*.model")
    assert model_files(pattern) == [str(tmp_path / "mace_a.model"), str(tmp_path / "mace_b.model")]
    assert model_files(None, pattern) == model_files(pattern)
    assert model_files("medium") == "medium" and model_files(["x.model"]) == ["x.model"]
    with pytest.raises(FileNotFoundError, match=r"model_paths: no model file matches the pattern '.*nope_\*'"):
        model_files(str(tmp_path / "nope_*"))
    with pytest.raises(ValueError, match="model_path and model_paths: give one of them"):
        model_files("a.model", "b.model")
    # mace-torch's older argument name, as its scripts pass it: a committee of the files matched
    calc = MACECalculator(model_path=pattern, device="cpu")
    assert calc.num_models == 2
    atoms = water()
    atoms.calc = calc
    assert calc.get_property("energy_var", atoms) == pytest.approx(0.0, abs=1e-20)


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
