"""The regression guard and ``merge`` with stored runs that would make them pass silently or crash."""
import copy
import json

import pytest

from equikernels.bench.compare import SCHEMA, compare, load_run, merge
from equikernels.bench.report import markdown

MACE = "mace/float32/1008atoms/E+F"
TP = "tp/mace-large/float32/50000/fwd"


def _run(kind="nvidia-h200", **env):
    cells = [{"id": TP, "group": "tp", "impl": "equikernels", "status": "ok", "ms": 0.8, "err": 1e-7, "tol": 1e-4},
             {"id": MACE, "group": "mace", "impl": "equikernels", "status": "ok", "ms": 6.0, "ms_rounds": [6.5, 6.0]},
             {"id": TP, "group": "tp", "impl": "cuequivariance", "status": "ok", "ms": 1.0}]
    return {"schema": SCHEMA, "gpu_kind": kind, "env": {"torch": "2.11.0", "triton": "3.6.0", **env},
            "copy": {}, "cells": cells, "scope": {"groups": ["tp", "mace"], "problems": ["mace-large"]}}


def _cell(run, cid, impl="equikernels"):
    return next(c for c in run["cells"] if c["id"] == cid and c["impl"] == impl)


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def test_a_check_that_compared_nothing_fails():
    """A run with no cell the baseline guards (nothing measured, or other problems) is not vouched for."""
    base = _run()
    empty = dict(copy.deepcopy(base), cells=[], scope={"groups": [], "problems": []})
    res = compare(base, empty)
    assert res.compared == 0 and res.findings == [] and not res.ok
    assert res.summary().splitlines()[-1].startswith("FAIL: no guarded cell of the baseline was measured")
    other = dict(copy.deepcopy(base), scope={"groups": ["tp"], "problems": ["nequip-water"]})
    other["cells"] = [dict(c, id=c["id"].replace("mace-large", "nequip-water")) for c in other["cells"]
                      if c["group"] == "tp"]
    assert not compare(base, other).ok
    assert compare(base, base).ok


@pytest.mark.parametrize("field, value, needle", [
    ("ms_rounds", [float("inf")], "'ms_rounds' [inf]"),   # would lift the cell's limit out of reach
    ("ms_rounds", [None, 6.0], "'ms_rounds' [None, 6.0]"),
    ("ms_rounds", "6.0", "'ms_rounds' '6.0'"),
    ("host_us", "fast", "'host_us' 'fast'"),
    ("host_us", -3.0, "'host_us' -3.0"),
    ("err", "small", "'err' 'small'"),
    ("tol", [1e-4], "'tol' [0.0001]"),
])
def test_cell_fields_the_guard_reads_must_be_numbers(field, value, needle, tmp_path):
    bad = _run()
    _cell(bad, MACE)[field] = value
    with pytest.raises(ValueError, match="cells\\[1\\]") as ex:
        load_run(_write(tmp_path, "bad.json", bad), "--check")
    assert needle in str(ex.value) and MACE in str(ex.value)


def test_an_infinite_baseline_round_does_not_let_a_slower_run_pass(tmp_path):
    base = _run()
    _cell(base, MACE)["ms_rounds"] = [float("inf"), 6.0]
    path = _write(tmp_path, "base.json", json.dumps(base))  # json writes Infinity, and reads it back
    assert "Infinity" in path.read_text()
    with pytest.raises(ValueError, match="ms_rounds"):
        load_run(path, "--check")


@pytest.mark.parametrize("change, needle", [
    ({"scope": ["tp"]}, "'scope' is a JSON array; expected an object"),
    ({"scope": {"groups": "mace,md", "problems": []}}, "'scope' 'groups' is 'mace,md'; expected a list"),
    ({"scope": {"groups": ["mace"], "atoms": ["1008"]}}, "'scope' 'atoms'"),
    ({"env": "torch 2.11"}, "'env' is a JSON string"),
    ({"merged": "yesterday"}, "'merged'"),
    ({"interrupted": True}, "'interrupted' is a JSON boolean"),
    ({"quick": "no"}, "'quick' is 'no'"),
    ({"wall_s": "long"}, "'wall_s' is 'long'"),
    ({"gpu_kind": "../elsewhere"}, "'gpu_kind' '../elsewhere' is not a GPU-kind name"),
    ({"gpu_kind": 5}, "'gpu_kind' 5"),
])
def test_run_fields_of_another_shape_are_refused(change, needle, tmp_path):
    with pytest.raises(ValueError) as ex:
        load_run(_write(tmp_path, "bad.json", dict(_run(), **change)), "--results")
    assert str(ex.value).startswith("--results '") and needle in str(ex.value)


def test_a_cell_given_twice_is_refused(tmp_path):
    """With two results for one cell only the last was judged: a failure listed first passed."""
    run = _run()
    run["cells"].insert(0, dict(_cell(run, MACE), status="error", error="boom"))
    with pytest.raises(ValueError, match=r"cells\[2\] repeats cells\[0\] \(mace/float32/1008atoms/E\+F, equikernels\)"):
        load_run(_write(tmp_path, "dup.json", run))


def test_messages_name_json_types_and_an_empty_file(tmp_path):
    with pytest.raises(ValueError, match="found a JSON null"):
        load_run(_write(tmp_path, "null.json", "null"))
    with pytest.raises(ValueError, match="cells\\[0\\] is not an object \\(found a JSON number\\)"):
        load_run(_write(tmp_path, "ints.json", dict(_run(), cells=[1])))
    with pytest.raises(ValueError, match="empty.json' is empty; expected a JSON file"):
        load_run(_write(tmp_path, "empty.json", " \n"))


def test_stored_runs_load(tmp_path):
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "benchmarks"
    runs = [load_run(p) for p in sorted(root.glob("baselines/*.json"))]
    assert runs and all(r["cells"] for r in runs)


def test_merge_keeps_a_measurement_over_a_later_absent_library():
    """A later run without a library installed did not measure its cells; a later failure is kept
    but listed among the replacements."""
    from equikernels.bench.compare import replacements
    first, later = _run(), _run()
    _cell(later, TP, "cuequivariance").update(status="absent", error="not installed", ms=None)
    _cell(later, MACE).update(status="error", error="boom")
    _cell(later, TP)["ms"] = 0.7
    cells = {(c["id"], c["impl"]): c for c in merge([first, later])["cells"]}
    assert cells[(TP, "cuequivariance")]["status"] == "ok" and cells[(TP, "cuequivariance")]["ms"] == 1.0
    assert cells[(MACE, "equikernels")]["status"] == "error" and cells[(TP, "equikernels")]["ms"] == 0.7
    assert sorted(replacements([first, later])) == [(MACE, "equikernels", "ok", "error"),
                                                     (TP, "equikernels", "ok", "ok")]


def test_other_versions_are_named_by_the_check_and_the_merged_report():
    base, cur = _run(), _run(torch="2.13.0")
    res = compare(base, cur)
    assert res.ok and "torch 2.11.0 -> 2.13.0" in res.summary() and "triton" not in res.summary()
    assert "other versions" not in compare(base, _run()).summary()
    cur["env"]["date_utc"] = "2026-02-01"
    md = markdown(merge([base, cur]))
    assert [ln for ln in md.splitlines() if ln.startswith("- ")][1].endswith("; torch 2.13.0")
    assert merge([base, cur])["merged"][1]["torch"] == "2.13.0"


def test_an_interrupted_run_says_so_in_the_check():
    cur = _run()
    cur["interrupted"] = {"after_s": 42.0}
    cur["cells"] = [c for c in cur["cells"] if c["group"] == "tp"]
    text = compare(_run(), cur).summary()
    assert "interrupted after 42.0 s" in text and "missing" in text
