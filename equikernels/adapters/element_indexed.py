"""Element-indexed products: a fully connected tensor product of node features with one-hot node
attributes (mace-torch's ``skip_tp``, SevenNet's ``SelfConnectionIntro``).

With exactly one-hot attributes each node's result is its features times its element's weight
block, so the product runs as ``ElementLinear`` on the same weight Parameter (nodes grouped by
element once per forward, the grouping shared by every such layer). Attributes that are not exactly
one-hot or that require a gradient, explicit weights and traced calls take the original product.
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch
from torch import nn

from ..models.element_linear import ElementLinear
from ..nn.tensor_product import TensorProduct
from ..problem import TPProblem, irreps_str
from .classes import accelerated_class, register_overrides
from .graph_cache import shared_element_groups
from .registry import NotFused

OVERRIDE = "element_linear"


def one_hot_groups(y, elements: int):
    """The shared element grouping of node attributes ``y`` [N, elements] if they are exactly one-hot
    (eager, no gradient), else None."""
    if (not isinstance(y, torch.Tensor) or y.dim() != 2 or y.shape[1] != elements or y.requires_grad
            or torch.compiler.is_compiling() or isinstance(y, torch._subclasses.FakeTensor)):
        return None
    return shared_element_groups(y)


def _elements(tp: TensorProduct) -> int:
    """The element count of ``tp``'s second input if it is ``E x 0e`` (one block of scalars), else 0."""
    irreps = tp.problem.irreps_in2
    return irreps[0][0] if len(irreps) == 1 and irreps[0][1:] == (0, 1) else 0


def _linear(tp: TensorProduct) -> ElementLinear:
    """The ElementLinear computing ``tp`` on one-hot attributes, on ``tp``'s own weight Parameter."""
    lin = tp.__dict__.get("_ek_lin")
    if lin is None or lin.weight is not tp.weight:
        p = tp.problem
        lin = ElementLinear(irreps_str(p.irreps_in1), _elements(tp), irreps_str(p.irreps_out), tp.layout)
        lin.weight = tp.weight  # shared, not registered on tp: state_dict keys stay the original's
        tp.__dict__["_ek_lin"] = lin
    return lin


def _overrides(cls: type) -> dict:
    def forward(self, x: torch.Tensor, y: torch.Tensor, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        if torch.jit.is_scripting():  # TorchScript compiles the product's own forward
            return self._ek_script_forward(x, y, weight)
        if (weight is None and isinstance(x, torch.Tensor) and x.dim() == 2 and x.dtype == self.weight.dtype
                and isinstance(y, torch.Tensor) and y.shape[:1] == x.shape[:1]):
            groups = one_hot_groups(y, _elements(self))
            if groups is not None:
                return _linear(self)(x, groups)
        return cls.forward(self, x, y, weight)

    forward.__signature__ = inspect.signature(cls.forward)
    forward.__doc__ = ("As the original product; on exactly one-hot ``y`` (no gradient) and the internal weight, "
                       "computed per element as ElementLinear.")
    return {"forward": forward}


register_overrides(OVERRIDE, _overrides)


def element_linear_apply(tp: nn.Module) -> str:
    """An adapter's ``apply`` for the product ``tp``: rewired, or NotFused with the reason."""
    if getattr(type(tp), "_ek_adapter", None) == OVERRIDE:
        return ""
    if not isinstance(tp, TensorProduct):
        raise NotFused(f"it is a {type(tp).__name__}, not an equikernels TensorProduct")
    ne = _elements(tp)
    if not ne:
        raise NotFused(f"its second input {tp.irreps_in2} is not one block of element scalars (E x 0e)")
    p = tp.problem
    if not isinstance(getattr(tp, "weight", None), nn.Parameter) or tp.weight.numel() != p.weight_numel:
        raise NotFused("it has no internal shared weight")
    lin = ElementLinear(irreps_str(p.irreps_in1), ne, irreps_str(p.irreps_out), tp.layout)
    links = [(i, 0, o, "uvw", True) for i, o, _, _ in lin.paths]
    want = TPProblem.create(irreps_str(p.irreps_in1), f"{ne}x0e", irreps_str(p.irreps_out), links)
    have = [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight) for i in p.instructions]
    if have != links or any(abs(a - b) > 1e-12 * abs(b) for a, b in zip(p.path_coefficients, want.path_coefficients)):
        raise NotFused("it is not the fully connected element-indexed product (instructions or normalisation differ)")
    tp.__class__ = accelerated_class(OVERRIDE, type(tp))
    return f"element-indexed product ({ne} elements) as ElementLinear: one matmul per element and block"
