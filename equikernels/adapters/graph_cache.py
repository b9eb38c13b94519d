"""One ``ConvGraph`` per graph, shared by every fused layer of a model, and one element grouping per
node-attribute tensor, shared by every element-indexed layer."""
from __future__ import annotations

import threading
from typing import Optional, Tuple

import torch

from ..models.element_linear import ElementGroups
from ..nn.frozen import tracing
from ..ops.conv import ConvGraph


def _key(t: torch.Tensor) -> Optional[tuple]:
    """Where ``t`` lives and its version; None for a tensor whose in-place writes cannot be seen
    (an inference tensor has no version counter), which is then never looked up in a cache."""
    if t.is_inference():
        return None
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t._version,
            t.dtype, t.device)


def _check_ranges(src: torch.Tensor, dst: torch.Tensor, n: int) -> None:
    """Node indices of both edge ends in [0, n): one host synchronisation for the four bounds."""
    ints = (torch.int32, torch.int64)
    if src.dim() != 1 or dst.shape != src.shape or not src.numel() or src.dtype not in ints or dst.dtype not in ints:
        return  # types and shapes are checked by ConvGraph.build; no edges, nothing to check
    lo_s, hi_s, lo_d, hi_d = torch.stack([t.long() for t in (src.min(), src.max(), dst.min(), dst.max())]).tolist()
    for name, lo, hi in (("src", lo_s, hi_s), ("dst", lo_d, hi_d)):
        if lo < 0 or hi >= n:
            raise IndexError(f"{name}: node indices must lie in [0, {n}) (num_nodes), got values in [{lo}, {hi}]")


class GraphCache:
    """Remembers the last graph built: layers that gather and scatter with the same index tensors
    (the same storage, view and version) in one forward share its sorted orders and offsets.

    The entry holds the index tensors themselves, so their memory cannot be handed to a new
    tensor while the entry lives (a new graph at the same address is a new key). Under tracing
    (torch.compile, export, make_fx, torch.jit.trace) nothing is cached: the graph is built inside
    the trace, with no host synchronisation. Index tensors made under ``torch.inference_mode`` are
    not cached either (their in-place writes bump no version): every call builds their graph."""

    def __init__(self) -> None:
        self._entry: Optional[Tuple[tuple, tuple, ConvGraph]] = None

    def get(self, src: torch.Tensor, dst: torch.Tensor, num_nodes) -> ConvGraph:
        if tracing() or isinstance(src, torch._subclasses.FakeTensor):
            return ConvGraph.build(src, dst, num_nodes)
        ks, kd = _key(src), _key(dst)
        key = (ks, kd, int(num_nodes))
        entry = self._entry
        if ks is not None and kd is not None and entry is not None and entry[0] == key:
            return entry[2]
        _check_ranges(src, dst, int(num_nodes))
        with torch.inference_mode(False):  # a kept graph serves later calls, which autograd may record
            graph = ConvGraph.build(src, dst, num_nodes, validate=False)
        self._entry = (key, (src, dst), graph) if ks is not None and kd is not None else None
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


class ElementCache:
    """Remembers the element grouping of the last one-hot node-attribute tensor seen (same storage,
    view and version), so every element-indexed layer of one forward shares one grouping and one
    host synchronisation; attributes made under ``torch.inference_mode`` are grouped on every call."""

    def __init__(self) -> None:
        self._entry: Optional[Tuple[tuple, torch.Tensor, Optional[ElementGroups]]] = None

    def get(self, attrs: torch.Tensor) -> Optional[ElementGroups]:
        key = _key(attrs)
        entry = self._entry
        if key is not None and entry is not None and entry[0] == key:
            return entry[2]
        with torch.inference_mode(False):  # kept groupings serve later calls, which autograd may record
            groups = _one_hot_groups(attrs)
        self._entry = (key, attrs, groups) if key is not None else None
        return groups

    def clear(self) -> None:
        self._entry = None


def _one_hot_groups(attrs: torch.Tensor) -> Optional[ElementGroups]:
    """Nodes grouped by element if every row of ``attrs`` [N, elements] is exactly one-hot, else None."""
    n, ne = attrs.shape
    if n == 0 or ne == 0:
        return None
    element = torch.argmax(attrs, dim=1)
    exact = (attrs == torch.nn.functional.one_hot(element, ne).to(attrs.dtype)).all()
    stats = torch.cat([torch.bincount(element, minlength=ne), exact.long().view(1)]).tolist()  # one host sync
    if not stats[-1]:
        return None
    perm = torch.sort(element, stable=True).indices
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(n, device=perm.device)
    runs, start = [], 0
    for z, count in enumerate(stats[:-1]):
        if count:
            runs.append((z, start, start + count))
            start += count
    return ElementGroups(element, perm, inverse, runs)


def shared_element_groups(attrs: torch.Tensor) -> Optional[ElementGroups]:
    """The element grouping of one-hot node attributes ``attrs`` [N, elements] from this thread's
    cache (None if a row is not exactly one-hot): built once per attribute tensor and shared by
    every element-indexed layer given it."""
    cache = getattr(_SHARED, "elements", None)
    if cache is None:
        cache = _SHARED.elements = ElementCache()
    return cache.get(attrs)


def clear_shared() -> None:
    """Forget this thread's shared graph and element grouping (their memory is freed once no model
    output or autograd graph still uses them)."""
    for name in ("cache", "elements"):
        cache = getattr(_SHARED, name, None)
        if cache is not None:
            cache.clear()
