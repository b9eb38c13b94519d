"""What a training run leaves in its output directory, and the rule that a new run never replaces
another run's results unless asked: continue it (``resume``) or replace it (``overwrite``)."""
from __future__ import annotations

import os
from typing import List, Sequence, Tuple

from . import checkpoint as ckpt

# the files a run writes into out_dir (the trainer names them from here)
MODEL, MACE_MODEL = "model.pt", "mace.model"              # the saved (best or last) weights
MODEL_LAST, MACE_MODEL_LAST = "model_last.pt", "mace_last.model"  # the last weights, when they differ
METRICS, PLOT = "metrics.json", "training.png"
RUN_FILES = (MODEL, MODEL_LAST, MACE_MODEL, MACE_MODEL_LAST, METRICS, PLOT)


def checkpoint_dir(out_dir: str) -> str:
    return os.path.join(out_dir, "checkpoints")


def previous_run(out_dir: str) -> List[str]:
    """The files of an earlier run in ``out_dir``: its outputs and checkpoints (paths)."""
    if not os.path.isdir(out_dir):
        return []
    found = [os.path.join(out_dir, n) for n in RUN_FILES if os.path.isfile(os.path.join(out_dir, n))]
    return found + ckpt.list_checkpoints(checkpoint_dir(out_dir))


def describe(paths: List[str]) -> str:
    names = [os.path.basename(p) for p in paths if ckpt.checkpoint_step(p) is None]
    n = len(paths) - len(names)
    return ", ".join(names + ([f"{n} checkpoint{'s' if n != 1 else ''}"] if n else []))


def check(out_dir: str, resume: bool, overwrite: bool, resume_flag: str = "resume=True",
          overwrite_flag: str = "overwrite=True", out_flag: str = "out_dir",
          inputs: Sequence[Tuple[str, str]] = ()) -> None:
    """Refuse to start where a run would replace another's results: ``out_dir`` holds an earlier
    run and neither ``resume`` (with a checkpoint to continue from) nor ``overwrite`` is given; or
    where it would replace one of its own ``inputs`` ((option, path) pairs), whatever is given."""
    for option, path in inputs:
        for name in RUN_FILES:
            target = os.path.join(out_dir, name)
            if os.path.isfile(target) and os.path.samefile(path, target):
                raise FileExistsError(f"{option} {path!r} is the file this run writes its {name} to in {out_flag} "
                                      f"{out_dir!r}; move it out of {out_dir!r} or choose another {out_flag}")
    if resume and overwrite:
        raise ValueError(f"{resume_flag} and {overwrite_flag}: give one (continue the run in {out_dir!r}, or "
                         "replace it)")
    found = previous_run(out_dir)
    if overwrite or not found:
        return
    if not resume:
        raise FileExistsError(f"{out_flag} {out_dir!r} holds an earlier run ({describe(found)}); {resume_flag} "
                              f"continues it, {overwrite_flag} replaces it, or choose another {out_flag}")
    if ckpt.latest(checkpoint_dir(out_dir)) is None:
        raise FileExistsError(f"{out_flag} {out_dir!r} holds an earlier run's results ({describe(found)}) but no "
                              f"checkpoint to continue from; {overwrite_flag} replaces them, or choose another "
                              f"{out_flag}")


def clear(out_dir: str) -> List[str]:
    """Delete an earlier run's files from ``out_dir`` (``overwrite``): its checkpoints must not be
    taken for this run's by a later resume. Returns the paths removed."""
    removed = []
    for path in previous_run(out_dir):
        try:
            os.remove(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed
