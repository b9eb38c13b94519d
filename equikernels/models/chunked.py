"""Edge-chunked evaluation of an interaction's per-edge part, recomputed in the backward.

The memory of a large MACE system is per edge: the radial MLP's per-edge tensor-product weights
[E, weight_numel], its activations, ``w * cutoff``, and in the backward the weight gradient. The
convolution itself never materialises per-edge messages. ``chunked_edge_conv`` computes

    tensor_product_conv(problem, h, edge_attrs, radial_mlp(edge_feats) * cutoff, src, dst, N)

over chunks of destination nodes: a chunk is a contiguous node range [n0, n1) whose incoming
edges (contiguous in the graph's dst-sorted order ``perm_dst`` / ``ptr_dst``) number at most
``chunk_edges`` (a node with more incoming edges is a chunk of its own). Rows n0..n1 of the result
depend only on that chunk's edges, so the result is the concatenation of the chunks' outputs.
Each chunk runs the existing convolution on a local graph (its sources u = unique(src), sorted,
renumbered by rank; destinations shifted by n0; ``max(len(u), n1 - n0)`` nodes; node features
h[u] padded with zero rows) and keeps the first n1 - n0 rows.

With gradients on, each chunk (MLP, cutoff, local graph, convolution) runs under
``torch.utils.checkpoint.checkpoint(use_reentrant=False)``: the forward keeps only the chunk's
inputs (views of one dst-sorted copy of edge_attrs, edge_feats and cutoff per layer: 27 floats per
edge for MACE-MP-0's shapes), and
the backward recomputes one chunk at a time, freeing each recomputed tensor as soon as it is used.
Non-reentrant checkpointing is differentiable to any order (tests/models/test_chunked.py: a force
loss, ``create_graph=True``, differentiated again to the parameters), so force training works too;
there the recomputed graph is kept for the second backward, so chunking saves little memory in
training, only in energy + forces (MD, inference). Without gradients the chunks simply run in turn.

The values are the unchunked ones: per-edge weights and per-destination sums of messages are
computed in the same order; only the gradient of h sums its per-chunk parts in a different order.

When: ``InteractionBlock.edge_chunk`` (None = the environment) or ``EQUIKERNELS_EDGE_CHUNK``:
"auto" (``EDGE_CHUNK_DEFAULT``) chunks a layer only when its unchunked step would not fit in the
memory available on its device (free device memory plus the allocator's cached free blocks, or the
host's available memory on CPU): the step is estimated at ``STEP_BYTES_PER_WEIGHT_BYTE`` times the
per-edge weights E * weight_numel * itemsize, and must fit in ``MEMORY_MARGIN`` of what is
available. Chunks then hold ``CHUNK_FRACTION`` of the available memory each. The rule is the same
for every dtype; an integer setting is the number of edges per chunk (0 = never). Chunking
needs host synchronisation (chunk boundaries, unique sources), so it is never used while
torch.compile traces or a CUDA graph is captured: those paths always run unchunked.
``blocks.set_edge_chunk(model, value)`` sets every interaction of a model.
"""
from __future__ import annotations

import bisect
import functools
import os
import time
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .. import settings
from ..ops.conv import ConvGraph, tensor_product_conv
from ..problem import TPProblem

EDGE_CHUNK_ENV = "EQUIKERNELS_EDGE_CHUNK"
EDGE_CHUNK_DEFAULT = "auto"
# "auto": an unchunked step's peak is about this many times its per-edge weights (saved for the
# backward, their gradient, the radial MLP's activations); MACE-MP-0-medium on 795k edges peaks at
# 2.5-3x the weights of both layers in fp32 and fp64
STEP_BYTES_PER_WEIGHT_BYTE = 3
# "auto": run unchunked only when the estimated step fits in this fraction of the available memory
MEMORY_MARGIN = 0.8
# "auto", once chunking: each chunk's estimated step takes about this fraction of the available memory
CHUNK_FRACTION = 0.25
# "auto": a free-memory reading is reused for this long when it covers twice what a layer needs
FREE_TTL_S = 1.0
_FREE_SEEN: dict = {}  # device -> (time.monotonic() of the reading, free bytes)

EdgeChunk = Union[str, int]


def parse_edge_chunk(value, name: str = "edge_chunk") -> EdgeChunk:
    """"auto" or a non-negative number of edges per chunk (0 = never chunk); ValueError otherwise."""
    if isinstance(value, str):
        s = value.strip().lower()
        if s == "auto":
            return "auto"
        if s.isdigit():
            return int(s)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return int(value)
    raise ValueError(f"{name}: expected 'auto' or a non-negative integer (edges per chunk, 0 = never chunk), "
                     f"got {value!r}")


def edge_chunk_setting(setting: Optional[EdgeChunk] = None) -> EdgeChunk:
    """The setting in force: ``setting`` if given, else ``EQUIKERNELS_EDGE_CHUNK``, else the default."""
    if setting is not None:
        return parse_edge_chunk(setting)
    return settings.get().edge_chunk


def available_bytes(device: torch.device, needed: Optional[int] = None) -> int:
    """Bytes a step on ``device`` can still allocate: the device's free memory plus the blocks
    PyTorch's caching allocator holds unused (CUDA), or the host's available memory (CPU). With
    ``needed``, the device's free memory alone when it covers ``needed`` (the allocator's
    statistics cost about a millisecond of host time per query). A device reading younger than
    ``FREE_TTL_S`` that covers twice ``needed`` is reused without asking the driver again."""
    device = torch.device(device)
    if device.type == "cuda":
        seen = _FREE_SEEN.get(device)
        now = time.monotonic()
        if needed is not None and seen is not None and now - seen[0] < FREE_TTL_S and needed * 2 <= seen[1]:
            return seen[1]  # a reading this recent with twice the room: no query (about 50 us of host time)
        free, _ = torch.cuda.mem_get_info(device)
        _FREE_SEEN[device] = (now, int(free))
        if needed is not None and free >= needed:
            return int(free)
        stats = torch.cuda.memory_stats(device)
        return int(free + stats.get("reserved_bytes.all.current", 0) - stats.get("allocated_bytes.all.current", 0))
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # no sysconf: never chunk on the host
        return 1 << 62


def resolve_edge_chunk(setting: Optional[EdgeChunk], num_edges: int, weight_numel: int, itemsize: int,
                       device: Union[str, torch.device] = "cpu") -> int:
    """Edges per chunk for a layer with ``num_edges`` edges and ``weight_numel`` per-edge weights of
    ``itemsize`` bytes on ``device``; 0 = run unchunked (always while compiling or capturing a CUDA
    graph). "auto" chunks only when the estimated unchunked step does not fit (module docstring)."""
    if torch.compiler.is_compiling() or (torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()):
        return 0
    value = edge_chunk_setting(setting)
    num_edges = int(num_edges)
    if value == "auto":
        step_per_edge = max(1, weight_numel * itemsize * STEP_BYTES_PER_WEIGHT_BYTE)
        avail = available_bytes(device, needed=int(num_edges * step_per_edge / MEMORY_MARGIN) + 1)
        if num_edges * step_per_edge <= MEMORY_MARGIN * avail:
            return 0
        chunk = max(1, int(CHUNK_FRACTION * avail) // step_per_edge)
        return 0 if num_edges <= chunk else chunk
    return 0 if value == 0 or num_edges <= value else value


def chunk_plan(ptr_dst: List[int], chunk_edges: int) -> List[Tuple[int, int, int, int]]:
    """(n0, n1, e0, e1) per chunk: contiguous node ranges covering every node, each with at most
    ``chunk_edges`` incoming edges (positions e0:e1 of the dst-sorted order), except a node with
    more (with the edge-less nodes just before it). Every chunk has edges unless the graph has none."""
    if isinstance(chunk_edges, bool) or not isinstance(chunk_edges, int) or chunk_edges < 1:
        raise ValueError(f"chunk_edges: expected a positive integer, got {chunk_edges!r}")
    n = len(ptr_dst) - 1
    plan: List[Tuple[int, int, int, int]] = []
    n0 = 0
    while n0 < n:
        base = ptr_dst[n0]
        n1 = bisect.bisect_right(ptr_dst, base + chunk_edges, lo=n0 + 1) - 1  # the last with ptr <= limit
        if n1 <= n0 or ptr_dst[n1] == base:  # the next node with edges has too many: through it
            n1 = min(bisect.bisect_right(ptr_dst, base, lo=n0 + 1), n)
        if ptr_dst[n1] == base and plan:  # only edge-less nodes left: into the previous chunk
            plan[-1] = (plan[-1][0], n1, plan[-1][2], plan[-1][3])
        else:
            plan.append((n0, n1, base, ptr_dst[n1]))
        n0 = n1
    return plan


def edge_weights(radial_mlp: nn.Module, edge_feats: Tensor, cutoff: Optional[Tensor], dtype: torch.dtype,
                 paired: bool = False) -> Tensor:
    """Per-edge tensor-product weights ``radial_mlp(edge_feats) * cutoff`` in ``dtype``, the node
    features' (mixed precision: the MLP runs in the half type, as autocast would; edge_feats and
    cutoff stay full precision until here). ``paired``: edge_feats and cutoff are the first half of
    paired edges; the weights of both halves are returned."""
    x = edge_feats if edge_feats.dtype == dtype else edge_feats.to(dtype)
    c = None if cutoff is None else (cutoff if cutoff.dtype == dtype else cutoff.to(dtype))
    # the cutoff scales the MLP's last hidden rows (64 wide), not its [edges, weights] output
    return radial_mlp(x, paired=paired, row_scale=c)


def _chunk(problem: TPProblem, radial_mlp: nn.Module, layout: str, src: Tensor, dst: Tensor, n0: int, n1: int,
           h: Tensor, eidx: Tensor, edge_attrs: Tensor, edge_feats: Tensor, cutoff: Optional[Tensor]) -> Tensor:
    """Rows n0..n1 of the convolution from the chunk's edges ``eidx`` (edge tensors: its rows)."""
    src_c = src.index_select(0, eidx)
    u, local_src = torch.unique(src_c, sorted=True, return_inverse=True)
    m = n1 - n0
    local_n = max(int(u.shape[0]), m)
    graph = ConvGraph.build(local_src, dst.index_select(0, eidx) - n0, local_n, validate=False)
    x = h.index_select(0, u)
    if local_n > x.shape[0]:
        x = torch.nn.functional.pad(x, (0, 0, 0, local_n - x.shape[0]))
    w = edge_weights(radial_mlp, edge_feats, cutoff, h.dtype)
    out = tensor_product_conv(problem, x, edge_attrs, w, graph.src, graph.dst, local_n, graph=graph, layout=layout,
                              validate=False)
    return out[:m] if local_n > m else out


def chunked_edge_conv(problem: TPProblem, radial_mlp: nn.Module, h: Tensor, edge_attrs: Tensor, edge_feats: Tensor,
                      cutoff: Optional[Tensor], graph: ConvGraph, chunk_edges: int, layout: str) -> Tensor:
    """``tensor_product_conv(problem, h, edge_attrs, w, graph.src, graph.dst, graph.num_nodes,
    graph=graph, layout=layout)`` with ``w = radial_mlp(edge_feats) * cutoff`` (as
    ``InteractionBlock.forward``), evaluated in chunks of at most ``chunk_edges`` edges (see the
    module docstring); with gradients on, each chunk is recomputed in the backward."""
    ptr = graph.ptr_dst.tolist()  # one host sync
    plan = chunk_plan(ptr, chunk_edges)
    if len(plan) <= 1:  # one chunk (or no edges): unchunked
        return tensor_product_conv(problem, h, edge_attrs, edge_weights(radial_mlp, edge_feats, cutoff, h.dtype),
                                   graph.src, graph.dst, graph.num_nodes, graph=graph, layout=layout, validate=False)
    perm = graph.perm_dst
    params = [p for p in radial_mlp.parameters() if p.requires_grad]
    edge_ts = [t for t in (edge_attrs, edge_feats, cutoff) if t is not None]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in [h] + edge_ts + params)
    run = functools.partial(_chunk, problem, radial_mlp, layout, graph.src, graph.dst)
    # one dst-sorted copy of the edge features, split into the chunks: the split's backward
    # concatenates the chunks' gradients (an index_select per chunk would zero-fill E rows per chunk)
    sizes = [e1 - e0 for _, _, e0, e1 in plan]
    pieces = [torch.split(t.index_select(0, perm), sizes) for t in edge_ts]
    outs = []
    for i, (n0, n1, e0, e1) in enumerate(plan):
        args = (n0, n1, h, perm[e0:e1], pieces[0][i], pieces[1][i], pieces[2][i] if cutoff is not None else None)
        # with gradients: keep only the chunk's inputs, recompute it in the backward
        outs.append(checkpoint(run, *args, use_reentrant=False, preserve_rng_state=False) if grad else run(*args))
    return torch.cat(outs, 0)
