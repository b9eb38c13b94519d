"""ASE's frame selection of a structures file, ``FILE@INDEX`` (an index or a slice of its frames)."""
from __future__ import annotations

import os
from typing import Tuple


def split_selection(structures: str) -> Tuple[str, str]:
    """``FILE@INDEX`` (ASE's frame selection: an index or a slice) -> (FILE, INDEX); a path that exists
    as written, or has no ``@`` in its name, is the whole file (INDEX ``:``)."""
    from ase.io.formats import string2index  # noqa: PLC0415

    if "@" not in os.path.basename(structures) or os.path.exists(structures):
        return structures, ":"
    path, index = structures.rsplit("@", 1)
    try:
        chosen = string2index(index)
    except ValueError:
        chosen = None
    if not isinstance(chosen, (int, slice)):  # ASE returns other text unchanged
        raise ValueError(f"{structures!r}: no such file, and {index!r} after '@' is not a frame selection such as "
                         "-1, :10 or ::2")
    return path, index


def select(frames: list, index: str, structures: str) -> list:
    """The frames ``index`` (as ``split_selection`` gives it) picks from ``frames``, at least one."""
    from ase.io.formats import string2index  # noqa: PLC0415

    chosen = string2index(index)
    if isinstance(chosen, slice):
        picked = frames[chosen]
    elif -len(frames) <= chosen < len(frames):
        picked = [frames[chosen]]
    else:
        picked = []
    if not picked:
        raise ValueError(f"{structures!r}: selects no frame (the file holds {len(frames)})")
    return picked
