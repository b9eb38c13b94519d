"""Persistent store of tuned choices: one JSON file shared by every process of a user.

Keys name everything a measurement depends on (GPU, torch / triton / equikernels versions, problem,
direction, size bucket), so a version change simply misses. Writers take a lock file, re-read,
merge and rename a temporary file into place: concurrent processes never lose each other's entries
or see a partial file. A file that does not parse (empty, truncated, not JSON) or was written in
another format is ignored, with one warning naming it, and replaced by the next write; entries
without a configuration are dropped. A location that cannot be written
(a directory in the file's place, a read-only directory) moves the cache to the process's private
temporary directory, with one warning (``codegen.cache.fallback_dir``).
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Dict, Optional, Set

from .. import settings
from .._files import atomic_write
from ..codegen import cache as _kernel_cache

FORMAT = 1
FILE_NAME = "tuning.json"
_WARNED: Set[str] = set()  # tuning files already reported unreadable in this process


def variable() -> str:
    """The environment variable that places the tuning file."""
    return "EQUIKERNELS_TUNE_FILE" if settings.get().tune_file else "EQUIKERNELS_CACHE_DIR"


def default_path() -> Path:
    """Where this process keeps tunings: the configured file, or the private fallback once the
    cache directory proved unusable."""
    s = settings.get()
    return _kernel_cache.absolute(s.tune_file) if s.tune_file else _kernel_cache.usable_dir() / FILE_NAME


def configured_path() -> Path:
    """Where the settings put the tuning file, whether or not it proved usable."""
    s = settings.get()
    return _kernel_cache.absolute(s.tune_file) if s.tune_file else _kernel_cache.cache_dir() / FILE_NAME


def check_persistent(path: Path) -> None:
    """Raise OSError naming the setting and ``path`` unless tunings written there outlive this
    process: not the private fallback, no directory in its place, its directory can be created and
    takes new files."""
    fallback = _kernel_cache._FALLBACK
    why = ""
    if fallback is not None and path.parent == fallback:
        why = "no usable cache directory: it would be a temporary one, removed at exit"
    elif path.is_dir():
        why = "a directory is in its place"
    else:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.tmp{os.getpid()}_")
            os.close(fd)
            os.unlink(tmp)
        except OSError as exc:
            why = f"{type(exc).__name__}: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    if why:
        raise OSError(f"{variable()}: cannot keep tunings in {path} ({why}); expected a writable location")


class TuneCache:
    def __init__(self, path: Optional[Path] = None):
        self.path = Path(path) if path is not None else default_path()
        self._entries: Optional[Dict[str, dict]] = None
        self.checked: Set[str] = set()  # keys whose configuration was found among the candidates

    def _read(self) -> Dict[str, dict]:
        try:
            raw = self.path.read_bytes()
        except OSError:  # missing, unreadable, a directory: nothing to report until a write fails
            return {}
        try:
            data = json.loads(raw)
        except ValueError as exc:  # empty, truncated, not UTF-8, not JSON
            self._ignored(f"not a JSON file ({'empty' if not raw.strip() else exc})")
            return {}
        if isinstance(data, dict) and "format" in data and data["format"] != FORMAT:
            self._ignored(f"format {data['format']!r}, written by another version of equikernels (this one reads "
                          f"format {FORMAT})")
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            self._ignored("JSON, but not a tuning file (expected an object with format and entries)")
            return {}
        return {k: v for k, v in data["entries"].items() if isinstance(v, dict) and isinstance(v.get("config"), dict)}

    def _ignored(self, why: str) -> None:
        if str(self.path) not in _WARNED:
            _WARNED.add(str(self.path))
            warnings.warn(f"equikernels autotune: ignoring the tuning file {self.path}: {why}; "
                          "the next tuning replaces it", RuntimeWarning, stacklevel=4)

    def get(self, key: str) -> Optional[dict]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries.get(key)

    def put(self, key: str, entry: dict) -> None:
        """Store ``entry`` under ``key`` (merged with what other processes wrote meanwhile)."""
        self._update(lambda entries: entries.__setitem__(key, entry))

    def _update(self, change) -> None:
        try:
            self._locked_update(change)
        except OSError as exc:
            if self.path.parent == _kernel_cache._FALLBACK:
                raise
            fallback = _kernel_cache.fallback_dir(
                self.path.parent, exc, "EQUIKERNELS_TUNE_FILE" if settings.get().tune_file
                else "EQUIKERNELS_CACHE_DIR")
            self.path, self._entries = fallback / FILE_NAME, None
            self._locked_update(change)

    def _locked_update(self, change) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(str(self.path) + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                entries = self._read()
                change(entries)
                text = json.dumps({"format": FORMAT, "entries": entries}, indent=1, sort_keys=True)

                def write(tmp: str) -> None:
                    with open(tmp, "w") as f:
                        f.write(text)
                atomic_write(self.path, write)
                self._entries = entries
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
