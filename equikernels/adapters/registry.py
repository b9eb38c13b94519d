"""Adapters that accelerate whole layers of known model families, registered in one place.

An adapter recognises a layer (``matches``) and rewires it in place (``apply``), keeping its class
name, parameters, ``state_dict`` keys and call signature; ``apply`` returns what it did ("" for a
layer it rewired in an earlier call) or raises ``NotFused`` with the reason. An adapter with a
``child`` attribute name rewires that submodule of the layers it matches (reported under the
submodule's name), alongside whichever layer adapter applies. ``accelerate_layers`` runs every
adapter over a model (after the module-by-module conversion of ``equikernels.nn.convert``) and
records the outcome in the report.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, List

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


def accelerate_layers(model: nn.Module, report, early: bool = False) -> None:
    """Apply the first matching layer adapter, and every matching child adapter, to every submodule
    of ``model`` (and ``model`` itself); appends (name, class, what) to ``report.fused`` and (name,
    class, why) to ``report.not_fused``. ``early``: only the adapters that run before the module
    conversion, else only the others."""
    _load()
    adapters = [a for a in ADAPTERS if a.early == early]
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
        for where, target, adapter in todo:
            _apply(adapter, where, target, report)


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
    # also "" (rewired by an earlier call): then neither fused now nor an e3nn module left alone
    report.left_alone[:] = [e for e in report.left_alone if e[0] != name]
