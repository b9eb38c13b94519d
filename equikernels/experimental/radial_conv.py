"""Convolution with the radial MLP's last layer fused in:

    radial_conv(problem, x, y, h, weight, graph) == tensor_product_conv(problem, x, y, h @ weight, graph)

``h`` [E, H] is the radial MLP's last hidden activation (times the cutoff: the last layer is linear,
so ``(h3 @ W) * cutoff == (h3 * cutoff) @ W``), ``weight`` [H, weight_numel] its last layer (already
divided by sqrt(fan_in)). The fused kernels (codegen_radial_conv.py) form the per-edge weights in
registers and never write the [E, weight_numel] tensor, forward or backward.

When: the triton backend, float32/float64 operands of one dtype, a problem the generator takes
(channel-wise MACE convolutions; ``codegen_radial_conv.paths_of``), eager execution. Otherwise the
same value is computed unfused (``h @ weight`` then ``tensor_product_conv``), differentiable to any
order. The first backward runs the fused kernels; a backward that is itself being recorded (force
training: ``create_graph=True``) is composed from differentiable ops (the unfused convolution's
backward with ``w = h @ weight`` recomputed), so every higher derivative is exact.

Measured (H200, MACE-MP medium layer 2, 10,192 Cu atoms, fp32; docs/performance.md):
24x less extra memory than the unfused path for energy + forces, but 1.5x (forward) to 2.7x (E+F)
slower. It is the memory-lean option; radial_fusion decides when a MACE model uses it.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import settings
from ..problem import TPProblem
from ..ops.conv import ConvGraph, tensor_product_conv
from ..ops.conv_fused import ConvCall, cbwd
from ..ops.tp import autocast_dtype, check_same, is_eager, plan_of, resolve_backend, spec_of

KERNEL_DTYPES = (torch.float32, torch.float64)


def fusable(problem: TPProblem, hidden: int, layout: str = "mul_ir") -> Optional[str]:
    """None if the fused kernels take this problem and hidden width, else the reason."""
    from .codegen_radial_conv import block_width, paths_of  # noqa: PLC0415 (Triton imported on demand)
    paths, why = paths_of(plan_of(spec_of(problem, layout)))
    if paths is None:
        return why
    if not block_width(hidden):
        return f"hidden width {hidden} is not a power of two >= 16"
    return None


class _Static:
    """Not a tensor: autograd skips it. ``nodes``: the autograd nodes that receive each input's
    gradient (None where it needs none)."""
    __slots__ = ("kernels", "conv", "graph", "nodes")

    def __init__(self, kernels, conv, graph, nodes=()):
        self.kernels, self.conv, self.graph, self.nodes = kernels, conv, graph, nodes


def _grad_node(t: Tensor):
    """The node a gradient for ``t`` flows into (its grad_fn, or a leaf's AccumulateGrad)."""
    if not t.requires_grad:
        return None
    if t.grad_fn is not None:
        return t.grad_fn
    with torch.enable_grad():
        return t.view_as(t).grad_fn.next_functions[0][0]


def _wanted(st: _Static, flags):
    """needs_input_grad narrowed to what this backward pass will use: ``autograd.grad(E, positions)``
    of a model whose weights require grad does not want the weight gradient (forces in MD), and
    the fused weight-gradient kernel is then skipped, as autograd skips the unfused path's matmul."""
    try:
        if torch._C._current_graph_task_id() == -1 or len(st.nodes) != len(flags):
            return flags
    except AttributeError:  # private API; keep every gradient when it is unavailable
        return flags
    return tuple(f and _executes(n) for f, n in zip(flags, st.nodes))


def _executes(node) -> bool:
    if node is None:
        return False
    try:
        return bool(torch._C._will_engine_execute_node(node))
    except RuntimeError:  # a leaf under autograd.grad(): not answerable, assume wanted
        return True


class _RadialConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, h, w, st: _Static):
        ctx.save_for_backward(x, y, h, w)
        ctx.st = st
        return st.kernels.forward(x, y, h, w, st.graph)

    @staticmethod
    def backward(ctx, g):
        x, y, h, w = ctx.saved_tensors
        st, g = ctx.st, g.contiguous()
        nx, ny, nh, nw = _wanted(st, ctx.needs_input_grad[:4])
        if torch.is_grad_enabled():  # a higher derivative is being recorded: differentiable ops
            gx, gy, gh, gw = _composed_grads(st.conv, x, y, h, w, g, (nx, ny, nh, nw))
        else:
            gx, gy, gh, gw = st.kernels.backward(x, y, h, w, g, st.graph, nx, ny, nh, nw)
        return gx, gy, gh, gw, None


def _composed_grads(conv: ConvCall, x, y, h, w, g, flags):
    nx, ny, nh, nw = flags
    names = "".join(n for n, f in zip("xyw", (nx, ny, nh or nw)) if f)
    if not names:
        return None, None, None, None
    gx, gy, gwe = cbwd(conv, x, y, h @ w, g, names)
    gh = gwe @ w.t() if nh else None
    gW = h.t() @ gwe if nw else None
    return (gx if nx else None), (gy if ny else None), gh, gW


def radial_conv(problem: TPProblem, x: Tensor, y: Tensor, h: Tensor, weight: Tensor, graph: ConvGraph, *,
                layout: str = "mul_ir", backend: Optional[str] = None, fused: Optional[bool] = None) -> Tensor:
    """out[n] = sum over edges e with dst[e] == n of TP(x[src[e]], y[e], h[e] @ weight).

    x: [N, dim_in1] node features; y: [E, dim_in2] edge features; h: [E, H] per-edge hidden
    features; weight: [H, weight_numel]; graph: ``ConvGraph.build(src, dst, N)``. ``fused``: None =
    fused whenever the kernels take the call (``EQUIKERNELS_RADIAL_CONV=0`` turns that off), False
    = always unfused, True = fused or a ValueError saying why not."""
    if not isinstance(graph, ConvGraph):
        raise TypeError(f"graph: expected a ConvGraph (ConvGraph.build), got {type(graph).__name__}")
    if problem.shared_weights or not problem.weight_numel:
        raise ValueError("problem: radial_conv needs per-edge weights (shared_weights=False, weight_numel > 0)")
    for name, t in (("h", h), ("weight", weight)):
        if not isinstance(t, Tensor) or t.dim() != 2:
            raise ValueError(f"{name}: expected a 2-d tensor, got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
    if h.shape[0] != graph.num_edges:
        raise ValueError(f"h: expected one row per edge ({graph.num_edges}), got {h.shape[0]}")
    if weight.shape != (h.shape[1], problem.weight_numel):
        raise ValueError(f"weight: expected shape ({h.shape[1]}, {problem.weight_numel}) "
                         f"(h's width, the problem's weight_numel), got {tuple(weight.shape)}")
    check_same("h", h, x)
    check_same("weight", weight, x)
    be = resolve_backend(backend, x.device)
    why = _why_unfused(problem, x, y, h, weight, layout, be)
    if fused is None:
        fused = settings.get().radial_conv != "0" and why is None
    elif fused and why is not None:
        raise ValueError(f"fused=True: the fused radial convolution does not take this call ({why})")
    if not fused:
        return tensor_product_conv(problem, x, y, h @ weight, graph.src, graph.dst, graph.num_nodes, graph=graph,
                                   layout=layout, backend=be, validate=False)
    from .codegen_radial_conv import kernels_for  # noqa: PLC0415
    plan = plan_of(spec_of(problem, layout))
    ins = (x.contiguous(), y.contiguous(), h.contiguous(), weight.contiguous())
    nodes = tuple(_grad_node(t) for t in ins) if torch.is_grad_enabled() else ()
    st = _Static(kernels_for(plan, h.shape[1]), ConvCall(spec_of(problem, layout), graph, "deterministic", be, None, plan),
                 graph, nodes)
    return _RadialConv.apply(*ins, st)


def fused_available(problem: TPProblem, hidden: int, x: Tensor, layout: str = "mul_ir",
                    backend: Optional[str] = None) -> bool:
    """Whether ``radial_conv`` can run fused for node features like ``x`` (cheap: no kernel built)."""
    if resolve_backend(backend, x.device) != "triton" or x.dtype not in KERNEL_DTYPES or not is_eager(x):
        return False
    if problem.shared_weights or not problem.weight_numel:
        return False
    return fusable(problem, hidden, layout) is None


def _why_unfused(problem, x, y, h, weight, layout, backend) -> Optional[str]:
    if backend != "triton":
        return "reference backend"
    if not is_eager(x, y, h, weight):
        return "traced (torch.compile / export use the unfused custom ops)"
    if x.dtype not in KERNEL_DTYPES or any(t.dtype != x.dtype for t in (y, h, weight)):
        return "operands must all be float32 or all float64"
    if autocast_dtype(x) is not None:
        return "autocast"
    return fusable(problem, h.shape[1], layout)
