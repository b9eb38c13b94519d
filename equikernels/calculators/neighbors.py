"""Neighbour lists for the calculator: vesin-torch on the model's device, with a Verlet skin.

The list is built with vesin at ``cutoff + skin`` and reused while no atom has moved more than
half the skin since the build (then no pair can have crossed the cutoff unseen); under a changing
periodic cell (NPT, cell relaxation) the same bound is applied to the motion relative to the
affinely deformed reference, widened by the cell's deformation (see ``SkinNeighborList``). Every call
returns exactly the pairs within ``cutoff`` (the candidates are filtered by their current
distance), so results equal a fresh list at every step, whatever the model does with edges
beyond its cutoff. Conventions are mace-torch's: ``sender = i``, ``receiver = j``,
``vector = x[j] - x[i] + S @ cell``, self-pairs only across periodic images. With ``paired`` the
list holds each pair once and the edges come back paired (the second half the first reversed).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..models.data import with_reverses

DEFAULT_SKIN = 0.5  # Angstrom: typical MD moves atoms < 0.01 A per fs, so rebuilds every ~20+ steps


@dataclass
class Edges:
    """The pairs within the cutoff, as tensors on the positions' device."""
    sender: torch.Tensor       # [E] int64
    receiver: torch.Tensor     # [E] int64
    unit_shifts: torch.Tensor  # [E, 3] positions' dtype (integer values)
    shifts: torch.Tensor       # [E, 3] positions' dtype, unit_shifts @ cell

    @property
    def edge_index(self) -> torch.Tensor:
        cached = self.__dict__.get("_edge_index")
        return cached if cached is not None else torch.stack((self.sender, self.receiver))


def _vesin_neighbor_list(cutoff: float, full_list: bool = True):
    try:
        from vesin_torch import NeighborList  # vesin-torch >= 0.4
    except ImportError:  # older releases only ship the vesin.torch alias
        from vesin.torch import NeighborList
    return NeighborList(cutoff=cutoff, full_list=full_list)


def vesin_pairs(positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor, cutoff: float,
                full_list: bool = True):
    """All pairs within ``cutoff`` from vesin (no skin): i, j (int64) and integer shifts S (as the
    positions' dtype), on the positions' device; both directions of each pair, or with
    ``full_list=False`` one. Non-periodic directions may have a zero cell row."""
    nl = _vesin_neighbor_list(cutoff, full_list)
    i, j, shifts = nl.compute(positions.detach(), cell.detach(), pbc, "ijS")
    return i.to(torch.int64), j.to(torch.int64), shifts.to(positions.dtype)


class SkinNeighborList:
    """Verlet neighbour list for one structure.

    ``update(positions, cell, pbc)`` returns the current :class:`Edges`. The candidate list is
    rebuilt when the structure changes (number of atoms, pbc) or when any atom moved more than
    ``skin / 2`` since the last build. When a fully periodic cell changes from ``h0`` (rows are
    lattice vectors) to ``h``, with ``A = h0^-1 h``: a pair within ``cutoff`` now was within
    ``(cutoff + 2 d) / sigma_min(A)`` at the build, ``d`` the largest distance of an atom from its
    reference position mapped by ``A``; the list is reused while that is at most ``cutoff + skin``
    (with ``A = 1`` this is the ``skin / 2`` rule). A partly periodic cell that changes rebuilds.
    ``num_builds`` counts vesin calls (tests and logs use it). ``paired``: the list holds each pair
    once; ``update`` returns the pairs within the cutoff as paired edges (edge E/2 + p is edge p
    reversed, ``models.data.PAIRED_KEY``) and ``candidates`` one edge per candidate pair. Pass new
    ``cell``/``pbc`` tensors when they change rather than modifying the previous ones in place (an unchanged object is
    taken as an unchanged value, which saves a device sync per step). ``host``: the same positions
    as a float64 NumPy array [N, 3] (ASE's), optional; with it the displacement test of an unchanged
    cell runs on the host, without device launches or a sync.
    """

    def __init__(self, cutoff: float, skin: float = DEFAULT_SKIN, paired: bool = False):
        self.cutoff = _length("cutoff", cutoff, "a positive")
        self.skin = _length("skin", skin, "a non-negative")
        if not self.cutoff > 0:
            raise ValueError(f"cutoff must be a positive number of Angstrom, got {cutoff!r}")
        self.paired = bool(paired)
        self.num_builds = 0
        self._ref_positions: Optional[torch.Tensor] = None
        self._ref_cell: Optional[torch.Tensor] = None
        self._ref_pbc: Optional[torch.Tensor] = None
        self._ref_cell_src: Optional[torch.Tensor] = None
        self._ref_pbc_src: Optional[torch.Tensor] = None
        self._candidates = None  # (i, j, S) within cutoff + skin at the last build
        self._cand_edges = None  # (cell, Edges) of ``candidates``: valid until the next build
        self._ref_host: Optional[np.ndarray] = None  # the host positions at the last build, if given

    def reset(self) -> None:
        self._ref_positions = None
        self._ref_host = None
        self._candidates = None
        self._cand_edges = None

    def _needs_rebuild(self, positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor,
                       host: Optional[np.ndarray] = None) -> bool:
        ref = self._ref_positions
        if (ref is None or ref.shape != positions.shape or ref.device != positions.device
                or ref.dtype != positions.dtype):
            return True
        if pbc is not self._ref_pbc_src and not torch.equal(self._ref_pbc, pbc):
            return True
        if self.skin == 0.0:
            return True
        # the calculator passes the same tensor objects while cell and pbc are unchanged: skip the
        # element-wise comparison (a device sync on CUDA) in that case
        if cell is self._ref_cell_src or torch.equal(self._ref_cell, cell):
            if host is not None and self._ref_host is not None and self._ref_host.shape == host.shape:
                return bool(np.square(host - self._ref_host).sum(axis=1).max() > (0.5 * self.skin) ** 2)
            # one reduction and one host sync per step
            max_sq = (positions - ref).square().sum(dim=1).max()
            return bool(max_sq > (0.5 * self.skin) ** 2)
        if not bool(self._ref_pbc.all()):
            return True
        h0, h = self._ref_cell.detach().cpu().double(), cell.detach().cpu().double()
        try:
            deform = torch.linalg.solve(h0, h)  # A = h0^-1 h: reference fractional coordinates -> now
        except RuntimeError:  # a singular cell: nothing to reuse
            return True
        sigma_min = float(torch.linalg.svdvals(deform)[-1])
        if not sigma_min > 0.0:
            return True
        mapped = ref @ deform.to(device=ref.device, dtype=ref.dtype)
        d = float((positions - mapped).square().sum(dim=1).max().sqrt())
        return (self.cutoff + 2.0 * d) / sigma_min > self.cutoff + self.skin

    def candidates(self, positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor,
                   host: Optional[np.ndarray] = None) -> Edges:
        """Every pair within ``cutoff + skin`` of the last build (unfiltered; a build by :meth:`update`
        counts), as the same tensor objects between builds while the cell is unchanged. For models
        whose terms vanish exactly beyond the cutoff (MACE's envelope): results equal those of
        :meth:`update`, and the edge set is constant between rebuilds (fixed shapes for CUDA graphs)."""
        positions = positions.detach()
        rebuilt = self._needs_rebuild(positions, cell, pbc, host)
        if rebuilt:
            self._rebuild(positions, cell, pbc, host)
        cached = self._cand_edges
        if cached is None or cached[0] is not cell:
            i, j, unit_shifts = self._candidates
            edges = Edges(i, j, unit_shifts, unit_shifts @ cell.detach())
            edges.__dict__["_edge_index"] = torch.stack((i, j))
            self._cand_edges = (cell, edges)
        return self._cand_edges[1]

    def _rebuild(self, positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor,
                 host: Optional[np.ndarray] = None) -> None:
        self._candidates = vesin_pairs(positions, cell, pbc, self.cutoff + self.skin, full_list=not self.paired)
        self._cand_edges = None  # a build through ``update`` must not leave the previous list's edges
        self._ref_positions = positions.clone()
        self._ref_host = None if host is None else np.array(host, dtype=np.float64)
        self._ref_cell, self._ref_cell_src = cell.detach().clone(), cell
        self._ref_pbc, self._ref_pbc_src = pbc.clone(), pbc
        self.num_builds += 1

    def update(self, positions: torch.Tensor, cell: torch.Tensor, pbc: torch.Tensor,
               host: Optional[np.ndarray] = None) -> Edges:
        positions = positions.detach()
        if self._needs_rebuild(positions, cell, pbc, host):
            self._rebuild(positions, cell, pbc, host)
        i, j, unit_shifts = self._candidates
        shifts = unit_shifts @ cell.detach()
        if self.skin > 0.0:
            vec = positions[j] - positions[i] + shifts
            keep = torch.nonzero(vec.square().sum(dim=1) < self.cutoff ** 2).squeeze(1)
            i, j, unit_shifts, shifts = i[keep], j[keep], unit_shifts[keep], shifts[keep]
        if self.paired:
            ei, shifts, unit_shifts = with_reverses(torch.stack((i, j)), shifts, unit_shifts)
            return Edges(ei[0], ei[1], unit_shifts, shifts)
        return Edges(i, j, unit_shifts, shifts)


def _length(name: str, value, what: str) -> float:
    """``value`` as a float: a finite, non-negative real number, else an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {what} number of Angstrom, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name} must be {what} finite number of Angstrom, got {value!r}")
    return value


def pbc_tensor(pbc, device) -> torch.Tensor:
    """ASE's pbc (bool or 3 bools) as a bool tensor of 3 on ``device``."""
    arr = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,))
    return torch.tensor(arr.tolist(), dtype=torch.bool, device=device)
