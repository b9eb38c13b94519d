"""A cheap answer to ASE's "did the structure change since the last calculation".

ASE asks the calculator for forces several times per MD step (the integrator, its observers, the
logger), and each time compares the stored structure with the current one through ``np.allclose``
on every array: at 10,000 atoms about 2 ms per step. Exactly equal arrays are unchanged for ASE too
and cost a fraction of that to compare, so ``changes`` runs ASE's tolerance test only on the
properties that are not exactly equal.
"""
from __future__ import annotations

import numpy as np
from ase import Atoms
from ase.calculators.calculator import all_changes, equal

_ARRAYS = tuple(p for p in all_changes if p not in ("cell", "pbc"))


def changes(old: Atoms, new: Atoms, tol: float = 1e-15, excluded=()) -> list:
    """The properties ASE's ``compare_atoms(old, new, tol, excluded)`` reports as changed (as a set:
    the order may differ): exactly equal ones are unchanged for it too, so only the others are
    tested with its tolerance."""
    if old is None:
        return list(all_changes)
    out = []
    for prop in ("cell", "pbc"):
        a, b = getattr(old, prop), getattr(new, prop)
        if prop not in excluded and not (np.array_equal(a, b) or equal(a, b, atol=tol)):
            out.append(prop)
    a, b = old.arrays, new.arrays
    for prop in _ARRAYS:
        if prop in excluded:
            continue
        if (prop in a) != (prop in b):
            out.append(prop)
        elif prop in a and not (np.array_equal(a[prop], b[prop]) or equal(a[prop], b[prop], atol=tol)):
            out.append(prop)
    return out
