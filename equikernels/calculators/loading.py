"""Resolve the calculator's model argument: a module, a file, or the bundled default model.

Models follow mace-torch's call interface (``model(data, compute_force=..., compute_stress=...,
training=False) -> dict``) and expose ``r_max``, ``atomic_numbers`` and optionally ``heads``.
``equikernels.models`` is imported lazily: calculators sit above models, and a missing or
partial models package only disables what needs it.
"""
from __future__ import annotations

import importlib
import os
import warnings
from typing import List, Optional, Union

import torch

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device) -> torch.device:
    """``device`` as a ``torch.device`` that this torch can use (``ValueError`` saying why not)."""
    if device is None:
        return default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must be a torch device such as 'cpu' or 'cuda', got {device!r}") from exc
    if dev.type == "cuda":
        if not torch.backends.cuda.is_built():
            raise ValueError(f"device {device!r}: this torch ({torch.__version__}) was built without CUDA; "
                             "use device 'cpu' or install a CUDA build of torch")
        count = torch.cuda.device_count()
        if count == 0:
            raise ValueError(f"device {device!r}: no CUDA device is visible (CUDA_VISIBLE_DEVICES, driver); "
                             "use device 'cpu'")
        if dev.index is not None and dev.index >= count:
            raise ValueError(f"device {device!r}: only {count} CUDA device(s) are visible (cuda:0..cuda:{count - 1})")
    elif dev.type not in ("cpu", "meta"):
        backend = getattr(torch, dev.type, None)
        available = getattr(backend, "is_available", None)
        if available is not None and not available():
            raise ValueError(f"device {device!r}: not available in this torch; use 'cpu' or 'cuda'")
    return dev


def resolve_dtype(default_dtype, model: torch.nn.Module) -> torch.dtype:
    """``None`` keeps the model's own dtype."""
    if default_dtype is None:
        param = next(model.parameters(), None)
        return param.dtype if param is not None else torch.get_default_dtype()
    if isinstance(default_dtype, torch.dtype) and default_dtype in DTYPES.values():
        return default_dtype
    if default_dtype in DTYPES:
        return DTYPES[default_dtype]
    raise ValueError(f"default_dtype must be one of {sorted(DTYPES)} (or None for the model's dtype), "
                     f"got {default_dtype!r}")


def _models_attr(name: str):
    """``equikernels.models.<name>`` or None while the models package does not provide it."""
    try:
        mod = importlib.import_module("equikernels.models")
    except ModuleNotFoundError as exc:
        if exc.name and "equikernels.models".startswith(exc.name):
            return None
        raise
    return getattr(mod, name, None)


def _default_model_finder():
    finder = _models_attr("default_model_path")
    if finder is None:  # the fine-tuning work ships it beside the models package
        try:
            finder = getattr(importlib.import_module("equikernels.default_model"), "default_model_path", None)
        except ModuleNotFoundError:
            finder = None
    return finder


def default_model_path() -> str:
    finder = _default_model_finder()
    reason = "no default_model_path() is provided"
    path = None
    if finder is not None:
        try:
            path = finder()
        except FileNotFoundError as exc:
            reason = str(exc)
        else:
            reason = f"{path!r} does not exist"
    if path is None or not os.path.exists(str(path)):
        raise FileNotFoundError(
            f"no default model is bundled with this installation of equikernels ({reason}); "
            "pass model=<path to a model file> or model=<torch.nn.Module>")
    return str(path)


def load_model_file(path, device: torch.device) -> torch.nn.Module:
    """A model file or directory through ``equikernels.models.load``, the loader every command uses:
    our format (a file, or the directory ``equikernels convert IN DIR`` writes) or a mace-torch
    ``.model`` file, checked before anything is unpickled."""
    path = os.fspath(path)
    loader = _models_attr("load")
    if loader is None:
        raise ImportError(f"loading model file {path!r} needs equikernels.models, which is not available")
    unconvertible = _models_attr("UnconvertibleMaceModel") or ()
    try:
        return loader(path, device=device)
    except unconvertible as exc:
        return _accelerated(exc.module, exc.reason, path, device)


def _accelerated(module: torch.nn.Module, reason: str, path: str, device: torch.device) -> torch.nn.Module:
    """A mace-torch model whose structure equikernels' MACE does not read, run as mace-torch's module
    with its layers on equikernels' kernels (``equikernels.accelerate``)."""
    from ..adapters import accelerate  # noqa: PLC0415

    warnings.warn(f"{path}: {reason}, which equikernels' MACE does not read; running mace-torch's model with "
                  "its convolutions and contractions on equikernels' kernels (equikernels.accelerate; no CUDA "
                  "graphs, no precision=)", RuntimeWarning, stacklevel=4)
    accelerate(module)
    return module.to(device).eval()


def resolve_model(model: Union[None, str, os.PathLike, torch.nn.Module], device: torch.device) -> torch.nn.Module:
    if model is None:
        model = default_model_path()
    if isinstance(model, (str, os.PathLike)):
        model = load_model_file(model, device)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be None (the bundled default), a file path or a torch.nn.Module, "
                        f"got {type(model).__name__}")
    missing = [name for name in ("r_max", "atomic_numbers") if not hasattr(model, name)]
    if missing:
        raise TypeError(f"model must expose r_max and atomic_numbers like a mace-torch MACE model; "
                        f"{type(model).__name__} lacks {', '.join(missing)}")
    if type(model).__module__.split(".")[0] == "mace":  # a mace-torch module given as it is, not yet accelerated
        from ..adapters import accelerate  # noqa: PLC0415

        accelerate(model)  # in place, sharing its tensors: the numbers stay mace-torch's
    return model


def model_heads(model: torch.nn.Module) -> List[str]:
    heads = getattr(model, "heads", None)
    return list(heads) if heads else ["Default"]


def resolve_head(head: Optional[str], heads: List[str]) -> int:
    """Index of ``head`` in ``heads`` by ``equikernels.models.data.head_index``'s rule: with no head
    given, the only head or the one called 'default'; a name matches exactly, else up to letter case."""
    from ..models.data import head_index  # noqa: PLC0415 (models load lazily, see above)

    return head_index(head, heads)
