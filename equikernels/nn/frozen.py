"""Keys of values derived from frozen weights and kept between calls (inference then repeats no
per-call weight work)."""
from __future__ import annotations

from typing import Sequence, Tuple

import torch


def frozen_key(ts: Sequence[torch.Tensor]) -> Tuple[tuple, ...]:
    """The values of ``ts`` as torch tracks them: storage address, version, dtype, device. A cache
    under this key must also hold ``storages(ts)``: a tensor given new storage (``p.data = t``) keeps
    its version, and only while its old storage is alive can no new one take the old address. A write
    into the same storage through ``p.data`` is not seen (``load_state_dict`` and in-place writes
    under ``torch.no_grad()`` are)."""
    return tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in ts)


def storages(ts: Sequence[torch.Tensor]) -> tuple:
    """The storages of ``ts``, to be held next to a value cached under ``frozen_key(ts)``."""
    return tuple(t.untyped_storage() for t in ts)
