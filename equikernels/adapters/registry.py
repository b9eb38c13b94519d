"""Adapters that accelerate whole layers of known model families, registered in one place.

An adapter recognises a layer (``matches``) and rewires it in place (``apply``), keeping its class
name, parameters, ``state_dict`` keys and call signature; ``apply`` returns what it did ("" for a
layer it rewired in an earlier call) or raises ``NotFused`` with the reason. An adapter with a
``child`` attribute name rewires that submodule of the layers it matches (reported under the
submodule's name), alongside whichever layer adapter applies. ``accelerate_layers`` runs every
adapter over a model (after the module-by-module conversion of ``equikernels.nn.convert``) and
records the outcome in the report; ``recognised_layers`` lists, without changing anything, what a
fusing call would rewire.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Tuple

from torch import nn


class NotFused(Exception):
    """Raised by an adapter's ``apply``: the layer is recognised but cannot be rewired (the message says why)."""


@dataclass
class Adapter:
    name: str
    matches: Callable[[nn.Module], bool]
    apply: Callable[[nn.Module], str]
    child: str = ""  # set: ``matches`` sees the parent layer, ``apply`` gets ``getattr(parent, child)``
    early: bool = False  # runs before the module-by-module conversion (reads the original modules)
    # why ``apply`` would raise NotFused, found without changing the layer ("" when nothing known stops it)
    check: Optional[Callable[[nn.Module], str]] = None


ADAPTERS: List[Adapter] = []
# the generic detector last: family adapters take precedence
_FAMILIES = ("mace_model", "mace", "sevenn", "e3nn_mlp", "e3nn_gate", "e3nn_graph")
_loaded = False


def register(adapter: Adapter) -> Adapter:
    ADAPTERS[:] = [a for a in ADAPTERS if a.name != adapter.name] + [adapter]
    return adapter


def _load() -> None:
    global _loaded
    if not _loaded:
        for fam in _FAMILIES:
            importlib.import_module(f"{__package__}.{fam}")
        _loaded = True


def _targets(model: nn.Module, adapters: List[Adapter]) -> Iterator[Tuple[str, nn.Module, Adapter]]:
    """(name, module, adapter): the first matching layer adapter and every matching child adapter of
    every submodule of ``model`` (and ``model`` itself), each module once."""
    seen = set()
    for name, module in list(model.named_modules()):
        if id(module) in seen:
            continue
        seen.add(id(module))
        layer = next((a for a in adapters if not a.child and a.matches(module)), None)
        todo = [(name, module, layer)] if layer is not None else []
        for a in adapters:
            sub = getattr(module, a.child, None) if a.child else None
            if isinstance(sub, nn.Module) and a.matches(module):
                todo.append((f"{name}.{a.child}" if name else a.child, sub, a))
        yield from todo


def accelerate_layers(model: nn.Module, report, early: bool = False) -> None:
    """Apply the first matching layer adapter, and every matching child adapter, to every submodule
    of ``model`` (and ``model`` itself); appends (name, class, what) to ``report.fused``, (name,
    class, why) to ``report.not_fused`` and (name, class) to ``report.already``. ``early``: only the
    adapters that run before the module conversion, else only the others."""
    _load()
    for where, target, adapter in _targets(model, [a for a in ADAPTERS if a.early == early]):
        _apply(adapter, where, target, report)


def recognised_layers(model: nn.Module, report) -> None:
    """What ``accelerate_layers`` would rewire, left as it is: appends (name, class, why) to
    ``report.not_fused`` for every layer an adapter recognises, why being what the adapter's
    ``check`` finds or else "fuse=False"; layers rewired by an earlier call are skipped."""
    _load()
    names = set()
    for where, target, adapter in _targets(model, ADAPTERS):
        if where in names or _rewired(target, adapter):
            continue
        names.add(where)
        why = adapter.check(target) if adapter.check is not None else ""
        report.not_fused.append((where, type(target).__name__, why or "fuse=False"))


def _rewired(layer: nn.Module, adapter: Adapter) -> bool:
    """Whether an earlier call rewired ``layer``, or (as mace-torch's interaction blocks) a submodule of it for it."""
    return (getattr(type(layer), "_ek_adapter", None) is not None
            or any(getattr(type(c), "_ek_adapter", None) == adapter.name for c in layer.children()))


def _apply(adapter: Adapter, name: str, module: nn.Module, report) -> None:
    try:
        what = adapter.apply(module)
    except NotFused as exc:
        report.not_fused.append((name, type(module).__name__, str(exc)))
        return
    if what:
        report.fused.append((name, type(module).__name__, what))
    elif what is not None:  # "": rewired by an earlier call
        report.already.append((name, type(module).__name__))
