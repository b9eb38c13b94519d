"""Per-atom descriptors of the calculator (mace-torch's ``get_descriptors``): which node-feature
columns they hold, their invariance under rotation, bad arguments; parity with mace-torch's own
calculator is in test_calculator_mace.py."""
import numpy as np
import pytest
import torch
from ase.build import molecule

from equikernels._compat import o3
from equikernels.calculators import MACECalculator
from equikernels.calculators.descriptors import descriptor_columns
from random_models import small_random_model

ELEMENTS = [1, 6, 8, 29]
LAYERS = [o3.Irreps("8x0e+8x1o"), o3.Irreps("8x0e")]  # the small model's two layers


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def calc():
    return MACECalculator(small_random_model(ELEMENTS, seed=3), device="cpu")


def ethanol():
    atoms = molecule("CH3CH2OH")
    atoms.rattle(0.05, seed=5)
    return atoms


def test_columns_of_each_layer():
    assert descriptor_columns(LAYERS, True, -1).tolist() == list(range(8)) + list(range(32, 40))
    assert descriptor_columns(LAYERS, True, 1).tolist() == list(range(8))
    assert descriptor_columns(LAYERS, False, -1).tolist() == list(range(40))
    assert descriptor_columns(LAYERS, False, 1).tolist() == list(range(32))
    # invariant channels wherever they sit; 0o is not invariant under reflections
    mixed = [o3.Irreps("4x1o+4x0e+2x0o+3x0e")]
    assert descriptor_columns(mixed, True, -1).tolist() == [12, 13, 14, 15, 18, 19, 20]


@pytest.mark.parametrize("num_layers", [0, 3, -2, True, 1.0])
def test_bad_num_layers(num_layers):
    with pytest.raises(ValueError, match=r"num_layers: expected -1 \(all\) or 1\.\.2"):
        descriptor_columns(LAYERS, True, num_layers)


def test_shapes_and_layers(calc):
    atoms = ethanol()
    full = calc.get_descriptors(atoms, invariants_only=False)
    assert full.shape == (len(atoms), 40) and full.dtype == np.float64
    np.testing.assert_array_equal(calc.get_descriptors(atoms, invariants_only=False, num_layers=1), full[:, :32])
    np.testing.assert_array_equal(calc.get_descriptors(atoms), full[:, list(range(8)) + list(range(32, 40))])
    assert np.abs(full).max() > 1e-3


def test_invariant_under_rotation_and_reflection(calc):
    atoms = ethanol()
    before, before_full = calc.get_descriptors(atoms), calc.get_descriptors(atoms, invariants_only=False)
    turned = atoms.copy()
    turned.rotate(73.0, (0.3, -0.5, 0.8), center="COM")
    turned.positions[:, 0] *= -1.0
    after, after_full = calc.get_descriptors(turned), calc.get_descriptors(turned, invariants_only=False)
    np.testing.assert_allclose(after, before, rtol=1e-10, atol=1e-12)
    # the vector channels do turn: the test above would see a vector column slipping in
    assert np.abs(after_full[:, 8:32] - before_full[:, 8:32]).max() > 1e-3


def test_calculation_state_is_kept(calc):
    atoms, other = ethanol(), molecule("H2O")
    energy = calc.get_potential_energy(atoms)
    calc.get_descriptors(other)
    assert calc.get_descriptors().shape == (len(atoms), 16)  # default: the last structure calculated
    moved = atoms.copy()
    moved.positions += 0.01
    fresh = MACECalculator(small_random_model(ELEMENTS, seed=3), device="cpu")
    assert calc.get_potential_energy(moved) == pytest.approx(fresh.get_potential_energy(moved), rel=1e-12)
    assert calc.get_potential_energy(atoms) == pytest.approx(energy, rel=1e-12)


def test_no_structure():
    with pytest.raises(ValueError, match="atoms: no structure to describe"):
        MACECalculator(small_random_model(ELEMENTS, seed=3), device="cpu").get_descriptors()


def test_mixed_precision_gives_float32():
    calc = MACECalculator(small_random_model(ELEMENTS, seed=3, dtype=torch.float32), device="cpu",
                          precision="bf16-mixed")
    out = calc.get_descriptors(ethanol())
    assert out.dtype == np.float32 and np.isfinite(out).all()

