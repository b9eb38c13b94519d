"""Convert e3nn modules to equikernels ones: ``from_e3nn`` (one module) and ``accelerate`` (a model).

Converted modules hold the *same* Parameter objects as the originals (optimisers, weight tying and
``state_dict`` keep working) and the same buffers, so ``state_dict()`` is unchanged by conversion.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from torch import nn

from .._compat import o3
from . import linear as _linear
from . import spherical_harmonics as _sh
from . import tensor_product as _tp

__all__ = ["from_e3nn", "accelerate", "AccelerateReport"]

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
    new.problem = dataclasses.replace(new.problem, internal_weights=module.internal_weights)
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
    _adopt(new, module, ("weight", "bias", "output_mask"))
    return new


def _convert_sh(module):
    new = _sh.SphericalHarmonics(list(module._ls_list), module.normalize, module.normalization,
                                 irreps_in=module.irreps_in)
    new.train(module.training)
    return new


def _why_not(module) -> Optional[str]:
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
    why = _why_not(module)
    if why is not None:
        raise TypeError(f"from_e3nn: cannot convert {type(module).__module__}.{type(module).__qualname__} ({why}); "
                        "supported: o3.TensorProduct and subclasses, o3.Linear, o3.SphericalHarmonics")
    if isinstance(module, o3.TensorProduct):
        return _convert_tp(module, _e3nn_tp_target(module)[0])
    if isinstance(module, o3.Linear):
        return _convert_linear(module)
    return _convert_sh(module)


@dataclass
class AccelerateReport:
    """What ``accelerate`` did: ``replaced`` (name, e3nn type, new type), ``left_alone`` (name, type,
    reason) for e3nn modules it kept, ``fused`` (name, layer class, what) for whole layers rewired
    in place by an adapter (``equikernels.adapters``) and ``not_fused`` (name, class, reason) for
    layers an adapter recognised but left as they were."""
    replaced: List[Tuple[str, str, str]] = field(default_factory=list)
    left_alone: List[Tuple[str, str, str]] = field(default_factory=list)
    fused: List[Tuple[str, str, str]] = field(default_factory=list)
    not_fused: List[Tuple[str, str, str]] = field(default_factory=list)

    @property
    def fused_names(self) -> List[str]:
        return [n for n, _, _ in self.fused]

    @property
    def replaced_names(self) -> List[str]:
        return [n for n, _, _ in self.replaced]

    @property
    def left_alone_names(self) -> List[str]:
        return [n for n, _, _ in self.left_alone]

    def __len__(self) -> int:
        return len(self.replaced)

    def __str__(self) -> str:
        lines = [f"equikernels.accelerate: replaced {len(self.replaced)} module(s), "
                 f"left {len(self.left_alone)} e3nn module(s) alone, fused {len(self.fused)} layer(s), "
                 f"left {len(self.not_fused)} recognised layer(s) unfused"]
        lines += [f"  fused       {n or '<root>'}: {t} ({what})" for n, t, what in self.fused]
        lines += [f"  not fused   {n or '<root>'}: {t} ({why})" for n, t, why in self.not_fused]
        lines += [f"  replaced    {n or '<root>'}: {a} -> {b}" for n, a, b in self.replaced]
        lines += [f"  left alone  {n or '<root>'}: {t} ({why})" for n, t, why in self.left_alone]
        return "\n".join(lines)


def _is_e3nn(module) -> bool:
    """An instance of an e3nn class or of a subclass of one."""
    return any(c.__module__.split(".")[0] == "e3nn" for c in type(module).__mro__)


def _accelerate_why_not(module) -> Optional[str]:
    """None if ``accelerate`` replaces this e3nn module, else why it keeps it."""
    why = _why_not(module)
    if why is None and type(module).__module__.split(".")[0] != "e3nn":
        # a user subclass may add attributes or methods that the rest of the model relies on
        return ("user-defined subclass of an e3nn module; convert it explicitly with "
                "equikernels.from_e3nn if its extras are not needed")
    return why


def accelerate(model: nn.Module, fuse: bool = True) -> AccelerateReport:
    """Replace, in place, every supported e3nn submodule of ``model`` (at any depth, including inside
    ModuleList/Sequential/ModuleDict and e3nn containers such as ``nn.Gate``) by its equikernels
    equivalent sharing the same Parameters. ``model.state_dict()`` is unchanged. A module reached
    through several parents is converted once and stays shared.

    With ``fuse`` (default), whole layers are then rewired by the adapters of
    ``equikernels.adapters``: message passing (gather -> tensor product with per-edge weights ->
    scatter-sum) becomes one fused convolution on a graph shared by every layer, and mace-torch's
    symmetric contraction runs as generated kernels; the layers keep their class names,
    parameters, ``state_dict`` keys and call signatures. The report lists what was fused and why
    a recognised layer was not.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if _is_e3nn(model) and _accelerate_why_not(model) is None:
        raise TypeError(f"model: {type(model).__name__} is itself a supported e3nn module and cannot be replaced "
                        "in place; use equikernels.from_e3nn(model)")
    report = AccelerateReport()
    done = {}  # id(old module) -> new module

    def walk(parent: nn.Module, prefix: str, report_e3nn: bool) -> int:
        """Convert below ``parent``; returns how many modules were replaced there."""
        count = 0
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            full = f"{prefix}.{name}" if prefix else name
            if id(child) in done:
                setattr(parent, name, done[id(child)])
                continue
            why = _accelerate_why_not(child) if _is_e3nn(child) else None
            if _is_e3nn(child) and why is None:
                new = from_e3nn(child)
                done[id(child)] = new
                setattr(parent, name, new)
                report.replaced.append((full, type(child).__name__, f"equikernels.{type(new).__name__}"))
                count += 1
                continue
            if _is_e3nn(child) and report_e3nn:  # report the outermost kept e3nn module only
                entry = len(report.left_alone)
                report.left_alone.append((full, type(child).__name__, why))
                n = walk(child, full, False)
                if n:
                    report.left_alone[entry] = (full, type(child).__name__,
                                                f"{why}; {n} submodule(s) inside it replaced")
            else:
                n = walk(child, full, report_e3nn and not _is_e3nn(child))
            count += n
        return count

    n = walk(model, "", not _is_e3nn(model))
    if _is_e3nn(model):
        note = f"; {n} submodule(s) inside it replaced" if n else ""
        report.left_alone.insert(0, ("", type(model).__name__, f"{_accelerate_why_not(model)}{note}"))
    if fuse:
        from ..adapters import accelerate_layers  # noqa: PLC0415 (the adapters build on nn, ops and models)
        accelerate_layers(model, report)
    return report
