"""One ``ConvGraph`` per graph, shared by every fused layer of a model."""
from __future__ import annotations

import threading
from typing import Optional, Tuple

import torch

from ..ops.conv import ConvGraph


def _key(t: torch.Tensor) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t._version,
            t.dtype, t.device)


class GraphCache:
    """Remembers the last graph built: layers that gather and scatter with the same index tensors
    (the same storage, view and version) in one forward share its sorted orders and offsets.

    The entry holds the index tensors themselves, so their memory cannot be handed to a new
    tensor while the entry lives (a new graph at the same address is a new key). Under tracing
    (torch.compile / export) nothing is cached: the graph is built inside the trace, with no host
    synchronisation."""

    def __init__(self) -> None:
        self._entry: Optional[Tuple[tuple, tuple, ConvGraph]] = None

    def get(self, src: torch.Tensor, dst: torch.Tensor, num_nodes) -> ConvGraph:
        if torch.compiler.is_compiling() or isinstance(src, torch._subclasses.FakeTensor):
            return ConvGraph.build(src, dst, num_nodes)
        key = (_key(src), _key(dst), int(num_nodes))
        entry = self._entry
        if entry is not None and entry[0] == key:
            return entry[2]
        graph = ConvGraph.build(src, dst, num_nodes)
        self._entry = (key, (src, dst), graph)
        return graph

    def clear(self) -> None:
        self._entry = None



_SHARED = threading.local()


def shared_graph(src: torch.Tensor, dst: torch.Tensor, num_nodes) -> ConvGraph:
    """The graph of (src, dst, num_nodes) from this thread's cache: built once, then shared by every
    fused layer of every accelerated model that is given the same index tensors."""
    cache = getattr(_SHARED, "cache", None)
    if cache is None:
        cache = _SHARED.cache = GraphCache()
    return cache.get(src, dst, num_nodes)
