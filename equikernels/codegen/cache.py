"""Content-addressed store of generated kernel source.

Triton's ``@jit`` reads the source of the function it decorates, so generated kernels must live in
real files. Each file is named by the hash of its body and starts with that hash; a file whose body
does not match (partial write, corruption) is rewritten, never trusted. Writes go to a temp file
in the same directory and are renamed into place, so concurrent processes never see partial files.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from .. import settings

_HEADER = "# equikernels generated kernel; sha256 of body: "


def cache_dir() -> Path:
    s = settings.get()
    if s.cache_dir:
        return Path(s.cache_dir)
    base = s.xdg_cache_home or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "equikernels"


def _body_hash(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def _valid(path: Path, digest: str) -> bool:
    try:
        text = path.read_text()
    except OSError:
        return False
    first, _, body = text.partition("\n")
    return first == _HEADER + digest and _body_hash(body) == digest


def write_source(name: str, body: str) -> Path:
    """Store ``body`` under the cache directory (idempotent) and return its path."""
    digest = _body_hash(body)
    d = cache_dir() / "kernels"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}_{digest[:20]}.py"
    if not _valid(path, digest):
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp_", suffix=".py")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(_HEADER + digest + "\n" + body)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return path


def load_module(name: str, body: str):
    """Write (if needed) and import generated source; returns the module."""
    path = write_source(name, body)
    mod_name = f"equikernels_generated.{path.stem}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[mod_name] = module
    return module
