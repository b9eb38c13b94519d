"""A MACE model pairs a full edge list itself: each edge with its reverse, so that the radial
embedding and MLPs run once per pair (``data.pair_edges``), for callers that pass mace-torch-style
data (``accelerate``d mace-torch models, mace-torch's calculator, scripts).

The ``pair_edges`` setting decides: "auto" pairs lists of at least ``AUTO_MIN_EDGES`` edges on CUDA
outside training (below that size the step is bound by the host, and pairing adds launches and a
sync; a training step, whose batches are new every step, measured no faster), "1" any list, "0"
none. A list without every reverse (a half list, ghost atoms) stays as it is, and the model
stops trying; a list that declares ``PAIRED_KEY`` (True or False) is left alone, as are calls that
return per-edge outputs (their rows follow the caller's edge order). The pairing of the last list
is kept while the same tensors come back unmodified (MD between neighbour-list rebuilds).
"""
from __future__ import annotations

from typing import Dict

import torch

from .. import settings
from ..nn.frozen import mode as frozen_mode
from ..nn.frozen import version
from .data import PAIRED_KEY, pair_edges

AUTO_MIN_EDGES = 150_000
EDGE_KEYS = ("edge_index", "shifts", "unit_shifts")


def auto_pairs(num_edges: int, device_type: str, training: bool) -> bool:
    """Whether "auto" pairs a list of ``num_edges`` edges on ``device_type``."""
    return device_type == "cuda" and num_edges >= AUTO_MIN_EDGES and not training


class EdgePairing:
    """``pairing(data, per_edge_outputs, training)`` -> ``data`` (checked by the model), or a copy of
    it with paired edges."""

    def __init__(self) -> None:
        self.refused = False  # a list without every reverse came: no more attempts
        self._last = None  # (source tensors and versions, paired edge entries)

    def __call__(self, data: Dict[str, torch.Tensor], per_edge_outputs: bool = False,
                 training: bool = False) -> Dict[str, torch.Tensor]:
        mode = settings.get().pair_edges
        ei = data["edge_index"]
        if mode == "0" or self.refused or per_edge_outputs or PAIRED_KEY in data or not ei.numel():
            return data
        if mode == "auto" and not auto_pairs(ei.shape[1], ei.device.type, training):
            return data
        if torch.compiler.is_compiling() or (ei.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return data  # pairing syncs
        sources = tuple((data[k], version(data[k])) for k in EDGE_KEYS if data.get(k) is not None)
        last = self._last
        if last is not None and last[2] == frozen_mode() and len(last[0]) == len(sources) and all(
                a is b and va == vb for (a, va), (b, vb) in zip(last[0], sources)):
            return {**data, **last[1]}
        try:
            paired = pair_edges(data)
        except ValueError:
            self.refused = True
            return data
        edges = {k: paired[k] for k in EDGE_KEYS + (PAIRED_KEY,) if k in paired}
        self._last = (sources, edges, frozen_mode())  # holds the sources: their ids cannot be reused while kept
        return {**data, **edges}
