"""Build the model's input dictionary (mace-torch's keys) from tensors already on the device."""
from __future__ import annotations

from typing import Dict, Sequence

import numpy as np
import torch

from .neighbors import Edges

MAX_Z = 119  # atomic numbers 0..118


class AtomicNumbers:
    """Atomic numbers in one-hot order, with mace-torch's ``AtomicNumberTable`` interface."""

    def __init__(self, zs: Sequence[int]):
        self.zs = [int(z) for z in zs]

    def __len__(self) -> int:
        return len(self.zs)

    def __str__(self) -> str:
        return f"AtomicNumberTable: {tuple(self.zs)}"

    def index_to_z(self, index: int) -> int:
        return self.zs[index]

    def z_to_index(self, atomic_number: int) -> int:
        return self.zs.index(atomic_number)


class ElementTable:
    """Atomic number -> one-hot over the model's elements, as a device lookup (no Python loop)."""

    def __init__(self, atomic_numbers: Sequence[int], device: torch.device):
        self.atomic_numbers = [int(z) for z in atomic_numbers]
        lookup = torch.full((MAX_Z,), -1, dtype=torch.int64)
        for k, z in enumerate(self.atomic_numbers):
            lookup[z] = k
        # a copy: a view would dangle once multiprocessing moves the tensor into shared memory
        self._lookup_np = lookup.numpy().copy()
        self._lookup = lookup.to(device)

    def check(self, numbers: np.ndarray) -> None:
        numbers = np.asarray(numbers)
        bad = (numbers < 0) | (numbers >= MAX_Z)
        bad[~bad] = self._lookup_np[numbers[~bad]] < 0
        if bad.any():
            from ase.data import chemical_symbols
            unknown = sorted({int(z) for z in numbers[bad]})
            names = [chemical_symbols[z] if 0 <= z < MAX_Z else str(z) for z in unknown]
            known = [chemical_symbols[z] for z in self.atomic_numbers]
            raise ValueError(f"the structure contains elements the model does not know: {', '.join(names)} "
                             f"(atomic numbers {unknown}); the model knows {', '.join(known)}")

    def index(self, numbers: np.ndarray) -> np.ndarray:
        """Each atom's position in the model's element list; ``numbers`` must have passed :meth:`check`."""
        return self._lookup_np[np.asarray(numbers, dtype=np.int64)]

    def one_hot(self, numbers: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        """``numbers`` must have passed :meth:`check`."""
        z = torch.as_tensor(np.asarray(numbers, dtype=np.int64)).to(self._lookup.device)
        index = self._lookup[z]
        out = torch.zeros(index.shape[0], len(self.atomic_numbers), dtype=dtype, device=index.device)
        out.scatter_(1, index.unsqueeze(1), 1.0)
        return out


def single_graph(positions: torch.Tensor, node_attrs: torch.Tensor, edges: Edges, cell: torch.Tensor,
                 head: torch.Tensor, batch: torch.Tensor, ptr: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The dictionary mace-torch's ``AtomicData`` batch of one structure gives a model.
    ``batch``/``ptr``/``head`` are cached by the caller (they change only with the atom count)."""
    return {
        "positions": positions,
        "node_attrs": node_attrs,
        "edge_index": edges.edge_index,
        "shifts": edges.shifts,
        "unit_shifts": edges.unit_shifts,
        "cell": cell,
        "batch": batch,
        "ptr": ptr,
        "head": head,
    }
