"""`equikernels bench`: an option that would do nothing in the run asked for (the margins without
--check, --out with --results, --problems without the tp group, --atoms without a sized group,
--check without equikernels among --impls) is a one-line error naming it; a name repeated in a list
is measured once."""
import json

import pytest
import torch

from equikernels.bench import environment, suite
from equikernels.bench.compare import SCHEMA
from equikernels.cli import main
from cli_checks import one_line_error


def _run_file(tmp_path):
    cell = {"id": "tp/mace-large/float32/50000/fwd", "group": "tp", "impl": "equikernels", "status": "ok", "ms": 0.8}
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"schema": SCHEMA, "gpu_kind": "nvidia-h200", "env": {}, "cells": [cell],
                                "scope": {"groups": ["tp"], "problems": ["mace-large"]}}))
    return str(path)


@pytest.mark.parametrize("argv, needles", [
    (["--margin", "0.2"], ["--margin", "only with --check"]),
    (["--slack-ms", "1"], ["--slack-ms", "only with --check"]),
    (["--groups", "mace", "--problems", "nequip-water"], ["--problems", "tp group", "--groups mace"]),
    (["--groups", "tp,conv", "--atoms", "1008"], ["--atoms", "--groups tp,conv"]),
    (["--impls", "e3nn", "--check", "RUN"], ["--check", "equikernels", "--impls e3nn"]),
])
def test_an_option_that_would_do_nothing_is_refused(argv, needles, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = [_run_file(tmp_path) if a == "RUN" else a for a in argv]
    assert main(["bench", *argv, "--out", str(tmp_path / "out")]) == 2
    one_line_error(capsys, *needles)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra", [["--margin", "0.2"], ["--out", "OUT"]])
def test_stored_runs_refuse_options_they_would_ignore(extra, tmp_path, capsys):
    run = _run_file(tmp_path)
    argv = {"--margin": ["--merge", run, "--out", str(tmp_path / "out")],
            "--out": ["--results", run, "--check", run]}[extra[0]]
    extra = [str(tmp_path / "out") if a == "OUT" else a for a in extra]
    assert main(["bench", *argv, *extra]) == 2
    one_line_error(capsys, extra[0])
    assert not (tmp_path / "out").exists()


def test_a_repeated_name_is_measured_once(tmp_path, monkeypatch):
    """A repeated name timed its cells twice: a result file that --merge and --check then refuse."""
    seen = []

    class _Stop(Exception):
        pass

    def stop(opts, device):
        seen.append(opts)
        raise _Stop
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(environment, "gpu_kind", lambda device: "nvidia-h200")
    monkeypatch.setattr(suite, "run_suite", stop)
    with pytest.raises(_Stop):
        main(["bench", "--groups", "tp,mace,tp", "--problems", "nequip-water,nequip-water", "--atoms", "1008,1008",
              "--impls", "equikernels,e3nn,equikernels", "--out", str(tmp_path / "out"), "--debug"])
    opts = seen[0]
    assert (list(opts.groups), list(opts.problems), list(opts.systems), list(opts.impls)) == \
        (["tp", "mace"], ["nequip-water"], [1008], ["equikernels", "e3nn"])
