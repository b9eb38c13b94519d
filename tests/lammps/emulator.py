"""An emulator of what LAMMPS's ML-IAP unified coupling hands ``compute_forces`` on each MPI rank.

``decompose`` splits a cell into a grid of spatial domains (one emulated rank each): a rank owns
the atoms whose fractional coordinates fall in its box, and holds as ghosts every periodic image
of any atom (its own atoms' images included) in the shell of ``ghost_cutoff`` around its box
(LAMMPS's rule, in fractional units per axis for triclinic cells), local atoms first. Pairs:
every centre (owned atoms; with ``ghost_neighbors``, ghosts as well) with every other node
within ``r_max``, ``rij = x_j - x_i``.

``RankData`` is the per-rank ``data`` object: ``nlocal``, ``ntotal``, ``npairs``, ``elems``,
``pair_i``, ``pair_j``, ``rij``, writable ``eatoms`` and ``energy``, ``update_pair_forces`` (``f[i]
+= fij; f[j] -= fij`` and LAMMPS's virial ``sum (x_i - x_j) (x) fij``) and, with ``exchange``, the
collective ``forward_exchange`` / ``reverse_exchange`` of the KOKKOS coupling between ranks
(threads or spawned processes meeting at barriers, as MPI ranks would). ``Emulation.run(obj)`` calls
``obj.compute_forces`` on every rank at once, returns the ghost forces to their owners and
gathers energy, per-atom energies, forces and virial by global atom index.
"""
from __future__ import annotations

import copy
import itertools
import pickle
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch

BARRIER_TIMEOUT_S = 120  # a rank that skips a collective exchange fails the test instead of hanging it


class _Comm:
    """Collective exchanges among the emulated ranks: each rank posts its buffer in ``slots``, all
    meet at ``barrier``, read what they need, and meet again. ``tables[q]``: rank q's ghost rows by
    owner rank, ``{owner: (ghost rows, rows at the owner)}``. Threads share a list of tensors and a
    ``threading.Barrier``; processes a manager's dict (host arrays) and barrier."""

    def __init__(self, tables, nlocals, slots, barrier):
        self.tables, self.nlocals, self.slots, self.barrier = tables, nlocals, slots, barrier
        self._on_device = {}  # (id, device) -> (host index tensor, its device copy): no copy per exchange

    def _index(self, t: torch.Tensor, device) -> torch.Tensor:
        key = (id(t), str(device))
        hit = self._on_device.get(key)
        if hit is None or hit[0] is not t:
            hit = self._on_device[key] = (t, t.to(device))
        return hit[1]

    def _slot(self, q: int, device) -> torch.Tensor:
        return torch.as_tensor(self.slots[q]).to(device)

    def _post(self, rank: int, src: torch.Tensor) -> None:
        self.slots[rank] = src if isinstance(self.slots, list) else src.detach().cpu().numpy()
        self.barrier.wait()

    def forward(self, rank: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        self._post(rank, src)
        dst.copy_(src)  # owned rows unchanged
        for q, (ghost_rows, owner_rows) in self.tables[rank].items():
            dst[self._index(ghost_rows, dst.device)] = self._slot(q, dst.device)[self._index(owner_rows, dst.device)]
        self.barrier.wait()

    def reverse(self, rank: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        self._post(rank, src)
        dst.zero_()
        dst[:self.nlocals[rank]] = src[:self.nlocals[rank]]
        for q, table in enumerate(self.tables):
            if rank in table:
                ghost_rows, owner_rows = table[rank]
                dst.index_add_(0, self._index(owner_rows, dst.device),
                               self._slot(q, dst.device)[self._index(ghost_rows, dst.device)])
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
        self.comm: Optional[_Comm] = None  # set by ``Emulation.run``
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
    def __init__(self, ranks: List[RankData], num_atoms: int, exchange: bool, device="cpu"):
        self.ranks, self.num_atoms, self.exchange = ranks, num_atoms, exchange
        self.device = torch.device(device)
        self.comm = _Comm([r.ghosts_by_owner for r in ranks], [r.nlocal for r in ranks], [None] * len(ranks),
                          threading.Barrier(len(ranks), timeout=BARRIER_TIMEOUT_S))
        for r in ranks:
            r.comm = self.comm if exchange else None
            if self.device.type != "cpu":
                r.to_device(self.device)

    def run(self, obj, separate_objects: bool = True, processes: bool = False) -> Result:
        """``obj.compute_forces`` on every rank at once (each rank its own unpickled copy, as each
        MPI process loads the file), then the ghost-force return. Ranks are threads, or with
        ``processes`` spawned processes (CUDA: the autograd engine runs every backward on the GPU
        in one shared thread, where one rank waiting at an exchange would block the others)."""
        if processes:
            return self._run_processes(pickle.dumps(obj))
        comm = self.comm
        comm.barrier.reset()
        for r in self.ranks:  # LAMMPS zeroes forces and virial before every force computation
            r.f[:] = 0.0
            r.virial[:] = 0.0
        objs = [pickle.loads(pickle.dumps(obj)) if separate_objects else obj for _ in self.ranks]
        errors: List[BaseException] = []

        def work(k):
            try:
                objs[k].compute_forces(self.ranks[k])
            except BaseException as exc:  # reported by the caller
                errors.append(exc)
                comm.barrier.abort()

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
        return self._gather([(r.f, _host(r.eatoms), r.virial, r.energy) for r in self.ranks])

    def _run_processes(self, payload: bytes) -> Result:
        mp = torch.multiprocessing.get_context("spawn")
        with mp.Manager() as manager:
            slots, barrier = manager.dict(), manager.Barrier(len(self.ranks), timeout=BARRIER_TIMEOUT_S)
            queue = manager.Queue()
            tables = [r.ghosts_by_owner for r in self.ranks]
            nlocals = [r.nlocal for r in self.ranks]
            procs = [mp.Process(target=_rank_main, args=(k, payload, _host_copy(r), tables, nlocals, slots, barrier,
                                                         str(self.device), self.exchange, queue))
                     for k, r in enumerate(self.ranks)]
            for p in procs:
                p.start()
            outs = [queue.get(timeout=4 * BARRIER_TIMEOUT_S) for _ in procs]
            for p in procs:
                p.join()
        failed = [o[1] for o in outs if o[1] is not None]
        if failed:
            raise RuntimeError("an emulated rank failed:\n" + next((f for f in failed if "BrokenBarrier" not in f),
                                                                     failed[0]))
        by_rank = sorted(outs, key=lambda o: o[0])
        for r, o in zip(self.ranks, by_rank):
            r.f, r.virial, r.energy = o[2], o[4], o[5]
        return self._gather([o[2:] for o in by_rank])

    def _gather(self, per_rank) -> Result:
        forces = np.zeros((self.num_atoms, 3))
        energies = np.zeros(self.num_atoms)
        virial = np.zeros((3, 3))
        energy = 0.0
        for r, (f, eatoms, vir, e) in zip(self.ranks, per_rank):
            np.add.at(forces, r.global_ids, f)  # owned rows, and ghost forces returned to their owners
            energies[r.global_ids[:r.nlocal]] = eatoms
            virial += vir
            energy += float(e)
        return Result(energy, energies, forces, virial)


def _host_copy(data: RankData) -> RankData:
    out = copy.copy(data)
    out.comm = None
    for name in ("elems", "pair_i", "pair_j", "rij", "eatoms"):
        setattr(out, name, np.array(_host(getattr(data, name))))
    return out


def _rank_main(rank, payload, data, tables, nlocals, slots, barrier, device, exchange, queue) -> None:
    """One emulated MPI process."""
    try:
        data.comm = _Comm(tables, nlocals, slots, barrier) if exchange else None
        if device != "cpu":
            data.to_device(torch.device(device))
        pickle.loads(payload).compute_forces(data)
        queue.put((rank, None, data.f, _host(data.eatoms), data.virial, data.energy))
    except BaseException:  # reported by the parent
        import traceback

        barrier.abort()
        queue.put((rank, traceback.format_exc(), None, None, None, None))


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
        ranks.append(cls(r, len(ids), node_atom, owners, elems_all[node_atom], node_pos, pi, pj))
    return Emulation(ranks, n_atoms, exchange, device)


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
