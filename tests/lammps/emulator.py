"""An emulator of what LAMMPS's ML-IAP unified coupling hands ``compute_forces`` on each MPI rank.

``decompose`` splits a cell into a grid of spatial domains (one emulated rank each): a rank owns
the atoms whose fractional coordinates fall in its box, and holds as ghosts every periodic image
of any atom (its own atoms' images included) in the shell of ``ghost_cutoff`` around its box
(LAMMPS's rule, in fractional units per axis for triclinic cells), local atoms first. Pairs: every centre (owned atoms; with ``ghost_neighbors``, ghosts as well) with every
other node within ``r_max``, ``rij = x_j - x_i``.

``RankData`` is the per-rank ``data`` object: ``nlocal``, ``ntotal``, ``npairs``, ``elems``,
``pair_i``, ``pair_j``, ``rij``, writable ``eatoms`` and ``energy``, ``update_pair_forces`` (``f[i]
+= fij; f[j] -= fij`` and LAMMPS's virial ``sum (x_i - x_j) (x) fij``) and, with ``exchange``, the
collective ``forward_exchange`` / ``reverse_exchange`` of the KOKKOS coupling between ranks
(Python threads meeting at barriers, as MPI ranks would). ``Emulation.run(obj)`` calls
``obj.compute_forces`` on every rank at once, returns the ghost forces to their owners and
gathers energy, per-atom energies, forces and virial by global atom index.
"""
from __future__ import annotations

import itertools
import pickle
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch

BARRIER_TIMEOUT_S = 120  # a rank that skips a collective exchange fails the test instead of hanging it


class _Comm:
    """Collective exchanges among the emulated ranks."""

    def __init__(self, ranks: List["RankData"]):
        self.ranks = ranks
        self.barrier = threading.Barrier(len(ranks), timeout=BARRIER_TIMEOUT_S)
        self.slots: List[Optional[torch.Tensor]] = [None] * len(ranks)

    def forward(self, rank: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        me = self.ranks[rank]
        self.slots[rank] = src
        self.barrier.wait()
        dst.copy_(src)  # owned rows unchanged
        for q, (ghost_rows, owner_rows) in me.ghosts_by_owner.items():
            dst[ghost_rows.to(dst.device)] = self.slots[q][owner_rows.to(dst.device)].to(dst.device)
        self.barrier.wait()

    def reverse(self, rank: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        me = self.ranks[rank]
        self.slots[rank] = src
        self.barrier.wait()
        dst.zero_()
        dst[:me.nlocal] = src[:me.nlocal]
        for q, other in enumerate(self.ranks):
            pair = other.ghosts_by_owner.get(rank)
            if pair is not None:
                ghost_rows, owner_rows = pair
                dst.index_add_(0, owner_rows.to(dst.device), self.slots[q][ghost_rows.to(dst.device)].to(dst.device))
        self.barrier.wait()


class RankData:
    """One rank's ``data`` object (the attributes and calls the ML-IAP unified coupling offers)."""

    def __init__(self, rank: int, nlocal: int, global_ids: np.ndarray, owners: np.ndarray, elems: np.ndarray,
                 positions: np.ndarray, pair_i: np.ndarray, pair_j: np.ndarray):
        self.rank = rank
        self.nlocal, self.ntotal, self.npairs = int(nlocal), int(len(global_ids)), int(len(pair_i))
        self.nlistatoms = self.nlocal
        self.global_ids = global_ids          # global atom index of every node
        self.owners = owners                  # [ntotal, 2]: (owner rank, index there) of every node
        self.positions = positions
        self.elems = elems.astype(np.int32)
        self.pair_i = pair_i.astype(np.int32)
        self.pair_j = pair_j.astype(np.int32)
        self.rij = np.ascontiguousarray(positions[pair_j] - positions[pair_i])
        self.eatoms = np.zeros(self.nlocal)
        self.energy = None
        self.f = np.zeros((self.ntotal, 3))
        self.virial = np.zeros((3, 3))
        self.pair_forces_calls = 0
        self.comm: Optional[_Comm] = None
        self.ghosts_by_owner = {}
        for q in np.unique(owners[nlocal:, 0]) if self.ntotal > nlocal else []:
            rows = np.nonzero(owners[:, 0] == q)[0]
            rows = rows[rows >= nlocal]
            self.ghosts_by_owner[int(q)] = (torch.as_tensor(rows), torch.as_tensor(owners[rows, 1]))

    def to_device(self, device: torch.device) -> None:
        """Hold the arrays as device tensors (as the KOKKOS coupling does on GPUs)."""
        for name in ("elems", "pair_i", "pair_j", "rij", "eatoms"):
            setattr(self, name, torch.as_tensor(getattr(self, name)).to(device))

    def update_pair_forces(self, fij) -> None:
        fij = fij.detach().cpu().numpy() if isinstance(fij, torch.Tensor) else np.asarray(fij)
        if fij.shape != (self.npairs, 3) or fij.dtype != np.float64:
            raise ValueError(f"fij: expected float64 [{self.npairs}, 3], got {fij.dtype} {fij.shape}")
        self.pair_forces_calls += 1
        i, j = _host(self.pair_i).astype(np.int64), _host(self.pair_j).astype(np.int64)
        np.add.at(self.f, i, fij)
        np.add.at(self.f, j, -fij)
        rij = _host(self.rij)
        self.virial += -np.einsum("pa,pb->ab", rij, fij)  # (x_i - x_j) (x) fij

    def update_pair_forces_gpu(self, fij) -> None:
        if not (isinstance(fij, torch.Tensor) and fij.is_cuda and fij.is_contiguous()):
            raise TypeError("update_pair_forces_gpu: expected a contiguous CUDA tensor")
        self.update_pair_forces(fij)


class ExchangeRankData(RankData):
    """``RankData`` with the KOKKOS coupling's collective ghost exchange."""

    def forward_exchange(self, src: torch.Tensor, dst: torch.Tensor, width: int) -> None:
        _check_exchange(self, src, dst, width)
        self.comm.forward(self.rank, src, dst)

    def reverse_exchange(self, src: torch.Tensor, dst: torch.Tensor, width: int) -> None:
        _check_exchange(self, src, dst, width)
        self.comm.reverse(self.rank, src, dst)


def _check_exchange(data, src, dst, width) -> None:
    if src.shape != (data.ntotal, width) or dst.shape != src.shape or src.dtype != dst.dtype:
        raise ValueError(f"exchange: expected src/dst [{data.ntotal}, {width}] of one dtype, got "
                         f"{tuple(src.shape)} {src.dtype} / {tuple(dst.shape)} {dst.dtype}")
    if src.dtype not in (torch.float32, torch.float64) or not (src.is_contiguous() and dst.is_contiguous()):
        raise TypeError("exchange: LAMMPS exchanges contiguous float32/float64 buffers")


def _host(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.detach().cpu().numpy()
    if not isinstance(a, np.ndarray) and hasattr(a, "__dlpack__"):
        return np.from_dlpack(a)
    return np.asarray(a)


@dataclass
class Result:
    energy: float
    energies: np.ndarray   # per atom, by global index
    forces: np.ndarray
    virial: np.ndarray     # LAMMPS's: sum over pairs (x_i - x_j) (x) f_ij; ASE stress = -virial / volume


class Emulation:
    def __init__(self, ranks: List[RankData], num_atoms: int, exchange: bool):
        self.ranks, self.num_atoms = ranks, num_atoms
        if exchange:
            comm = _Comm(ranks)
            for r in ranks:
                r.comm = comm

    def run(self, obj, separate_objects: bool = True) -> Result:
        """``obj.compute_forces`` on every rank at once (each rank its own unpickled copy, as each
        MPI process loads the file), then the ghost-force return."""
        objs = [pickle.loads(pickle.dumps(obj)) if separate_objects else obj for _ in self.ranks]
        errors: List[BaseException] = []

        def work(k):
            try:
                objs[k].compute_forces(self.ranks[k])
            except BaseException as exc:  # reported by the caller
                errors.append(exc)
                if self.ranks[k].comm is not None:
                    self.ranks[k].comm.barrier.abort()

        if len(self.ranks) == 1:
            work(0)
        else:
            threads = [threading.Thread(target=work, args=(k,)) for k in range(len(self.ranks))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if errors:
            raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
        forces = np.zeros((self.num_atoms, 3))
        energies = np.zeros(self.num_atoms)
        virial = np.zeros((3, 3))
        energy = 0.0
        for r in self.ranks:
            np.add.at(forces, r.global_ids, r.f)  # owned rows, and ghost forces returned to their owners
            energies[r.global_ids[:r.nlocal]] = _host(r.eatoms)
            virial += r.virial
            energy += float(r.energy)
        return Result(energy, energies, forces, virial)


def decompose(atoms, element_types: Sequence[str], r_max: float, grid=(1, 1, 1), ghost_cutoff: Optional[float] = None,
              ghost_neighbors: bool = False, exchange: bool = True, device="cpu") -> Emulation:
    """The per-rank data LAMMPS would build for ``atoms`` on a ``grid`` of domains (see module doc)."""
    ghost_cutoff = r_max if ghost_cutoff is None else ghost_cutoff
    cell = np.asarray(atoms.cell.array, dtype=np.float64)
    pbc = np.asarray(atoms.pbc, dtype=bool)
    frac = np.linalg.solve(cell.T, atoms.positions.T).T
    frac = np.where(pbc, frac % 1.0, frac)
    positions = frac @ cell
    grid = np.asarray(grid)
    box = np.clip(np.floor(frac * grid).astype(int), 0, grid - 1)
    owner_rank = np.ravel_multi_index(box.T, grid)
    element_index = {s: k for k, s in enumerate(element_types)}
    elems_all = np.array([element_index[s] for s in atoms.get_chemical_symbols()])
    # periodic images reaching ghost_cutoff: enough cell repeats along each periodic axis
    heights = np.abs(np.linalg.det(cell)) / np.linalg.norm(np.cross(np.roll(cell, -1, 0), np.roll(cell, -2, 0)), axis=1)
    reps = [int(np.ceil(ghost_cutoff / h)) + 1 if p else 0 for h, p in zip(heights, pbc)]
    shifts = np.array(list(itertools.product(*[range(-n, n + 1) for n in reps])), dtype=np.float64)
    n_atoms = len(atoms)
    img_atom = np.repeat(np.arange(n_atoms), len(shifts))
    img_shift = np.tile(shifts, (n_atoms, 1))
    img_pos = positions[img_atom] + img_shift @ cell
    img_home = np.all(img_shift == 0, axis=1)
    local_ids = [np.nonzero(owner_rank == r)[0] for r in range(int(np.prod(grid)))]
    local_index = np.empty(n_atoms, dtype=np.int64)
    for ids in local_ids:
        local_index[ids] = np.arange(len(ids))
    ranks = []
    cls = ExchangeRankData if exchange else RankData
    img_frac = frac[img_atom] + img_shift
    margin = np.where(pbc, ghost_cutoff / heights, np.inf)  # LAMMPS's ghost shell in fractional units
    for r, ids in enumerate(local_ids):
        lo = np.array(np.unravel_index(r, grid)) / grid
        hi = lo + 1.0 / grid
        is_local_image = img_home & (owner_rank[img_atom] == r)
        ghost = (~is_local_image) & np.all((img_frac >= lo - margin) & (img_frac < hi + margin), axis=1)
        node_atom = np.concatenate([ids, img_atom[ghost]])
        node_pos = np.concatenate([positions[ids], img_pos[ghost]])
        owners = np.stack([owner_rank[node_atom], local_index[node_atom]], axis=1)
        centres = len(node_atom) if ghost_neighbors else len(ids)
        pi, pj = _pairs(node_pos, centres, r_max)
        data = cls(r, len(ids), node_atom, owners, elems_all[node_atom], node_pos, pi, pj)
        if torch.device(device).type != "cpu":
            data.to_device(torch.device(device))
        ranks.append(data)
    return Emulation(ranks, n_atoms, exchange)


def _pairs(node_pos: np.ndarray, centres: int, r_max: float):
    """(i, j) for every centre i < ``centres`` and node j != i closer than ``r_max``, sorted by i."""
    from scipy.spatial import cKDTree

    if len(node_pos) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    both = cKDTree(node_pos).query_pairs(r_max, output_type="ndarray")
    pi, pj = np.concatenate([both[:, 0], both[:, 1]]), np.concatenate([both[:, 1], both[:, 0]])
    keep = pi < centres
    pi, pj = pi[keep], pj[keep]
    order = np.lexsort((pj, pi))
    return pi[order], pj[order]
