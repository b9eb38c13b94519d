"""Parameters given new storage, for the tests of the frozen-weight caches."""
import weakref

import numpy as np
import torch


def numpy_backed(p: torch.nn.Parameter) -> weakref.ref:
    """Gives ``p`` storage owned by a numpy array; returns a weak reference to that array."""
    arr = np.random.default_rng(0).standard_normal(tuple(p.shape)).astype(torch.empty(0, dtype=p.dtype).numpy().dtype)
    p.data = torch.from_numpy(arr)
    return weakref.ref(arr)


def swap_storage(p: torch.nn.Parameter, values: torch.Tensor) -> None:
    """The parameter's storage freed first, then new storage (often at the old address) given."""
    p.data = torch.empty(0, dtype=p.dtype)
    new = torch.empty(values.shape, dtype=p.dtype)
    new.copy_(values)
    p.data = new
