"""Keys of values derived from frozen weights and kept between calls (inference then repeats no
per-call weight work)."""
from __future__ import annotations

import functools
import types
from typing import Dict, Iterable, Sequence, Tuple

import torch


def tracing() -> bool:
    """Whether a tracer records the operations now (torch.compile or export, torch.jit.trace, or
    make_fx, which torch.export and nequip's compilation use): a value cached across calls would
    enter each trace as a constant, different from the operations the first trace recorded."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or make_fx_tracing()


def make_fx_tracing() -> bool:
    """Whether ``make_fx`` records the operations now (its proxy mode is active); False while dynamo
    traces (it cannot call the query, and its graphs are traced by AOT autograd afterwards)."""
    if torch.compiler.is_compiling():
        return False
    try:
        return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY) is not None
    except AttributeError:  # a torch without the query
        return False


def version(t: torch.Tensor) -> object:
    """``t._version``; for an inference tensor (no version counter) a new object equal to nothing, so
    a cache keyed by it is rebuilt on every call."""
    return object() if not torch.compiler.is_compiling() and t.is_inference() else t._version


def mode() -> bool:
    """Part of every cache key: values made under ``torch.inference_mode`` are inference tensors,
    which autograd outside it cannot save, so they are never served outside it (nor the reverse)."""
    return not torch.compiler.is_compiling() and torch.is_inference_mode_enabled()  # dynamo cannot trace it


def outside_inference_mode(forward):
    """``forward`` run outside ``torch.inference_mode`` (under ``torch.no_grad``) when it is called
    inside: the constants and caches it makes on first use are then ordinary tensors that later calls
    recorded by autograd can use (inference tensors cannot be saved for backward). Its outputs are
    ordinary tensors too."""
    def wrapper(*args, **kwargs):
        if not torch.compiler.is_compiling() and torch.is_inference_mode_enabled():  # dynamo cannot trace it
            with torch.inference_mode(False), torch.no_grad():
                return forward(*args, **kwargs)
        return forward(*args, **kwargs)
    # a code object of its own per forward: torch.compile's recompile limit counts per code object,
    # and one shared by every module class would spend one budget for all of them
    code = wrapper.__code__.replace(co_name=forward.__name__, co_qualname=forward.__qualname__) \
        if hasattr(wrapper.__code__, "co_qualname") else wrapper.__code__.replace(co_name=forward.__name__)
    own = types.FunctionType(code, wrapper.__globals__, forward.__name__, wrapper.__defaults__, wrapper.__closure__)
    return functools.wraps(forward)(own)


def frozen_key(ts: Sequence[torch.Tensor]) -> Tuple[object, ...]:
    """The values of ``ts`` as torch tracks them: storage address, version, dtype, device (and the
    inference mode). A cache under this key must also keep ``held(ts)``: a tensor given new storage
    (``p.data = t``) keeps its version, and only while its old storage is alive can no new one take
    the old address. A write into the same storage through ``p.data`` is not seen
    (``load_state_dict`` and in-place writes under ``torch.no_grad()`` are)."""
    return (mode(),) + tuple((t.data_ptr(), version(t), t.dtype, t.device) for t in ts)


def held(ts: Sequence[torch.Tensor]) -> tuple:
    """Views of ``ts`` that keep their storages alive, to be kept next to a value cached under
    ``frozen_key(ts)`` (tensors, not storages: ``torch.save`` stores a view with its base once)."""
    return tuple(t.detach() for t in ts)


def state_without(module: torch.nn.Module, caches: Iterable[str]) -> Dict:
    """``module.__dict__`` without its ``caches`` entries, for ``__getstate__``: a pickled, copied or
    saved module carries no per-call values (per-node tensors of the last system among them); they
    are rebuilt on first use."""
    state = module.__dict__.copy()
    for k in caches:
        state.pop(k, None)
    return state
