"""ASE Atoms -> the data dict MACE models take (mace-torch's conventions, exactly).

Edges come from vesin's neighbour list: ``edge_index = [sender, receiver]`` with
``vec = pos[receiver] - pos[sender] + shifts``, ``shifts = unit_shifts @ cell``; self pairs
without a periodic shift are dropped. As in mace-torch, cell vectors of non-periodic directions
are replaced by a long axis vector (``(max|pos| + 1) * 5 * r_max``), and that is the ``cell``
returned (it only enters the stress through the volume). Several structures batch
torch_geometric-style: node indices offset per graph, ``batch`` (graph of each node) and ``ptr``
(node offsets), ``cell`` stacked as [3 * num_graphs, 3].
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .._compat import pyg_data

NON_PERIODIC_CELL_FACTOR = 5  # mace-torch: non-periodic cell vectors = (max|pos| + 1) * 5 * r_max
# optional data key: True (a bool or a CPU bool tensor) when edges E/2 + p are edges p reversed
# (sender and receiver swapped, shifts negated); the models then run their radial MLPs on one half
PAIRED_KEY = "paired_edges"


def neighbour_list(positions: np.ndarray, cell: np.ndarray, pbc: Sequence[bool], r_max: float
                   ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(edge_index [2, E], shifts [E, 3], unit_shifts [E, 3], cell used [3, 3]) within ``r_max``."""
    import vesin  # noqa: PLC0415 (only needed to build graphs)

    pbc = tuple(bool(p) for p in pbc)
    cell = np.array(cell, dtype=np.float64).reshape(3, 3)
    if not cell.any():
        cell = np.identity(3)
    for k in range(3):
        if pbc[k] and not cell[k].any():
            raise ValueError(f"atoms: periodic along axis {k} but its cell vector is zero")
    extent = (np.max(np.abs(positions)) if len(positions) else 0.0) + 1
    for k in range(3):
        if not pbc[k]:
            cell[k] = extent * NON_PERIODIC_CELL_FACTOR * r_max * np.eye(3)[k]
    nl = vesin.NeighborList(cutoff=float(r_max), full_list=True)
    i, j, s = nl.compute(points=np.asarray(positions, dtype=np.float64), box=cell, periodic=list(pbc), quantities="ijS")
    keep = ~((i == j) & np.all(s == 0, axis=1))
    i, j, s = i[keep], j[keep], s[keep]
    edge_index = np.stack((i, j)).astype(np.int64)
    return edge_index, s.astype(np.float64) @ cell, s.astype(np.float64), cell


def atoms_to_data(atoms, r_max: float, atomic_numbers: Union[Sequence[int], torch.Tensor],
                  device: Union[str, torch.device, None] = None, dtype: Optional[torch.dtype] = None,
                  head: Union[int, str, None] = None, heads: Optional[Sequence[str]] = None) -> Dict[str, torch.Tensor]:
    """One structure as a batch of one graph. ``atomic_numbers``: the model's element table (the
    one-hot order); ``head``: index or name (with ``heads``, resolved by ``head_index``) of the model
    head to evaluate; None is ``heads``' default head, or head 0 without ``heads``."""
    return atoms_list_to_data([atoms], r_max, atomic_numbers, device, dtype, head, heads)


HEAD_UNKNOWN = "head {head!r} is not one of the model's heads {heads}"
HEAD_MISSING = "the model has several heads and none is called 'default': pass head=, one of {heads}"


def head_index(head: Optional[str], heads: Sequence[str], unknown: str = HEAD_UNKNOWN,
               missing: str = HEAD_MISSING) -> int:
    """Index in ``heads`` of the model head ``head`` names: a name given exactly; with no name (None),
    the only head, else the first called 'default' in any letter case (mace-torch's 'Default'); a name
    differing from exactly one head only in letter case, that head. Anything else raises ValueError
    with the one-line ``unknown`` (a name) or ``missing`` (no name), formatted with ``head`` and
    ``heads`` (a list). Unlike mace-torch, an unknown name never falls back to one of the heads."""
    heads = list(heads)
    if head is None:
        if len(heads) == 1:
            return 0
        defaults = [k for k, name in enumerate(heads) if str(name).lower() == "default"]
        if not defaults:
            raise ValueError(missing.format(head=head, heads=heads))
        return defaults[0]
    if head in heads:
        return heads.index(head)
    if isinstance(head, str):
        folded = [k for k, name in enumerate(heads) if str(name).lower() == head.lower()]
        if len(folded) == 1:
            return folded[0]
    raise ValueError(unknown.format(head=head, heads=heads))


def _head_index(head, heads) -> int:
    if head is None and not heads:
        return 0
    if head is None or isinstance(head, str):
        return head_index(head, heads or [], unknown="head: {head!r} is not one of the model's heads {heads}",
                          missing="head: the model has several heads {heads} and none is called 'default'; "
                                  "pass a head name")
    if not isinstance(head, int) or head < 0 or (heads is not None and head >= len(heads)):
        raise ValueError(f"head: expected a head name or an index < {len(heads) if heads else '?'}, got {head!r}")
    return head


def first_of_pairs(edge_index: torch.Tensor, unit_shifts: torch.Tensor) -> torch.Tensor:
    """Mask of the edges that come first in their pair: sender < receiver, or a periodic image of the
    same atom whose first non-zero shift component is positive (its reverse has the negated shift)."""
    s, r = edge_index[0], edge_index[1]
    sign = torch.zeros_like(s)
    for k in (2, 1, 0):  # the first non-zero component decides
        c = unit_shifts[:, k]
        sign = torch.where(c != 0, torch.sign(c).to(sign.dtype), sign)
    return (s < r) | ((s == r) & (sign > 0))


def both_halves(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Per-edge rows of the first half of paired edges, repeated for the second (None stays None)."""
    return None if t is None else torch.cat((t, t))


def with_reverses(edge_index: torch.Tensor, shifts: torch.Tensor, unit_shifts: Optional[torch.Tensor] = None):
    """Edges p (one per pair) followed by the same edges reversed: (edge_index [2, 2H], shifts,
    unit_shifts or None), the paired order of ``PAIRED_KEY``."""
    ei = torch.cat((edge_index, edge_index.flip(0)), 1)
    unit = None if unit_shifts is None else torch.cat((unit_shifts, -unit_shifts))
    return ei, torch.cat((shifts, -shifts)), unit


def _sorted_rows(rows: torch.Tensor) -> torch.Tensor:
    """``rows`` [E, C] in lexicographic order (stable sorts from the last column)."""
    order = torch.arange(rows.shape[0], device=rows.device)
    for c in range(rows.shape[1] - 1, -1, -1):
        order = order.index_select(0, torch.sort(rows[order, c], stable=True).indices)
    return rows.index_select(0, order)


def pair_edges(data: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``data`` with its edges in paired order (edge E/2 + p is edge p reversed) and ``PAIRED_KEY``
    set; the edge list must hold every edge's reverse (a full neighbour list), else ValueError."""
    ei, shifts = data["edge_index"], data["shifts"]
    unit = data.get("unit_shifts")
    first = first_of_pairs(ei, unit if unit is not None else shifts)
    idx, rest = torch.nonzero(first).squeeze(1), torch.nonzero(~first).squeeze(1)
    key = (unit if unit is not None else shifts).double()  # rows (sender, receiver, shift) compared exactly
    ours = torch.cat((ei.index_select(1, idx).flip(0).t().double(), -key.index_select(0, idx)), 1)
    theirs = torch.cat((ei.index_select(1, rest).t().double(), key.index_select(0, rest)), 1)
    if ours.shape != theirs.shape or not torch.equal(_sorted_rows(ours), _sorted_rows(theirs)):
        raise ValueError(f"data['edge_index']: pairing needs every edge's reverse (receiver and sender swapped, "
                         f"shift negated); {ei.shape[1]} edges, {idx.numel()} first of a pair")
    out = dict(data)
    out["edge_index"], out["shifts"], u = with_reverses(ei.index_select(1, idx), shifts.index_select(0, idx),
                                                       None if unit is None else unit.index_select(0, idx))
    if u is not None:
        out["unit_shifts"] = u
    out[PAIRED_KEY] = True
    return out


def atoms_list_to_data(atoms_list, r_max: float, atomic_numbers: Union[Sequence[int], torch.Tensor],
                       device: Union[str, torch.device, None] = None, dtype: Optional[torch.dtype] = None,
                       head: Union[int, str, None] = None, heads: Optional[Sequence[str]] = None
                       ) -> Dict[str, torch.Tensor]:
    """Several structures as one batch (torch_geometric ``Batch`` of per-structure graphs)."""
    from ase import Atoms  # noqa: PLC0415
    Batch, Data = pyg_data()

    if isinstance(atoms_list, Atoms) or not len(atoms_list):
        raise ValueError("atoms_list: expected a non-empty list of ase.Atoms")
    if not (isinstance(r_max, (int, float)) and r_max > 0):
        raise ValueError(f"r_max: expected a positive number, got {r_max!r}")
    dtype = dtype or torch.get_default_dtype()
    table = [int(z) for z in (atomic_numbers.tolist() if isinstance(atomic_numbers, torch.Tensor) else atomic_numbers)]
    index_of = {z: k for k, z in enumerate(table)}
    h = _head_index(head, heads)
    graphs = []
    for n, atoms in enumerate(atoms_list):
        if not isinstance(atoms, Atoms):
            raise TypeError(f"atoms_list[{n}]: expected ase.Atoms, got {type(atoms).__name__}")
        unknown = sorted(set(int(z) for z in atoms.numbers) - set(index_of))
        if unknown:
            raise ValueError(f"atoms_list[{n}]: atomic numbers {unknown} are not in the model's table {table}")
        pos = atoms.get_positions()
        edge_index, shifts, unit_shifts, cell = neighbour_list(pos, atoms.get_cell().array, atoms.get_pbc(), r_max)
        idx = torch.tensor([index_of[int(z)] for z in atoms.numbers], dtype=torch.long)
        graphs.append(Data(
            positions=torch.tensor(pos, dtype=dtype),
            node_attrs=torch.nn.functional.one_hot(idx, len(table)).to(dtype),
            edge_index=torch.from_numpy(edge_index),
            shifts=torch.tensor(shifts, dtype=dtype),
            unit_shifts=torch.tensor(unit_shifts, dtype=dtype),
            cell=torch.tensor(cell, dtype=dtype),
            head=torch.tensor([h], dtype=torch.long),
            num_nodes=len(atoms),
        ))
    batch = Batch.from_data_list(graphs)
    data = {k: batch[k] for k in ("positions", "node_attrs", "edge_index", "shifts", "unit_shifts", "cell", "head")}
    data["batch"], data["ptr"] = batch.batch, batch.ptr
    return {k: v.to(device) if device is not None else v for k, v in data.items()}
