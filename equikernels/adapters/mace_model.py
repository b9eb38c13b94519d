"""mace-torch ``MACE`` / ``ScaleShiftMACE`` as a whole.

The model's ``forward`` runs an equikernels MACE built from the model's own structure
(``models.io.config_from_mace``) whose parameters and buffers *are* the mace-torch model's tensors
(the same objects, not copies): optimisers, ``load_state_dict``, EMA swaps and in-place edits act
on both, and gradients land on mace-torch's parameters. The call signature and output keys are
mace-torch's, so ``MACECalculator``, training and evaluation scripts run unchanged.

The structure is read when ``accelerate`` runs (before any layer is converted) and kept on the
model (pickled with it). The equikernels model is rebuilt when a parameter or buffer is replaced
by another tensor (``.to()``, ``.double()``) or a buffer changes in place (U tensors, E0, scale
and shift loaded from a file). While being compiled without a built model, and for a model whose
structure could not be read, the layer-by-layer acceleration (``adapters.mace``) runs instead.
TorchScript (``e3nn.util.jit.compile``, as mace-torch's training script and LAMMPS export run it)
compiles mace-torch's own forward.
"""
from __future__ import annotations

import inspect
from typing import Dict, List, Tuple

import torch
from torch import nn

from ..models.io import build, check_normalisation, config_from_mace, mace_key_map
from ..models.mace import MACE as EquikernelsMACE
from ..nn.frozen import mode, version
from .classes import accelerated_class, forward_like, original_class, register_overrides
from .registry import Adapter, NotFused, register

MODEL = "mace_model"
_CONFIG = "_equikernels_mace_config"  # (config, our key -> mace-torch key); pickled with the model


def _slots(model: nn.Module, keymap: Dict[str, str]) -> List[Tuple[str, nn.Module, str]]:
    """(our key, owning module, attribute) of every mace-torch tensor in ``keymap``."""
    out = []
    for ours, theirs in keymap.items():
        owner_name, _, attr = theirs.rpartition(".")
        out.append((ours, model.get_submodule(owner_name) if owner_name else model, attr))
    return out


def _current(owner: nn.Module, attr: str) -> torch.Tensor:
    t = owner._parameters.get(attr)
    return owner._buffers[attr] if t is None else t


def _stamp(t: torch.Tensor) -> tuple:
    """Changes when ``t`` is moved or converted, and, for a buffer, when it is modified in place
    (parameter values may change freely: they are shared)."""
    return (id(t), t.data_ptr(), None if isinstance(t, nn.Parameter) else version(t), mode())


def _build(model: nn.Module):
    cfg, keymap = model.__dict__[_CONFIG]
    slots = _slots(model, keymap)
    theirs = {ours: _current(owner, attr) for ours, owner, attr in slots}
    device = next(iter(theirs.values())).device
    twin = build(cfg, {k: t.detach() for k, t in theirs.items()}).to(device)
    for ours, t in theirs.items():  # our tensors replaced by mace-torch's own objects
        owner_name, _, attr = ours.rpartition(".")
        owner = twin.get_submodule(owner_name) if owner_name else twin
        owner._parameters.pop(attr, None)
        owner._buffers.pop(attr, None)
        (owner._parameters if isinstance(t, nn.Parameter) else owner._buffers)[attr] = t
    stamps = [_stamp(t) for t in theirs.values()]
    return twin, slots, stamps


def _twin(model: nn.Module):
    """The equikernels MACE sharing ``model``'s tensors, built on first use and after a change."""
    cached = model.__dict__.get("_ek_twin")
    if cached is None or any(_stamp(_current(owner, attr)) != stamp
                             for (_, owner, attr), stamp in zip(cached[1], cached[2])):
        cached = model.__dict__["_ek_twin"] = _build(model)
    twin = cached[0]
    if twin.training != model.training:
        twin.train(model.training)
    return twin


def _overrides(cls: type) -> dict:
    params = list(inspect.signature(cls.forward).parameters.values())[1:]
    names = [p.name for p in params]
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    ours = set(inspect.signature(EquikernelsMACE.forward).parameters)

    def call(self, *args, **kwargs):
        bound = dict(zip(names, args), **kwargs)
        data = bound.pop(names[0])
        # a mace-torch option the equikernels MACE lacks, left at its default, changes nothing
        extra = {k: v for k, v in bound.items() if k not in ours}
        if _CONFIG not in self.__dict__ or any(k not in defaults or v != defaults[k] for k, v in extra.items()):
            return cls.forward(self, *args, **kwargs)
        bound = {k: v for k, v in bound.items() if k in ours}
        if torch.compiler.is_compiling():
            cached = self.__dict__.get("_ek_twin")
            if cached is None:
                return cls.forward(self, *args, **kwargs)
            return cached[0](data, **bound)
        return _twin(self)(data, **bound)

    # mace-torch's signature (TorchScript, e3nn.util.jit.compile: mace-torch's own forward)
    forward = forward_like(cls.forward, call)
    forward.__doc__ = cls.forward.__doc__
    return {"forward": forward}


register_overrides(MODEL, _overrides)


def _matches(module: nn.Module) -> bool:
    return any(c.__module__.startswith("mace.modules") and c.__name__ in ("MACE", "ScaleShiftMACE")
               for c in original_class(module).__mro__)


def _apply(model: nn.Module) -> str:
    if getattr(type(model), "_ek_adapter", None) == MODEL:
        return ""
    try:
        cfg = config_from_mace(model)
        model.__dict__[_CONFIG] = (cfg, mace_key_map(model, cfg))
        # built now to check it; the model kept is built on the first call (after the layers are converted)
        check_normalisation(model, _build(model)[0])
    except (TypeError, ValueError, KeyError) as exc:
        model.__dict__.pop(_CONFIG, None)
        raise NotFused(str(exc).removeprefix("mace_model: ")) from None
    model.__class__ = accelerated_class(MODEL, type(model))
    return "whole model as an equikernels MACE sharing its parameters and buffers"


register(Adapter(MODEL, _matches, _apply, early=True))
