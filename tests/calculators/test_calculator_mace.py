"""MACECalculator with real mace-torch models (random weights): forces and stress against finite
differences, identical results to mace-torch's own calculator, batched evaluation, precisions."""
import copy

import numpy as np
import pytest
import torch
from ase.build import bulk, fcc111, molecule
from ase.stress import voigt_6_to_full_3x3_stress

from random_models import small_random_mace_model

pytestmark = pytest.mark.mace

ELEMENTS = [1, 6, 8, 29]


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("mace")
    return small_random_mace_model(ELEMENTS, seed=1)


def calc(model, **kwargs):
    from equikernels.calculators import MACECalculator
    return MACECalculator(copy.deepcopy(model), device="cpu", **kwargs)


def crystal():
    atoms = bulk("Cu", "fcc", a=3.61).repeat((2, 2, 2))  # triclinic primitive cells
    atoms.set_cell(atoms.cell.array @ np.array([[1.0, 0.04, 0.0], [0.0, 0.98, 0.06], [0.0, 0.0, 1.03]]),
                   scale_atoms=True)
    atoms.rattle(0.1, seed=2)
    return atoms


def mixed():
    """CuOH on a Cu slab, periodic in x and y only."""
    atoms = fcc111("Cu", (2, 2, 2), vacuum=5.0)
    atoms.pbc = [True, True, False]
    top = atoms.positions[:, 2].max()
    atoms += molecule("H2O", positions=[[1.2, 1.0, top + 2.0], [1.9, 1.0, top + 2.6], [0.5, 1.0, top + 2.6]])
    atoms.rattle(0.05, seed=4)
    return atoms


def ethanol():
    atoms = molecule("CH3CH2OH")
    atoms.rattle(0.05, seed=5)
    return atoms


STRUCTURES = {"crystal": crystal, "mixed-pbc": mixed, "molecule": ethanol}


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    """Tiny systems: one intra-op thread is fastest on a shared CPU."""
    yield


def calculators(model, backend, dtype):
    """(ours, mace-torch's) calculators of ``model``: ours running the mace-torch model itself
    (``backend="mace-torch"``) or its conversion to equikernels.models ("equikernels")."""
    from mace.calculators import MACECalculator as MaceTorchCalculator

    if backend == "equikernels":
        from equikernels.models import from_mace
        from equikernels.calculators import MACECalculator
        ours = MACECalculator(from_mace(copy.deepcopy(model)), device="cpu", default_dtype=dtype)
    else:
        ours = calc(model, default_dtype=dtype)
    return ours, MaceTorchCalculator(models=copy.deepcopy(model), device="cpu", default_dtype=dtype)


def energy_at(calculator, atoms, positions=None, cell=None):
    displaced = atoms.copy()
    if cell is not None:
        displaced.set_cell(cell, scale_atoms=True)
    if positions is not None:
        displaced.positions = positions
    return calculator.get_potential_energy(displaced)


@pytest.mark.parametrize("name", ["crystal", "mixed-pbc", "molecule"])
def test_forces_are_minus_energy_gradient(model, name):
    """-dE/dt along random directions (all atoms move at once), and single components of two atoms."""
    atoms = STRUCTURES[name]()
    c = calc(model)
    forces = c.get_forces(atoms)
    assert np.abs(forces).max() > 1e-3, "forces should not vanish on a rattled structure"
    rng, h = np.random.default_rng(0), 2e-5  # truncation error ~h^2 (the ZBL term is stiff), roundoff ~1e-16 E / h
    directions = [v / np.linalg.norm(v) for v in rng.normal(size=(3, len(atoms), 3))]
    for atom in (0, len(atoms) - 1):
        for k in range(3):
            unit = np.zeros((len(atoms), 3))
            unit[atom, k] = 1.0
            directions.append(unit)
    for v in directions:
        slope = (energy_at(c, atoms, atoms.positions + h * v) - energy_at(c, atoms, atoms.positions - h * v)) / (2 * h)
        assert -np.sum(forces * v) == pytest.approx(slope, rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("name", ["crystal", "mixed-pbc"])
def test_stress_is_strain_derivative(model, name):
    """stress_ij = (1/V) dE/d(eps_ij) for the cell and positions deformed by (I + eps)."""
    atoms = STRUCTURES[name]()
    c = calc(model)
    stress = voigt_6_to_full_3x3_stress(c.get_stress(atoms))
    h, volume = 1e-5, atoms.get_volume()
    for i, j in ((0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1)):
        energies = []
        for sign in (1, -1):
            eps = np.eye(3)
            eps[i, j] += sign * h / 2
            eps[j, i] += sign * h / 2
            energies.append(energy_at(c, atoms, cell=atoms.cell.array @ eps))
        assert stress[i, j] == pytest.approx((energies[0] - energies[1]) / (2 * h) / volume, rel=1e-5, abs=1e-9)
    assert np.abs(stress).max() > 1e-4


@pytest.mark.parametrize("name", ["crystal", "mixed-pbc", "molecule"])
@pytest.mark.parametrize("dtype,rtol", [("float64", 1e-10), ("float32", 1e-5)])
@pytest.mark.parametrize("backend", ["mace-torch", "equikernels"])
def test_identical_to_mace_calculator(model, name, dtype, rtol, backend):
    """Our calculator running the mace-torch model itself, or it converted to equikernels.models,
    against mace-torch's calculator running the mace-torch model."""
    atoms = STRUCTURES[name]()
    periodic = atoms.pbc.all()
    props = ["energy", "forces", "energies"] + (["stress"] if periodic else [])
    ours, theirs = calculators(model, backend, dtype)
    # two steps: the second reuses our cached neighbour list and device state
    for step in range(2):
        atoms.positions += 0.02 * step
        ours.calculate(atoms, props)
        theirs.calculate(atoms, props)
        scale = np.abs(theirs.results["forces"]).max()
        assert ours.results["energy"] == pytest.approx(theirs.results["energy"], rel=rtol)
        assert ours.results["free_energy"] == pytest.approx(theirs.results["free_energy"], rel=rtol)
        np.testing.assert_allclose(ours.results["forces"], theirs.results["forces"], rtol=rtol, atol=rtol * scale)
        np.testing.assert_allclose(ours.results["energies"], theirs.results["energies"], rtol=rtol,
                                   atol=rtol * np.abs(theirs.results["energies"]).max())
        np.testing.assert_allclose(ours.results["node_energy"], theirs.results["node_energy"], rtol=rtol,
                                   atol=rtol * np.abs(theirs.results["energies"]).max())
        if periodic:
            np.testing.assert_allclose(ours.results["stress"], theirs.results["stress"], rtol=rtol,
                                       atol=rtol * np.abs(theirs.results["stress"]).max())
    assert ours.results["energies"].sum() == pytest.approx(ours.results["energy"], rel=1e-12 if dtype == "float64" else 1e-5)


def test_a_mace_torch_module_given_runs_accelerated_in_place(model):
    """A mace-torch module passed as it is (``model=``, ``models=``) runs on the kernels, keeping its
    own tensors, as ``equikernels.accelerate`` leaves it; a file's model is converted on loading."""
    from equikernels.calculators import MACECalculator

    module = copy.deepcopy(model)
    weights = {k: v.data_ptr() for k, v in module.state_dict().items()}
    for given in (dict(model=module), dict(models=[module])):
        ours = MACECalculator(**given, device="cpu", default_dtype="float64")
        assert ours.model is module and getattr(type(module), "_ek_adapter", None) is not None
        assert {k: v.data_ptr() for k, v in module.state_dict().items()} == weights


def test_mixed_pbc_virial_matches_mace(model):
    """mace-torch divides the virial by the volume of a cell it enlarges along non-periodic
    directions; we use the structure's own cell (ASE's convention). The virials agree."""
    from mace.calculators import MACECalculator as MaceTorchCalculator
    from mace.data.neighborhood import get_neighborhood

    atoms = mixed()
    ours = calc(model)
    theirs = MaceTorchCalculator(models=copy.deepcopy(model), device="cpu", default_dtype="float64")
    ours.calculate(atoms, ["stress"])
    theirs.calculate(atoms, ["stress"])
    cell = get_neighborhood(atoms.positions, ours.r_max, tuple(bool(p) for p in atoms.pbc), atoms.cell.array.copy())[3]
    np.testing.assert_allclose(ours.results["stress"] * atoms.get_volume(),
                               theirs.results["stress"] * abs(np.linalg.det(cell)), rtol=1e-9, atol=1e-12)


def test_batch_evaluate_equals_single(model):
    c = calc(model)
    structures = [crystal(), ethanol(), mixed(), bulk("Cu", "fcc", a=3.61, cubic=True)]
    batched = c.batch_evaluate(structures)
    chunked = c.batch_evaluate(structures, max_atoms_per_batch=20)
    assert len(batched) == len(chunked) == len(structures)
    for atoms, res, res_chunked in zip(structures, batched, chunked):
        c.calculate(atoms, ["energy", "forces"])
        for key in ("energy", "free_energy", "forces", "energies", "node_energy"):
            np.testing.assert_allclose(res[key], c.results[key], rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(res_chunked[key], c.results[key], rtol=1e-10, atol=1e-12)
    periodic = [s for s in structures if s.pbc.all()]
    for atoms, res in zip(periodic, c.batch_evaluate(periodic, properties=("energy", "forces", "stress"))):
        c.calculate(atoms, ["stress"])
        np.testing.assert_allclose(res["stress"], c.results["stress"], rtol=1e-10, atol=1e-12)


def test_stress_only_when_requested(model):
    c = calc(model)
    atoms = crystal()
    c.calculate(atoms, ["forces"])
    assert "stress" not in c.results
    c.calculate(atoms, ["stress"])
    assert c.results["stress"].shape == (6,)


def test_new_numbers_and_sizes_reset_state(model):
    """One calculator used for different structures in turn (as optimisers and screening do)."""
    c = calc(model)
    reference = calc(model)
    for atoms in (crystal(), ethanol(), crystal().repeat((1, 1, 2)), ethanol()):
        reference.neighbors.reset()
        reference._numbers = None
        assert c.get_potential_energy(atoms) == pytest.approx(reference.get_potential_energy(atoms), rel=1e-12)


def test_model_file_and_dtype(model, tmp_path):
    """A mace-torch model file loads (through equikernels.models.load or torch.load), and the
    model's dtype is kept when default_dtype is None."""
    path = tmp_path / "small.model"
    torch.save(copy.deepcopy(model).float(), path)
    from equikernels.calculators import MACECalculator
    c = MACECalculator(str(path), device="cpu")
    assert c.dtype == torch.float32
    ref = calc(model, default_dtype="float32")
    atoms = ethanol()
    assert c.get_potential_energy(atoms) == pytest.approx(ref.get_potential_energy(atoms), rel=1e-6)


@pytest.mark.parametrize("backend", ["mace-torch", "equikernels"])
def test_descriptors_identical_to_mace_calculator(model, backend):
    """``get_descriptors`` of our calculator (the mace-torch model itself, or converted) against
    mace-torch's, invariant channels or every feature, of all layers or the first."""
    ours, theirs = calculators(model, backend, "float64")
    atoms = crystal()
    for invariants_only in (True, False):
        for num_layers in (-1, 1):
            want = theirs.get_descriptors(atoms, invariants_only=invariants_only, num_layers=num_layers)
            got = ours.get_descriptors(atoms, invariants_only=invariants_only, num_layers=num_layers)
            assert got.shape == want.shape and np.abs(want).max() > 1e-3
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("backend", ["mace-torch", "equikernels"])
def test_hessian_identical_to_mace_calculator(model, backend):
    ours, theirs = calculators(model, backend, "float64")
    atoms = ethanol()
    want, got = theirs.get_hessian(atoms), ours.get_hessian(atoms)
    assert got.shape == want.shape == (3 * len(atoms), len(atoms), 3)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-10 * np.abs(want).max())


@pytest.mark.parametrize("backend", ["mace-torch", "equikernels"])
def test_committee_identical_to_mace_calculator(model, backend):
    """Two models: every result mace-torch's calculator gives a committee (means, ``*_comm``,
    ``*_var``, ``node_energy`` against the first model's E0s)."""
    from mace.calculators import MACECalculator as MaceTorchCalculator

    from equikernels.calculators import MACECalculator

    other = small_random_mace_model(ELEMENTS, seed=2)
    theirs = MaceTorchCalculator(models=[copy.deepcopy(model), copy.deepcopy(other)], device="cpu",
                                 default_dtype="float64")
    mine = [copy.deepcopy(m) for m in (model, other)]
    if backend == "equikernels":
        from equikernels.models import from_mace
        mine = [from_mace(m) for m in mine]
    ours = MACECalculator(models=mine, device="cpu", default_dtype="float64")
    atoms = crystal()
    ours.calculate(atoms, ["energy", "forces", "stress"])
    theirs.calculate(atoms, ["energy", "forces", "stress"])
    keys = ("energy", "free_energy", "energies", "node_energy", "forces", "stress", "energy_comm", "energy_var",
            "forces_comm", "forces_var", "stress_comm", "stress_var")
    assert set(keys) <= set(theirs.results)
    for key in keys:
        want = np.asarray(theirs.results[key], dtype=np.float64)
        np.testing.assert_allclose(ours.results[key], want, rtol=1e-9, atol=1e-9 * max(np.abs(want).max(), 1e-3),
                                   err_msg=key)




@pytest.mark.parametrize("backend", ["mace-torch", "equikernels"])
def test_atomic_stresses_identical_to_mace_calculator(model, backend):
    """``compute_atomic_stresses=True``, one model and two: per-atom virials equal mace-torch's
    calculator's for a crystal, a slab and a molecule; per-atom stresses (``stresses``, Voigt) equal
    on the crystal and sum to its stress (ASE's ``get_stresses``). mace-torch divides by the volume
    of a cell it enlarges along non-periodic directions, we by the structure's own (as for the
    stress): on the slab the two agree as virials; a molecule has no per-atom stresses."""
    from mace.calculators import MACECalculator as MaceTorchCalculator
    from mace.data.neighborhood import get_neighborhood

    from equikernels.calculators import MACECalculator

    other = small_random_mace_model(ELEMENTS, seed=2)
    for members in ([model], [model, other]):
        mine = [copy.deepcopy(m) for m in members]
        if backend == "equikernels":
            from equikernels.models import from_mace
            mine = [from_mace(m) for m in mine]
        ours = MACECalculator(models=mine, device="cpu", default_dtype="float64", compute_atomic_stresses=True)
        theirs = MaceTorchCalculator(models=[copy.deepcopy(m) for m in members], device="cpu",
                                     default_dtype="float64", compute_atomic_stresses=True)
        assert {"stresses", "virials"} <= set(ours.implemented_properties)
        for name, make in STRUCTURES.items():
            atoms = make()
            ours.calculate(atoms, ["energy", "forces"])
            theirs.calculate(atoms, ["energy", "forces"])
            want = theirs.results["virials"]
            assert ours.results["virials"].shape == want.shape == (len(atoms), 3, 3)
            assert np.abs(want).max() > 1e-4
            np.testing.assert_allclose(ours.results["virials"], want, rtol=1e-9, atol=1e-10 * np.abs(want).max(),
                                       err_msg=f"{name} virials")
            if name == "molecule":
                assert "stresses" not in ours.results
                with pytest.raises(ValueError, match="per-atom stress .* cell without volume"):
                    ours.calculate(atoms, ["stresses"])
                continue
            cell = get_neighborhood(atoms.positions, ours.r_max, tuple(bool(p) for p in atoms.pbc),
                                    atoms.cell.array.copy())[3]
            ratio = abs(np.linalg.det(cell)) / atoms.get_volume()  # 1 for the crystal
            want = theirs.results["stresses"] * ratio
            assert ours.results["stresses"].shape == want.shape == (len(atoms), 6)
            np.testing.assert_allclose(ours.results["stresses"], want, rtol=1e-9, atol=1e-10 * np.abs(want).max(),
                                       err_msg=f"{name} stresses")
            atoms.calc = ours
            np.testing.assert_allclose(atoms.get_stresses().sum(0), atoms.get_stress(), rtol=1e-9,
                                       atol=1e-9 * np.abs(atoms.get_stress()).max())
        # many structures in one call: the same per-atom results, none for the molecule
        structures = [make() for make in STRUCTURES.values()]
        for atoms, res in zip(structures, ours.batch_evaluate(structures, ["energy", "forces", "virials"])):
            ours.calculate(atoms, ["energy", "forces"])
            assert ("stresses" in res) == ("stresses" in ours.results)
            for key in ("stresses", "virials"):
                if key in res:
                    np.testing.assert_allclose(res[key], ours.results[key], rtol=1e-9,
                                               atol=1e-12 * np.abs(ours.results[key]).max())
