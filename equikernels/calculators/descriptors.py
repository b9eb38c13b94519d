"""Per-atom descriptors of a MACE model: the node features each interaction layer produces."""
from __future__ import annotations

import operator
from typing import List, Optional

import torch

from .._compat import o3


def layer_irreps(model) -> List["o3.Irreps"]:
    """The irreps of each interaction layer's node features (its product block's output), in the
    order the model's ``node_feats`` output concatenates them."""
    products = getattr(model, "products", None)
    if products is None:
        raise TypeError(f"model: expected a MACE model with product blocks, got {type(model).__name__}")
    return [o3.Irreps(str(p.linear.irreps_out)) for p in products]


def descriptor_columns(layers: List["o3.Irreps"], invariants_only: bool, num_layers: int) -> torch.Tensor:
    """Columns of ``node_feats`` (mul_ir, layers concatenated) that make the descriptor: every
    column of the first ``num_layers`` layers (-1: all), or only their invariant (0e) channels."""
    count = _integer(num_layers)
    if count is None or not (count == -1 or 1 <= count <= len(layers)):
        raise ValueError(f"num_layers: expected -1 (all) or 1..{len(layers)}, got {num_layers!r}")
    keep = len(layers) if count == -1 else count
    cols, offset = [], 0
    for irreps in layers[:keep]:
        if invariants_only:
            for (mul, ir), seg in zip(irreps, irreps.slices()):
                if ir.l == 0 and ir.p == 1:
                    cols.append(torch.arange(offset + seg.start, offset + seg.stop))
        else:
            cols.append(torch.arange(offset, offset + irreps.dim))
        offset += irreps.dim
    return torch.cat(cols) if cols else torch.zeros(0, dtype=torch.int64)


def _integer(value) -> Optional[int]:
    """``value`` as an int when it is an integer of any kind (Python, NumPy, a one-element torch
    tensor such as a model's ``num_interactions``), else None; bools are not counts."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None
