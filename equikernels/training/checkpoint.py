"""Checkpoints written atomically (temporary file in the same directory, fsync, rename), so a run
killed at any moment leaves either the previous or the new checkpoint, never a torn one."""
from __future__ import annotations

import glob
import os
import random
import re
import zipfile
from typing import Any, Dict, Optional

import numpy as np
import torch

from .._files import remove_stale_temps_in

_NAME = "checkpoint-{:09d}.pt"
_PATTERN = re.compile(r"checkpoint-(\d{9})\.pt$")


def atomic_torch_save(obj: Any, path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def rng_states() -> Dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_states(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(directory: str, step: int, state: Dict[str, Any], keep: Optional[int]) -> str:
    """Write the checkpoint of ``step``; then only the newest ``keep`` stay (None: every one)."""
    path = os.path.join(directory, _NAME.format(step))
    atomic_torch_save(state, path)
    if keep is not None:
        for old in list_checkpoints(directory)[:-keep]:
            os.remove(old)
    return path


def list_checkpoints(directory: str):
    found = [p for p in glob.glob(os.path.join(directory, "checkpoint-*.pt")) if _PATTERN.search(p)]
    return sorted(found, key=lambda p: int(_PATTERN.search(p).group(1)))


def checkpoint_step(path: str) -> Optional[int]:
    """The step of a checkpoint file's name, None for other names."""
    m = _PATTERN.search(path)
    return int(m.group(1)) if m else None


def latest(directory: str) -> Optional[str]:
    found = list_checkpoints(directory)
    return found[-1] if found else None


# top-level keys of Trainer.state_dict that a model file does not hold
_MARKERS = (b"batch_in_epoch", b"epoch_evaluated", b"optimizer", b"scheduler", b"world_size")


def is_checkpoint(path: str) -> bool:
    """Whether ``path`` is a training checkpoint written here; its pickle is read as bytes, never run."""
    try:
        if os.path.isdir(path) or not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.rsplit("/", 1)[-1] == "data.pkl"]
            if len(pickles) != 1:
                return False
            data = archive.read(pickles[0])
    except (OSError, zipfile.BadZipFile, RuntimeError):
        return False
    return all(marker in data for marker in _MARKERS)


def refuse_as_model(path: str) -> None:
    """Raise a one-line ``ValueError`` when ``path``, given as the model to fine-tune, is a training
    checkpoint: it names ``--resume`` (and the run's model.pt, when there is one)."""
    if not is_checkpoint(path):
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.basename(folder) != "checkpoints":  # --resume reads OUT/checkpoints/
        raise ValueError(f"model: {path} is a training checkpoint, not a model file; to continue its run, put it "
                         "in OUT/checkpoints/ and give --resume --out OUT (with the run's other options)")
    run = os.path.relpath(os.path.dirname(folder))
    saved = os.path.join(run, "model.pt")
    weights = f", or fine-tune the run's saved model with --model {saved}" if os.path.isfile(saved) else ""
    raise ValueError(f"model: {path} is a training checkpoint, not a model file; continue its run with --resume "
                     f"--out {run} (with the run's other options){weights}")


def load(path: str) -> Dict[str, Any]:
    # our own files: they hold numpy/python RNG states, which weights_only cannot restore
    return torch.load(path, map_location="cpu", weights_only=False)


def remove_stale_temporaries(directories) -> list:
    """Delete the ``*.tmp<PID>`` files that writes of a killed process left behind (checkpoints,
    models, metrics); files of a process still running are kept. Returns the paths removed."""
    return [path for directory in directories for path in remove_stale_temps_in(directory)]
