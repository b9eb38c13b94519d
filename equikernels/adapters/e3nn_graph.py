"""Generic detector for e3nn-style message passing (NequIP and similar layers).

The layer's own ``forward`` is traced with torch.fx, every submodule kept as one call, and in the
traced graph each pattern

    msg = tp(x[src], y, w)           # or x.index_select(0, src); tp: TensorProduct, per-edge weights
    out = zeros(N, d).index_add(0, dst, msg)   # or a registered scatter-sum with dim=0, dim_size=N

is replaced by one fused convolution (``fused.message_passing``); everything else in the forward
(radial MLPs, normalisation, gates, residuals) runs as before. The rewritten forward is Python code
generated from the graph, installed on a same-name subclass of the layer's class.
"""
from __future__ import annotations

import inspect
import operator
import types
import warnings
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import fx, nn

from .._compat import e3nn  # noqa: F401  (safe e3nn import first)
from e3nn import math as e3nn_math  # noqa: E402
from ..nn.tensor_product import TensorProduct
from .classes import accelerated_class, forward_like, original_class, register_overrides
from .fused import fusable_tp, message_passing
from .registry import Adapter, NotFused, register

ADAPTER = "e3nn_graph"

# scatter function -> parser of its (args, kwargs) into (src, index, dim, dim_size) or None (unsupported)
SCATTERS: Dict[Callable, Callable[[tuple, dict], Optional[tuple]]] = {}


def register_scatter(fn: Callable, parse: Callable[[tuple, dict], Optional[tuple]]) -> None:
    """Declare ``fn`` a scatter-sum: traced as one call, matched through ``parse``."""
    SCATTERS[fn] = parse


def _torch_scatter_style(args, kwargs):
    """scatter_sum(src, index, dim=-1, out=None, dim_size=None[, reduce='sum'])."""
    names = ("src", "index", "dim", "out", "dim_size", "reduce")
    bound = dict(zip(names, args), **kwargs)
    if bound.get("out") is not None or bound.get("reduce", "sum") not in ("sum", "add"):
        return None
    return bound.get("src"), bound.get("index"), bound.get("dim", -1), bound.get("dim_size")


try:  # the common third-party scatter
    import torch_scatter  # noqa: F401
    for _f in ("scatter", "scatter_add", "scatter_sum"):
        register_scatter(getattr(torch_scatter, _f), _torch_scatter_style)
except Exception:  # noqa: BLE001 (absent or broken: nothing to register)
    pass


def _signature_style(fn: Callable) -> Callable[[tuple, dict], Optional[tuple]]:
    """A parser binding a call to ``fn``'s own signature (parameters ``src``, ``index``, ``dim_size``,
    optionally ``dim`` (absent: rows, as checked by ``_sums_rows``), ``out`` and ``reduce``)."""
    sig = inspect.signature(fn)

    def parse(args, kwargs):
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            return None
        bound.apply_defaults()
        a = bound.arguments
        if a.get("out") is not None or a.get("reduce", "sum") not in ("sum", "add"):
            return None
        return a["src"], a["index"], a.get("dim", 0), a.get("dim_size")
    return parse


def _sums_rows(fn: Callable, params) -> bool:
    """Whether ``fn(src, index, [dim=0,] dim_size=n)`` gives ``zeros(n, d).index_add(0, index, src)`` on a probe."""
    src = torch.arange(1.0, 16.0, dtype=torch.float64).reshape(5, 3)
    index = torch.tensor([2, 0, 2, 3, 0])
    want = torch.zeros(4, 3, dtype=torch.float64).index_add(0, index, src)
    kwargs = dict(dim_size=4, **({"dim": 0} if "dim" in params else {}))
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = fn(src, index, **kwargs)
    except Exception:  # noqa: BLE001 (anything else is not a scatter-sum we can stand in for)
        return False
    return isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)


def _find_scatters(forward: Callable) -> None:
    """Register the plain functions that ``forward`` calls by a global name and that are scatter-sums
    in torch_scatter's convention (``scatter(src, index, dim=0, dim_size=n)``, the helpers of NequIP,
    mace-torch and e3nn's example networks): their signature names ``src``, ``index`` and ``dim_size``
    and, on a probe, they sum rows as ``index_add`` does."""
    code, env = getattr(forward, "__code__", None), getattr(forward, "__globals__", None)
    if code is None or env is None:
        return
    for name in code.co_names:
        fn = env.get(name)
        if not isinstance(fn, types.FunctionType) or fn in SCATTERS or fn in _E3NN_LEAVES:
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        if (list(params)[:2] != ["src", "index"] or "dim_size" not in params
                or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values())):
            continue
        if _sums_rows(fn, params):
            register_scatter(fn, _signature_style(fn))


# e3nn functions kept as single calls in a traced layer: some versions assign into tensors inside
# them (0.4.4's soft_one_hot_linspace), which fx cannot trace
_E3NN_LEAVES = tuple(getattr(e3nn_math, n) for n in ("soft_one_hot_linspace", "soft_unit_step")
                     if callable(getattr(e3nn_math, n, None)))


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return True  # only the layer's own code is traced

    def trace(self, root, concrete_args=None):
        # torch.zeros(n, d) with traced sizes does not dispatch to fx; record it as one call
        real = torch.zeros

        def zeros(*args, **kwargs):
            flat = list(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else list(args)
            if any(isinstance(a, fx.Proxy) for a in flat + list(kwargs.values())):
                return self.create_proxy("call_function", real, args, kwargs)
            return real(*args, **kwargs)

        torch.zeros = zeros
        try:
            return super().trace(root, concrete_args)
        finally:
            torch.zeros = real


def _zeros_rows(base: fx.Node):
    """The row count of a zero tensor node (torch.zeros(n, d) / zeros((n, d)) / t.new_zeros(n, d)), else None."""
    if base.op == "call_function" and base.target is torch.zeros:
        shape = base.args
    elif base.op == "call_method" and base.target == "new_zeros":
        shape = base.args[1:]
    else:
        return None
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return shape[0] if len(shape) == 2 else None


def _gather(node) -> Optional[Tuple[fx.Node, fx.Node]]:
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[1], fx.Node):
        return node.args[0], node.args[1]
    if node.op == "call_method" and node.target == "index_select" and node.args[1] == 0:
        return node.args[0], node.args[2]
    if node.op == "call_function" and node.target is torch.index_select and node.args[1] == 0:
        return node.args[0], node.args[2]
    return None


def _scatter(user: fx.Node, msg: fx.Node):
    """(dst, num_nodes) if ``user`` sums ``msg``'s rows onto nodes, else None."""
    if user.op == "call_method" and user.target == "index_add" and len(user.args) == 4 and not user.kwargs:
        base, dim, dst, src = user.args
        rows = _zeros_rows(base) if isinstance(base, fx.Node) else None
        if src is msg and dim == 0 and rows is not None:
            return dst, rows
        return None
    if user.op == "call_function" and user.target in SCATTERS:
        parsed = SCATTERS[user.target](user.args, user.kwargs)
        if parsed is not None:
            src, index, dim, dim_size = parsed
            if src is msg and dim in (0, -2) and dim_size is not None:
                return index, dim_size
    return None


def message_like(tp: TensorProduct, x: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """A stand-in with the message tensor's shape, dtype and device for code that reads only those
    (``msg.shape[1]``, ``msg.dtype``): a zero-stride view, no [E, dim] memory."""
    dtype = tp.output_dtype or x.dtype
    return x.new_zeros((1, tp.problem.dim_out), dtype=dtype).expand(src.shape[0], tp.problem.dim_out)


_META = ("shape", "dtype", "device")


def _prune(graph: fx.Graph) -> None:
    """Erase the metadata reads (getattr / getitem / message_like) left without users."""
    changed = True
    while changed:
        changed = False
        for n in reversed(list(graph.nodes)):
            if n.users or n.op != "call_function":
                continue
            if n.target in (getattr, operator.getitem, message_like, torch.Tensor.size):
                graph.erase_node(n)
                changed = True


def _untraceable(layer: nn.Module) -> str:
    """Why the signature of ``layer``'s forward rules out tracing it, or ""."""
    sig = inspect.signature(original_class(layer).forward)
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        return "forward takes *args/**kwargs"
    if any(p.default is None for p in sig.parameters.values()):
        # fx cannot follow `arg is None` branches on a traced argument
        return "forward has optional (None-default) arguments"
    return ""


def rewrite(layer: nn.Module) -> Tuple[Callable, int, str]:
    """(forward function, number of fused patterns, why none was found)."""
    cls = original_class(layer)
    why = _untraceable(layer)
    if why:
        return None, 0, why
    _find_scatters(cls.forward)
    current, layer.__class__ = layer.__class__, cls  # trace the layer's own forward, not the fused one
    try:
        graph = _Tracer(autowrap_functions=tuple(SCATTERS) + _E3NN_LEAVES).trace(layer)
    except Exception as exc:  # noqa: BLE001 (data-dependent control flow and the like: leave the layer alone)
        return None, 0, f"forward is not traceable by torch.fx ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    finally:
        layer.__class__ = current
    pattern = "no gather -> TensorProduct(per-edge weights) -> scatter-sum pattern in forward"
    fused, why, shared = 0, "", ""
    for node in list(graph.nodes):
        if node.op != "call_module":
            continue
        tp = layer.get_submodule(node.target)
        if not isinstance(tp, TensorProduct):
            continue
        reason = fusable_tp(tp)
        if reason:  # a product with shared weights is no message passing: say so only if nothing else is found
            shared = shared or f"{node.target}: {reason}"
            continue
        gathered = _gather(node.args[0] if node.args else node.kwargs.get("x"))
        users = list(node.users)
        meta = [u for u in users if u.op == "call_function" and u.target is getattr and u.args[1] in _META]
        rest = [u for u in users if u not in meta]
        scattered = _scatter(rest[0], node) if len(rest) == 1 else None
        if gathered is None:
            why = why or f"the first input of {node.target} is not gathered from nodes (x[src], x.index_select(0, src))"
            continue
        if scattered is None:
            why = why or (f"the output of {node.target} is not only summed onto nodes (zeros(N, d).index_add(0, dst, "
                          "msg) or a scatter-sum such as scatter(msg, dst, dim=0, dim_size=N))")
            continue
        y = node.args[1] if len(node.args) > 1 else node.kwargs["y"]
        w = node.args[2] if len(node.args) > 2 else node.kwargs.get("weight")
        scatter = rest[0]
        with graph.inserting_before(node):
            tp_ref = graph.get_attr(node.target)
            stand_in = graph.call_function(message_like, (tp_ref, gathered[0], gathered[1]))
        for u in meta:
            u.replace_input_with(node, stand_in)
        with graph.inserting_before(scatter):
            new = graph.call_function(message_passing, (tp_ref, gathered[0], y, w, gathered[1], *scattered))
        scatter.replace_all_uses_with(new)
        base = scatter.args[0] if scatter.op == "call_method" else None
        for dead in (scatter, node, node.args[0] if node.args else node.kwargs["x"], base):
            if isinstance(dead, fx.Node) and not dead.users:
                graph.erase_node(dead)
        fused += 1
    if not fused:
        return None, 0, f"{pattern} ({why or shared or 'no TensorProduct called'})"
    _prune(graph)
    graph.lint()
    code = graph.python_code(root_module="self")
    namespace = dict(code.globals)
    exec(compile(code.src, f"<equikernels fused {type(layer).__name__}.forward>", "exec"), namespace)  # noqa: S102
    return namespace["forward"], fused, ""


def _overrides(cls: type) -> dict:
    def call(self, *args, **kwargs):
        fn = self.__dict__.get("_ek_forward")
        if fn is None:  # after unpickling: trace again
            fn, _, why = rewrite(self)
            if fn is None:  # e.g. its submodules were since replaced (e3nn.util.jit.compile scripts them)
                warnings.warn(f"{type(self).__name__}: the fused forward could not be rebuilt ({why}); "
                              "running the layer's own forward", stacklevel=3)
                fn = cls.forward
            self.__dict__["_ek_forward"] = fn
        return fn(self, *args, **kwargs)

    if isinstance(cls.forward, types.FunctionType) and not hasattr(cls.forward, "__wrapped__"):
        return {"forward": forward_like(cls.forward, call)}
    call.__signature__ = inspect.signature(cls.forward)
    call.__doc__ = cls.forward.__doc__
    return {"forward": call}


register_overrides(ADAPTER, _overrides)


def _own_forward(module: nn.Module) -> bool:
    """Whether a class above ``nn.Module`` defines ``forward`` (read from the classes' dicts: a
    ScriptModule's ``forward`` descriptor raises when read from its class)."""
    for klass in type(module).__mro__:
        if klass is nn.Module:
            return False
        if "forward" in vars(klass):
            return True
    return False


def _matches(module: nn.Module) -> bool:
    adapter = getattr(type(module), "_ek_adapter", None)
    if adapter == ADAPTER:  # fused by an earlier call: reported as such
        return True
    if adapter is not None or isinstance(module, TensorProduct):
        return False
    if not _own_forward(module):  # a container (ModuleList, ModuleDict) has no forward to fuse
        return False
    # message passing holds a tensor product fed with per-edge weights
    return any(isinstance(c, TensorProduct) and c.weight_numel and not fusable_tp(c) for c in module.children())


def _apply(module: nn.Module) -> str:
    if getattr(type(module), "_ek_adapter", None) == ADAPTER:
        return ""
    fn, n, why = rewrite(module)
    if fn is None:
        raise NotFused(why)
    module.__class__ = accelerated_class(ADAPTER, type(module))
    module.__dict__["_ek_forward"] = fn
    return f"{n} gather -> tensor product -> scatter-sum fused into tensor_product_conv"


register(Adapter(ADAPTER, _matches, _apply, check=_untraceable))
