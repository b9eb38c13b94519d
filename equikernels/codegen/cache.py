"""Content-addressed store of generated kernel source.

Triton's ``@jit`` reads the source of the function it decorates, so generated kernels must live in
real files. Each file is named by the hash of its body and starts with that hash; a file whose
bytes do not match exactly (partial write, corruption, undecodable bytes, a directory in its place,
no read permission) is rewritten, never trusted. Writes go to a temp file in the same directory and
are renamed into place, so concurrent processes never see partial files.

A cache directory that cannot be created or written (``EQUIKERNELS_CACHE_DIR`` naming a file, a
read-only or foreign directory, no known home directory) is replaced, for the rest of the process,
by a private temporary directory, with one warning; nothing that reads or writes the cache raises
because of it. A configured path has ``~`` expanded and is made absolute once, so a later change of
the working directory does not move the cache.
"""
from __future__ import annotations

import atexit
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Dict, Optional, Set

from .._files import remove_stale_temps

from .. import settings

_HEADER = "# equikernels generated kernel; sha256 of body: "
_FALLBACK: Optional[Path] = None  # this process's private cache directory, made on first need
_UNUSABLE: Set[str] = set()  # configured cache directories that failed in this process
_SWEPT: Set[str] = set()
_ABSOLUTE: Dict[str, Path] = {}  # configured paths as resolved at their first use in this process


def absolute(configured: str) -> Path:
    """``configured`` with ``~`` expanded and, if relative, taken from the working directory of its
    first use in this process (the same answer afterwards, whatever the working directory)."""
    path = _ABSOLUTE.get(configured)
    if path is None:
        path = _ABSOLUTE[configured] = Path(os.path.abspath(os.path.expanduser(configured)))
    return path


def cache_dir() -> Path:
    """The configured cache directory, absolute: ``EQUIKERNELS_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/equikernels`` (an absolute ``XDG_CACHE_HOME`` only: the XDG spec has relative
    ones ignored), else ``~/.cache/equikernels``; the private fallback (warned once) where no home
    directory is known."""
    s = settings.get()
    if s.cache_dir:
        return absolute(s.cache_dir)
    if s.xdg_cache_home and os.path.isabs(s.xdg_cache_home):
        return Path(s.xdg_cache_home) / "equikernels"
    home = os.path.expanduser("~")
    if not os.path.isabs(home):  # HOME unset with no password entry, or relative: not a place to create
        why = OSError(f"no home directory: ~ expands to {home!r}, not an absolute path; is HOME set?")
        return fallback_dir(Path("~/.cache/equikernels"), why)
    return Path(home) / ".cache" / "equikernels"


def fallback_dir(configured: Path, exc: BaseException, variable: str = "EQUIKERNELS_CACHE_DIR") -> Path:
    """The process's private cache directory, to use instead of ``configured`` (which proved
    unusable, ``exc`` says why); warns once per configured directory, naming ``variable``.
    The private directory is removed when the process exits."""
    global _FALLBACK
    if _FALLBACK is None:
        _FALLBACK = Path(tempfile.mkdtemp(prefix="equikernels-cache-"))
        atexit.register(shutil.rmtree, _FALLBACK, True)
    if str(configured) not in _UNUSABLE:
        _UNUSABLE.add(str(configured))
        warnings.warn(f"equikernels: the cache directory {configured} is unusable ({type(exc).__name__}: {exc}); "
                      f"using a private temporary one for this process ({_FALLBACK}). Set {variable} "
                      "to a writable location to keep compiled kernels and tunings between runs.",
                      RuntimeWarning, stacklevel=3)
    return _FALLBACK


def usable_dir() -> Path:
    """``cache_dir()``, or the private fallback once it has proved unusable in this process."""
    base = cache_dir()
    return _FALLBACK if _FALLBACK is not None and str(base) in _UNUSABLE else base


def subdir(name: str) -> Path:
    """``usable_dir()/name``, created if needed; falls back (see ``fallback_dir``) when that fails."""
    base = usable_dir()
    d = base / name
    try:
        d.mkdir(parents=True, exist_ok=True)
        if not d.is_dir():
            raise NotADirectoryError(f"{d} is not a directory")
        return d
    except OSError as exc:
        if base == _FALLBACK:
            raise
        d = fallback_dir(base, exc) / name
        d.mkdir(parents=True, exist_ok=True)
        return d


def _body_hash(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()


def _content(body: str, digest: str) -> bytes:
    return (_HEADER + digest + "\n" + body).encode()


def _valid(path: Path, content: bytes) -> bool:
    """Whether ``path`` holds exactly ``content`` (any read failure or mismatch: no)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(len(content) + 1) == content
    except OSError:  # missing, a directory, no permission
        return False


def _write(d: Path, path: Path, content: bytes, attempts: int = 3) -> None:
    if str(d) not in _SWEPT:  # leftovers of writers killed mid-write, once per directory and process
        _SWEPT.add(str(d))
        remove_stale_temps(d, prefix=".tmp")
    for attempt in range(attempts):
        fd, tmp = tempfile.mkstemp(dir=d, prefix=f".tmp{os.getpid()}_", suffix=".py")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(content)
            os.replace(tmp, path)
            return
        except FileNotFoundError:
            # a sweeper in another pid namespace (a container, another host) took our temporary file
            if os.path.exists(tmp) or not d.is_dir() or attempt == attempts - 1:
                raise
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def write_source(name: str, body: str) -> Path:
    """Store ``body`` under the cache directory (idempotent) and return its path."""
    digest = _body_hash(body)
    content = _content(body, digest)
    fname = f"{name}_{digest[:20]}.py"
    d = subdir("kernels")
    path = d / fname
    if _valid(path, content):
        return path
    try:
        if path.is_dir():  # an empty directory in the entry's place is cleared; anything else falls back
            os.rmdir(path)
        _write(d, path, content)
    except OSError as exc:
        if d.parent == _FALLBACK:
            raise
        d = fallback_dir(d.parent, exc) / "kernels"
        d.mkdir(parents=True, exist_ok=True)
        path = d / fname
        _write(d, path, content)
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
