"""Graph convolution: out[dst[e]] += TP(x[src[e]], y[e], W[e]) over all edges.

Public entry: ``tensor_product_conv``. A ``ConvGraph`` holds the sorted orders and CSR offsets of
one graph; build it once (``ConvGraph.build``) and pass it to every layer.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import settings
from ..dtypes import STORAGE_DTYPES, acc_dtype
from ..problem import TPProblem
from .graph import ConvGraph, _check_range, _node_count
from .conv_fused import conv_bwd, conv_dbwd, conv_fwd, fused_conv  # noqa: F401 (registers the custom ops)
from .chain import autocast_dtype, in_transform
from .tp import LAYOUTS, _check_same, check_dtypes, resolve_backend, tensor_product

DATAFLOWS = ("auto", "atomic", "deterministic", "unfused")


def resolve_dataflow(dataflow: str, deterministic: Optional[bool], backend: str) -> Tuple[str, bool]:
    """(dataflow to run, whether the autotuner may still choose it)."""
    if dataflow not in DATAFLOWS:
        raise ValueError(f"dataflow: expected one of {DATAFLOWS}, got {dataflow!r}")
    det = deterministic if deterministic is not None else torch.are_deterministic_algorithms_enabled()
    if det and dataflow == "atomic":
        raise ValueError("dataflow='atomic' is not deterministic; use 'deterministic' or 'auto' with deterministic=True")
    if backend != "triton":
        return "unfused", False
    if dataflow == "auto":
        env = settings.get().conv_dataflow
        if env:
            return resolve_dataflow(env, deterministic, backend)[0], False
        # both fused dataflows walk each destination's edges; "atomic" adds the source-side gradients
        # (gx, dx) into their rows atomically instead of writing them per edge and summing them per
        # source: H200, MACE-MP medium L2, 10,192 atoms, backward 3.93 -> 3.30 ms, double backward
        # 8.74 -> 8.18 (kernels). So it is the default
        # unless determinism is asked for; the autotuner may revisit this per problem
        return ("deterministic" if det else "atomic"), not det
    return dataflow, False


def tensor_product_conv(problem: TPProblem, x: Tensor, y: Tensor, weight: Optional[Tensor], src: Optional[Tensor],
                        dst: Optional[Tensor], num_nodes: Optional[int] = None, *, graph: Optional[ConvGraph] = None,
                        layout: str = "mul_ir", backend: Optional[str] = None, dataflow: str = "auto",
                        deterministic: Optional[bool] = None, validate: bool = True,
                        math_dtype: Optional[torch.dtype] = None, output_dtype: Optional[torch.dtype] = None) -> Tensor:
    """out[n] = sum over edges e with dst[e] == n of TP(x[src[e]], y[e], weight[e] or weight).

    x: [N, dim_in1] node features; y: [E, dim_in2] edge features; weight: [E, weight_numel] per
    edge or [weight_numel] shared; src, dst: [E] int32/int64 node indices; num_nodes: rows of the
    output (default x.shape[0]). ``graph`` (from ``ConvGraph.build``) reuses sorted orders across
    layers; then ``src``/``dst`` may be None, and if given they must be the graph's edges (its own
    ``graph.src``/``graph.dst`` or the tensors it was built from are recognised by identity at no
    cost; other tensors are compared by value, a host sync, and a mismatch raises ValueError).
    Differentiable to any order in x, y and weight. Precision arguments and rules as
    ``ops.tensor_product`` (mixed float16/bfloat16/float32 operands, math in float32, output in
    ``output_dtype`` / the autocast dtype / x's); sums over edges of half-precision results are
    accumulated in float32 and rounded once.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    _warm(problem)
    for name, t, dim in (("x", x, problem.dim_in1), ("y", y, problem.dim_in2)):
        if not isinstance(t, Tensor) or t.dim() != 2 or t.shape[1] != dim:
            raise ValueError(f"{name}: expected a tensor of shape [rows, {dim}], got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
    n_out = x.shape[0] if num_nodes is None else _node_count(num_nodes)
    checked_src = graph is None and num_nodes is None  # build checks src < n_out = x.shape[0]
    if graph is None:
        if src is None or dst is None:
            raise ValueError("src and dst: required unless graph=ConvGraph.build(src, dst, num_nodes) is given")
        graph = ConvGraph.build(src, dst, n_out, validate)
    else:
        if not isinstance(graph, ConvGraph):
            raise TypeError(f"graph: expected a ConvGraph (ConvGraph.build), got {type(graph).__name__}")
        graph.check_edges(src, dst)
        if graph.num_nodes != n_out:
            raise ValueError(f"graph: built for {graph.num_nodes} nodes, but num_nodes is {n_out}")
        if graph.num_edges != y.shape[0]:
            raise ValueError(f"graph: has {graph.num_edges} edges, but y has {y.shape[0]} rows")
    if graph.src.device != x.device:
        raise ValueError(f"src/dst: device {graph.src.device} does not match x ({x.device})")
    if graph.num_edges != y.shape[0]:
        raise ValueError(f"y: expected one row per edge ({graph.num_edges}), got {y.shape[0]}")
    if validate and not checked_src:
        _check_range("src", graph.src, x.shape[0], "x.shape[0]")
    check_dtypes(math_dtype, output_dtype)
    for name, t in (("x", x), ("y", y)):
        if t.dtype not in STORAGE_DTYPES:
            raise TypeError(f"{name}: expected a float16, bfloat16, float32 or float64 tensor, got {t.dtype}")
    _check_same("y", y, x)
    nw = problem.weight_numel
    if nw:
        if weight is None:
            raise ValueError("weight: this tensor product has weights; pass weight")
        if isinstance(weight, Tensor) and weight.dtype not in STORAGE_DTYPES:
            raise TypeError(f"weight: expected a float16, bfloat16, float32 or float64 tensor, got {weight.dtype}")
        _check_same("weight", weight, x)
        want = (nw,) if problem.shared_weights else (graph.num_edges, nw)
        if tuple(weight.shape) != want:
            raise ValueError(f"weight: expected shape {want}, got {tuple(weight.shape)}")
    be = resolve_backend(backend, x.device)
    out_dtype = output_dtype or autocast_dtype(x) or x.dtype
    flow, tunable = resolve_dataflow(dataflow, deterministic, be)
    if flow != "unfused" and not torch.compiler.is_compiling() and in_transform():
        flow, tunable = "unfused", False  # torch.func transforms differentiate the products' plain form
    if flow != "unfused" and x.shape[0] != n_out:
        x = _node_rows(x, n_out)
    if tunable:
        flow = _tuned_dataflow(problem, x, y, weight, graph, layout, be, flow, math_dtype, out_dtype)
    if flow == "unfused":
        chunk = _cpu_chunk(problem, x, graph, be, out_dtype)
        if chunk:
            return _chunked(problem, x, y, weight, graph, n_out, layout, be, math_dtype, out_dtype, chunk)
        msgs = tensor_product(problem, x.index_select(0, graph.src), y, weight, layout=layout, backend=be,
                              math_dtype=math_dtype, output_dtype=acc_dtype(out_dtype))  # sum, then round
        return _segment_sum(msgs, graph, n_out).to(out_dtype)
    return fused_conv(problem, x, y, weight, graph, layout, be, flow, math_dtype, out_dtype)


def _node_rows(x: Tensor, n: int) -> Tensor:
    """``x`` with exactly ``n`` rows (the fused kernels index x and its gradients by the graph's
    nodes): rows past n (no edge leaves them) dropped, missing ones zeros; differentiable."""
    if x.shape[0] > n:
        return x.narrow(0, 0, n)
    return torch.cat([x, x.new_zeros(n - x.shape[0], x.shape[1])])


# Per-edge temporaries of one chunk of the CPU convolution stay well below glibc's largest mmap
# threshold (32 MiB): freed blocks are reused from the heap instead of being mapped and page-faulted
# anew (MACE E+F, 108 Cu atoms, 1 thread, fp64: 4.69 s all edges at once, 2.06 / 1.40 / 1.78 s in
# chunks of 16 / 8 / 4 MiB; fp32: 1.55 s, 0.81 s at 16 MiB, 0.68 s at 4 MiB)
CPU_CHUNK_BYTES = 8 << 20


def _cpu_chunk(problem: TPProblem, x: Tensor, graph: ConvGraph, backend: str, out_dtype) -> int:
    """Edges per chunk of the eager CPU convolution, or 0 to run all edges at once."""
    if backend != "cpu" or torch.compiler.is_compiling() or in_transform():  # (in place: no transforms)
        return 0
    widest = max(problem.dim_in1, problem.dim_out, 0 if problem.shared_weights else problem.weight_numel)
    itemsize = max(x.element_size(), acc_dtype(out_dtype).itemsize)
    chunk = max(1, CPU_CHUNK_BYTES // (widest * itemsize))
    return chunk if graph.num_edges > chunk else 0


def _chunked(problem: TPProblem, x: Tensor, y: Tensor, weight: Optional[Tensor], graph: ConvGraph, n_out: int,
             layout: str, backend: str, math_dtype, out_dtype, chunk: int) -> Tensor:
    """The unfused convolution ``chunk`` edges at a time, each chunk's messages added into the node
    rows (same sums, differentiable to any order)."""
    per_edge_w = weight is not None and problem.weight_numel and not problem.shared_weights
    out = x.new_zeros(n_out, problem.dim_out, dtype=acc_dtype(out_dtype))
    for s in range(0, graph.num_edges, chunk):
        n = min(chunk, graph.num_edges - s)
        msgs = tensor_product(problem, x.index_select(0, graph.src.narrow(0, s, n)), y.narrow(0, s, n),
                              weight.narrow(0, s, n) if per_edge_w else weight, layout=layout, backend=backend,
                              math_dtype=math_dtype, output_dtype=acc_dtype(out_dtype))
        out = out.index_add_(0, graph.dst.narrow(0, s, n), msgs)
    return out.to(out_dtype)


@torch.compiler.assume_constant_result
def _warm(problem: TPProblem) -> bool:
    """Fills the problem's cached properties outside the trace: dynamo cannot enter the lock of a
    first functools.cached_property access (Python < 3.12); once cached they are plain attributes."""
    return bool((problem.dim_in1, problem.dim_in2, problem.dim_out, problem.weight_numel))


def _tuned_dataflow(problem: TPProblem, x: Tensor, y: Tensor, weight: Optional[Tensor], graph: ConvGraph,
                    layout: str, backend: str, default: str, math_dtype=None, out_dtype=None) -> str:
    """The fused dataflow whose forward + backward (a training step's price) is fastest for this
    problem and graph size on this GPU, measured once and remembered (equikernels.tune)."""
    from .. import tune  # noqa: PLC0415
    if not tune.active(x.device):
        return default
    dt = f"{x.dtype}" if out_dtype in (None, x.dtype) and math_dtype is None else f"{x.dtype}>{out_dtype}/{math_dtype}"
    key = (f"{tune.device_key(x.device)}|conv|{problem.key()}|{layout}|{dt}|"
           f"N{tune.bucket(graph.num_nodes)}|E{tune.bucket(graph.num_edges)}")
    w0 = weight if weight is not None else x.new_empty(0)

    def step(flow: str):
        with torch.enable_grad():
            xs, ys, ws = (t.detach().requires_grad_() for t in (x, y, w0))
            out = fused_conv(problem, xs, ys, ws, graph, layout, backend, flow, math_dtype, out_dtype)
            torch.autograd.grad(out, (xs, ys, ws), torch.ones_like(out), allow_unused=True)

    cands = [{"dataflow": "deterministic"}, {"dataflow": "atomic"}]
    best = tune.choose(key, cands, lambda c: tune.time_ms(lambda: step(c["dataflow"]), x.device, reps=5),
                       {"dataflow": default})
    return best["dataflow"]


def _segment_sum(msgs: Tensor, graph: ConvGraph, n: int) -> Tensor:
    """Sum of edge rows per destination (index_add: the reference path), differentiable. With no
    edges the zeros still come from ``msgs`` (index_add of nothing), so they stay in its autograd
    graph: gradients through them are zeros, not missing."""
    return msgs.new_zeros(n, msgs.shape[1]).index_add(0, graph.dst, msgs)
