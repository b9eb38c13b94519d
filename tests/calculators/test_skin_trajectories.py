"""The calculator's cached neighbour list and per-structure state give, at every step of what users
run (cell relaxation, NPT, wrapped atoms, one calculator shared by several structures, descriptors
or a Hessian between steps), the numbers of the model evaluated on a full neighbour list built from
scratch. No mace-torch."""
import numpy as np
import pytest
import torch
from ase.build import bulk, fcc111
from ase.filters import FrechetCellFilter
from ase.neighborlist import neighbor_list
from ase.optimize import FIRE
from ase.stress import full_3x3_to_voigt_6_stress

from equikernels.calculators import MACECalculator
from equikernels.calculators.graph import ElementTable
from random_models import small_random_model

TOL = 1e-9


@pytest.fixture(scope="module")
def model():
    return small_random_model([28, 29], seed=3)


def reference(model, atoms):
    """Energy, forces (and stress for a 3-D cell) of ``model`` on ASE's full neighbour list."""
    i, j, unit_shifts = neighbor_list("ijS", atoms, float(model.r_max))
    cell = torch.tensor(atoms.cell.array)
    unit_shifts = torch.tensor(unit_shifts, dtype=torch.float64)
    n = len(atoms)
    data = {"positions": torch.tensor(atoms.positions), "cell": cell, "unit_shifts": unit_shifts,
            "node_attrs": ElementTable(model.atomic_numbers, "cpu").one_hot(atoms.numbers, torch.float64),
            "edge_index": torch.tensor(np.stack((i, j)), dtype=torch.int64), "shifts": unit_shifts @ cell,
            "batch": torch.zeros(n, dtype=torch.int64), "ptr": torch.tensor([0, n]), "head": torch.tensor([0])}
    stress = bool(atoms.pbc.all())
    out = model(data, compute_force=True, compute_stress=stress, training=False)
    res = {"energy": float(out["energy"].detach().sum()), "forces": out["forces"].detach().numpy()}
    if stress:
        res["stress"] = full_3x3_to_voigt_6_stress(out["stress"][0].detach().numpy())
    return res


def assert_matches(calc, atoms, what):
    ref = reference(calc.model, atoms)
    props = ["energy", "forces"] + (["stress"] if "stress" in ref else [])
    calc.get_property("forces", atoms)
    for p in props:
        np.testing.assert_allclose(calc.get_property(p, atoms), ref[p], rtol=0, atol=TOL, err_msg=f"{what}: {p}")


def crystal(seed=0, rep=2):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(rep)
    atoms.numbers[::3] = 28
    atoms.rattle(0.05, seed=seed)
    return atoms


def calculator(model, skin=0.5, padded=False):
    calc = MACECalculator(model, device="cpu", default_dtype="float64", skin=skin)
    if padded:  # the fixed-shape evaluation CUDA graphs replay, run eagerly: the candidate list unfiltered
        calc._enable_graphs(capture=False)
    return calc


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("between", ["descriptors", "hessian"])
def test_other_structure_between_steps(model, between, padded):
    """Descriptors or a Hessian of a moved copy rebuild the list; the next step of that copy uses
    its own pairs, not those cached for the structure before."""
    calc = calculator(model, padded=padded)
    atoms = crystal()
    assert_matches(calc, atoms, "first structure")
    moved = atoms.copy()
    moved.positions[0] += [1.1, -0.8, 0.6]  # past half the skin
    if between == "descriptors":
        calc.get_descriptors(moved)
    else:
        calc.get_hessian(moved[:6])  # a smaller structure first: a fresh list, then the moved copy's
        calc.get_descriptors(moved)
    moved.positions[3] += 0.05  # a new step of the moved copy, within the skin
    assert_matches(calc, moved, f"after {between}")
    assert_matches(calc, atoms, "the first structure again")


@pytest.mark.parametrize("skin", [0.5, 0.0])
def test_cell_relaxation_with_shear(model, skin):
    atoms = crystal(seed=1)
    atoms.set_cell(atoms.cell.array @ np.array([[1.04, 0.03, 0.0], [0.0, 0.97, 0.02], [0.01, 0.0, 1.03]]),
                   scale_atoms=True)
    calc = calculator(model, skin=skin)
    atoms.calc = calc
    opt = FIRE(FrechetCellFilter(atoms), logfile=None)
    opt.attach(lambda: assert_matches(calc, atoms, f"step {opt.nsteps}"))
    opt.run(fmax=1e-6, steps=6)
    assert abs(atoms.cell.array - crystal(seed=1).cell.array).max() > 0.05  # the cell did change


@pytest.mark.parametrize("padded", [False, True])
def test_shared_calculator_strained_wrapped_and_slab(model, padded):
    """One calculator alternating between structures of other cells and pbc, each walking, its cell
    strained (shear included) and its atoms wrapped back into the cell now and then."""
    calc = calculator(model, padded=padded)
    slab = fcc111("Cu", (2, 2, 3), vacuum=3.0)
    slab.pbc = [True, True, False]
    structures = [crystal(seed=2), crystal(seed=3), slab]
    structures[1].positions += 1.9  # many atoms outside the cell
    rng = np.random.default_rng(0)
    for step in range(4):
        for atoms in structures:
            atoms.positions += rng.normal(scale=0.06, size=atoms.positions.shape)
            if atoms.pbc.all():
                atoms.set_cell(atoms.cell.array @ (np.eye(3) + rng.normal(scale=0.01, size=(3, 3))), scale_atoms=True)
            if step % 2:
                atoms.wrap()
            assert_matches(calc, atoms, f"step {step}, {atoms.get_chemical_formula()} pbc={atoms.pbc.tolist()}")
