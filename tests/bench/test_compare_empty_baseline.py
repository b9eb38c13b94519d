"""A baseline with no measured equikernels cell fails the check, and the summary blames the baseline."""
import json

from equikernels.bench.compare import SCHEMA, compare
from equikernels.cli import main

KIND = "nvidia-h100-80gb-hbm3"
CID = "tp/mace-large/float32/50000/fwd"


def _run(*cells):
    return {"schema": SCHEMA, "gpu_kind": KIND, "env": {}, "copy": {"gbps_median": 3000.0}, "cells": list(cells)}


def _cell(impl, status="ok", ms=1.0):
    return {"id": CID, "group": "tp", "impl": impl, "status": status, "ms": ms if status == "ok" else None,
            **({"err": 1e-7, "tol": 1e-4} if impl == "equikernels" else {}),
            **({} if status == "ok" else {"error": "RuntimeError: boom"})}


CURRENT = _run(_cell("equikernels"), _cell("e3nn"))
BASELINES = {"e3nn only": _run(_cell("e3nn")), "equikernels errored": _run(_cell("equikernels", "error"), _cell("e3nn"))}


def test_summary_names_the_baseline():
    for what, base in BASELINES.items():
        res = compare(base, CURRENT)
        assert not res.ok and res.compared == 0, what
        last = res.summary().splitlines()[-1]
        assert last.startswith("FAIL: the baseline holds no measured equikernels cell"), (what, last)
        assert "run the groups" not in last


def test_a_current_run_missing_the_baselines_cells_still_blames_the_run():
    base = _run(_cell("equikernels"))
    cur = dict(_run(), scope={"groups": [], "problems": []})
    assert compare(base, cur).summary().splitlines()[-1].startswith("FAIL: no guarded cell of the baseline was measured")


def test_cli_exits_1_naming_the_baseline(tmp_path, capsys):
    (tmp_path / "run.json").write_text(json.dumps(CURRENT))
    (tmp_path / "base.json").write_text(json.dumps(BASELINES["e3nn only"]))
    assert main(["bench", "--results", str(tmp_path / "run.json"), "--check", str(tmp_path / "base.json")]) == 1
    out = capsys.readouterr().out
    assert "the baseline holds no measured equikernels cell" in out and "run the groups" not in out
