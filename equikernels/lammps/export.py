"""Write and read the ML-IAP object LAMMPS loads with ``pair_style mliap unified FILE 0``.

LAMMPS reads ``FILE`` with ``torch.load`` when it ends in ``.pt``/``.pth`` (lower case) and with
``pickle.load`` otherwise, so ``export_mliap`` writes it the same way. The pickled object holds the model's
config (JSON) and weights (plain tensors), and rebuilds the model on load: the file needs
equikernels (not mace-torch) where LAMMPS runs.
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import zipfile
from typing import Optional, Union

import torch

from .._files import atomic_write, check_output_file, same_file
from ..models.io import check_torch_file, is_mliap_file
from .mliap import EquikernelsMLIAP

TORCH_SUFFIXES = (".pt", ".pth")


def is_torch_file(path: str) -> bool:
    """Whether LAMMPS reads ``path`` with ``torch.load``: its test is case-sensitive (``x.PT`` is unpickled)."""
    return path.endswith(TORCH_SUFFIXES)


def export_mliap(model, path: Union[str, os.PathLike], dtype: Optional[str] = None, head: Optional[str] = None
                 ) -> EquikernelsMLIAP:
    """Write the ML-IAP object of ``model`` (an equikernels MACE, or a model file: ours or a
    mace-torch ``.model``, read through ``equikernels.models.io.load``) to ``path``; returns it."""
    from ..models.io import load  # noqa: PLC0415

    path = os.fspath(path)  # checked before the model is read: converting a large model takes a while
    check_output_file(path, "path", "model-mliap.pt")
    if isinstance(model, (str, os.PathLike)):
        if os.path.abspath(os.fspath(model)) == os.path.abspath(path) or same_file(os.fspath(model), path):
            raise ValueError(f"path: {path!r} is the model file itself; choose another name such as model-mliap.pt")
        if is_mliap_file(os.fspath(model)):
            raise ValueError(f"model: {os.fspath(model)!r} is an ML-IAP file written by export-lammps, not a model; "
                             "export from the model file it was written from")
        model = load(model, device="cpu")
    obj = EquikernelsMLIAP(model, head=head, dtype=dtype)

    def write(tmp: str) -> None:
        if is_torch_file(path):
            torch.save(obj, tmp)
        else:
            with open(tmp, "wb") as f:
                pickle.dump(obj, f)
    try:  # a failed write leaves neither a partial file nor the temporary one
        atomic_write(path, write)
    except (OSError, RuntimeError) as exc:  # full disk, a folder turned read-only meanwhile
        raise OSError(f"path: cannot write {path!r} ({_first_line(exc)})") from None
    return obj


EXPECTED = "an ML-IAP model file written by equikernels export-lammps"
_PICKLE_PROTOCOLS = (2, 3, 4, 5)
# truncated or damaged files, and states of another version (EquikernelsMLIAP.__setstate__)
_READ_ERRORS = (EOFError, RuntimeError, ValueError, TypeError, AttributeError, IndexError, KeyError, OSError,
                zipfile.BadZipFile)


def load_mliap(path: Union[str, os.PathLike]) -> EquikernelsMLIAP:
    """Read a file written by ``export_mliap`` (what LAMMPS loads), checking its format first: a
    file that is not a torch archive (``.pt``/``.pth``) or a pickle (other names), or that holds
    anything besides an ``EquikernelsMLIAP`` and tensors, is refused with a ``ValueError`` naming it,
    without running code from it. (LAMMPS itself unpickles in full: give it only files you trust.)"""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"path: no such file: {path!r}")
    if is_torch_file(path):
        check_torch_file(path, EXPECTED)
        try:
            with torch.serialization.safe_globals([EquikernelsMLIAP]):
                obj = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise ValueError(f"{path}: holds objects other than an EquikernelsMLIAP and tensors ({_first_line(exc)}); "
                             f"expected {EXPECTED}") from None
        except _READ_ERRORS as exc:
            raise ValueError(f"{path}: cannot be read ({type(exc).__name__}: {_first_line(exc)}); "
                             f"expected {EXPECTED}") from None
    else:
        with open(path, "rb") as f:
            head = f.read(2)
            if len(head) < 2 or head[0] != 0x80 or head[1] not in _PICKLE_PROTOCOLS:
                raise ValueError(f"{path}: not a pickle (it {_describe_head(head)}); expected {EXPECTED} "
                                 "(.pt/.pth files are read as torch archives)")
            f.seek(0)
            try:
                obj = _RestrictedUnpickler(f).load()
            except pickle.UnpicklingError as exc:
                raise ValueError(f"{path}: {_first_line(exc)}; expected {EXPECTED}") from None
            except _READ_ERRORS as exc:
                raise ValueError(f"{path}: cannot be read ({type(exc).__name__}: {_first_line(exc)}); "
                                 f"expected {EXPECTED}") from None
    if not isinstance(obj, EquikernelsMLIAP):
        raise ValueError(f"{path}: holds a {type(obj).__name__}, expected {EXPECTED}")
    return obj


def _storage_from_bytes(data: bytes):
    """A tensor storage pickled inside the file, read without running code (``weights_only``)."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


class _RestrictedUnpickler(pickle.Unpickler):
    """Builds only what ``export_mliap`` writes: the ML-IAP object, tensors and their storages."""

    _ALLOWED = {("equikernels.lammps.mliap", "EquikernelsMLIAP"): EquikernelsMLIAP,
                ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
                ("torch.storage", "_load_from_bytes"): _storage_from_bytes,
                ("collections", "OrderedDict"): collections.OrderedDict}

    def find_class(self, module: str, name: str):
        found = self._ALLOWED.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"refers to {module}.{name}, which an ML-IAP model file does not hold")
        return found


def _describe_head(head: bytes) -> str:
    if not head:
        return "is empty"
    try:
        return f"is text, starting {head.decode('ascii')!r}"
    except UnicodeDecodeError:
        return "has unrecognised binary content"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
