"""`equikernels bench --merge` / `--results --check` with a result file whose fields have the wrong
JSON type (hand-edited, or another tool's): one line naming the file and the field, exit status 2,
nothing written, where they crashed in the report or the comparison."""
import copy
import json

import pytest

from equikernels.bench.compare import SCHEMA
from equikernels.cli import main
from cli_checks import one_line_error

TP, MACE = "tp/mace-large/float32/50000/fwd", "mace/float32/1008atoms/E+F"


def _run():
    cells = [{"id": TP, "group": "tp", "impl": "equikernels", "status": "ok", "ms": 0.8, "gbps": 1500.0},
             {"id": TP, "group": "tp", "impl": "cuequivariance", "status": "ok", "ms": 1.0},
             {"id": MACE, "group": "mace", "impl": "equikernels", "status": "ok", "ms": 5.0}]
    return {"schema": SCHEMA, "gpu_kind": "nvidia-h200", "env": {"equikernels": {"version": "0.1.0"}},
            "copy": {"gbps_median": 3000.0}, "cells": cells,
            "scope": {"groups": ["tp", "mace"], "problems": ["mace-large"]}}


def _changed(path, value):
    data = _run()
    *keys, last = path
    node = data
    for k in keys:
        node = node[k]
    node[last] = copy.deepcopy(value)
    return data


CASES = [
    ((("env", "equikernels"), "0.1.0"), ["'env' 'equikernels'", "expected an object"]),
    ((("merged",), [{"equikernels": "0.1.0"}]), ["'merged'[0] 'equikernels'", "expected an object"]),
    ((("env", "torch"), {"version": "2.11.0"}), ["'env' 'torch'", "expected a version"]),
    ((("merged",), [{"groups": "tp,mace"}]), ["'merged'[0] 'groups'", "expected a list of names"]),
    ((("cells", 0, "gbps"), "fast"), ["cells[0]", "'gbps'", "expected a number"]),
    ((("cells", 0, "group"), ["tp"]), ["cells[0]", "'group'", "expected a group name"]),
    ((("scope", "groups"), None), ["'scope' 'groups'", "expected a list of names"]),
    ((("scope", "problems"), None), ["'scope' 'problems'", "expected a list of names"]),
]


@pytest.mark.parametrize("change, needles", CASES)
def test_merge_names_the_field(change, needles, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_changed(*change)))
    out = tmp_path / "out"
    assert main(["bench", "--merge", str(bad), "--out", str(out)]) == 2
    one_line_error(capsys, f"--merge '{bad}'", *needles)
    assert not out.exists()


def test_check_of_a_run_with_null_groups_names_the_field(tmp_path, capsys):
    """The run lacks a cell of the baseline: deciding whether it was in scope read its null groups."""
    data = _changed(("scope", "groups"), None)
    data["cells"] = data["cells"][:2]
    bad, base = tmp_path / "run.json", tmp_path / "base.json"
    bad.write_text(json.dumps(data))
    base.write_text(json.dumps(_run()))
    assert main(["bench", "--results", str(bad), "--check", str(base)]) == 2
    one_line_error(capsys, f"--results '{bad}'", "'scope' 'groups'")


def test_null_atoms_stand_for_every_size(tmp_path):
    run = tmp_path / "run.json"
    run.write_text(json.dumps(_changed(("scope", "atoms"), None)))
    assert main(["bench", "--merge", str(run), "--out", str(tmp_path / "out")]) == 0
