"""Atomic file writes whose interrupted leftovers are cleaned up by the next writer or reader.

A write goes to ``<target>.tmp<pid>`` beside the target and is renamed into place, so readers
never see a partial file. A process killed mid-write (SIGKILL, power loss) leaves its temporary
file behind; ``remove_stale_temps`` deletes those whose process is gone (or that are older than a
day, in case the pid was reused or belongs to another host), never another live writer's.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Callable, List, Union

STALE_AFTER_S = 86400.0  # a temporary file this old is stale whatever its pid says
_TMP = re.compile(r"\.tmp(\d+)(?:_[^/]*)?$")


def temp_path(target: Union[str, os.PathLike]) -> str:
    """This process's temporary name for ``target``."""
    return f"{os.fspath(target)}.tmp{os.getpid()}"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but is not ours (EPERM)
        return True
    return True


def remove_stale_temps(target: Union[str, os.PathLike], prefix: str = "") -> int:
    """Delete leftovers of interrupted writes: files ``<name>.tmp<pid>[_...]`` in the directory of
    ``target`` (its own name when ``prefix`` is empty, else every name starting with ``prefix``)
    whose writer is no longer running. Returns how many were removed; never raises."""
    target = Path(target)
    directory = target.parent if not prefix else target
    stem = target.name if not prefix else prefix
    removed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    now = time.time()
    for name in names:
        if not name.startswith(stem):
            continue
        m = _TMP.search(name[len(stem):] if not prefix else name)
        if m is None or (not prefix and m.start() != 0):
            continue
        path = directory / name
        try:
            old = now - path.stat().st_mtime > STALE_AFTER_S
            if old or not _alive(int(m.group(1))):
                path.unlink()
                removed += 1
        except OSError:  # gone meanwhile, or not ours to remove
            continue
    return removed


def remove_stale_temps_in(directory: Union[str, os.PathLike]) -> List[str]:
    """Delete every leftover ``*.tmp<pid>[_...]`` file in ``directory`` whose writer is no longer
    running (or that is older than ``STALE_AFTER_S``); returns the paths removed, never raises."""
    removed: List[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        m = _TMP.search(name)
        path = os.path.join(directory, name)
        try:
            if m and os.path.isfile(path) and (now - os.path.getmtime(path) > STALE_AFTER_S
                                               or not _alive(int(m.group(1)))):
                os.remove(path)
                removed.append(path)
        except OSError:  # gone meanwhile, or not ours to remove
            continue
    return removed


def atomic_write(target: Union[str, os.PathLike], write: Callable[[str], None]) -> None:
    """``write(tmp)`` then rename ``tmp`` onto ``target``; the temporary file never outlives a
    failed or interrupted (KeyboardInterrupt, SIGTERM) write."""
    target = os.fspath(target)
    remove_stale_temps(target)
    tmp = temp_path(target)
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.lexists(tmp):
            try:
                os.unlink(tmp)
            except OSError:
                pass


def same_file(a: Union[str, os.PathLike], b: Union[str, os.PathLike]) -> bool:
    """Whether ``a`` and ``b`` name one existing file (through a link too); False when either is missing."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # missing, unreadable, or a name the OS refuses
        return False


def check_output_file(path: str, name: str, example: str, overwrite: bool = True,
                      overwrite_option: str = "--overwrite") -> None:
    """Raise, naming the argument ``name``, unless ``path`` names a file that can be written: not
    empty, its folder exists and takes a new file, no directory in its place (``example``: a file
    name such as the argument expects), and, unless ``overwrite``, no file there yet (the error
    names ``overwrite_option``, what allows replacing it)."""
    if not path:
        raise ValueError(f"{name}: empty, expected a file name such as {example}")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        what = "is not a folder" if os.path.exists(parent) else "does not exist; create it first"
        raise FileNotFoundError(f"{name}: the folder of {path!r} ({parent!r}) {what}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{name}: {path!r} is a directory, expected a file name such as {example}")
    if not overwrite and os.path.lexists(path):
        raise FileExistsError(f"{name}: {path!r} already exists; {overwrite_option} replaces it, or choose "
                              "another name")
    probe = temp_path(path)
    try:  # a folder that takes no new file is named now, not after the work that would fill it
        with open(probe, "wb"):
            pass
    except OSError as exc:
        raise OSError(f"{name}: cannot write {path!r} ({exc.strerror or type(exc).__name__})") from None
    finally:
        if os.path.exists(probe):
            os.remove(probe)
