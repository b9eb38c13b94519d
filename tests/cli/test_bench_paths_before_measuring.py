"""`equikernels bench` refuses, before a GPU measures anything, the paths that would turn an option off
or lose the results at the end of the run: an empty path, an --out that cannot be written or holds a
folder in a results file's place, a --model file that is no model."""
import json
import os
import tempfile

import pytest
import torch

from equikernels.bench import environment, suite
from equikernels.bench.compare import SCHEMA
from equikernels.cli import build_parser, main
from cli_checks import one_line_error

KIND = "nvidia-h200"


def _run(ms=0.8):
    cell = {"id": "tp/mace-large/float32/50000/fwd", "group": "tp", "impl": "equikernels", "status": "ok", "ms": ms}
    return {"schema": SCHEMA, "gpu_kind": KIND, "env": {}, "cells": [cell], "wall_s": 1.0,
            "scope": {"groups": ["tp"], "problems": ["mace-large"]}}


def _write(path, data):
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.fixture
def fake_gpu(monkeypatch):
    """A visible GPU of kind KIND whose suite returns a run at once; the list records each measurement."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(environment, "gpu_kind", lambda device: KIND)
    monkeypatch.setattr(suite, "run_suite", lambda opts, device: calls.append(opts) or _run(5.0))
    return calls


@pytest.mark.parametrize("flag", ["--check", "--results", "--out", "--model"])
def test_an_empty_path_is_refused_not_taken_as_absent(flag, fake_gpu, tmp_path, capsys, monkeypatch):
    """``--check "$BASELINE"`` with the variable unset measured without checking and exited 0."""
    monkeypatch.chdir(tmp_path)
    base = _write(tmp_path / "base.json", _run())
    argv = {"--check": ["--check", ""], "--results": ["--results", "", "--check", base],
            "--out": ["--out", ""], "--model": ["--model", ""]}[flag]
    assert main(["bench", "--groups", "tp", *argv]) == 2
    one_line_error(capsys, f"{flag}: an empty path")
    assert fake_gpu == [] and sorted(os.listdir(tmp_path)) == ["base.json"]
    assert main(["bench", "--merge", base, "", "--out", str(tmp_path / "out")]) == 2
    one_line_error(capsys, "--merge: an empty path")


@pytest.fixture
def unwritable(tmp_path):
    """A folder this process cannot create files in (a read-only one; for root, /sys)."""
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, "/sys"):
        try:
            fd, probe = tempfile.mkstemp(dir=candidate)
        except OSError:
            yield str(candidate)
            break
        os.close(fd)
        os.unlink(probe)
    else:
        pytest.skip("no folder here refuses new files")
    folder.chmod(0o755)


def test_an_out_that_cannot_be_written_is_refused_before_measuring(unwritable, fake_gpu, tmp_path, capsys):
    """The run measured for its whole length, then failed to write, losing every cell."""
    out = os.path.join(unwritable, "results")
    assert main(["bench", "--groups", "tp", "--out", out]) == 2
    one_line_error(capsys, f"--out {out!r}", "cannot write in", "expected a folder that can be written")
    assert fake_gpu == []
    assert main(["bench", "--merge", _write(tmp_path / "run.json", _run()), "--out", out]) == 2
    one_line_error(capsys, "--out", "cannot write in")


def test_a_folder_in_place_of_a_results_file_is_refused_before_measuring(fake_gpu, tmp_path, capsys):
    out = tmp_path / "out"
    (out / f"{KIND}.json").mkdir(parents=True)
    assert main(["bench", "--groups", "tp", "--out", str(out), "--overwrite"]) == 2
    one_line_error(capsys, "--out", f"folder named {KIND}.json")
    assert fake_gpu == []


def test_a_model_file_that_is_no_model_is_refused_before_measuring(fake_gpu, tmp_path, capsys):
    """It was accepted, and the suite reported its cells as errors at the end of the run."""
    notes = _write(tmp_path / "notes.txt", "not a model\n")
    assert main(["bench", "--groups", "tp", "--model", notes, "--out", str(tmp_path / "out")]) == 2
    one_line_error(capsys, "--model", notes, "not a model file")
    assert fake_gpu == [] and not (tmp_path / "out").exists()


def test_the_writable_out_and_a_real_model_still_run(fake_gpu, tmp_path, capsys):
    from equikernels.default_model import default_model_path
    out = tmp_path / "out"
    assert main(["bench", "--groups", "tp", "--model", default_model_path(), "--out", str(out)]) == 0
    assert len(fake_gpu) == 1 and fake_gpu[0].model == os.path.normpath(default_model_path())
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".png")) == [f"{KIND}.json", f"{KIND}.md"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # the probe file is gone


def test_help_says_what_quick_and_target_ms_time():
    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    helps = {a.dest: a.help for a in bench._actions}
    assert "MD" in helps["quick"] and "training" in helps["quick"]
    assert "MD cell times ten times as much" in helps["target_ms"]
