"""Dataset statistics a model needs: E0s (isolated-atom reference energies), the mean number of
neighbours, and the scale/shift of the interaction energy."""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

import numpy as np

from .data import Config, check_elements


def _composition(configs: Sequence[Config], z_table: Sequence[int]) -> np.ndarray:
    index = {int(z): k for k, z in enumerate(z_table)}
    counts = np.zeros((len(configs), len(z_table)))
    try:
        for g, c in enumerate(configs):
            for z in c.atomic_numbers:
                counts[g, index[int(z)]] += 1
    except KeyError:  # an element the model lacks: named with its file and frame
        check_elements(configs, z_table)
        raise
    return counts


def average_e0s(configs: Sequence[Config], z_table: Sequence[int],
                fixed: Optional[Mapping[int, float]] = None) -> Dict[int, float]:
    """Least-squares E0 per element, E_total ≈ Σ_elements count·E0, for the elements present;
    the elements in ``fixed`` keep their given E0 (returned too) and only the others are fitted."""
    fixed = {int(z): float(e) for z, e in (fixed or {}).items()}
    labelled = [c for c in configs if c.energy is not None]
    if not labelled and not fixed:
        raise ValueError("e0s 'average' needs structures with energy labels")
    counts = _composition(labelled, z_table)
    free = [k for k in np.flatnonzero(counts.sum(axis=0) > 0) if int(z_table[k]) not in fixed]
    if not free:
        return fixed
    known = np.array([fixed.get(int(z), 0.0) for z in z_table])
    energies = np.array([c.energy for c in labelled]) - counts @ known
    sol, *_ = np.linalg.lstsq(counts[:, free], energies, rcond=None)
    return {**fixed, **{int(z_table[k]): float(e) for k, e in zip(free, sol)}}


def parse_given_e0s(values: Mapping, z_table: Sequence[int]) -> Dict[int, float]:
    """{'Cu': -3.5, 29: -3.5, '29': ...} -> {29: -3.5}; every key must be an element of the model."""
    from ase.data import atomic_numbers as symbol_to_z

    out = {}
    for key, energy in values.items():
        if isinstance(key, str) and key in symbol_to_z:
            z = symbol_to_z[key]
        else:
            try:
                z = int(key)
            except (TypeError, ValueError):
                raise ValueError(f"e0s: {key!r} is not an element symbol or atomic number") from None
        if z not in set(int(t) for t in z_table):
            raise ValueError(f"e0s: element {key!r} is not one of the model's elements {list(z_table)}")
        try:
            out[z] = float(energy)
        except (TypeError, ValueError):
            out[z] = float("nan")
        if isinstance(energy, bool) or not np.isfinite(out[z]):
            raise ValueError(f"e0s: the energy of {key!r} must be a finite number (eV), got {energy!r}")
    return out


def avg_num_neighbors(graphs) -> float:
    edges = sum(int(g.edge_index.shape[1]) for g in graphs)
    atoms = sum(int(g.num_nodes) for g in graphs)
    return edges / max(atoms, 1)


def scale_shift(configs: Sequence[Config], e0s: Mapping[int, float]):
    """Scale = RMS force component, shift = mean interaction energy per atom (energy minus E0s)."""
    forces = [c.forces.reshape(-1) for c in configs if c.forces is not None]
    scale = float(np.sqrt(np.mean(np.concatenate(forces) ** 2))) if forces else 1.0
    per_atom = [(c.energy - sum(e0s.get(int(z), 0.0) for z in c.atomic_numbers)) / c.num_atoms
                for c in configs if c.energy is not None]
    shift = float(np.mean(per_atom)) if per_atom else 0.0
    return (scale if scale > 1e-8 else 1.0), shift
