"""e3nn's ``FullyConnectedNet`` (the radial MLP of MACE, SevenNet and NequIP-style models) with its
constants folded into the weights.

e3nn scales each activation to unit second moment (``f(x) * cst``) and multiplies by
``sqrt(var_out)`` after it: two elementwise passes over the [edges, hidden] activations per hidden
layer, forward and backward. Both factors are constants in front of the next matmul, so they are
multiplied into the next layer's (small) weight instead: per layer ``x @ (W * scale)`` then the
bare activation. Same parameters and ``state_dict``; the scaled weights are kept between calls
while no weight requires a gradient and none has changed.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import nn

from .._compat import e3nn  # noqa: F401  (safe e3nn import first)
from ..nn.frozen import frozen_key, held, tracing
from ..ops.chain import functorch_wrapped
from ..ops.silu import silu
from .classes import accelerated_class, register_overrides
from .registry import Adapter, NotFused, register

try:
    from e3nn.nn._fc import _Layer as _E3nnLayer
except ImportError:  # another e3nn layout: the attribute check alone decides
    _E3nnLayer = None

MLP = "e3nn_mlp"


def _layers(net: nn.Module) -> List[nn.Module]:
    return [getattr(net, f"layer{i}") for i in range(len(net.hs) - 1)]


def _scale(carried: float, fan: float) -> float:
    """``carried / sqrt(fan)``; a layer of no inputs has an empty weight, which any scale leaves zero."""
    return carried / fan ** 0.5 if fan > 0 else 0.0


def _factors(net: nn.Module) -> Tuple[List[float], list, float]:
    """(weight scale per layer, activation per layer or None, factor after the last layer)."""
    scales, gates, carried = [], [], 1.0
    for layer in _layers(net):
        act = layer.act
        if act is None:
            scales.append(_scale(carried, layer.h_in * layer.var_in / layer.var_out))
            gates.append(None)
            carried = 1.0
        else:
            scales.append(_scale(carried, layer.h_in * layer.var_in))
            if hasattr(act, "f") and hasattr(act, "cst"):  # e3nn normalize2mom: f(x) * cst unless ~identity
                gates.append(silu if act.f is torch.nn.functional.silu else act.f)
                cst = 1.0 if getattr(act, "_is_id", False) else float(act.cst)
            else:
                gates.append(act)
                cst = 1.0
            carried = cst * layer.var_out ** 0.5
    return scales, gates, carried


def _frozen_weights(net: nn.Module) -> Optional[List[torch.Tensor]]:
    """The scaled weights, kept between calls while no weight takes gradients and none changed;
    None when one takes gradients, is transformed by torch.func or traced (each product then applies
    its scale itself)."""
    scales = net.__dict__["_ek_mlp"][0]
    ws = [layer.weight for layer in _layers(net)]
    if tracing() or any(w.requires_grad or functorch_wrapped(w) for w in ws):
        return None  # (a weight inside a torch.func transform has no storage to key a cache on)
    key = frozen_key(ws)
    cached = net.__dict__.get("_ek_mlp_w")
    if cached is None or cached[0] != key:
        cached = net.__dict__["_ek_mlp_w"] = (key, [w * s for w, s in zip(ws, scales)], held(ws))
    return cached[1]


def _forward(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if "_ek_mlp" not in net.__dict__:
        net.__dict__["_ek_mlp"] = _factors(net)
    scales, gates, tail = net.__dict__["_ek_mlp"]
    if torch.jit.is_tracing():  # a trace cannot hold (nor save) an autograd Function: torch's own silu
        gates = [torch.nn.functional.silu if g is silu else g for g in gates]
    frozen = _frozen_weights(net)
    if frozen is None:  # the scale as the product's alpha: one operation, no scaled copy per call
        zeros = net.__dict__.setdefault("_ek_zero", {})  # addmm's ignored input, kept per device and dtype
        traced = tracing()
        zero = None if traced else zeros.get((x.device, x.dtype))  # (a trace records each call)
        if zero is None:
            # not x.new_zeros: made inside a torch.func transform, that is a tensor invalid after it
            zero = torch.zeros((), device=x.device, dtype=x.dtype)
            if not traced:
                zeros[(x.device, x.dtype)] = zero
        lead = x.shape[:-1]  # e3nn's matmul takes any leading dimensions, addmm two-dimensional ones
        x = x.reshape(-1, x.shape[-1])
        for layer, s, gate in zip(_layers(net), scales, gates):
            x = torch.addmm(zero, x, layer.weight, beta=0, alpha=s)
            if gate is not None:
                x = gate(x)
        x = x.reshape(lead + x.shape[-1:])
    else:
        for w, gate in zip(frozen, gates):
            x = x @ w
            if gate is not None:
                x = gate(x)
    return x if tail == 1.0 else x * tail


def _overrides(cls: type) -> dict:
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():  # TorchScript compiles e3nn's own forward
            return self._ek_script_forward(x)
        return _forward(self, x)

    def restore(net: nn.Module) -> None:
        net.__dict__["_ek_mlp"] = _factors(net)

    forward.__doc__ = "e3nn's FullyConnectedNet forward, its constants folded into the weights."
    return {"forward": forward, "_ek_restore": restore}


register_overrides(MLP, _overrides)


def _matches(module: nn.Module) -> bool:
    return any(c.__name__ == "FullyConnectedNet" and c.__module__.startswith("e3nn.nn")
               for c in type(module).__mro__)


def _e3nn_net(cls: type) -> type:
    """e3nn's own ``FullyConnectedNet`` class among ``cls``'s bases."""
    return next(c for c in cls.__mro__ if c.__name__ == "FullyConnectedNet" and c.__module__.startswith("e3nn.nn"))


def _check(net: nn.Module) -> str:
    """Why the rewired forward cannot stand in for ``net``'s, or ""."""
    if type(net).forward is not _e3nn_net(type(net)).forward:  # the rewired forward would drop the subclass's
        return f"{type(net).__name__} overrides forward(); its semantics are unknown"
    try:
        layers = _layers(net)
        for layer in layers:
            _ = (layer.weight, layer.h_in, layer.var_in, layer.var_out, layer.act)
    except AttributeError as exc:
        return f"not e3nn's layer structure ({exc})"
    if _E3nnLayer is not None and any(type(layer).forward is not _E3nnLayer.forward for layer in layers):
        return "a layer's forward is not e3nn's"
    return ""


def _apply(net: nn.Module) -> str:
    if getattr(type(net), "_ek_adapter", None) == MLP:
        return ""
    why = _check(net)
    if why:
        raise NotFused(why)
    net.__dict__["_ek_mlp"] = _factors(net)
    net.__class__ = accelerated_class(MLP, type(net))
    hidden = sum(1 for g in net.__dict__["_ek_mlp"][1] if g is not None)
    return f"radial MLP {net.hs}: activation constants of {hidden} layer(s) folded into the weights"


register(Adapter(MLP, _matches, _apply, check=_check))
