"""A thin layer between the trainer and the model: load a foundation model file, build a new
small MACE, read/write E0s, freeze layers, save the result.

Two kinds of model share one call interface (mace-torch's: ``model(data, training=...,
compute_force=..., compute_stress=...) -> dict``): equikernels' own MACE (``equikernels.models``)
and mace-torch's. Ours is preferred when present; mace-torch is imported only when a mace-torch
model is needed, so the package works without it."""
from __future__ import annotations

import importlib
import os
import warnings
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from .._compat import o3, quiet_mace
from . import checkpoint
from ..models import builder as model_builder
from ..models.foundations import foundation_checkpoint
from .new_model_options import DEFAULT_NEW_MODEL, resolve_new_model  # noqa: F401 (DEFAULT_NEW_MODEL: the trainer's)


def ours():
    """``equikernels.models`` when it is importable and offers load/save, else None."""
    try:
        mod = importlib.import_module("equikernels.models")
    except ImportError:
        return None
    if all(hasattr(mod, name) for name in ("load", "save")):
        return mod
    return None


def resolve_backend(backend: str) -> str:
    if backend == "auto":
        return "equikernels" if ours() is not None and hasattr(ours(), "from_mace") else "mace"
    if backend == "equikernels" and ours() is None:
        raise RuntimeError("model_backend 'equikernels' needs equikernels.models, which is not available")
    return backend


def is_ours(model: torch.nn.Module) -> bool:
    return type(model).__module__.startswith("equikernels.")


def _mace_torch_load(path: str) -> torch.nn.Module:
    quiet_mace()
    try:
        importlib.import_module("mace")
    except ImportError as exc:
        raise RuntimeError(f"{path} is not an equikernels model file and mace-torch, needed to read "
                           "a mace-torch model, is not installed (pip install mace-torch)") from exc
    model = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"{path}: expected a pickled mace-torch model, found a {type(model).__name__}")
    return model


def load_model(path: str, backend: str = "auto") -> torch.nn.Module:
    """A foundation model from a file, as ``backend``: 'equikernels' reads our format and
    mace-torch ``.model`` files (converted); 'mace' needs a mace-torch ``.model`` file. A
    foundation-model name ("medium", "small_off", ...) stands for its file (``models.foundations``)."""
    path = foundation_checkpoint(path) or path
    if not os.path.exists(path):
        raise FileNotFoundError(f"model file {path!r} does not exist")
    checkpoint.refuse_as_model(path)
    backend = resolve_backend(backend)
    if backend == "equikernels":
        return ours().load(path)
    try:
        return _mace_torch_load(path)
    except Exception as exc:
        hint = (" (it may be in equikernels' format, which only model_backend 'equikernels' can train)"
                if ours() is not None else "")
        raise ValueError(f"model_backend 'mace': cannot read {path} as a mace-torch model{hint}: {exc}") from exc


def convert(model: torch.nn.Module, backend: str) -> torch.nn.Module:
    backend = resolve_backend(backend)
    if backend == "equikernels" and not is_ours(model):
        mod = ours()
        if not hasattr(mod, "from_mace"):
            raise RuntimeError("equikernels.models has no from_mace; cannot convert a mace-torch model")
        return mod.from_mace(model)
    return model


def _mace_class(name: str):
    quiet_mace()
    import mace.modules as mm

    if not hasattr(mm, name):
        raise ValueError(f"unknown mace-torch interaction block {name!r}")
    return getattr(mm, name)


def have_mace() -> bool:
    """Whether mace-torch is importable."""
    try:
        importlib.import_module("mace")
    except ImportError:
        return False
    return True


_have_mace = have_mace


def build_new_model(hparams: Optional[Dict[str, Any]], atomic_numbers: Sequence[int],
                    e0s: np.ndarray, avg_num_neighbors: float, scale, shift,
                    heads: Sequence[str] = ("Default",), backend: str = "auto") -> torch.nn.Module:
    """A fresh ScaleShiftMACE in the current default dtype; ``scale`` and ``shift`` are numbers, or
    one per head. Built by mace-torch's constructor
    when it is installed (its initialisation and symmetric-contraction basis), converted to ours
    for backend 'equikernels'; without mace-torch, built by ``equikernels.models.builder``."""
    hp = resolve_new_model(hparams or {})
    builder = hp.pop("builder")
    if builder == "auto":
        builder = "mace" if _have_mace() or ours() is None else "equikernels"
    if builder == "equikernels":
        if resolve_backend(backend) == "mace":
            raise ValueError("new_model builder 'equikernels' cannot make a model for model_backend 'mace'")
        return _build_ours(hp, atomic_numbers, e0s, avg_num_neighbors, scale, shift, heads)
    return convert(_build_mace(hp, atomic_numbers, e0s, avg_num_neighbors, scale, shift, heads), backend)


def _build_mace(hp, atomic_numbers, e0s, avg_num_neighbors, scale, shift, heads):
    quiet_mace()
    import mace.modules as mm

    return mm.ScaleShiftMACE(
        r_max=float(hp["r_max"]), num_bessel=int(hp["num_bessel"]),
        num_polynomial_cutoff=int(hp["num_polynomial_cutoff"]), max_ell=int(hp["max_ell"]),
        interaction_cls=_mace_class(hp["interaction"]),
        interaction_cls_first=_mace_class(hp["interaction_first"]),
        num_interactions=int(hp["num_interactions"]), num_elements=len(atomic_numbers),
        hidden_irreps=o3.Irreps(hp["hidden_irreps"]), MLP_irreps=o3.Irreps(hp["MLP_irreps"]),
        atomic_energies=np.asarray(e0s, dtype=np.float64), avg_num_neighbors=float(avg_num_neighbors),
        atomic_numbers=[int(z) for z in atomic_numbers], correlation=int(hp["correlation"]),
        gate=torch.nn.functional.silu, radial_MLP=list(hp["radial_MLP"]), heads=list(heads),
        atomic_inter_scale=_per_head(scale), atomic_inter_shift=_per_head(shift),
    )


def _build_ours(hp, atomic_numbers, e0s, avg_num_neighbors, scale, shift, heads):
    config = model_builder.mace_config(
        r_max=float(hp["r_max"]), num_bessel=int(hp["num_bessel"]),
        num_polynomial_cutoff=int(hp["num_polynomial_cutoff"]), max_ell=int(hp["max_ell"]),
        interaction=hp["interaction"], interaction_first=hp["interaction_first"],
        num_interactions=int(hp["num_interactions"]), atomic_numbers=[int(z) for z in atomic_numbers],
        hidden_irreps=hp["hidden_irreps"], MLP_irreps=hp["MLP_irreps"],
        avg_num_neighbors=float(avg_num_neighbors), correlation=int(hp["correlation"]),
        radial_MLP=list(hp["radial_MLP"]), heads=list(heads))
    # weights drawn from the global RNG, so the run's seed decides them
    model = model_builder.random_model(config, seed=int(torch.randint(0, 2**31 - 1, ()).item()))
    set_e0s(model, torch.as_tensor(np.asarray(e0s, dtype=np.float64)).expand(len(heads), -1))
    with torch.no_grad():
        model.scale.copy_(torch.as_tensor(_per_head(scale), dtype=model.scale.dtype).expand_as(model.scale))
        model.shift.copy_(torch.as_tensor(_per_head(shift), dtype=model.shift.dtype).expand_as(model.shift))
    return model


def _per_head(value):
    """A number, or a list of one number per head."""
    return [float(v) for v in value] if isinstance(value, (list, tuple)) else float(value)


# ---- introspection shared by both kinds (same attribute names as mace-torch) -------------------

def atomic_numbers(model: torch.nn.Module) -> List[int]:
    return [int(z) for z in model.atomic_numbers]


def r_max(model: torch.nn.Module) -> float:
    return float(model.r_max)


def heads(model: torch.nn.Module) -> List[str]:
    return list(getattr(model, "heads", None) or ["Default"])


def rename_heads(model: torch.nn.Module, names: Sequence[str]) -> None:
    """Give the model's heads ``names`` (as many as it has), in the model and in the configuration
    its file is written from."""
    if len(names) != len(heads(model)):
        raise ValueError(f"heads: {len(names)} name(s) for a model of {len(heads(model))} head(s)")
    model.heads = list(names)
    config = getattr(model, "config", None)
    if isinstance(config, dict) and "heads" in config:
        config["heads"] = list(names)


def one_head(model: torch.nn.Module, head: str) -> torch.nn.Module:
    """Head ``head`` of ``model`` as a one-head model of the same kind (ours or mace-torch's), with the
    energies that head gives (``models.select_head``); errors name ``model_head``."""
    from ..models import select_head  # noqa: PLC0415

    if is_ours(model):
        return select_head(model, head, argument="model_head")
    from .mace_export import to_mace  # noqa: PLC0415

    return to_mace(select_head(convert(model, "equikernels"), head, argument="model_head"))


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def _e0_buffer(model: torch.nn.Module) -> torch.Tensor:
    if hasattr(model, "atomic_energies_fn"):  # mace-torch
        return model.atomic_energies_fn.atomic_energies
    if isinstance(getattr(model, "atomic_energies", None), torch.Tensor):  # equikernels
        return model.atomic_energies
    raise TypeError(f"{type(model).__name__} has no atomic energies (E0s) buffer")


def get_e0s(model: torch.nn.Module) -> torch.Tensor:
    """E0s as [n_heads, n_elements]."""
    return torch.atleast_2d(_e0_buffer(model).detach().clone())


def set_e0s(model: torch.nn.Module, e0s: torch.Tensor) -> None:
    buf = _e0_buffer(model)
    with torch.no_grad():
        buf.copy_(torch.as_tensor(e0s, dtype=buf.dtype).reshape(buf.shape))


def freeze(model: torch.nn.Module, prefixes: Sequence[str]) -> List[str]:
    """Keep every parameter whose name starts with one of ``prefixes`` fixed; returns their names."""
    names = [n for n, _ in model.named_parameters()]
    frozen = []
    for prefix in prefixes:
        hit = [n for n in names if n == prefix or n.startswith(prefix + ".")]
        if not hit:
            tops = sorted({n.split(".")[0] for n in names})
            raise ValueError(f"freeze: {prefix!r} matches no parameter; top-level modules: {tops} "
                             "(use e.g. 'interactions.0')")
        frozen.extend(hit)
    for n, p in model.named_parameters():
        if n in frozen:
            p.requires_grad_(False)
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("freeze: every parameter is frozen, nothing left to train")
    return frozen


def save_mace_torch(model: torch.nn.Module, path: str, template: Optional[str] = None) -> str:
    """The model as mace-torch's own file (a pickled mace-torch module), written atomically; one
    of ours is rebuilt as mace-torch's first (``mace_export.to_mace``, filling in ``template``, a
    mace-torch file of the same structure, when it is one). Needs mace-torch."""
    if is_ours(model):
        from .mace_export import to_mace

        model = to_mace(model, template)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        torch.save(model, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def save_model(model: torch.nn.Module, path: str) -> str:
    """Save in equikernels' format when ``equikernels.models`` is available (converting a
    mace-torch model), else as a pickled mace-torch model. Returns the path written."""
    mod = ours()
    if mod is not None:
        if not is_ours(model):
            model = convert(model, "equikernels")
        mod.save(model, path)
        return path
    warnings.warn("equikernels.models is not available: saving a mace-torch model instead of "
                  "equikernels' format", stacklevel=2)
    return save_mace_torch(model, path)
