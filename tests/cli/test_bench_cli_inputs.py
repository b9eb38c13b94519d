"""`equikernels bench` with bad stored runs and arguments: one line naming the argument and the file,
exit status 2, checked before a GPU is looked for and before anything is written."""
import json

import pytest
import torch

from equikernels.bench.compare import SCHEMA
from equikernels.cli import main
from cli_checks import one_line_error


def _run(kind="nvidia-h200", **extra):
    cells = [{"id": "tp/mace-large/float32/50000/fwd", "group": "tp", "impl": "equikernels", "status": "ok",
              "ms": 0.8, "err": 1e-7, "tol": 1e-4},
             {"id": "mace/float32/1008atoms/E+F", "group": "mace", "impl": "equikernels", "status": "ok", "ms": 5.0}]
    return {"schema": SCHEMA, "gpu_kind": kind, "env": {}, "copy": {"gbps_median": 3000.0}, "cells": cells, **extra}


def _write(path, data):
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("flag", ["--check", "--results"])
def test_stored_run_errors_name_the_flag_and_file(flag, tmp_path, capsys):
    good = _write(tmp_path / "good.json", _run())
    cases = {
        "missing.json": (None, ["does not exist"]),
        "folder": ("dir", ["is a folder"]),
        "text.json": ("{not json", ["is not JSON"]),
        "v2.json": (dict(_run(), schema="equikernels-bench/2"), ["found schema 'equikernels-bench/2'"]),
        "noid.json": (dict(_run(), cells=[{"impl": "equikernels", "status": "ok", "ms": 1.0}]), ["cells[0]", "'id'"]),
        "ints.json": (dict(_run(), cells=[1, 2]), ["cells[0]", "not an object"]),
        "zero.json": (dict(_run(), cells=[dict(_run()["cells"][0], ms=0)]), ["cells[0]", "time > 0"]),
        "null.json": (dict(_run(), cells=[dict(_run()["cells"][0], ms=None)]), ["cells[0]", "time > 0"]),
    }
    for name, (content, needles) in cases.items():
        path = tmp_path / name
        if content == "dir":
            path.mkdir()
        elif content is not None:
            _write(path, content)
        other = ["--results", good] if flag == "--check" else ["--check", good]
        assert main(["bench", flag, str(path), *other]) == 2, name
        one_line_error(capsys, f"{flag} '{path}'", *needles)


def test_a_baseline_timed_at_zero_is_refused_not_divided_by(tmp_path, capsys):
    base = _write(tmp_path / "base.json", dict(_run(), cells=[dict(_run()["cells"][0], ms=0.0)]))
    assert main(["bench", "--results", _write(tmp_path / "run.json", _run()), "--check", base]) == 2
    one_line_error(capsys, "--check", "time > 0")


@pytest.mark.parametrize("flag, value", [("--margin", "nan"), ("--margin", "-0.1"), ("--slack-ms", "inf")])
def test_check_margins_must_be_finite_and_not_negative(flag, value, tmp_path, capsys):
    """A NaN margin made every cell pass."""
    slow = _run()
    slow["cells"][0]["ms"] = 8.0
    argv = ["bench", "--results", _write(tmp_path / "slow.json", slow), "--check", _write(tmp_path / "b.json", _run())]
    assert main(argv + [flag, value]) == 2
    one_line_error(capsys, flag, value)


@pytest.mark.parametrize("argv, needles", [
    (["--target-ms", "0"], ["--target-ms", "> 0"]),
    (["--time-budget-s", "-1"], ["--time-budget-s", ">= 0"]),
    (["--check", "no-such-baseline.json"], ["--check", "no-such-baseline.json", "does not exist"]),
])
def test_arguments_are_checked_before_the_gpu(argv, needles, no_gpu, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", *argv]) == 2
    one_line_error(capsys, *needles)


def test_out_that_is_a_file_is_refused_before_measuring_or_merging(no_gpu, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep")
    assert main(["bench", "--out", str(afile)]) == 2
    one_line_error(capsys, "--out", "is a file")
    run = _write(tmp_path / "run.json", _run())
    for out in (afile, afile / "sub"):
        assert main(["bench", "--merge", run, "--out", str(out)]) == 2
        one_line_error(capsys, "--out", "is a file")
    assert afile.read_text() == "keep"


def test_merge_refuses_a_baseline_of_another_gpu_before_writing(tmp_path, capsys):
    out = tmp_path / "merged"
    other = _write(tmp_path / "h100.json", _run(kind="nvidia-h100-80gb-hbm3"))
    assert main(["bench", "--merge", _write(tmp_path / "run.json", _run()), "--out", str(out), "--check", other]) == 2
    one_line_error(capsys, "--check", "not comparable")
    assert not out.exists()


def test_merge_of_runs_without_copy_bandwidth_or_groups_writes_the_report(tmp_path, capsys):
    """Runs joined from files that lack the copy measurement or the cells' groups get a full report,
    not a JSON left without its markdown."""
    bare = _run()
    del bare["copy"], bare["env"]
    for c in bare["cells"]:
        del c["group"]
    out = tmp_path / "merged"
    assert main(["bench", "--merge", _write(tmp_path / "bare.json", bare), "--out", str(out)]) == 0
    md = (out / "nvidia-h200.md").read_text()
    assert "mace-large/float32/50000/fwd" in md and "float32/1008atoms/E+F" in md
    assert "Device-to-device copy" not in md
    assert json.loads((out / "nvidia-h200.json").read_text())["cells"][0]["ms"] == 0.8
