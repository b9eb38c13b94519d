"""The ML-IAP unified object against the ASE calculator, on emulated LAMMPS data (``emulator.py``):
1, 2 and 4 spatial domains with ghost shells and the KOKKOS coupling's ghost exchange, small cells
whose atoms are their own ghosts, isolated atoms, ranks without atoms, the exchange-free ghost
neighbour list and the error without either; per-pair force sign; export, pickling and the CLI."""
import os
import pickletools

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk

from emulator import decompose
from equikernels.calculators import MACECalculator
from equikernels.default_model import default_model_path
from equikernels.lammps import EquikernelsMLIAP, export_mliap, load_mliap
from equikernels.models.io import load

TOL = 1e-10
GRIDS = {1: (1, 1, 1), 2: (2, 1, 1), 4: (2, 2, 1)}


@pytest.fixture(scope="module")
def model():
    return load(default_model_path(), dtype=torch.float64)


@pytest.fixture(scope="module")
def mliap(model):
    return EquikernelsMLIAP(model)


def crystal():
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 2, 1))
    atoms.symbols[[0, 3, 7, 12]] = "Ni"
    atoms.rattle(0.05, seed=1)
    return atoms


def small_cell():
    """A 3.6 A cell: with r_max = 5 A every atom has its own periodic images as neighbours."""
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.symbols[[0, 2]] = "Ni"
    atoms.rattle(0.05, seed=3)
    return atoms


def with_isolated_atom():
    return Atoms("Cu3Ni", positions=[[1, 1, 1], [3.4, 1.2, 1], [1.5, 3.3, 1.2], [8, 8, 8]], cell=[15, 15, 15],
                 pbc=True)


def sparse_gas(n=8, box=9.0, seed=0):
    rng = np.random.default_rng(seed)
    pos = []
    while len(pos) < n:
        p = rng.uniform(0, box, 3)
        if all(np.linalg.norm((p - q + box / 2) % box - box / 2) > 2.2 for q in pos):
            pos.append(p)
    return Atoms("CuNi" * (n // 2), positions=pos, cell=[box] * 3, pbc=True)


_REFERENCES = {}


def reference(model, atoms):
    key = (id(model), atoms.get_chemical_formula(), atoms.positions.tobytes(), atoms.cell.array.tobytes())
    if key not in _REFERENCES:
        _REFERENCES[key] = _reference(model, atoms)
    return _REFERENCES[key]


def _reference(model, atoms):
    atoms = atoms.copy()
    atoms.calc = MACECalculator(model, device="cpu", default_dtype="float64")
    return (atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress(voigt=False),
            atoms.get_potential_energies())


def check(result, ref, atoms, tol=TOL):
    energy, forces, stress, energies = ref
    assert abs(result.energy - energy) <= tol * max(1.0, abs(energy))
    np.testing.assert_allclose(result.energies, energies, rtol=0, atol=tol)
    np.testing.assert_allclose(result.forces, forces, rtol=0, atol=tol)
    np.testing.assert_allclose(-result.virial / atoms.get_volume(), stress, rtol=0, atol=tol)


@pytest.mark.parametrize("domains", [1, 2, 4])
def test_domains_match_calculator(model, mliap, domains):
    atoms = crystal()
    em = decompose(atoms, mliap.element_types, float(model.r_max), GRIDS[domains])
    assert len(em.ranks) == domains and all(r.ntotal > r.nlocal > 0 for r in em.ranks)
    check(em.run(mliap, separate_objects=False), reference(model, atoms), atoms)
    assert all(r.pair_forces_calls == 1 for r in em.ranks)


@pytest.mark.parametrize("domains", [1, 4])
def test_atoms_are_their_own_ghosts(model, mliap, domains):
    atoms = small_cell()
    em = decompose(atoms, mliap.element_types, float(model.r_max), GRIDS[domains])
    own = em.ranks[0]
    assert own.global_ids[0] in own.global_ids[own.pair_j[own.pair_i == 0]]  # an image of atom 0 is its neighbour
    check(em.run(mliap, separate_objects=False), reference(model, atoms), atoms)


@pytest.mark.parametrize("domains", [1, 4])
def test_isolated_atom(model, mliap, domains):
    atoms = with_isolated_atom()
    em = decompose(atoms, mliap.element_types, float(model.r_max), GRIDS[domains])
    if domains == 4:  # the isolated atom's rank has no pairs at all; two ranks own no atoms
        assert [(r.nlocal, r.npairs) for r in em.ranks][1:] == [(0, 0), (0, 0), (1, 0)]
    result = em.run(mliap, separate_objects=False)
    ref = reference(model, atoms)
    check(result, ref, atoms)
    assert np.all(result.forces[3] == 0) and result.energies[3] == ref[3][3]


def test_rank_without_atoms_takes_part_in_exchanges(model, mliap):
    atoms = Atoms("Cu2Ni", positions=[[0.5, 1, 1], [2.9, 1.1, 1], [1.6, 3.2, 1.1]], cell=[9.6, 4.2, 4.2], pbc=True)
    em = decompose(atoms, mliap.element_types, float(model.r_max), (2, 1, 1))
    assert em.ranks[1].nlocal == 0 and em.ranks[1].ntotal > 0
    check(em.run(mliap, separate_objects=False), reference(model, atoms), atoms)


def test_every_rank_loads_its_own_copy(model, mliap):
    atoms = small_cell()
    em = decompose(atoms, mliap.element_types, float(model.r_max), GRIDS[2])
    check(em.run(mliap, separate_objects=True), reference(model, atoms), atoms)


def test_ghost_neighbour_list_without_exchange(model, mliap):
    """No exchange hooks, ghosts reaching num_layers * r_max with their own neighbours: exact too."""
    atoms = sparse_gas()
    em = decompose(atoms, mliap.element_types, float(model.r_max), GRIDS[2], exchange=False,
                   ghost_cutoff=len(model.interactions) * float(model.r_max), ghost_neighbors=True)
    assert not hasattr(em.ranks[0], "forward_exchange")
    check(em.run(mliap, separate_objects=False), reference(model, atoms), atoms)


def test_missing_exchange_is_an_error(model, mliap):
    atoms = crystal()
    em = decompose(atoms, mliap.element_types, float(model.r_max), GRIDS[2], exchange=False)
    with pytest.raises(RuntimeError, match="2 interaction layers.*forward_exchange.*KOKKOS"):
        em.run(mliap, separate_objects=False)


def tiny_model(layers, hidden="4x0e+4x1o", max_ell=2, correlation=2, pair_repulsion=False, heads=None,
               interaction="RealAgnosticResidualInteractionBlock", first="RealAgnosticInteractionBlock"):
    from equikernels.models.builder import mace_config, random_model

    cfg = mace_config(r_max=4.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=max_ell,
                      interaction=interaction, interaction_first=first, num_interactions=layers,
                      atomic_numbers=[28, 29], hidden_irreps=hidden, MLP_irreps="4x0e",
                      avg_num_neighbors=8.0, correlation=correlation, radial_MLP=[8], pair_repulsion=pair_repulsion,
                      heads=heads)
    return random_model(cfg, seed=1, dtype=torch.float64).eval()


def test_multi_head_model_runs_the_chosen_head():
    model = tiny_model(2, hidden="4x0e", max_ell=1, correlation=1, heads=["pbe", "r2scan"])
    with pytest.raises(ValueError, match="several heads"):
        EquikernelsMLIAP(model)
    obj = EquikernelsMLIAP(model, head="r2scan")
    atoms = small_cell()
    em = decompose(atoms, obj.element_types, float(model.r_max), GRIDS[2])
    result = em.run(obj, separate_objects=False)
    ref = atoms.copy()
    ref.calc = MACECalculator(model, device="cpu", head="r2scan")
    assert abs(result.energy - ref.get_potential_energy()) < TOL
    np.testing.assert_allclose(result.forces, ref.get_forces(), rtol=0, atol=TOL)


def test_random_model_three_layers_and_one_layer():
    """Equivariant (l = 1) hidden features, ZBL, three layers (two exchanges); one layer needs none;
    density-normalised layers."""
    density = "RealAgnosticDensityResidualInteractionBlock"
    for layers, kinds in ((3, {}), (1, {}), (2, {"interaction": density, "first": density})):
        model = tiny_model(layers, pair_repulsion=True, **kinds)
        obj = EquikernelsMLIAP(model)
        atoms = small_cell()
        em = decompose(atoms, obj.element_types, float(model.r_max), GRIDS[2], exchange=layers > 1)
        check(em.run(obj, separate_objects=False), reference(model, atoms), atoms)


def test_pair_forces_are_dE_drij(model, mliap):
    """fij (what LAMMPS adds to f[i] and subtracts from f[j]) is +dE/drij: central differences."""
    atoms = with_isolated_atom()[:3]
    atoms.pbc = False
    em = decompose(atoms, mliap.element_types, float(model.r_max))
    data = em.ranks[0]
    fij = {}
    data.update_pair_forces = lambda f: fij.setdefault("f", np.array(f))
    mliap.compute_forces(data)
    rij0, h = data.rij.copy(), 1e-5
    for p, k in ((0, 0), (1, 2), (3, 1)):
        energies = []
        for sign in (1, -1):
            data.rij = rij0.copy()
            data.rij[p, k] += sign * h
            mliap.compute_forces(data)
            energies.append(data.energy)
        assert abs((energies[0] - energies[1]) / (2 * h) - fij["f"][p, k]) < 1e-7


def test_float32_export(model, tmp_path):
    path = tmp_path / "model32.pt"
    obj = export_mliap(model, path, dtype="float32")
    assert obj.model.atomic_energies.dtype == torch.float32
    atoms = crystal()
    em = decompose(atoms, obj.element_types, float(model.r_max), GRIDS[2])
    check(em.run(load_mliap(path), separate_objects=False), reference(model, atoms), atoms, tol=2e-4)


def test_export_files_hold_no_model_classes(model, tmp_path):
    path = tmp_path / "model.pkl"
    export_mliap(default_model_path(), path)
    with open(path, "rb") as f:
        globals_ = {a for op, a, _ in pickletools.genops(f) if op.name in ("GLOBAL", "STACK_GLOBAL") and a}
        f.seek(0)
        names = [a for op, a, _ in pickletools.genops(f) if op.name in ("SHORT_BINUNICODE", "BINUNICODE")]
    assert "equikernels.lammps.mliap" in names and "EquikernelsMLIAP" in names
    assert not any(str(n).startswith("equikernels.models") for n in names) and not globals_ & {"MACE"}
    obj = load_mliap(path)
    assert obj.element_types == ["Al", "Ni", "Cu", "Pd", "Ag", "Pt", "Au"]
    assert obj.rcutfac == pytest.approx(0.5 * float(model.r_max)) and obj.ndescriptors == 1 and obj.nparams == 1
    assert obj.interface is None


def test_export_lammps_cli(model, tmp_path, capsys):
    from equikernels.cli import main

    out = tmp_path / "out.pt"
    assert main(["export-lammps", default_model_path(), str(out), "--dtype", "float64"]) == 0
    assert "pair_style mliap unified" in capsys.readouterr().out
    obj = load_mliap(out)
    atoms = small_cell()
    em = decompose(atoms, obj.element_types, float(model.r_max), GRIDS[2])
    check(em.run(obj, separate_objects=False), reference(model, atoms), atoms)
    assert main(["export-lammps", default_model_path(), str(out), "--head", "nope", "--overwrite"]) == 2
    assert "head" in capsys.readouterr().err
    assert main(["export-lammps", str(tmp_path / "missing.model"), str(out)]) == 2


def test_triton_interpreter_one_domain(monkeypatch):
    """The generated kernels (Triton's interpreter on CPU; a tiny model keeps it fast) against the
    calculator on the reference backend."""
    if torch.cuda.is_available():
        pytest.skip("covered by the GPU test")
    model = tiny_model(layers=2, hidden="4x0e", max_ell=1, correlation=1)
    mliap = EquikernelsMLIAP(model)
    atoms = Atoms("CuNi", positions=[[1, 1, 1], [3.4, 1.2, 1]], cell=[4.6, 12, 12], pbc=True)
    ref = reference(model, atoms)
    monkeypatch.setenv("EQUIKERNELS_BACKEND", "triton")
    em = decompose(atoms, mliap.element_types, float(model.r_max))
    assert em.ranks[0].ntotal > em.ranks[0].nlocal  # its own images are ghosts
    check(em.run(mliap, separate_objects=False), ref, atoms)


def test_bad_model_argument():
    with pytest.raises(TypeError, match="model: expected an equikernels MACE"):
        EquikernelsMLIAP(torch.nn.Linear(2, 2))
    with pytest.raises(FileNotFoundError, match="path"):
        load_mliap(os.path.join(os.path.dirname(__file__), "missing.pt"))


@pytest.mark.gpu
def test_gpu_two_domains_run_triton_kernels(model):
    """CUDA tensors as the KOKKOS coupling hands them. Two domains as two processes (one GPU):
    matches the calculator in fp64. One domain in this process, profiled: compute_forces launches
    the generated kernels the calculator launches."""
    obj = EquikernelsMLIAP(model)
    atoms = crystal()
    ref = reference(model, atoms)
    em = decompose(atoms, obj.element_types, float(model.r_max), GRIDS[2], device="cuda")
    assert em.ranks[0].rij.is_cuda and em.ranks[0].elems.is_cuda
    check(em.run(obj, processes=True), ref, atoms)

    em = decompose(atoms, obj.element_types, float(model.r_max), GRIDS[1], device="cuda")
    em.run(obj, separate_objects=False)  # warm-up: compiles the kernels outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        result = em.run(obj, separate_objects=False)
    assert obj.model.atomic_energies.is_cuda
    check(result, ref, atoms)
    probe = atoms.copy()
    probe.calc = MACECalculator(model, device="cuda", default_dtype="float64", cuda_graph=False)
    probe.get_forces()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as calc_prof:
        probe.calc.reset()
        probe.get_forces()

    def generated(p):  # generated kernels have plain identifiers; library kernels are C++ names or GEMMs
        return {e.name for e in p.events() if e.name.isidentifier() and "gemm" not in e.name.lower()
                and not e.name.startswith(("sm", "ampere", "cutlass", "volta", "turing", "Memcpy", "Memset"))}

    ours, calc = generated(prof), generated(calc_prof)
    assert ours & calc, (sorted(ours), sorted(calc))


class _DLPackArray:
    """An array known only through the DLPack protocol (as cupy arrays from Kokkos views are)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_dlpack_arrays_are_used_in_place(model, mliap):
    atoms = small_cell()
    em = decompose(atoms, mliap.element_types, float(model.r_max), GRIDS[2])
    eatoms = [r.eatoms for r in em.ranks]
    for r in em.ranks:
        for name in ("elems", "pair_i", "pair_j", "rij", "eatoms"):
            setattr(r, name, _DLPackArray(getattr(r, name)))
    check(em.run(mliap, separate_objects=False), reference(model, atoms), atoms)
    for r, buf in zip(em.ranks, eatoms):  # written through the DLPack view into the coupling's buffer
        assert r.eatoms.array is buf and np.all(buf != 0)


@pytest.mark.mace
def test_export_mace_torch_file(tmp_path):
    pytest.importorskip("mace")
    from random_models import small_random_model

    mace_model = small_random_model([28, 29], seed=4, backend="mace-torch")
    path = tmp_path / "mace.model"
    torch.save(mace_model, path)
    obj = export_mliap(path, tmp_path / "mace-mliap.pkl")
    assert obj.element_types == ["Ni", "Cu"]
    atoms = small_cell()
    em = decompose(atoms, obj.element_types, 2 * obj.rcutfac, GRIDS[2])
    check(em.run(load_mliap(tmp_path / "mace-mliap.pkl"), separate_objects=False), _reference(mace_model, atoms),
          atoms)
