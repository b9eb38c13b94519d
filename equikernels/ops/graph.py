"""The graph of a convolution: edges (src -> dst) with the sorted orders and CSR offsets its kernels
walk. Built once per graph (``ConvGraph.build``) and shared by every layer."""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Optional, Tuple

import torch
from torch import Tensor

from .chain import is_eager as _eager


@dataclass
class ConvGraph:
    """Edges (src -> dst) of a graph with ``num_nodes`` nodes, plus the orders the kernels need.

    ``perm_dst``: edge order sorted by (dst, src) (stable); ``ptr_dst[n]:ptr_dst[n+1]`` are the
    positions in that order of node n's incoming edges. ``perm_src`` / ``ptr_src`` likewise by src
    (the backward for x gathers by source; the graph need not be symmetric).

    ``build`` is traceable (torch.compile / export): no host synchronisation, node and edge
    counts may be symbolic; when traced, ``validate`` becomes an asynchronous assert in the graph
    (a RuntimeError instead of the eager IndexError).
    """
    src: Tensor
    dst: Tensor
    num_nodes: int
    perm_dst: Tensor
    ptr_dst: Tensor
    perm_src: Tensor
    ptr_src: Tensor
    # the src/dst tensors ``build`` was given (before the int64 cast), so that a call passing them
    # back is recognised by identity, without comparing values
    given: Tuple[Tensor, ...] = field(default=(), compare=False, repr=False)

    @property
    def num_edges(self) -> int:
        return self.src.shape[0]  # not int(): that would specialise a symbolic edge count

    @property
    def device(self) -> torch.device:
        return self.src.device

    def to(self, device) -> "ConvGraph":
        """This graph on ``device`` (itself when already there); the edges and orders are copied, not
        rebuilt."""
        device = torch.device(device)
        if self.src.device == device:
            return self
        moved = [t.to(device) for t in (self.src, self.dst, self.perm_dst, self.ptr_dst, self.perm_src, self.ptr_src)]
        return ConvGraph(moved[0], moved[1], self.num_nodes, *moved[2:])

    @staticmethod
    def build(src: Tensor, dst: Tensor, num_nodes: int, validate: bool = True, paired: bool = False) -> "ConvGraph":
        """``paired``: edge E/2 + p is edge p reversed (trusted, not checked); the source order is then
        the destination order's reverse edges (one sort instead of two)."""
        src, dst = _check_index("src", src), _check_index("dst", dst)
        if src.shape != dst.shape:
            raise ValueError(f"src and dst: expected the same shape [E], got {tuple(src.shape)} and {tuple(dst.shape)}")
        if src.device != dst.device:
            raise ValueError(f"src and dst: on different devices ({src.device}, {dst.device})")
        num_nodes = _node_count(num_nodes)
        if validate:
            _check_range("src", src, num_nodes, "num_nodes")
            _check_range("dst", dst, num_nodes, "num_nodes")
        src64, dst64 = src.long(), dst.long()
        perm_dst, ptr_dst = _order(dst64, src64, num_nodes)
        if paired:
            if src64.shape[0] % 2:
                raise ValueError(f"paired: needs an even number of edges, got {src64.shape[0]}")
            half = src64.shape[0] // 2
            # the edges leaving n are the reverses of those entering n, in the same order
            perm_src = torch.where(perm_dst < half, perm_dst + half, perm_dst - half)
            ptr_src = ptr_dst
        else:
            perm_src, ptr_src = _order(src64, dst64, num_nodes)
        return ConvGraph(src64.contiguous(), dst64.contiguous(), num_nodes, perm_dst, ptr_dst, perm_src, ptr_src,
                         (src, dst))

    def check_edges(self, src: Optional[Tensor], dst: Optional[Tensor]) -> None:
        """Raise unless ``src``/``dst`` are this graph's edges. None, the graph's own tensors or the
        ones it was built from pass by identity (no work, no host sync); other tensors are compared
        by value (one host sync when eager, an asynchronous assert when traced)."""
        for name, t, mine in (("src", src, self.src), ("dst", dst, self.dst)):
            if t is None or t is mine or (self.given and t is self.given[name == "dst"]):
                continue
            t = _check_index(name, t)
            if t.shape != mine.shape:
                raise ValueError(f"{name}: has {t.shape[0]} edges but graph was built for {mine.shape[0]}; "
                                 f"pass the graph's own {name} (graph.{name}) or None")
            if t.device != mine.device:
                raise ValueError(f"{name}: on {t.device}, graph is on {mine.device}")
            if t.device.type == "meta":  # no values to compare
                continue
            if not _eager(t):
                torch._assert_async((t.long() == mine).all(), f"{name}: differs from the edges graph was built for")
            elif not torch.equal(t.long(), mine):
                raise ValueError(f"{name}: differs from the edges graph was built for; build a ConvGraph for "
                                 f"these edges, or pass graph.{name} (or None)")


def _check_index(name: str, t) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of node indices, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: expected an int32 or int64 tensor, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name}: expected shape [E], got {tuple(t.shape)}")
    return t


def _node_count(n):
    """``n`` as an int (numpy and other integer scalars accepted), or a SymInt: a symbolic node
    count (x.shape[0]) under torch.compile(dynamic=True) / export."""
    if isinstance(n, bool) or not isinstance(n, (int, torch.SymInt)):
        if isinstance(n, (bool, Tensor)) or not hasattr(n, "__index__"):
            raise ValueError(f"num_nodes: expected a non-negative int, got {n!r} ({type(n).__name__})")
        n = operator.index(n)
    if n < 0:
        raise ValueError(f"num_nodes: expected a non-negative int, got {n!r}")
    return n


def _check_range(name: str, t: Tensor, n, label: str) -> None:
    """Indices of ``t`` must lie in [0, n). Eager: checked on the host, the error names the values
    found. Traced: an asynchronous assert in the graph (no host sync, no graph break). Meta tensors
    hold no values: nothing to check."""
    if t.device.type == "meta":
        return
    if not _eager(t):
        torch._assert_async(((t >= 0) & (t < n)).all(), f"{name}: node indices must lie in [0, {label})")
        return
    if t.numel():
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi >= n:
            raise IndexError(f"{name}: node indices must lie in [0, {n}) ({label}), got values in [{lo}, {hi}]")


INT32_KEYS_MAX_NODES = 46339  # (n + 1)^2 - 1 fits int32: sort keys of half the width, half the radix passes


def _order(key: Tensor, tie: Tensor, n):
    """Permutation sorting edges by (key, tie) and CSR offsets of key; deterministic, and free of
    host synchronisation (called every MD step); traceable with symbolic n."""
    if key.numel() == 0:
        return key.new_zeros(0), key.new_zeros(n + 1)
    if isinstance(n, int) and n <= INT32_KEYS_MAX_NODES:
        key, tie = key.int(), tie.int()
    perm = torch.sort(key * (n + 1) + tie, stable=True).indices  # ties < n + 1, so no collisions
    ptr = torch.searchsorted(key.index_select(0, perm), torch.arange(n + 1, device=key.device, dtype=key.dtype))
    return perm, ptr
