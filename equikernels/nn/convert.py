"""Convert e3nn modules to equikernels ones, one module at a time: ``from_e3nn`` (a whole model:
``equikernels.accelerate``).

Converted modules hold the *same* Parameter objects as the originals (optimisers, weight tying and
``state_dict`` keep working) and the same buffers, so ``state_dict()`` is unchanged by conversion.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Tuple

from torch import nn

from .._compat import o3
from . import linear as _linear
from . import spherical_harmonics as _sh
from . import tensor_product as _tp

__all__ = ["from_e3nn", "why_not_convertible"]

# e3nn class name -> equikernels class; subclasses that do not override forward map to TensorProduct
_TP_CLASSES = {
    "TensorProduct": _tp.TensorProduct,
    "FullyConnectedTensorProduct": _tp.FullyConnectedTensorProduct,
    "ElementwiseTensorProduct": _tp.ElementwiseTensorProduct,
    "FullTensorProduct": _tp.FullTensorProduct,
    "TensorSquare": _tp.TensorSquare,
}
_OURS = (_tp.TensorProduct, _linear.Linear, _sh.SphericalHarmonics)


def _e3nn_tp_target(module) -> Tuple[Optional[type], str]:
    """The equikernels class for an e3nn TensorProduct (sub)class, or (None, why not)."""
    cls = type(module)
    e3nn_cls = getattr(o3, cls.__name__, None)
    if e3nn_cls is cls and cls.__name__ in _TP_CLASSES:
        return _TP_CLASSES[cls.__name__], ""
    # a user subclass: safe only if it computes what o3.TensorProduct computes
    base = next(c for c in cls.__mro__ if c.__module__.startswith("e3nn.") and c.__name__ in _TP_CLASSES)
    for meth in ("forward", "right"):
        if getattr(cls, meth) is not getattr(base, meth):
            return None, f"{cls.__name__} overrides {meth}(); its semantics are unknown"
    return _TP_CLASSES[base.__name__], ""


def _adopt(new: nn.Module, old: nn.Module, names) -> None:
    """Make ``new`` hold ``old``'s tensors under ``names`` (Parameters shared, buffers shared)."""
    for n in names:
        t = getattr(old, n)
        if n in old._parameters:
            setattr(new, n, t)
        else:
            if n in new._parameters:
                del new._parameters[n]
            new.register_buffer(n, t, persistent=n not in old._non_persistent_buffers_set)
    new.train(old.training)


def _convert_tp(module, cls: type):
    # e3nn keeps only the *normalised* path weights sqrt(alpha) in .instructions. Rebuilding with
    # path_weight = pw**2 and no normalisation gives coefficient sqrt(pw**2) == pw exactly (IEEE
    # sqrt of a correctly rounded square returns the original number), whatever in1_var/out_var/
    # irrep_normalization/path_normalization the original was built with.
    instr = [(i.i_in1, i.i_in2, i.i_out, i.connection_mode, i.has_weight, i.path_weight ** 2)
             for i in module.instructions]
    new = cls.__new__(cls)  # bypass the subclass constructor: irreps/instructions come from `module`
    # built without internal weights (no torch.randn: converting must not advance the RNG), then
    # given the original's Parameter
    _tp.TensorProduct.__init__(
        new, module.irreps_in1, module.irreps_in2, module.irreps_out, instr,
        irrep_normalization="none", path_normalization="none",
        internal_weights=False, shared_weights=module.shared_weights)
    new.internal_weights = module.internal_weights
    new.problem = dataclasses.replace(new.problem, internal_weights=module.internal_weights).with_sizes()
    if cls is _tp.TensorSquare:
        new.irreps_in = module.irreps_in
    _adopt(new, module, ("weight", "output_mask"))
    for name in ("_compiled_main_left_right", "_compiled_main_right"):  # the exact persisted constants
        gen = getattr(module, name, None)
        if isinstance(gen, nn.Module):
            setattr(new, name, _tp._CodegenConstants(gen.state_dict(keep_vars=True)))
    return new


def _convert_linear(module):
    w = module.weight
    f_in = f_out = None
    if module.internal_weights and w.dim() == 3:  # weights [f_in, f_out, numel]
        f_in, f_out = int(w.shape[0]), int(w.shape[1])
    weighted = [(i.i_in, i.i_out) for i in module.instructions if i.i_in != -1]
    has_bias = {i.i_out for i in module.instructions if i.i_in == -1}
    kw = dict(f_in=f_in, f_out=f_out, internal_weights=False, shared_weights=module.shared_weights,
              instructions=weighted, biases=[o in has_bias for o in range(len(module.irreps_out))])
    # e3nn stores neither f_in nor path_normalization; its normalised path weights must match one
    # of the candidates, else f_in was used with external weights (it changes the input shape too)
    for path_normalization in ("element", "path"):
        new = _linear.Linear(module.irreps_in, module.irreps_out, path_normalization=path_normalization, **kw)
        if all(a[:3] == b[:3] and math.isclose(a.path_weight, b.path_weight, rel_tol=1e-12)
               for a, b in zip(new.instructions, module.instructions)):
            break
    else:
        raise TypeError("o3.Linear: could not recover its f_in/f_out (external weights with f_in?); "
                        "build equikernels.Linear with the same arguments instead")
    new.internal_weights = module.internal_weights
    new.instructions = list(module.instructions)  # the exact numbers
    new._set_weight_index_slices()
    _adopt(new, module, ("weight", "bias", "output_mask"))
    new.__dict__.pop("_plan", None)  # the plan built at construction saw external weights: rebuild it
    new._derived()
    return new


def _convert_sh(module):
    new = _sh.SphericalHarmonics(list(module._ls_list), module.normalize, module.normalization,
                                 irreps_in=module.irreps_in)
    new.train(module.training)
    return new


def why_not_convertible(module) -> Optional[str]:
    """None if ``module`` can be converted, else the reason."""
    if isinstance(module, o3.TensorProduct):
        cls, why = _e3nn_tp_target(module)
        return None if cls is not None else why
    if isinstance(module, (o3.Linear, o3.SphericalHarmonics)):
        if type(module) not in (o3.Linear, o3.SphericalHarmonics):
            base = o3.Linear if isinstance(module, o3.Linear) else o3.SphericalHarmonics
            if type(module).forward is not base.forward:
                return f"{type(module).__name__} overrides forward(); its semantics are unknown"
        return None
    return "no equikernels equivalent"


def from_e3nn(module: nn.Module) -> nn.Module:
    """The equikernels module equivalent to an e3nn one, sharing its Parameters and buffers.

    Supported: ``o3.TensorProduct`` and its subclasses (FullyConnected, Elementwise, Full,
    TensorSquare, and user subclasses that keep e3nn's forward), ``o3.Linear``,
    ``o3.SphericalHarmonics``.
    """
    if isinstance(module, _OURS):
        return module
    why = why_not_convertible(module)
    if why is not None:
        raise TypeError(f"from_e3nn: cannot convert {type(module).__module__}.{type(module).__qualname__} ({why}); "
                        "supported: o3.TensorProduct and subclasses, o3.Linear, o3.SphericalHarmonics; "
                        "equikernels.accelerate(model) also rewires whole layers (FullyConnectedNet, Gate, "
                        "graph convolutions) in place")
    if isinstance(module, o3.TensorProduct):
        return _convert_tp(module, _e3nn_tp_target(module)[0])
    if isinstance(module, o3.Linear):
        return _convert_linear(module)
    return _convert_sh(module)
