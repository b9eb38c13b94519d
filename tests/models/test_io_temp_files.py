"""Model writes are atomic and leave nothing behind: a temporary file of an interrupted write is
removed by the next save or load of that path (if its writer is gone), and a write that fails
removes its own."""
import os

import pytest
import torch

from equikernels.models import load, save

DEAD_PID = 2 ** 22 + 4321  # above the default pid_max: no such process


@pytest.fixture(scope="module")
def model():
    from random_models import small_random_model
    return small_random_model([29], seed=2)


def test_leftovers_of_killed_writers_are_removed(model, tmp_path):
    path = tmp_path / "m.model"
    stale = tmp_path / f"m.model.tmp{DEAD_PID}"
    stale.write_bytes(b"partial")
    save(model, path)
    assert not stale.exists() and path.exists()
    stale.write_bytes(b"partial")
    live = tmp_path / f"m.model.tmp{os.getppid()}"  # a running writer's file is not touched
    live.write_bytes(b"in progress")
    load(path)
    assert not stale.exists() and live.exists()
    d = tmp_path / "dir"
    d.mkdir()
    save(model, d)
    for name in ("config.json", "weights.pt"):
        (d / f"{name}.tmp{DEAD_PID}").write_bytes(b"partial")
    load(d)
    assert sorted(os.listdir(d)) == ["config.json", "weights.pt"]


def test_failed_write_removes_its_temporary_file(model, tmp_path, monkeypatch):
    def interrupted(obj, f, *args, **kwargs):
        with open(f, "wb") as fh:
            fh.write(b"half")
        raise KeyboardInterrupt
    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save(model, tmp_path / "m.model")
    assert os.listdir(tmp_path) == []


def test_interrupted_directory_write_keeps_the_earlier_pair(model, tmp_path, monkeypatch):
    from random_models import small_random_model
    d = tmp_path / "dir"
    d.mkdir()
    save(model, d)
    before = {n: (d / n).read_bytes() for n in ("config.json", "weights.pt")}
    other = small_random_model([29, 8], seed=3)  # another config and other weights
    real = torch.save

    def interrupted(obj, f, *args, **kwargs):
        real(obj, f, *args, **kwargs)
        raise KeyboardInterrupt  # after the weights are written, before they are renamed
    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save(other, d)
    monkeypatch.setattr(torch, "save", real)
    assert sorted(os.listdir(d)) == ["config.json", "weights.pt"]
    assert {n: (d / n).read_bytes() for n in before} == before
    load(d)
