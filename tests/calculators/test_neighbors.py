"""Skin neighbour list: the same pairs as an independent list (ASE's) for any cell and pbc, at
every step of a random walk across many rebuilds; rebuilds only when needed. No mace-torch."""
import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, fcc111, molecule
from ase.neighborlist import neighbor_list

from equikernels.calculators.neighbors import SkinNeighborList, pbc_tensor

CUTOFF = 4.0


def pair_set(i, j, shifts):
    """(i, j, S) pairs as a set of tuples, so lists in any order compare equal."""
    arr = np.concatenate([np.asarray(i)[:, None], np.asarray(j)[:, None], np.rint(np.asarray(shifts)).astype(int)], 1)
    return set(map(tuple, arr.tolist()))


def ase_pairs(atoms, cutoff=CUTOFF):
    i, j, S = neighbor_list("ijS", atoms, cutoff)
    return pair_set(i, j, S)


def ours(nl, atoms, dtype=torch.float64, host=False):
    edges = nl.update(torch.tensor(atoms.positions, dtype=dtype), torch.tensor(atoms.cell.array, dtype=dtype),
                      pbc_tensor(atoms.pbc, "cpu"), host=atoms.positions if host else None)
    # shifts must be unit_shifts @ cell (the model's displacement-based stress relies on both)
    np.testing.assert_allclose(edges.shifts.numpy(), edges.unit_shifts.numpy() @ atoms.cell.array, atol=1e-5)
    return pair_set(edges.sender.numpy(), edges.receiver.numpy(), edges.unit_shifts.numpy())


def triclinic():
    atoms = bulk("Cu", "fcc", a=3.61).repeat((2, 2, 2))  # primitive fcc: a triclinic cell
    atoms.set_cell(atoms.cell.array @ np.array([[1.0, 0.05, 0.0], [0.0, 1.0, 0.1], [0.0, 0.0, 1.02]]), scale_atoms=True)
    return atoms


def slab(zero_cell_row):
    atoms = fcc111("Cu", (2, 2, 3), vacuum=4.0)
    atoms.pbc = [True, True, False]
    if zero_cell_row:
        atoms.cell[2] = 0.0
    return atoms


def structures():
    mol = molecule("CH3CH2OH")
    small = bulk("Cu", "fcc", a=3.61)  # one atom, cell much smaller than the cutoff: many images
    wire = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((1, 1, 3))
    wire.pbc = [False, False, True]
    return {"molecule": mol, "primitive-1-atom": small, "triclinic": triclinic(), "slab-vacuum": slab(False),
            "slab-zero-row": slab(True), "wire": wire}


@pytest.mark.parametrize("name", sorted(structures()))
def test_matches_ase_neighbor_list(name):
    atoms = structures()[name]
    atoms.rattle(0.05, seed=3)
    expected = ase_pairs(atoms)
    assert expected, "the structure should have neighbours"
    for skin in (0.0, 0.7):
        assert ours(SkinNeighborList(CUTOFF, skin=skin), atoms) == expected


@pytest.mark.parametrize("host", [False, True])
@pytest.mark.parametrize("name", ["triclinic", "slab-vacuum", "molecule"])
def test_correct_at_every_step_across_rebuilds(name, host):
    atoms = structures()[name]
    rng = np.random.default_rng(0)
    nl = SkinNeighborList(CUTOFF, skin=0.6)
    steps = 120
    for _ in range(steps):
        atoms.positions += rng.normal(scale=0.04, size=atoms.positions.shape)  # ~0.07 A per step per atom
        assert ours(nl, atoms, host=host) == ase_pairs(atoms)
    assert 3 < nl.num_builds < steps, f"expected a few skin rebuilds, got {nl.num_builds} in {steps} steps"


def test_host_positions_decide_the_rebuild():
    """With host positions the displacement test reads them (not the device tensor): a host copy
    moved past half the skin rebuilds although the tensor did not move, and the other way round."""
    atoms = triclinic()
    pos = torch.tensor(atoms.positions)
    cell, pbc = torch.tensor(atoms.cell.array), pbc_tensor(atoms.pbc, "cpu")
    nl = SkinNeighborList(CUTOFF, skin=1.0)
    nl.candidates(pos, cell, pbc, host=atoms.positions)
    moved = atoms.positions.copy()
    moved[2] += [0.6, 0.0, 0.0]
    nl.candidates(pos, cell, pbc, host=moved)
    assert nl.num_builds == 2
    nl.candidates(pos + torch.tensor([0.6, 0.0, 0.0]), cell, pbc, host=moved)
    assert nl.num_builds == 2
    nl.candidates(pos + torch.tensor([0.6, 0.0, 0.0]), cell, pbc)  # no host copy: the tensor decides
    assert nl.num_builds == 3


def test_rebuilds_only_past_half_the_skin():
    atoms = triclinic()
    nl = SkinNeighborList(CUTOFF, skin=1.0)
    ours(nl, atoms)
    assert nl.num_builds == 1
    atoms.positions[3] += [0.45, 0.0, 0.0]  # < skin/2: reuse
    ours(nl, atoms)
    assert nl.num_builds == 1
    atoms.positions[3] += [0.1, 0.0, 0.0]  # 0.55 > skin/2 from the reference: rebuild
    ours(nl, atoms)
    assert nl.num_builds == 2
    atoms.set_cell(atoms.cell.array * 1.001, scale_atoms=True)  # a slightly strained cell: reuse
    assert ours(nl, atoms) == ase_pairs(atoms)
    assert nl.num_builds == 2
    atoms.set_cell(atoms.cell.array * 1.5, scale_atoms=True)  # expanding brings no pair closer: reuse
    assert ours(nl, atoms) == ase_pairs(atoms)
    assert nl.num_builds == 2
    atoms.set_cell(atoms.cell.array / 1.5 * 0.75, scale_atoms=True)  # 25 % compression: past the skin

    assert ours(nl, atoms) == ase_pairs(atoms)
    assert nl.num_builds == 3
    atoms.pbc = [True, False, True]  # a changed pbc always rebuilds
    assert ours(nl, atoms) == ase_pairs(atoms)
    assert nl.num_builds == 4


@pytest.mark.parametrize("name", ["triclinic", "primitive-1-atom"])
def test_changing_cell_reuses_the_list_and_stays_exact(name):
    """NPT-like walk: every step strains the cell a little (shear included) and moves the atoms; the
    pairs equal ASE's at every step, with far fewer builds than steps."""
    atoms = structures()[name]
    rng = np.random.default_rng(1)
    nl = SkinNeighborList(CUTOFF, skin=0.6)
    steps = 80
    for _ in range(steps):
        strain = np.eye(3) + rng.normal(scale=0.002, size=(3, 3))
        atoms.set_cell(atoms.cell.array @ strain, scale_atoms=True)
        atoms.positions += rng.normal(scale=0.01, size=atoms.positions.shape)
        assert ours(nl, atoms) == ase_pairs(atoms)
    assert nl.num_builds < steps // 4, f"{nl.num_builds} builds in {steps} steps"


def test_float32_positions():
    atoms = triclinic()
    atoms.rattle(0.05, seed=1)
    assert ours(SkinNeighborList(CUTOFF, skin=0.5), atoms, torch.float32) == ase_pairs(atoms)


def test_bad_arguments():
    with pytest.raises(ValueError, match="cutoff"):
        SkinNeighborList(0.0)
    with pytest.raises(ValueError, match="skin"):
        SkinNeighborList(4.0, skin=-1.0)
    with pytest.raises(ValueError, match="skin must be a non-negative finite number"):
        SkinNeighborList(4.0, skin=float("inf"))  # vesin would fail (or never finish) at the first call
    with pytest.raises(ValueError, match="cutoff must be a positive finite number"):
        SkinNeighborList(float("nan"))
    for bad in ("0.5", None, True):
        with pytest.raises(TypeError, match="skin must be a non-negative number of Angstrom"):
            SkinNeighborList(4.0, skin=bad)
    assert SkinNeighborList(np.float32(4.0), skin=np.int64(1)).skin == 1.0


@pytest.mark.parametrize("paired", [False, True])
def test_candidates_after_a_build_through_update(paired):
    """A build by ``update`` (the calculator's descriptors or Hessian of another structure) replaces
    the edges ``candidates`` returns for the same cell: they hold every pair within the cutoff of the
    structure just built, not those of the earlier one."""
    atoms = triclinic()
    cell, pbc = torch.tensor(atoms.cell.array), pbc_tensor(atoms.pbc, "cpu")
    nl = SkinNeighborList(CUTOFF, skin=0.6, paired=paired)
    nl.candidates(torch.tensor(atoms.positions), cell, pbc, host=atoms.positions)
    moved = atoms.copy()
    moved.positions[0] += [1.2, -0.9, 0.7]  # past half the skin: a new build
    nl.update(torch.tensor(moved.positions), cell, pbc, host=moved.positions)
    assert nl.num_builds == 2
    cand = nl.candidates(torch.tensor(moved.positions), cell, pbc, host=moved.positions)
    assert nl.num_builds == 2
    pairs = pair_set(cand.sender.numpy(), cand.receiver.numpy(), cand.unit_shifts.numpy())
    if paired:
        pairs |= pair_set(cand.receiver.numpy(), cand.sender.numpy(), -cand.unit_shifts.numpy())
    assert ase_pairs(moved) <= pairs
    assert pairs <= ase_pairs(moved, CUTOFF + 0.6)


def test_empty_neighbourhood():
    atoms = Atoms("H2", positions=[[0, 0, 0], [0, 0, 10.0]])
    assert ours(SkinNeighborList(CUTOFF, skin=0.5), atoms) == set()


@pytest.mark.parametrize("name", sorted(structures()))
def test_paired_lists(name):
    """``paired``: candidates hold each pair once; ``update`` returns the full list (as a set) with
    edge E/2 + p the reverse of edge p, across rebuilds."""
    atoms = structures()[name]
    atoms.rattle(0.05, seed=3)
    rng = np.random.default_rng(1)
    nl = SkinNeighborList(CUTOFF, skin=0.6, paired=True)
    for _ in range(30):
        atoms.positions += rng.normal(scale=0.08, size=atoms.positions.shape)
        assert ours(nl, atoms) == ase_pairs(atoms)
        edges = nl.update(torch.tensor(atoms.positions), torch.tensor(atoms.cell.array), pbc_tensor(atoms.pbc, "cpu"))
        h = edges.sender.shape[0] // 2
        assert torch.equal(edges.sender[h:], edges.receiver[:h]) and torch.equal(edges.receiver[h:], edges.sender[:h])
        assert torch.equal(edges.unit_shifts[h:], -edges.unit_shifts[:h])
        cand = nl.candidates(torch.tensor(atoms.positions), torch.tensor(atoms.cell.array),
                             pbc_tensor(atoms.pbc, "cpu"))
        pairs = pair_set(cand.sender.numpy(), cand.receiver.numpy(), cand.unit_shifts.numpy())
        assert len(pairs) == cand.sender.shape[0]
        assert not pairs & pair_set(cand.receiver.numpy(), cand.sender.numpy(), -cand.unit_shifts.numpy())
    assert nl.num_builds > 1
