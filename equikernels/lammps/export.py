"""Write and read the ML-IAP object LAMMPS loads with ``pair_style mliap unified FILE 0``.

LAMMPS reads ``FILE`` with ``torch.load`` when it ends in ``.pt``/``.pth`` and with ``pickle.load``
otherwise, so ``export_mliap`` writes it the same way. The pickled object holds the model's
config (JSON) and weights (plain tensors), and rebuilds the model on load: the file needs
equikernels (not mace-torch) where LAMMPS runs.
"""
from __future__ import annotations

import os
import pickle
from typing import Optional, Union

import torch

from .mliap import EquikernelsMLIAP

TORCH_SUFFIXES = (".pt", ".pth")


def _is_torch_file(path: str) -> bool:
    return path.lower().endswith(TORCH_SUFFIXES)


def export_mliap(model, path: Union[str, os.PathLike], dtype: Optional[str] = None, head: Optional[str] = None
                 ) -> EquikernelsMLIAP:
    """Write the ML-IAP object of ``model`` (an equikernels MACE, or a model file: ours or a
    mace-torch ``.model``, read through ``equikernels.models.io.load``) to ``path``; returns it."""
    from ..models.io import load  # noqa: PLC0415

    if isinstance(model, (str, os.PathLike)):
        model = load(model, device="cpu")
    obj = EquikernelsMLIAP(model, head=head, dtype=dtype)
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"path: directory {parent!r} does not exist")
    tmp = f"{path}.tmp{os.getpid()}"
    if _is_torch_file(path):
        torch.save(obj, tmp)
    else:
        with open(tmp, "wb") as f:
            pickle.dump(obj, f)
    os.replace(tmp, path)
    return obj


def load_mliap(path: Union[str, os.PathLike]) -> EquikernelsMLIAP:
    """Read a file written by ``export_mliap`` as LAMMPS does (unpickling runs code named in the
    file: load only files you trust)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"path: no such file: {path!r}")
    if _is_torch_file(path):
        obj = torch.load(path, map_location="cpu", weights_only=False)
    else:
        with open(path, "rb") as f:
            obj = pickle.load(f)
    if not isinstance(obj, EquikernelsMLIAP):
        raise ValueError(f"path: {path!r} holds a {type(obj).__name__}, expected an EquikernelsMLIAP")
    return obj
