"""``accelerate(model)``: every supported e3nn module of a model replaced by its equikernels
equivalent (``nn.convert.from_e3nn``), then whole layers rewired by the adapters of this package."""
from __future__ import annotations

import contextlib
import itertools
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from .._compat import e3nn, o3
from ..nn.convert import from_e3nn, why_not_convertible
from ..ops.tp import resolve_backend
from .registry import accelerate_layers, recognised_layers


@dataclass
class AccelerateReport:
    """What ``accelerate`` did, each module listed once: ``replaced`` (name, e3nn type, new type);
    ``fused`` (name, layer class, what) for whole layers rewired in place by an adapter
    (``equikernels.adapters``); ``not_fused`` (name, class, reason) for layers an adapter recognises
    but left as they were (with ``fuse=False``, every one, the reason "fuse=False" unless the adapter
    finds why a fusing call would keep it too); ``left_alone`` (name, type, reason) for the other
    e3nn modules it kept (and TorchScript modules holding some); ``already`` (name, class) for layers
    an earlier call rewired; ``device``, where the model's parameters were when it ran."""
    replaced: List[Tuple[str, str, str]] = field(default_factory=list)
    left_alone: List[Tuple[str, str, str]] = field(default_factory=list)
    fused: List[Tuple[str, str, str]] = field(default_factory=list)
    not_fused: List[Tuple[str, str, str]] = field(default_factory=list)
    already: List[Tuple[str, str]] = field(default_factory=list)
    device: Optional[str] = None

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
                 f"left {len(self.not_fused)} recognised layer(s) unfused"
                 + (f", {len(self.already)} layer(s) accelerated by an earlier call" if self.already else "")]
        lines += [f"  fused       {n or '<root>'}: {t} ({what})" for n, t, what in self.fused]
        lines += [f"  not fused   {n or '<root>'}: {t} ({why})" for n, t, why in self.not_fused]
        lines += [f"  replaced    {n or '<root>'}: {a} -> {b}" for n, a, b in self.replaced]
        lines += [f"  left alone  {n or '<root>'}: {t} ({why})" for n, t, why in self.left_alone]
        lines += [f"  already     {n or '<root>'}: {t}" for n, t in self.already]
        if (self.device == "cpu" and any("tensor_product_conv" in what for _, _, what in self.fused)
                and resolve_backend(None, torch.device("cpu")) == "cpu"):  # (a chosen backend runs kernels there)
            lines.append("  note        on the CPU, a fused convolution runs its gather, product and scatter-sum as "
                         "separate steps; moved to a CUDA device, each is one kernel")
        return "\n".join(lines)


def _is_e3nn(module) -> bool:
    """An instance of an e3nn class or of a subclass of one."""
    return any(c.__module__.split(".")[0] == "e3nn" for c in type(module).__mro__)


# torch.package names the modules of an archive's own copies "<torch_package_N>.e3nn...."
_PACKAGED_E3NN = re.compile(r"<torch_package_\d+>\.e3nn(\.|$)")


def _is_packaged_e3nn(module) -> bool:
    """An instance of a class of the copy of e3nn inside a torch.package archive (nequip's packaged
    models): not the installed e3nn's, so not converted."""
    return any(_PACKAGED_E3NN.match(c.__module__) for c in type(module).__mro__)


def _acceleratewhy_not_convertible(module) -> Optional[str]:
    """None if ``accelerate`` replaces this e3nn module, else why it keeps it."""
    why = why_not_convertible(module)
    if why is None and type(module).__module__.split(".")[0] != "e3nn":
        # a user subclass may add attributes or methods that the rest of the model relies on
        return ("user-defined subclass of an e3nn module; convert it explicitly with "
                "equikernels.from_e3nn if its extras are not needed")
    return why


@contextlib.contextmanager
def _e3nn_eager():
    """e3nn modules built inside keep their functions as plain Python: under e3nn's jit_mode "script"
    (which nequip's model builders leave set) they would hold TorchScript functions, and a model
    holding one can no longer be deep-copied, pickled or scripted as a whole."""
    get = getattr(e3nn, "get_optimization_defaults", None)
    mode = get().get("jit_mode", "eager") if get is not None else "eager"
    if mode == "eager":
        yield
        return
    e3nn.set_optimization_defaults(jit_mode="eager")
    try:
        yield
    finally:
        e3nn.set_optimization_defaults(jit_mode=mode)


_CONVERTED = (o3.TensorProduct, o3.Linear, o3.SphericalHarmonics)  # the e3nn kinds from_e3nn replaces
_PACKAGED = ("its class is from the copy of e3nn inside a torch.package archive (a packaged model, such as "
             "nequip's .nequip.zip), not the installed e3nn; accelerate the model built from its Python code "
             "(for nequip, from its checkpoint)")
_SCRIPTED = ("compiled by TorchScript (e3nn.util.jit.compile, torch.jit.script): "
             "accelerate the model before scripting it")


def _scripted_e3nn(module: nn.Module) -> bool:
    """A TorchScript module (compiled code, which ``accelerate`` cannot rewire) holding e3nn modules."""
    for m in module.modules():
        try:
            name = m._c._type().qualified_name()
        except (AttributeError, RuntimeError):
            continue
        if name.startswith("__torch__.e3nn."):
            return True
    return False


_HOOKS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
          "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
          "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


def _carry_hooks(old: nn.Module, new: nn.Module) -> None:
    """The hooks registered on ``old`` (feature capture, checkpoint key rewrites) kept on its replacement:
    ``new`` takes ``old``'s hook dicts themselves, so the handles that registered them still remove them."""
    for attr in _HOOKS:
        hooks, own = old.__dict__.get(attr), new.__dict__.get(attr)
        if hooks and own is not None:
            hooks.update(own)
            new.__dict__[attr] = hooks
    if old.__dict__.get("_is_full_backward_hook") is not None:
        new._is_full_backward_hook = old._is_full_backward_hook


def _module_hint(obj) -> str:
    """Where the torch module(s) of a calculator passed as ``model`` are, as '; pass ...', or ''."""
    if isinstance(getattr(obj, "models", None), list):
        return "; pass each of its .models"
    if isinstance(getattr(obj, "model", None), nn.Module):
        return "; pass its .model"
    # ASE's SumCalculator and kin (e.g. SevenNetD3Calculator: SevenNet plus D3) hold their calculators in .mixer
    calcs = getattr(getattr(obj, "mixer", None), "calcs", None)
    inner = [f".mixer.calcs[{i}].model ({type(c).__name__})"
             for i, c in enumerate(calcs if isinstance(calcs, (list, tuple)) else ())
             if isinstance(getattr(c, "model", None), nn.Module)]
    return f"; pass its {' and '.join(inner)}" if inner else ""


def accelerate(model: nn.Module, fuse: bool = True) -> AccelerateReport:
    """Replace, in place, every supported e3nn submodule of ``model`` (at any depth, including inside
    ModuleList/Sequential/ModuleDict and e3nn containers such as ``nn.Gate``) by its equikernels
    equivalent sharing the same Parameters and keeping the hooks registered on it.
    ``model.state_dict()`` is unchanged. A module reached through several parents is converted once
    and stays shared. TorchScript modules are compiled code: a scripted ``model`` is refused
    (``TypeError``), scripted submodules holding e3nn modules are kept and listed in ``left_alone``.

    With ``fuse`` (default), whole layers are then rewired by the adapters of
    ``equikernels.adapters``: message passing (gather -> tensor product with per-edge weights ->
    scatter-sum) becomes one fused convolution on a graph shared by every layer, and mace-torch's
    symmetric contraction runs as generated kernels; the layers keep their class names,
    parameters, ``state_dict`` keys and call signatures, and script (``torch.jit.script``,
    ``e3nn.util.jit.compile``) as their original forward. The report lists what was fused and why
    a recognised layer was not; with ``fuse=False`` it lists, as not fused, the layers a fusing call
    would rewire.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}{_module_hint(model)}")
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("model: a TorchScript module (torch.jit.script / torch.jit.load) cannot be accelerated; "
                        "accelerate the Python model, then script it")
    if _is_e3nn(model) and _acceleratewhy_not_convertible(model) is None:
        raise TypeError(f"model: {type(model).__name__} is itself a supported e3nn module and cannot be replaced "
                        "in place; use equikernels.from_e3nn(model)")
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    report = AccelerateReport(device=None if first is None else first.device.type)
    if fuse:
        accelerate_layers(model, report, early=True)
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
            if isinstance(child, torch.jit.ScriptModule):  # compiled: nothing inside can be replaced
                if _scripted_e3nn(child):
                    scripted.append(full)
                    if report_e3nn:
                        report.left_alone.append((full, child.original_name, _SCRIPTED))
                continue
            if _is_packaged_e3nn(child):
                if report_e3nn:
                    report.left_alone.append((full, type(child).__name__, _PACKAGED))
                count += walk(child, full, False)
                continue
            why = _acceleratewhy_not_convertible(child) if _is_e3nn(child) else None
            new = None
            if _is_e3nn(child) and why is None:
                try:
                    with _e3nn_eager():
                        new = from_e3nn(child)
                except (TypeError, ValueError, NotImplementedError) as exc:  # kept as it is, with the reason
                    why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if new is not None:
                _carry_hooks(child, new)
                done[id(child)] = new
                setattr(parent, name, new)
                report.replaced.append((full, type(child).__name__, f"equikernels.{type(new).__name__}"))
                count += 1
                continue
            if not fuse and getattr(type(child), "_ek_adapter", None) is not None:  # rewired by a fusing call
                report.already.append((full, type(child).__name__))
                count += walk(child, full, False)
                continue
            # report the outermost kept e3nn module, and every kept module of a kind accelerate converts
            if _is_e3nn(child) and (report_e3nn or isinstance(child, _CONVERTED)):
                entry = len(report.left_alone)
                report.left_alone.append((full, type(child).__name__, why))
                n = walk(child, full, False)
                inside[full] = _inside(0, full)  # (its replaced submodules are listed as such)
                report.left_alone[entry] = (full, type(child).__name__, why + _inside(n, full))
            else:
                n = walk(child, full, report_e3nn and not _is_e3nn(child))
            count += n
        return count

    def _inside(n: int, prefix: str) -> str:
        """What happened inside a kept e3nn module: its replaced and its compiled submodules."""
        kept = sum(1 for name in scripted if not prefix or name.startswith(prefix + "."))
        return ((f"; {n} submodule(s) inside it replaced" if n else "")
                + (f"; {kept} submodule(s) inside it {_SCRIPTED}" if kept else ""))

    scripted: List[str] = []  # TorchScript modules holding e3nn modules
    inside: Dict[str, str] = {}  # name of a kept e3nn module -> its compiled submodules, as a suffix
    n = walk(model, "", not (_is_e3nn(model) or _is_packaged_e3nn(model)))
    if _is_packaged_e3nn(model):
        report.left_alone.insert(0, ("", type(model).__name__, _PACKAGED))
    if _is_e3nn(model):
        why = _acceleratewhy_not_convertible(model)
        inside[""] = _inside(0, "")
        report.left_alone.insert(0, ("", type(model).__name__, f"{why}{_inside(n, '')}"))
    if fuse:
        accelerate_layers(model, report)
    else:
        if getattr(type(model), "_ek_adapter", None) is not None:  # (walk sees only the submodules)
            report.already.insert(0, ("", type(model).__name__))
        recognised_layers(model, report)
    _list_once(report, inside)
    return report


def _list_once(report: AccelerateReport, inside: Dict[str, str]) -> None:
    """An e3nn module that an adapter rewired or recognised is listed there, not also as left alone;
    a kept one takes along its compiled submodules (not listed elsewhere)."""
    layers = {n for n, _, _ in report.fused} | {n for n, _ in report.already}
    kept = {n for n, _, _ in report.left_alone}
    report.not_fused[:] = [(n, t, why + inside.get(n, "") if n in kept else why) for n, t, why in report.not_fused]
    layers |= {n for n, _, _ in report.not_fused}
    report.left_alone[:] = [e for e in report.left_alone if e[0] not in layers]
