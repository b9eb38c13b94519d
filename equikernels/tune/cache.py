"""Persistent store of tuned choices: one JSON file shared by every process of a user.

Keys name everything a measurement depends on (GPU, torch / triton / equikernels versions, problem,
direction, size bucket), so a version change simply misses. Writers take a lock file, re-read,
merge and rename a temporary file into place: concurrent processes never lose each other's entries
or see a partial file. A file that does not parse is ignored (and replaced by the next write).
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Dict, Optional

from .. import settings
from ..codegen.cache import cache_dir

FORMAT = 1


def default_path() -> Path:
    return Path(settings.get().tune_file or cache_dir() / "tuning.json")


class TuneCache:
    def __init__(self, path: Optional[Path] = None):
        self.path = Path(path) if path is not None else default_path()
        self._entries: Optional[Dict[str, dict]] = None

    def _read(self) -> Dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            return {}
        return {k: v for k, v in data["entries"].items() if isinstance(v, dict) and isinstance(v.get("config"), dict)}

    def get(self, key: str) -> Optional[dict]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries.get(key)

    def put(self, key: str, entry: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(str(self.path) + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                entries = self._read()
                entries[key] = entry
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tuning.", suffix=".tmp")
                with os.fdopen(fd, "w") as f:
                    json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
                os.replace(tmp, self.path)
                self._entries = entries
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
