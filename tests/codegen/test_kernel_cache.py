"""The generated-kernel cache and the tuning file under hostile cache states: undecodable or
unreadable entries are regenerated, unusable cache locations fall back to a private directory with
one warning, and leftovers of interrupted writes are removed."""
import os
import warnings

import pytest

from equikernels import settings
from equikernels.codegen import cache as kcache
from equikernels.tune.cache import TuneCache

BODY = "def f():\n    return 42\n"


@pytest.fixture
def cache_env(monkeypatch, tmp_path):
    """Point EQUIKERNELS_CACHE_DIR at ``where`` for one test, with a fresh fallback state."""
    monkeypatch.setattr(kcache, "_FALLBACK", None)
    monkeypatch.setattr(kcache, "_UNUSABLE", set())
    monkeypatch.setattr(kcache, "_SWEPT", set())

    def point(where):
        monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(where))
        monkeypatch.delenv("EQUIKERNELS_TUNE_FILE", raising=False)
        settings.reload()
    yield point
    monkeypatch.undo()
    settings.reload()


def _entry(tmp_path):
    path = kcache.write_source("k", BODY)
    assert path.parent == tmp_path / "kernels"
    return path


@pytest.mark.parametrize("garbage", [b"\xff\xfe\x80 not utf-8", b"", b"# equikernels generated kernel; sha256"])
def test_corrupt_entry_is_regenerated(cache_env, tmp_path, garbage):
    cache_env(tmp_path)
    path = _entry(tmp_path)
    path.write_bytes(garbage)
    assert kcache.load_module("k", BODY) is not None
    assert kcache.write_source("k", BODY) == path and path.read_bytes().endswith(BODY.encode())


def test_directory_in_place_of_an_entry(cache_env, tmp_path):
    cache_env(tmp_path)
    path = _entry(tmp_path)
    path.unlink()
    path.mkdir()
    assert kcache.write_source("k", BODY) == path and path.is_file()
    path.unlink()
    (path / "x").parent.mkdir()
    (path / "x").write_text("someone's file")  # not ours to delete: this entry goes elsewhere
    with pytest.warns(RuntimeWarning, match="EQUIKERNELS_CACHE_DIR"):
        other = kcache.write_source("k", BODY)
    assert other != path and other.read_bytes().endswith(BODY.encode()) and (path / "x").exists()


def test_cache_dir_is_a_file(cache_env, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    cache_env(blocker)
    with pytest.warns(RuntimeWarning, match="EQUIKERNELS_CACHE_DIR") as record:
        mod = kcache.load_module("k2", BODY)
        kcache.load_module("k3", BODY + "\n")
        TuneCache().put("key", {"config": {"rows": 1}})
    assert mod.f() == 42 and len([w for w in record if "unusable" in str(w.message)]) == 1
    assert TuneCache().get("key")["config"] == {"rows": 1}  # the fallback keeps it for this process


def test_unwritable_cache_dir(cache_env, tmp_path, monkeypatch):
    cache_env(tmp_path)
    (tmp_path / "kernels").mkdir()
    real = kcache.tempfile.mkstemp

    def refuse(*args, dir=None, **kwargs):  # a read-only directory (root ignores permission bits)
        if dir is not None and str(dir).startswith(str(tmp_path)):
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*args, dir=dir, **kwargs)
    monkeypatch.setattr(kcache.tempfile, "mkstemp", refuse)
    with pytest.warns(RuntimeWarning, match="unusable"):
        path = kcache.write_source("k4", BODY)
    assert not str(path).startswith(str(tmp_path)) and path.is_file()


def test_tuning_file_is_a_directory(cache_env, tmp_path):
    cache_env(tmp_path)
    (tmp_path / "tuning.json").mkdir()
    c = TuneCache()
    assert c.get("a") is None
    with pytest.warns(RuntimeWarning, match="unusable"):
        c.put("a", {"config": {"rows": 2}})
    assert c.get("a")["config"] == {"rows": 2}


def test_interrupted_writes_are_cleaned_up(cache_env, tmp_path):
    cache_env(tmp_path)
    d = tmp_path / "kernels"
    d.mkdir()
    dead = 2 ** 22 + 12345  # above the default pid_max: no such process
    stale = d / f".tmp{dead}_abc.py"
    stale.write_text("partial")
    live = d / f".tmp{os.getppid()}_def.py"  # a running writer's file stays
    live.write_text("in progress")
    kcache.write_source("k5", BODY)
    assert not stale.exists() and live.exists()
    tfile = tmp_path / "tuning.json"
    (tmp_path / f"tuning.json.tmp{dead}").write_text("{")
    TuneCache(tfile).put("a", {"config": {}})
    assert not (tmp_path / f"tuning.json.tmp{dead}").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TuneCache(tfile).get("a") is not None
