"""Checks of what goes into and comes out of the model, with messages that name the cause.

``check_structure`` refuses input a model cannot run (no atoms, non-finite positions or cell, a
periodic direction without a cell vector); ``check_stress_cell`` refuses stress without a 3-D
cell; ``check_finite`` refuses non-finite energies, forces, stress, per-atom stresses and virials,
Hessians or descriptors and says why when it can tell (atoms on top of each other, with their
indices).
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
from ase import Atoms
from ase.calculators.calculator import PropertyNotImplementedError

MIN_VOLUME = 1e-8      # A^3: below this the cell has no volume and stress is undefined
CLOSE_DISTANCE = 0.1   # A: atoms closer than this coincide for any interatomic potential
_AXES = "abc"
# results checked for NaN or infinity: the calculator's, its per-atom ones and get_hessian's / get_descriptors'
CHECKED = ("energy", "forces", "stress", "stresses", "virials", "hessian", "descriptors")


class NonFiniteError(ValueError):
    """The model gave a NaN or infinite result (energy, forces, stress, Hessian, descriptors, ...)."""


class NoCellError(PropertyNotImplementedError, ValueError):
    """Stress (or per-atom stress) asked of a structure whose cell has no volume: ASE's
    ``PropertyNotImplementedError``, which ASE's own calculators raise there and ASE's tools catch,
    and a ``ValueError`` (an input the calculation cannot take)."""


def check_structure(atoms, what: str = "atoms", cell: bool = True) -> None:
    """Raise ``TypeError``/``ValueError`` naming ``what`` for a structure no model can evaluate
    (``cell=False`` skips the cell check, for a cell and pbc already checked)."""
    if not isinstance(atoms, Atoms):
        raise TypeError(f"{what} must be an ase.Atoms, got {type(atoms).__name__}")
    if len(atoms) == 0:
        raise ValueError(f"{what} is empty: the calculator needs at least one atom")
    with np.errstate(over="ignore", invalid="ignore"):
        suspect = not np.isfinite(atoms.positions.sum())  # one reduction per MD step (huge values may overflow it)
    if suspect:
        bad = np.flatnonzero(~np.isfinite(atoms.positions).all(axis=1))
        if bad.size:
            raise ValueError(f"{what}: positions of atoms {_indices(bad)} are not finite (NaN or infinite)")
    if not cell:
        return
    h = np.asarray(atoms.cell.array, dtype=float)
    if not np.isfinite(h).all():  # also along open directions: the model reads the cell there too
        raise ValueError(f"{what}: its cell is not finite (NaN or infinite: {h.tolist()}); set a finite cell, "
                         "or a zero cell for a molecule")
    pbc = np.broadcast_to(np.asarray(atoms.pbc, dtype=bool), (3,))
    if pbc.any():
        vectors = h[pbc]
        if np.linalg.matrix_rank(vectors, tol=1e-6) < len(vectors):
            axes = ", ".join(_AXES[k] for k in np.flatnonzero(pbc))
            raise ValueError(f"{what} is periodic along {axes} (pbc={pbc.tolist()}) but its cell vectors there are "
                             f"zero or degenerate ({h.round(6).tolist()}): set the cell of the periodic box, "
                             "or pbc=False for a molecule")


def check_stress_cell(atoms: Atoms, what: str = "atoms", prop: str = "stress") -> None:
    """Raise ``NoCellError`` when ``atoms`` has no 3-D cell to divide a stress by."""
    if abs(atoms.cell.volume) < MIN_VOLUME:
        raise NoCellError(f"{prop} was requested but {what} has a cell without volume ({atoms.cell.array.tolist()}); "
                          f"{prop} needs a 3-D cell (set atoms.cell, or do not ask for {prop})")


def close_pairs(atoms: Atoms, cutoff: float = CLOSE_DISTANCE, limit: int = 5) -> List[tuple]:
    """Up to ``limit`` pairs (i, j, distance) with i < j closer than ``cutoff`` (periodic images too)."""
    from ase.neighborlist import neighbor_list

    try:
        i, j, d = neighbor_list("ijd", atoms, cutoff, self_interaction=False)
    except Exception:  # noqa: BLE001 (a diagnosis must not hide the original problem)
        return []
    keep = i < j
    pairs = sorted(zip(d[keep].tolist(), i[keep].tolist(), j[keep].tolist()))
    return [(a, b, dist) for dist, a, b in pairs[:limit]]


def check_finite(results: Dict[str, np.ndarray], atoms: Atoms, what: str = "atoms") -> None:
    """Raise ``NonFiniteError`` when any of the ``CHECKED`` results present is NaN or infinite (each
    one named), naming the likely cause."""
    bad = [k for k in CHECKED if k in results and not np.isfinite(results[k]).all()]
    if not bad:
        return
    pairs = close_pairs(atoms)
    if pairs:
        listed = ", ".join(f"{a} and {b} ({d:.3g} A apart)" for a, b, d in pairs)
        cause = f"atoms coincide: {listed}; move them apart (closer than {CLOSE_DISTANCE} A)"
    else:
        cause = "no coincident atoms were found: check the structure (units are Angstrom) and the model"
    raise NonFiniteError(f"{what}: the model gave a non-finite {' and '.join(bad)} (NaN or infinite); {cause}")


def _indices(idx: np.ndarray, limit: int = 8) -> str:
    shown = ", ".join(str(int(k)) for k in idx[:limit])
    return shown + (f" ... ({idx.size} in all)" if idx.size > limit else "")
