"""Structures at the edges of the neighbour list give mace-torch's calculator's numbers (float64, a
mace-torch model file loaded by both): one atom, atoms without neighbours, tiny and very skewed
cells with many periodic images, atoms outside the cell, a periodic wire; then one calculator
through a strained, wrapped trajectory with its skin, against a fresh mace-torch evaluation."""
import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk

from random_models import small_random_mace_model

pytestmark = pytest.mark.mace


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    pytest.importorskip("mace")
    path = tmp_path_factory.mktemp("edge") / "tiny.model"
    torch.save(small_random_mace_model([1, 8, 29], seed=1), str(path))
    return str(path)


STRUCTURES = {
    "one-atom-primitive": lambda: bulk("Cu", "fcc", a=3.61),
    "one-atom-molecule": lambda: Atoms("Cu"),
    "no-neighbours": lambda: Atoms("CuO", positions=[[0, 0, 0], [8.0, 0, 0]], cell=[20, 20, 20], pbc=True),
    "skewed-tiny": lambda: Atoms("CuO", scaled_positions=[[0.1, 0.2, 0.3], [0.6, -0.3, 1.4]],
                                 cell=[[2.2, 0, 0], [2.1, 0.7, 0], [2.0, 0.6, 0.8]], pbc=True),
    "outside-the-cell": lambda: Atoms("CuH", positions=[[-3.0, 7.0, -1.0], [12.3, -4.5, 2.2]],
                                      cell=[[3.0, 0, 0], [2.0, 2.5, 0], [-1.0, 0.7, 2.8]], pbc=True),
    "left-handed": lambda: Atoms("CuO", scaled_positions=[[0.1, 0.2, 0.3], [0.6, 0.3, 0.4]],
                                 cell=[[3.0, 0, 0], [0, 2.6, 0], [0.4, 0.2, -2.8]], pbc=True),
    "wire": lambda: Atoms("CuO", positions=[[0, 0, 0], [1.0, 0.5, 1.1]], cell=[0, 0, 2.2], pbc=[False, False, True]),
}


def both(model_file):
    from mace.calculators import MACECalculator as MaceTorchCalculator

    from equikernels.calculators import MACECalculator
    return (MACECalculator(model_paths=model_file, device="cpu", default_dtype="float64"),
            MaceTorchCalculator(model_paths=model_file, device="cpu", default_dtype="float64"))


def assert_same(ours, theirs, atoms):
    props = ["energy", "forces"] + (["stress"] if atoms.pbc.all() else [])
    ours.calculate(atoms, props)
    theirs.calculate(atoms, props)
    for name in props:
        want = np.asarray(theirs.results[name])
        np.testing.assert_allclose(ours.results[name], want, rtol=1e-10, atol=1e-10 * max(1.0, np.abs(want).max()),
                                   err_msg=name)


@pytest.mark.parametrize("name", sorted(STRUCTURES))
def test_edge_structures_match_mace_torch(model_file, name):
    ours, theirs = both(model_file)
    assert_same(ours, theirs, STRUCTURES[name]())


def test_one_calculator_through_strain_wrapping_and_new_structures(model_file):
    ours, theirs = both(model_file)
    rng = np.random.default_rng(0)
    atoms = bulk("Cu", "fcc", a=3.61).repeat((2, 2, 1))
    atoms.numbers[1] = 8
    for step in range(12):
        atoms.set_cell(atoms.cell.array @ (np.eye(3) + rng.normal(0, 0.003, (3, 3))), scale_atoms=True)
        atoms.positions += rng.normal(0, 0.01, atoms.positions.shape) - 0.04
        if step % 4 == 3:  # atoms cross the cell's faces
            atoms.wrap()
        assert_same(ours, theirs, atoms)
    assert ours.neighbors.num_builds < 12  # the skin was reused on the way
    for name in ("skewed-tiny", "wire", "one-atom-primitive"):  # other structures on the same calculator
        assert_same(ours, theirs, STRUCTURES[name]())
    assert_same(ours, theirs, atoms)
