"""Keys of values derived from frozen weights and kept between calls (inference then repeats no
per-call weight work)."""
from __future__ import annotations

from typing import Dict, Iterable, Sequence, Tuple

import torch


def frozen_key(ts: Sequence[torch.Tensor]) -> Tuple[tuple, ...]:
    """The values of ``ts`` as torch tracks them: storage address, version, dtype, device. A cache
    under this key must also keep ``held(ts)``: a tensor given new storage (``p.data = t``) keeps its
    version, and only while its old storage is alive can no new one take the old address. A write
    into the same storage through ``p.data`` is not seen (``load_state_dict`` and in-place writes
    under ``torch.no_grad()`` are)."""
    return tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in ts)


def held(ts: Sequence[torch.Tensor]) -> tuple:
    """Views of ``ts`` that keep their storages alive, to be kept next to a value cached under
    ``frozen_key(ts)`` (tensors, not storages: ``torch.save`` stores a view with its base once)."""
    return tuple(t.detach() for t in ts)


def state_without(module: torch.nn.Module, caches: Iterable[str]) -> Dict:
    """``module.__dict__`` without its ``caches`` entries, for ``__getstate__``: a pickled, copied or
    saved module carries no per-call values (per-node tensors of the last system among them); they
    are rebuilt on first use."""
    state = module.__dict__.copy()
    for k in caches:
        state.pop(k, None)
    return state
