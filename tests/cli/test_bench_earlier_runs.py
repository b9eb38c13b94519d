"""`equikernels bench` keeps the results of an earlier run of the same GPU kind in --out (its
<gpu-kind>.json and .md) unless --overwrite is given: a merge refuses before writing, a measuring run
before measuring."""
import json

import pytest
import torch

from equikernels.bench import environment, suite
from equikernels.bench.compare import SCHEMA
from equikernels.cli import main
from cli_checks import one_line_error

KIND = "nvidia-h200"


def _run(ms=0.8):
    cell = {"id": "tp/mace-large/float32/50000/fwd", "group": "tp", "impl": "equikernels", "status": "ok", "ms": ms}
    return {"schema": SCHEMA, "gpu_kind": KIND, "env": {}, "cells": [cell],
            "scope": {"groups": ["tp"], "problems": ["mace-large"]}}


def _write(path, data):
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("earlier", [f"{KIND}.json", f"{KIND}.md"])
def test_merge_keeps_an_earlier_run_unless_overwrite(earlier, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / earlier).write_text("an earlier run")
    run = _write(tmp_path / "run.json", _run())
    assert main(["bench", "--merge", run, "--out", str(out)]) == 2
    one_line_error(capsys, "--out", earlier, "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == [earlier]
    assert (out / earlier).read_text() == "an earlier run"
    assert main(["bench", "--merge", run, "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / f"{KIND}.json").read_text())["cells"][0]["ms"] == 0.8


def test_a_run_of_another_gpu_kind_is_not_an_earlier_run(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "nvidia-h100-80gb-hbm3.json").write_text("another GPU's run")
    assert main(["bench", "--merge", _write(tmp_path / "run.json", _run()), "--out", str(out)]) == 0
    assert (out / "nvidia-h100-80gb-hbm3.json").read_text() == "another GPU's run"


@pytest.fixture
def fake_gpu(monkeypatch):
    """A visible GPU of kind KIND whose suite returns ``_run()`` at once (recording it was called)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(environment, "gpu_kind", lambda device: KIND)
    monkeypatch.setattr(suite, "run_suite", lambda opts, device: calls.append(opts) or dict(_run(0.5), wall_s=1.0))
    return calls


def test_a_measuring_run_refuses_before_measuring(fake_gpu, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{KIND}.json").write_text("an earlier run")
    assert main(["bench", "--groups", "tp", "--out", str(out)]) == 2
    one_line_error(capsys, "--out", f"{KIND}.json", "--overwrite")
    assert fake_gpu == [] and (out / f"{KIND}.json").read_text() == "an earlier run"
    assert main(["bench", "--groups", "tp", "--out", str(out), "--overwrite"]) == 0
    assert len(fake_gpu) == 1 and json.loads((out / f"{KIND}.json").read_text())["cells"][0]["ms"] == 0.5
