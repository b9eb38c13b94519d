"""The calculator's extras as a mace-torch user calls them: descriptors with a layer count of any
integer type, non-finite Hessians and per-atom results named, what a committee's members compute
for ``*_comm`` / ``*_var``, and mace-torch's model-file patterns (``model_paths="mace_*.model"``)."""
import numpy as np
import pytest
import torch
from ase.build import molecule

from equikernels.calculators import MACECalculator
from equikernels.calculators.checks import NonFiniteError, check_finite
from equikernels.calculators.committee import member_properties
from equikernels.calculators.mace_args import model_files
from random_models import small_random_model

ELEMENTS = [1, 6, 8]
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
