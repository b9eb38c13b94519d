"""A cheap first test for ASE's "did the structure change since the last calculation".

ASE asks the calculator for forces several times per MD step (the integrator, its observers, the
logger), and each time compares the stored structure with the current one through ``np.allclose``
on every array: at 10,000 atoms about 2 ms per step. Exact equality of the same arrays implies
ASE's answer "no change", and costs a fraction of it; anything else goes to ASE's own comparison.
"""
from __future__ import annotations

import numpy as np
from ase import Atoms
from ase.calculators.calculator import all_changes

_ARRAYS = tuple(p for p in all_changes if p not in ("cell", "pbc"))


def unchanged(old: Atoms, new: Atoms) -> bool:
    """True only when every property ASE compares is exactly equal (then ASE reports no change)."""
    if old is None or new is None or len(old) != len(new):
        return False
    if not (np.array_equal(old.pbc, new.pbc) and np.array_equal(old.cell.array, new.cell.array)):
        return False
    a, b = old.arrays, new.arrays
    for prop in _ARRAYS:
        if (prop in a) != (prop in b):
            return False
        if prop in a and not np.array_equal(a[prop], b[prop]):
            return False
    return True
