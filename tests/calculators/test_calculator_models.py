"""MACECalculator with equikernels' own models (random weights, built without mace-torch): forces,
stress and the Hessian against finite differences, per-atom energies, batching and a short NVE run. These
run in CI's main stage, where mace-torch is absent."""
import copy

import numpy as np
import pytest
import torch
from ase import units
from ase.build import bulk, fcc111, molecule
from ase.md.verlet import VelocityVerlet
from ase.stress import voigt_6_to_full_3x3_stress

from equikernels.calculators import MACECalculator
from equikernels.calculators.md import initialise_velocities
from random_models import small_random_model

ELEMENTS = [1, 6, 8, 29]


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def model():
    return small_random_model(ELEMENTS, seed=3, backend="equikernels")


def energy_at(calc, atoms, positions=None, cell=None):
    displaced = atoms.copy()
    if cell is not None:
        displaced.set_cell(cell, scale_atoms=True)
    if positions is not None:
        displaced.positions = positions
    return calc.get_potential_energy(displaced)


def crystal():
    atoms = bulk("Cu", "fcc", a=3.61).repeat((2, 2, 1))
    atoms.set_cell(atoms.cell.array @ np.array([[1.0, 0.03, 0.0], [0.0, 1.0, 0.05], [0.0, 0.0, 1.02]]),
                   scale_atoms=True)
    atoms.rattle(0.1, seed=7)
    return atoms


def slab():
    atoms = fcc111("Cu", (2, 2, 2), vacuum=4.0)
    atoms.pbc = [True, True, False]
    atoms.rattle(0.1, seed=8)
    return atoms


def test_node_energy_leaves_out_the_isolated_atom_energies(model):
    """mace-torch's ``node_energy``: per-atom energies without E0. Shifting a model's E0s moves
    ``energies`` (and the total) by the shift and leaves ``node_energy`` where it was."""
    atoms = molecule("CH3OH")
    shifted = copy.deepcopy(model)
    e0_shift = torch.tensor([-1.0, -2.0, -3.0, -4.0], dtype=shifted.atomic_energies.dtype)  # H, C, O, Cu
    shifted.atomic_energies.add_(e0_shift)
    runs = []
    for m in (model, shifted):
        calc = MACECalculator(m, device="cpu")
        runs.append({"single": calc.get_property("node_energy", atoms).copy(),
                     "energies": calc.get_property("energies", atoms).copy(),
                     "batched": calc.batch_evaluate([atoms])[0]["node_energy"]})
    per_atom = e0_shift.numpy()[[ELEMENTS.index(z) for z in atoms.numbers]]
    np.testing.assert_allclose(runs[1]["energies"] - runs[0]["energies"], per_atom, rtol=0, atol=1e-12)
    np.testing.assert_allclose(runs[1]["single"], runs[0]["single"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(runs[0]["batched"], runs[0]["single"], rtol=1e-12, atol=1e-12)
    assert np.abs(runs[0]["energies"] - runs[0]["single"]).min() > 0  # the model's E0s are not zero
    # the same calculator on other elements in the same number of atoms: its cached E0s follow them
    other = atoms.copy()
    other.numbers = other.numbers[::-1]
    np.testing.assert_allclose(calc.get_property("node_energy", other), calc.batch_evaluate([other])[0]["node_energy"],
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make", [crystal, slab, lambda: molecule("CH3OH")], ids=["crystal", "slab", "molecule"])
def test_forces_and_energies(model, make):
    atoms = make()
    atoms.rattle(0.05, seed=9)
    calc = MACECalculator(model, device="cpu")
    calc.calculate(atoms, ["energy", "forces", "energies"])
    forces, results = calc.results["forces"], dict(calc.results)
    assert results["energies"].sum() == pytest.approx(results["energy"], rel=1e-12)
    assert results["free_energy"] == results["energy"]
    rng, h = np.random.default_rng(1), 2e-5
    for v in rng.normal(size=(3, len(atoms), 3)):
        v /= np.linalg.norm(v)
        slope = (energy_at(calc, atoms, atoms.positions + h * v) - energy_at(calc, atoms, atoms.positions - h * v)) / (2 * h)
        assert -np.sum(forces * v) == pytest.approx(slope, rel=1e-6, abs=1e-8)


def test_stress(model):
    atoms = crystal()
    calc = MACECalculator(model, device="cpu")
    stress = voigt_6_to_full_3x3_stress(calc.get_stress(atoms))
    h, volume = 1e-5, atoms.get_volume()
    for i, j in ((0, 0), (1, 2), (0, 1)):
        energies = []
        for sign in (1, -1):
            eps = np.eye(3)
            eps[i, j] += sign * h / 2
            eps[j, i] += sign * h / 2
            energies.append(energy_at(calc, atoms, cell=atoms.cell.array @ eps))
        assert stress[i, j] == pytest.approx((energies[0] - energies[1]) / (2 * h) / volume, rel=1e-5, abs=1e-9)


def test_batch_evaluate(model):
    from equikernels.models.radial import RadialMLP
    calc = MACECalculator(model, device="cpu")
    structures = [crystal(), molecule("CH3OH"), slab()]
    rows = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: rows.append(args[0].shape[0]))
             for m in calc.model.modules() if isinstance(m, RadialMLP)]
    batched = calc.batch_evaluate(structures, properties=("energy", "forces"))
    for h in hooks:
        h.remove()
    assert set(rows) == {sum(calc.graph(a)["edge_index"].shape[1] for a in structures) // 2}  # once per pair
    for atoms, res in zip(structures, batched):
        calc.calculate(atoms, ["energy", "forces"])
        assert res["energy"] == pytest.approx(calc.results["energy"], rel=1e-12)
        np.testing.assert_allclose(res["forces"], calc.results["forces"], rtol=1e-10, atol=1e-12)


def test_short_nve(model):
    """200 steps (the 1,000-step bound is tested with a faster mace-torch model in test_md_mace.py)."""
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.calc = MACECalculator(model, device="cpu", default_dtype="float64")
    initialise_velocities(atoms, 300.0, seed=0)
    dyn = VelocityVerlet(atoms, timestep=2.0 * units.fs)
    energies = []
    dyn.attach(lambda: energies.append(atoms.get_total_energy()), interval=1)
    dyn.run(200)
    assert np.abs(np.array(energies) - energies[0]).max() / len(atoms) < 5e-5


def test_float32(model):
    atoms = crystal()
    ref = MACECalculator(model, device="cpu", default_dtype="float64").get_forces(atoms)
    forces = MACECalculator(copy.deepcopy(model), device="cpu", default_dtype="float32").get_forces(atoms)
    assert forces.dtype == np.float64  # ASE gets float64 whatever the model's precision
    np.testing.assert_allclose(forces, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    assert torch.get_default_dtype() == torch.float32  # the calculator leaves the global default alone


def test_cell_relaxation_takes_stress_from_the_same_evaluation(model):
    """An optimiser on a cell filter asks for forces and stress at every step: one model call each."""
    from ase.filters import FrechetCellFilter
    from ase.optimize import FIRE

    atoms = crystal()
    calc = MACECalculator(copy.deepcopy(model), device="cpu")
    calls = []
    forward = calc.model.forward
    calc.model.forward = lambda *a, **k: calls.append(k.get("compute_stress")) or forward(*a, **k)
    atoms.calc = calc
    opt = FIRE(FrechetCellFilter(atoms), logfile=None)
    opt.run(fmax=1e-6, steps=5)
    assert len(calls) <= opt.nsteps + 2 and all(calls[1:])


def test_slab_forces_bring_stress_once_it_was_asked_for(model):
    """A slab (periodic in x and y, a 3-D cell): once stress was asked for, a forces evaluation gives it
    too, as for a crystal (an optimiser asking for both pays one model call), with the same value."""
    atoms = slab()
    atoms.calc = MACECalculator(copy.deepcopy(model), device="cpu")
    atoms.get_stress()
    atoms.positions[0, 0] += 0.05
    atoms.get_forces()
    assert "stress" in atoms.calc.results
    fresh = atoms.copy()
    fresh.calc = MACECalculator(copy.deepcopy(model), device="cpu")
    np.testing.assert_allclose(atoms.calc.results["stress"], fresh.get_stress(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("graphs", [False, True])
def test_paired_edges_by_default(model, graphs):
    """The calculator gives an equikernels MACE paired edges (the radial MLPs see one row per pair),
    eagerly and in the padded fixed-shape mode, with the results of a full neighbour list."""
    from equikernels.calculators.neighbors import SkinNeighborList
    from equikernels.models.radial import RadialMLP
    atoms = crystal()
    calc = MACECalculator(model, device="cpu")
    full = MACECalculator(model, device="cpu")
    full.neighbors = SkinNeighborList(full.r_max, full.neighbors.skin, paired=False)
    assert calc.neighbors.paired
    if graphs:
        calc._enable_graphs(capture=False)
        full._enable_graphs(capture=False)
    rows = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: rows.append(args[0].shape[0]))
             for m in calc.model.modules() if isinstance(m, RadialMLP)]
    calc.calculate(atoms, ["energy", "forces", "stress"])
    seen = set(rows)
    for h in hooks:
        h.remove()
    full.calculate(atoms, ["energy", "forces", "stress"])
    edges = calc.graph(atoms)["edge_index"].shape[1]
    if graphs:  # the first ``capacity`` pairs (within the cutoff, plus headroom)
        assert seen == {calc._graphed._capacity} and edges // 2 <= calc._graphed._capacity < edges
    else:
        assert seen == {edges // 2}
    for k in ("energy", "forces", "stress"):
        np.testing.assert_allclose(calc.results[k], full.results[k], rtol=1e-10, atol=1e-10)


def test_hessian_is_the_derivative_of_minus_forces(model):
    """[3N, N, 3], row k = d(-F_k)/dx, against central differences of the forces; symmetric."""
    calc = MACECalculator(copy.deepcopy(model), device="cpu")
    atoms = molecule("CH3CH2OH")
    atoms.rattle(0.05, seed=5)
    n = len(atoms)
    hessian = calc.get_hessian(atoms)
    assert hessian.shape == (3 * n, n, 3)
    h, step = hessian.reshape(3 * n, 3 * n), 1e-5
    for k in (0, 4, 3 * n - 1):
        displaced = []
        for sign in (1, -1):
            moved = atoms.copy()
            moved.positions.reshape(-1)[k] += sign * step
            displaced.append(calc.get_forces(moved).reshape(-1))
        column = -(displaced[0] - displaced[1]) / (2 * step)
        np.testing.assert_allclose(h[:, k], column, rtol=1e-5, atol=1e-7 * np.abs(h).max())
    np.testing.assert_allclose(h, h.T, atol=1e-9 * np.abs(h).max())
    assert np.abs(h).max() > 1e-2


def test_hessian_without_structure(model):
    with pytest.raises(ValueError, match="atoms: no structure for the Hessian"):
        MACECalculator(copy.deepcopy(model), device="cpu").get_hessian()


def test_committee_of_two_models():
    """Several models make a committee, as mace-torch's calculator has them: mean results, each
    model's energy, forces and stress (3x3) and their population variance."""
    from ase.stress import voigt_6_to_full_3x3_stress

    model_a = small_random_model(ELEMENTS, seed=3, backend="equikernels")
    other = small_random_model(ELEMENTS, seed=5, backend="equikernels")
    atoms = crystal()
    atoms.numbers[:2] = [8, 1]
    alone = []
    for m in (model_a, other):
        c = MACECalculator(m, device="cpu")
        c.calculate(atoms, ["energy", "forces", "stress"])
        alone.append(dict(c.results))
    committee = MACECalculator(models=[model_a, other], device="cpu")
    committee.calculate(atoms, ["energy", "forces", "stress"])
    r = committee.results
    energies = np.array([a["energy"] for a in alone])
    assert r["energy"] == pytest.approx(energies.mean(), rel=1e-12) and r["free_energy"] == r["energy"]
    np.testing.assert_allclose(r["energy_comm"], energies, rtol=1e-12)
    assert r["energy_var"] == pytest.approx(((energies - energies.mean()) ** 2).mean(), rel=1e-9)
    forces = np.stack([a["forces"] for a in alone])
    np.testing.assert_allclose(r["forces"], forces.mean(0), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(r["forces_var"], forces.var(0), rtol=1e-9, atol=1e-16)
    stress = np.stack([voigt_6_to_full_3x3_stress(a["stress"]) for a in alone])
    np.testing.assert_allclose(r["stress_comm"], stress, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(r["stress"], alone[0]["stress"] / 2 + alone[1]["stress"] / 2, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(r["node_energy"], np.mean([a["energies"] for a in alone], 0) - alone[0]["energies"]
                               + alone[0]["node_energy"], rtol=1e-12, atol=1e-12)  # the first model's E0
    assert r["energy_var"] > 0 and committee.get_property("energy_var", atoms) == r["energy_var"]
    batched = committee.batch_evaluate([atoms], ("energy", "forces", "stress"))[0]
    for key in ("energy", "energy_var", "forces", "forces_comm", "stress_var", "node_energy"):
        np.testing.assert_allclose(batched[key], r[key], rtol=1e-10, atol=1e-12)
    hessians = committee.get_hessian(atoms)
    assert len(hessians) == 2 and not np.allclose(hessians[0], hessians[1])
    same = MACECalculator(models=[model_a, model_a], device="cpu")
    same.calculate(atoms, ["energy", "forces"])
    assert same.results["energy_var"] == 0 and not same.results["forces_var"].any()
