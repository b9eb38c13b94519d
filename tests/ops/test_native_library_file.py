"""The compiled autograd node's library file on disk: a cached library that does not load (truncated,
overwritten) is rebuilt once instead of leaving every later process on the Python node; a failed
build leaves no temporary file beside it."""
import subprocess

import pytest

from equikernels.ops import native


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_ext", None)
    monkeypatch.setattr(native, "_failed", None)
    monkeypatch.setattr(native, "library_path", lambda: tmp_path / "node.so")
    return tmp_path


def test_a_cached_library_that_does_not_load_is_rebuilt(fresh, monkeypatch):
    (fresh / "node.so").write_bytes(b"\x7fELF truncated")
    builds = []

    def build(path):
        builds.append(path)
        path.write_bytes(b"still not a library")
    monkeypatch.setattr(native, "_build", build)
    with pytest.warns(RuntimeWarning, match="could not be built"):
        assert native.load() is None
    assert builds == [fresh / "node.so"]


@pytest.mark.parametrize("how", ["exit status", "time limit"])
def test_a_failed_build_leaves_no_temporary_file(fresh, monkeypatch, how):
    monkeypatch.setattr(native, "build_command", lambda src, out: ["false"])
    if how == "time limit":
        def run(cmd, **kwargs):
            raise subprocess.TimeoutExpired(cmd, kwargs.get("timeout"))
        monkeypatch.setattr(native.subprocess, "run", run)
    with pytest.warns(RuntimeWarning, match="could not be built"):
        assert native.load() is None
    assert list(fresh.iterdir()) == []
