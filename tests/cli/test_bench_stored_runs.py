"""`equikernels bench --results` and `--merge` on stored runs: exit status, one-line errors naming the
argument and the file, and what a merge says about the cells and versions it joins."""
import json

import pytest

from equikernels.bench.compare import SCHEMA
from equikernels.cli import main
from cli_checks import one_line_error

TP = "tp/mace-large/float32/50000/fwd"


def _run(kind="nvidia-h200", torch_version="2.11.0", **extra):
    cells = [{"id": TP, "group": "tp", "impl": "equikernels", "status": "ok", "ms": 0.8},
             {"id": TP, "group": "tp", "impl": "cuequivariance", "status": "ok", "ms": 1.0}]
    return {"schema": SCHEMA, "gpu_kind": kind, "env": {"torch": torch_version}, "cells": cells,
            "scope": {"groups": ["tp"], "problems": ["mace-large"]}, **extra}


def _write(path, data):
    path.write_text(json.dumps(data))
    return str(path)


def test_a_run_with_a_scope_of_another_shape_is_an_input_error_not_a_crash(tmp_path, capsys):
    """A traceback ended with status 1, which reads as a regression."""
    bad = _write(tmp_path / "bad.json", _run(scope=["tp"]))
    assert main(["bench", "--results", bad, "--check", _write(tmp_path / "base.json", _run())]) == 2
    one_line_error(capsys, f"--results '{bad}'", "'scope' is a JSON array; expected an object")


def test_a_run_that_measured_nothing_the_baseline_guards_exits_1(tmp_path, capsys):
    empty = _write(tmp_path / "empty.json", _run(cells=[], scope={"groups": [], "problems": []}))
    assert main(["bench", "--results", empty, "--check", _write(tmp_path / "base.json", _run())]) == 1
    assert "nothing was compared" in capsys.readouterr().out


def test_an_unsafe_gpu_kind_writes_nothing_outside_out(tmp_path, capsys):
    out = tmp_path / "out"
    run = _write(tmp_path / "run.json", _run(kind="../escaped"))
    assert main(["bench", "--merge", run, "--out", str(out)]) == 2
    one_line_error(capsys, f"--merge '{run}'", "'gpu_kind' '../escaped'")
    assert not (tmp_path / "escaped.json").exists() and not out.exists()


def test_merge_of_two_gpu_kinds_names_each_file(tmp_path, capsys):
    a, b = _write(tmp_path / "a.json", _run()), _write(tmp_path / "b.json", _run(kind="nvidia-h100-80gb-hbm3"))
    assert main(["bench", "--merge", a, b, "--out", str(tmp_path / "out")]) == 2
    one_line_error(capsys, "--merge", f"'{a}' on 'nvidia-h200'", f"'{b}' on 'nvidia-h100-80gb-hbm3'")


def test_merge_says_which_measurements_a_later_run_replaced_and_which_versions_differ(tmp_path, capsys):
    later = _run(torch_version="2.13.0")
    later["cells"][0].update(status="error", error="boom", ms=None)
    later["cells"][1].update(status="absent", error="not installed", ms=None)
    paths = [_write(tmp_path / "a.json", _run()), _write(tmp_path / "b.json", later)]
    assert main(["bench", "--merge", *paths, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "1 cell(s) of earlier runs replaced by a later run's" in out
    assert f"{TP} [equikernels]: measured (ok) in an earlier run, now error from a later one" in out
    assert f"different torch: 2.11.0 ({paths[0]}); 2.13.0 ({paths[1]})" in out
    cells = {c["impl"]: c for c in json.loads((tmp_path / "out" / "nvidia-h200.json").read_text())["cells"]}
    assert cells["cuequivariance"]["ms"] == 1.0 and cells["equikernels"]["status"] == "error"


@pytest.mark.parametrize("flag, value", [("--groups", "tp"), ("--quick", None), ("--atoms", "1008"),
                                         ("--time-budget-s", "60")])
def test_measuring_options_are_refused_with_stored_runs(flag, value, tmp_path, capsys):
    """They would do nothing: a stored run keeps the scope it was measured with."""
    run = _write(tmp_path / "run.json", _run())
    option = [flag] + ([value] if value else [])
    assert main(["bench", "--results", run, "--check", run, *option]) == 2
    one_line_error(capsys, f"{flag}: not with --results")
    assert main(["bench", "--merge", run, "--out", str(tmp_path / "out"), *option]) == 2
    one_line_error(capsys, f"{flag}: not with --merge")
    assert not (tmp_path / "out").exists()
