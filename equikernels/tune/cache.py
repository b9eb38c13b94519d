"""Persistent store of tuned choices: one JSON file shared by every process of a user.

Keys name everything a measurement depends on (GPU, torch / triton / equikernels versions, problem,
direction, size bucket), so a version change simply misses. Writers take a lock file, re-read,
merge and rename a temporary file into place: concurrent processes never lose each other's entries
or see a partial file. A file that does not parse (or cannot be read) is ignored and replaced by
the next write; entries without a configuration are dropped. A location that cannot be written
(a directory in the file's place, a read-only directory) moves the cache to the process's private
temporary directory, with one warning (``codegen.cache.fallback_dir``).
"""
from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Dict, Optional, Set

from .. import settings
from .._files import atomic_write
from ..codegen import cache as _kernel_cache

FORMAT = 1
FILE_NAME = "tuning.json"


def default_path() -> Path:
    return Path(settings.get().tune_file or _kernel_cache.usable_dir() / FILE_NAME)


class TuneCache:
    def __init__(self, path: Optional[Path] = None):
        self.path = Path(path) if path is not None else default_path()
        self._entries: Optional[Dict[str, dict]] = None
        self.checked: Set[str] = set()  # keys whose configuration was found among the candidates

    def _read(self) -> Dict[str, dict]:
        try:
            data = json.loads(self.path.read_bytes())
        except (OSError, ValueError):  # missing, unreadable, a directory, not UTF-8, not JSON
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            return {}
        return {k: v for k, v in data["entries"].items() if isinstance(v, dict) and isinstance(v.get("config"), dict)}

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
