"""The calculator on CUDA: vesin's neighbour list on the GPU against ASE's, results against the same
calculator on CPU, and a short MD run (marked gpu: skipped without CUDA)."""
import copy

import numpy as np
import pytest
import torch
from ase.build import bulk, fcc111, molecule
from ase.neighborlist import neighbor_list

from equikernels.calculators import MACECalculator
from equikernels.calculators.neighbors import SkinNeighborList, pbc_tensor
from random_models import small_random_model

pytestmark = pytest.mark.gpu

ELEMENTS = [1, 6, 8, 29]


def structures():
    slab = fcc111("Cu", (3, 3, 3), vacuum=5.0)
    slab.pbc = [True, True, False]
    crystal = bulk("Cu", "fcc", a=3.61).repeat((3, 3, 3))
    for atoms in (slab, crystal):
        atoms.rattle(0.05, seed=0)
    return {"slab": slab, "crystal": crystal, "molecule": molecule("CH3CH2OH")}


@pytest.mark.parametrize("name", ["slab", "crystal", "molecule"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_neighbour_list_on_gpu(name, dtype):
    atoms = structures()[name]
    nl = SkinNeighborList(4.5, skin=0.5)
    rng = np.random.default_rng(0)
    for _ in range(20):
        atoms.positions += rng.normal(scale=0.05, size=atoms.positions.shape)
        edges = nl.update(torch.tensor(atoms.positions, dtype=dtype, device="cuda"),
                          torch.tensor(atoms.cell.array, dtype=dtype, device="cuda"), pbc_tensor(atoms.pbc, "cuda"))
        assert edges.sender.is_cuda and edges.shifts.is_cuda
        got = np.concatenate([edges.sender.cpu().numpy()[:, None], edges.receiver.cpu().numpy()[:, None],
                              np.rint(edges.unit_shifts.cpu().numpy()).astype(int)], 1)
        i, j, S = neighbor_list("ijS", atoms, 4.5)
        assert set(map(tuple, got.tolist())) == set(map(tuple, np.concatenate([i[:, None], j[:, None], S], 1).tolist()))
    assert nl.num_builds < 20


@pytest.fixture(scope="module", params=["equikernels", "mace-torch"])
def model(request):
    if request.param == "mace-torch":
        pytest.importorskip("mace")
    return small_random_model(ELEMENTS, seed=2, backend=request.param)


@pytest.mark.parametrize("name", ["slab", "crystal", "molecule"])
def test_cuda_matches_cpu(model, name):
    atoms = structures()[name]
    props = ["energy", "forces", "energies"] + (["stress"] if atoms.pbc.all() else [])
    cpu = MACECalculator(copy.deepcopy(model), device="cpu", default_dtype="float64")
    gpu = MACECalculator(copy.deepcopy(model), device="cuda", default_dtype="float64")
    assert gpu.device.type == "cuda"
    cpu.calculate(atoms, props)
    gpu.calculate(atoms, props)
    for key in props:
        ref = np.asarray(cpu.results[key])
        np.testing.assert_allclose(gpu.results[key], ref, rtol=1e-9, atol=1e-9 * max(np.abs(ref).max(), 1.0))
    batched = gpu.batch_evaluate([atoms, molecule("H2O")])
    np.testing.assert_allclose(batched[0]["forces"], cpu.results["forces"], rtol=1e-9, atol=1e-9)


def test_md_on_gpu(model, tmp_path):
    from equikernels.calculators.md import MDSettings, run_md

    atoms = structures()["crystal"]
    atoms.calc = MACECalculator(copy.deepcopy(model), device="cuda", default_dtype="float32")
    summary = run_md(atoms, MDSettings(steps=50, timestep_fs=1.0, ensemble="nvt-langevin"), out_dir=str(tmp_path),
                     progress=False)
    assert summary["device"].startswith("cuda") and summary["ns_per_day"] > 0
    assert np.isfinite(summary["total_energy_end_eV"])
