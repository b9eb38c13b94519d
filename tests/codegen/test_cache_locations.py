"""Where the generated-kernel cache lives: ``~`` and relative paths in the settings, a relative
XDG_CACHE_HOME, no home directory, unusual characters, and a temporary file taken away mid-write."""
import os
import warnings

import pytest

from equikernels import settings
from equikernels.codegen import cache as kcache
from equikernels.tune.cache import check_persistent, configured_path, default_path

BODY = "def f():\n    return 7\n"


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A fresh cache state, HOME at ``tmp_path/home``, the working directory ``tmp_path/work``."""
    for name, value in (("_FALLBACK", None), ("_UNUSABLE", set()), ("_SWEPT", set()), ("_ABSOLUTE", {})):
        monkeypatch.setattr(kcache, name, value)
    for name in ("EQUIKERNELS_CACHE_DIR", "EQUIKERNELS_TUNE_FILE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "work")
    settings.reload()
    yield monkeypatch
    monkeypatch.undo()
    settings.reload()


def test_tilde_in_the_cache_dir_is_the_home_directory(env, tmp_path):
    env.setenv("EQUIKERNELS_CACHE_DIR", "~/ek cache")
    path = kcache.write_source("k", BODY)
    assert path.parent == tmp_path / "home" / "ek cache" / "kernels"
    assert os.listdir(tmp_path / "work") == []  # no directory named "~" in the working directory
    env.setenv("EQUIKERNELS_TUNE_FILE", "~/tunings.json")
    assert default_path() == tmp_path / "home" / "tunings.json"


def test_relative_cache_dir_stays_where_it_was_first_used(env, tmp_path):
    env.setenv("EQUIKERNELS_CACHE_DIR", "rel")
    first = kcache.write_source("k", BODY)
    assert first.is_absolute() and first.parent == tmp_path / "work" / "rel" / "kernels"
    env.chdir(tmp_path / "home")
    assert kcache.write_source("k", BODY) == first and kcache.cache_dir() == tmp_path / "work" / "rel"


def test_relative_xdg_cache_home_is_ignored(env, tmp_path):
    env.setenv("XDG_CACHE_HOME", "relative")
    assert kcache.cache_dir() == tmp_path / "home" / ".cache" / "equikernels"
    env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kcache.cache_dir() == tmp_path / "xdg" / "equikernels"


def test_no_home_directory_falls_back_with_one_warning(env, tmp_path):
    env.setenv("HOME", "not/absolute")
    with pytest.warns(RuntimeWarning, match="EQUIKERNELS_CACHE_DIR") as record:
        mod = kcache.load_module("k", BODY)
        kcache.write_source("k2", BODY + "\n")
    assert mod.f() == 7 and len([w for w in record if "unusable" in str(w.message)]) == 1
    assert os.listdir(tmp_path / "work") == [] and kcache.cache_dir() == kcache._FALLBACK
    with pytest.raises(OSError, match="EQUIKERNELS_CACHE_DIR"):
        check_persistent(configured_path())


@pytest.mark.parametrize("name", ["dir with spaces", "ünïcödé ✓ 缓存"])
def test_unusual_characters_in_the_path(env, tmp_path, name):
    env.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path / name))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kcache.load_module(f"k_{len(name)}", BODY).f() == 7
    assert (tmp_path / name / "kernels").is_dir()


def test_temporary_file_taken_by_another_sweeper_is_rewritten(env, tmp_path):
    """A writer in another pid namespace (container, host) may take our temporary file for a dead
    process's leftover; the entry is written again, not moved to a private directory."""
    env.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path / "c"))
    real, taken = os.replace, []

    def replace(src, dst):
        if not taken:
            taken.append(src)
            os.unlink(src)
        return real(src, dst)
    env.setattr(kcache.os, "replace", replace)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = kcache.write_source("k", BODY)
    assert taken and path.parent == tmp_path / "c" / "kernels" and path.read_bytes().endswith(BODY.encode())
