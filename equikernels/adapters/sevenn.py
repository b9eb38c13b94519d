"""SevenNet: ``IrrepsConvolution`` (sevenn.nn.convolution).

Its forward computes per-edge weights, ``message = convolution(x[edge_src], filter, weight)``,
``message_gather`` (scatter-sum onto ``edge_dst``, ``len(x)`` rows), divides by ``denominator``
and writes the result back into the data dict. The override does the same with the gather,
product and scatter as one fused convolution. Applied only where the installed sevenn's forward
is the one mirrored here (its source is checked) and the layer is not in LAMMPS parallel mode (a
layer switched to it later runs sevenn's own forward). A convolution on SevenNet's own accelerators
(cuEquivariance, FlashTP, OpenEquivariance) is kept as it is, said in the report.

``SelfConnectionIntro`` (the self connection of node features with one-hot node attributes): its
``fc_tensor_product`` runs as ``ElementLinear`` on the same weight (``element_indexed``).
"""
from __future__ import annotations

import inspect
from typing import Dict

import torch
from torch import nn

from .classes import accelerated_class, original_class, register_overrides
from .element_indexed import element_linear_apply
from .fused import fusable_tp, message_passing
from .registry import Adapter, NotFused, register

ADAPTER = "sevenn"
# the statements of IrrepsConvolution.forward that the override reproduces
_EXPECTED = ("weight = self.weight_nn(data[self.key_weight_input])", "x = data[self.key_x]",
             "edge_src = data[self.key_edge_idx][1]", "edge_dst = data[self.key_edge_idx][0]",
             "message = self.convolution(x[edge_src], data[self.key_filter], weight)",
             "x = message_gather(x, edge_dst, message)", "x = x.div(self.denominator)", "data[self.key_x] = x")


def _overrides(cls: type) -> dict:
    def forward(self, data: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        if torch.jit.is_scripting():  # TorchScript (sevenn's deploy) compiles sevenn's own forward
            return self._ek_script_forward(data)
        if getattr(self, "is_parallel", False):  # ghost-atom features: joined and split by sevenn's own forward
            return self._ek_script_forward(data)
        weight = self.weight_nn(data[self.key_weight_input])
        x = data[self.key_x]
        edge_index = data[self.key_edge_idx]
        x = message_passing(self.convolution, x, data[self.key_filter], weight, edge_index[1], edge_index[0],
                            x.shape[0])
        data[self.key_x] = x.div(self.denominator)
        return data

    forward.__signature__ = inspect.signature(cls.forward)
    forward.__doc__ = cls.forward.__doc__
    return {"forward": forward}


register_overrides(ADAPTER, _overrides)


# sevenn's convolution classes: the one rewired, and the one its accelerators' kernels run in
_CONVOLUTIONS = ("IrrepsConvolution", "IrrepsScatterGatterFusedConvolution")


def _matches(module: nn.Module) -> bool:
    cls = original_class(module)
    return cls.__module__.startswith("sevenn.") and cls.__name__ in _CONVOLUTIONS


def _foreign(module) -> str:
    """'' for an e3nn or equikernels module (or None), else its package and class, e.g.
    "cuequivariance_torch's ChannelWiseTensorProduct"."""
    if module is None:
        return ""
    root = type(module).__module__.split(".")[0]
    return "" if root in ("e3nn", "equikernels") else f"{root}'s {type(module).__name__}"


def _check(conv: nn.Module) -> str:
    """Why ``conv`` is kept as it is, or ""."""
    tp = getattr(conv, "convolution", None)
    if original_class(conv).__name__ != "IrrepsConvolution":
        product = f", running {_foreign(tp) or type(tp).__name__}" if tp is not None else ""
        return (f"sevenn's own fused convolution, from its FlashTP, OpenEquivariance or cuEquivariance "
                f"option{product}: kept as it is")
    if _foreign(tp):
        return f"its tensor product is {_foreign(tp)}, from a sevenn accelerator option: kept as it is"
    try:
        source = " ".join(inspect.getsource(original_class(conv).forward).split())
    except (OSError, TypeError) as exc:  # installed without its .py sources
        return f"the source of this sevenn's IrrepsConvolution.forward cannot be read ({exc})"
    missing = [s for s in _EXPECTED if " ".join(s.split()) not in source]
    if missing:
        return f"this sevenn version's IrrepsConvolution.forward differs from the one mirrored ({missing[0]!r})"
    if getattr(conv, "is_parallel", False):
        return "parallel (LAMMPS ghost-atom) mode"
    if tp is None:
        return "its tensor product is not built yet (lazy_layer_instantiate): call instantiate() first"
    return fusable_tp(tp)


def _apply(conv: nn.Module) -> str:
    if getattr(type(conv), "_ek_adapter", None) == ADAPTER:
        return ""
    why = _check(conv)
    if why:
        raise NotFused(why)
    conv.__class__ = accelerated_class(ADAPTER, type(conv))
    return "gather -> convolution -> message_gather fused into tensor_product_conv"


register(Adapter(ADAPTER, _matches, _apply, check=_check))


def _self_connection_matches(module: nn.Module) -> bool:
    cls = original_class(module)
    return cls.__module__.startswith("sevenn.") and cls.__name__ == "SelfConnectionIntro"


def _self_connection_apply(tp: nn.Module) -> str:
    if _foreign(tp):
        raise NotFused(f"it is {_foreign(tp)}, from a sevenn accelerator option: kept as it is")
    return element_linear_apply(tp)


register(Adapter("sevenn_self_connection", _self_connection_matches, _self_connection_apply, child="fc_tensor_product"))
