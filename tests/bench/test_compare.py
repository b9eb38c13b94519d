"""The regression guard of ``equikernels bench --check`` and the command on CPU."""
import copy
import json

import pytest

from equikernels.bench.compare import SCHEMA, GPUKindMismatch, compare, load_run
from equikernels.cli import main


def _run(kind="nvidia-h100-80gb-hbm3", **ms):
    cells = [{"id": cid, "group": cid.split("/")[0], "impl": "equikernels", "status": "ok", "ms": v,
              "err": 1e-7, "tol": 1e-4} for cid, v in ms.items()]
    cells.append({"id": "tp/mace-large/float32/50000/fwd", "group": "tp", "impl": "cuequivariance", "status": "ok",
                  "ms": 1.0})
    return {"schema": SCHEMA, "gpu_kind": kind, "env": {}, "copy": {"gbps_median": 3000.0}, "cells": cells}


BASE = dict(**{"tp/mace-large/float32/50000/fwd": 0.8, "conv/mace-mp-medium-L2/float32/10192atoms/dbwd": 12.0,
               "mace/float64/10192atoms/E+F": 50.0})


def _slower(run, cid, factor):
    out = copy.deepcopy(run)
    for c in out["cells"]:
        if c["id"] == cid and c["impl"] == "equikernels":
            c["ms"] *= factor
    return out


def test_planted_slowdown_is_flagged():
    base = _run(**BASE)
    res = compare(base, _slower(base, "mace/float64/10192atoms/E+F", 1.3))
    assert not res.ok
    assert [(f.cell, f.kind) for f in res.findings] == [("mace/float64/10192atoms/E+F", "slower")]
    assert "FAIL" in res.summary()


def test_within_margin_passes():
    base = _run(**BASE)
    res = compare(base, _slower(_slower(base, "mace/float64/10192atoms/E+F", 1.08), "tp/mace-large/float32/50000/fwd",
                                1.12))  # 0.8 ms * 1.12 stays below 0.8 * 1.1 + 0.05 ms slack
    assert res.ok and res.compared == 3


def test_baseline_impls_are_not_guarded():
    base = _run(**BASE)
    cur = copy.deepcopy(base)
    next(c for c in cur["cells"] if c["impl"] == "cuequivariance")["ms"] = 5.0
    assert compare(base, cur).ok


def test_failed_missing_and_inaccurate_cells_regress():
    base = _run(**BASE)
    cur = copy.deepcopy(base)
    cur["cells"] = [c for c in cur["cells"]
                    if c["id"] != "tp/mace-large/float32/50000/fwd" or c["impl"] != "equikernels"]
    conv = next(c for c in cur["cells"] if c["id"].startswith("conv/"))
    conv.update(status="error", error="RuntimeError: boom")
    next(c for c in cur["cells"] if c["id"].startswith("mace/"))["err"] = 1e-2
    kinds = sorted(f.kind for f in compare(base, cur).findings)
    assert kinds == ["failed", "inaccurate", "missing"]


def test_a_skipped_cell_fails_the_check_as_not_measured():
    base = _run(**BASE)
    cur = copy.deepcopy(base)
    next(c for c in cur["cells"] if c["id"].startswith("conv/")).update(status="skipped", error="time budget spent",
                                                                        ms=None)
    res = compare(base, cur)
    assert [(f.cell, f.kind) for f in res.findings] == [("conv/mace-mp-medium-L2/float32/10192atoms/dbwd", "skipped")]
    text = res.summary()
    assert "not measured (time budget spent)" in text and "--time-budget-s" in text
    assert text.splitlines()[-1] == "FAIL: 1 guarded cell(s) not as good as the baseline (1 skipped)"


def test_refuses_other_gpu_kind():
    with pytest.raises(GPUKindMismatch, match="not comparable"):
        compare(_run(**BASE), _run(kind="nvidia-h200", **BASE))


def test_load_run_rejects_other_files(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"cells": []}))
    with pytest.raises(ValueError, match="not an 'equikernels bench' result"):
        load_run(p)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "missing.json")


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return str(p)


def test_cli_check_exit_codes(tmp_path, capsys):
    base = _run(**BASE)
    b = _write(tmp_path, "base.json", base)
    assert main(["bench", "--results", _write(tmp_path, "same.json", base), "--check", b]) == 0
    assert "OK: no regression" in capsys.readouterr().out
    slow = _write(tmp_path, "slow.json", _slower(base, "conv/mace-mp-medium-L2/float32/10192atoms/dbwd", 1.3))
    assert main(["bench", "--results", slow, "--check", b]) == 1
    assert "slower" in capsys.readouterr().out
    other = _write(tmp_path, "h200.json", _run(kind="nvidia-h200", **BASE))
    assert main(["bench", "--results", other, "--check", b]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not comparable" in err[0]


def test_cli_help_and_no_cuda(capsys, monkeypatch):
    with pytest.raises(SystemExit) as ex:
        main(["bench", "--help"])
    assert ex.value.code == 0 and "--check BASELINE.json" in capsys.readouterr().out
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a CUDA GPU" in err[0]
    # a mistyped argument is named before the missing GPU
    assert main(["bench", "--groups", "mace,mdd"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--groups" in err[0] and "mdd" in err[0] and "md" in err[0]


def _only(run, *groups, problems=("mace-large",)):
    out = copy.deepcopy(run)
    out["cells"] = [c for c in out["cells"] if c["group"] in groups
                    and (c["group"] != "tp" or c["id"].split("/")[1] in problems)]
    out["scope"] = {"groups": list(groups), "problems": list(problems)}
    return out


def test_a_run_of_some_groups_is_compared_on_those():
    base = _run(**BASE)
    res = compare(base, _only(base, "conv"))
    assert res.ok and res.compared == 1 and res.out_of_scope == 2
    assert "outside this run's groups" in res.summary()
    # a cell of a group the run measured is still missed when absent
    cur = _only(base, "conv", "tp")
    cur["cells"] = [c for c in cur["cells"] if c["group"] != "tp" or c["impl"] != "equikernels"]
    assert [f.kind for f in compare(base, cur).findings] == ["missing"]
    # a problem the run was not asked for is out of scope
    assert compare(base, _only(base, "tp", problems=("nequip-water",))).findings == []
    # runs without a scope (older files) are compared on every cell
    old = _only(base, "conv")
    del old["scope"]
    assert sorted(f.kind for f in compare(base, old).findings) == ["missing", "missing"]


def test_merged_runs_make_one_baseline(tmp_path, capsys):
    base = _run(**BASE)
    parts = [_only(base, "conv", "mace"), _only(base, "tp")]
    parts[1]["gpu_kind"] = base["gpu_kind"]
    paths = [_write(tmp_path, f"part{i}.json", p) for i, p in enumerate(parts)]
    out = tmp_path / "merged"
    assert main(["bench", "--merge", *paths, "--out", str(out), "--check", _write(tmp_path, "base.json", base)]) == 0
    assert "OK: no regression" in capsys.readouterr().out
    merged = load_run(out / f"{base['gpu_kind']}.json")
    key = lambda c: (c["id"], c["impl"])  # noqa: E731
    assert sorted(map(key, merged["cells"])) == sorted(map(key, base["cells"]))
    assert merged["scope"]["groups"] == ["conv", "mace", "tp"] and len(merged["merged"]) == 2
    other = _write(tmp_path, "h200.json", _run(kind="nvidia-h200", **BASE))
    assert main(["bench", "--merge", paths[0], other, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "different GPU kinds" in err[0]


def test_merge_keeps_measured_cells_over_skipped_ones_and_every_run_listed(tmp_path):
    """A later run whose time budget skipped a cell does not erase the earlier measurement of it; a
    measured later cell still replaces the earlier one; merging a merge keeps its list of runs, and
    the markdown names every run."""
    from equikernels.bench.compare import merge
    from equikernels.bench.report import markdown

    first = _run(**BASE)
    first["env"] = {"date_utc": "2026-01-01T00:00:00+00:00", "equikernels": {"git_commit": "aaa"}}
    first["scope"] = {"groups": ["conv", "mace", "tp"], "problems": ["mace-large"]}
    later = copy.deepcopy(first)
    later["env"] = {"date_utc": "2026-01-02T00:00:00+00:00", "equikernels": {"git_commit": "bbb"}}
    later["scope"] = {"groups": ["tp", "mace"], "problems": ["mace-large"]}
    for c in later["cells"]:
        if c["id"].startswith("tp/") and c["impl"] == "cuequivariance":
            c.update(status="skipped", error="time budget spent")
            c.pop("ms")
        elif c["id"].startswith("mace/"):
            c["ms"] = 40.0
    one = merge([first, later])
    cells = {(c["id"], c["impl"]): c for c in one["cells"]}
    assert cells[("tp/mace-large/float32/50000/fwd", "cuequivariance")]["ms"] == 1.0
    assert cells[("mace/float64/10192atoms/E+F", "equikernels")]["ms"] == 40.0
    third = copy.deepcopy(first)
    third["env"] = {"date_utc": "2026-01-03T00:00:00+00:00", "equikernels": {"git_commit": "ccc"}}
    again = merge([one, third])
    assert [m["equikernels"]["git_commit"] for m in again["merged"]] == ["aaa", "bbb", "ccc"]
    md = markdown(again)
    assert "Joined from 3 runs" in md and all(f"equikernels {k}" in md for k in ("aaa", "bbb", "ccc"))


def test_cells_of_several_rounds_are_judged_against_the_slowest_baseline_round():
    """A host-bound cell whose baseline rounds read 9.2 and 6.4 ms (kept: 6.4): 8.6 ms is inside the
    baseline's own spread, 10.4 ms beyond it; a cell of one round is judged against its ms alone."""
    cid = "mace/float64/1008atoms/E+F"
    base = _run(**BASE, **{cid: 6.4})
    next(c for c in base["cells"] if c["id"] == cid)["ms_rounds"] = [9.2, 6.4]
    assert compare(base, _slower(base, cid, 8.6 / 6.4)).ok
    res = compare(base, _slower(base, cid, 10.4 / 6.4))
    assert [(f.cell, f.kind) for f in res.findings] == [(cid, "slower")] and "limit 10.17 ms" in res.findings[0].detail
    del next(c for c in base["cells"] if c["id"] == cid)["ms_rounds"]
    assert [f.cell for f in compare(base, _slower(base, cid, 8.6 / 6.4)).findings] == [cid]


def test_host_probe_ratio_is_reported_not_judged():
    """Cells carrying their run's host probe: a slower finding names current / baseline, the summary
    the median ratio; the verdict is the same with or without the probe."""
    base = _run(**BASE)
    cur = _slower(base, "mace/float64/10192atoms/E+F", 1.3)
    for c in base["cells"]:
        c["host_us"] = 4.0
    for c in cur["cells"]:
        c["host_us"] = 6.0
    res = compare(base, cur)
    assert [f.kind for f in res.findings] == ["slower"] and "host probe 1.50x" in res.findings[0].detail
    assert "took 1.50x the baseline's time" in res.summary()
    del cur["cells"][0]["host_us"]  # a cell of an older run: no ratio for it
    assert len(compare(base, cur).host_ratios) == res.compared - 1
    for c in base["cells"]:
        del c["host_us"]
    plain = compare(base, cur)
    assert [f.kind for f in plain.findings] == ["slower"] and "host probe" not in plain.summary()


def test_host_probe_measures_issue_time():
    import torch
    from equikernels.bench.timing import host_probe
    p = host_probe(torch.device("cpu"), ops=200, batches=4)
    assert 0 < p["us_per_op_min"] <= p["us_per_op"] < 1e4 and p["ops"] == 200


def test_a_run_of_some_system_sizes_is_compared_on_those():
    from equikernels.bench.compare import merge
    base = _run(**BASE, **{"mace/float64/1008atoms/E+F": 8.0, "train/fp32/1008atoms/E+F": 40.0,
                           "train/fp32/10192atoms/E+F": 90.0})
    cur = _only(base, "mace", "train")
    cur["cells"] = [c for c in cur["cells"] if "/10192atoms/" in c["id"]]
    cur["scope"]["atoms"] = [10192]
    res = compare(base, cur)
    assert res.ok and res.compared == 2 and res.findings == []
    # a size the run measured is still missed when absent, and a slower one flagged
    gone = copy.deepcopy(cur)
    gone["cells"] = [c for c in gone["cells"] if c["id"] != "train/fp32/10192atoms/E+F"]
    assert [f.kind for f in compare(base, gone).findings] == ["missing"]
    assert [f.kind for f in compare(base, _slower(cur, "train/fp32/10192atoms/E+F", 1.3)).findings] == ["slower"]
    # without "atoms" every size is in scope
    del cur["scope"]["atoms"]
    assert sorted(f.kind for f in compare(base, cur).findings) == ["missing", "missing"]
    # merged scopes: sizes united; one run of every size leaves the merge unrestricted
    small = copy.deepcopy(cur)
    small["scope"]["atoms"] = [1008]
    cur["scope"]["atoms"] = [10192]
    assert merge([small, cur])["scope"]["atoms"] == [1008, 10192]
    assert "atoms" not in merge([small, _only(base, "mace")])["scope"]


def test_a_quick_run_is_compared_on_what_it_measures():
    """--quick times other rows, sizes, dtypes and modes than the full baseline: the cells both runs
    measured are compared, the rest of the baseline is out of scope, and a cell the quick run should
    have measured is still missed."""
    full = {"tp/nequip-water/float32/50000/fwd": 0.5, "tp/nequip-water/float32/20000/dbwd": 0.9,
            "conv/mace-mp-medium-L2/float32/10192atoms/fwd": 1.2, "mace/float32/1008atoms/E+F": 6.0,
            "mace/float32/1008atoms/E+F+S": 7.0, "mace/float64/1008atoms/E+F": 9.0,
            "md/float32/1008atoms/step": 4.0}
    base = _run(**full)
    quick = _run(**{"tp/nequip-water/float32/20000/fwd": 0.2, "tp/nequip-water/float32/20000/dbwd": 0.9,
                    "tp/tetris-poly-1/float32/20000/dbwd": 0.1, "conv/mace-mp-medium-L2/float32/1008atoms/fwd": 0.3,
                    "mace/float32/1008atoms/E+F": 6.0, "md/float32/1008atoms/step": 4.0})
    quick["cells"] = [c for c in quick["cells"] if c["impl"] == "equikernels"]
    quick.update(quick=True, scope={"groups": ["tp", "conv", "mace", "md"],
                                    "problems": ["nequip-water", "tetris-poly-1"], "atoms": [1008]})
    res = compare(base, quick)
    assert res.ok and res.compared == 3 and res.out_of_scope == 4, res.summary()
    assert "--quick" in res.summary()
    slow = _slower(quick, "md/float32/1008atoms/step", 1.5)
    assert [f.kind for f in compare(base, slow).findings] == ["slower"]
    gone = copy.deepcopy(quick)
    gone["cells"] = [c for c in gone["cells"] if c["id"] != "tp/nequip-water/float32/20000/dbwd"]
    assert [(f.kind, f.cell) for f in compare(base, gone).findings] == [
        ("missing", "tp/nequip-water/float32/20000/dbwd")]
    # a group the quick run has no cell of at all is reported, not excused
    no_md = copy.deepcopy(quick)
    no_md["cells"] = [c for c in no_md["cells"] if c["group"] != "md"]
    assert [f.cell for f in compare(base, no_md).findings] == ["md/float32/1008atoms/step"]
    # the other way round, a full run against a --quick baseline: the quick-only cells are not missing
    full_run = copy.deepcopy(base)
    full_run["scope"] = quick["scope"]
    quick_base = copy.deepcopy(quick)
    quick_base.pop("scope")
    res = compare(quick_base, full_run)
    assert res.ok and res.compared == 3 and res.out_of_scope == 3, res.summary()
    assert [f.kind for f in compare(quick_base, _slower(full_run, "mace/float32/1008atoms/E+F", 1.5)).findings] == [
        "slower"]
    full_run["cells"] = [c for c in full_run["cells"] if c["group"] != "md"]
    missing = [(f.kind, f.cell) for f in compare(quick_base, full_run).findings]
    assert missing == [("missing", "md/float32/1008atoms/step")]


def test_the_check_hands_its_limits_to_the_rounds(tmp_path, monkeypatch, capsys):
    """Measuring with --check gives the suite each guarded cell's limit (slowest baseline round x margin + slack)."""
    import torch

    from equikernels.bench import environment, suite
    from equikernels.bench.compare import limits

    base = _run(**BASE)
    mace = next(c for c in base["cells"] if c["id"] == "mace/float64/10192atoms/E+F")
    mace["ms_rounds"] = [50.0, 60.0]
    assert limits(base) == {("tp/mace-large/float32/50000/fwd", "equikernels"): pytest.approx(0.8 * 1.1 + 0.05),
                            ("conv/mace-mp-medium-L2/float32/10192atoms/dbwd", "equikernels"): pytest.approx(13.25),
                            ("mace/float64/10192atoms/E+F", "equikernels"): pytest.approx(66.05)}
    seen = {}

    def run_suite(opts, device):
        seen["opts"] = opts
        return dict(copy.deepcopy(base), wall_s=1.0)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(environment, "gpu_kind", lambda device: base["gpu_kind"])
    monkeypatch.setattr(suite, "run_suite", run_suite)
    monkeypatch.setattr("equikernels.cli.bench._write", lambda data, out: [])
    b = _write(tmp_path, "base.json", base)
    assert main(["bench", "--groups", "mace", "--check", b, "--margin", "0.2", "--confirm-rounds", "5",
                 "--out", str(tmp_path / "o")]) == 0
    opts = seen["opts"]
    assert opts.confirm_rounds == 5
    assert opts.limits[("mace/float64/10192atoms/E+F", "equikernels")] == pytest.approx(60.0 * 1.2 + 0.05)
    assert main(["bench", "--groups", "mace", "--out", str(tmp_path / "o")]) == 0
    assert seen["opts"].limits is None
    capsys.readouterr()
    for args, needle in ((["--confirm-rounds", "-1", "--check", str(b)], ">= 0"),
                         (["--confirm-rounds", "5"], "only with --check"),
                         (["--results", str(b), "--check", str(b), "--confirm-rounds", "1"], "--confirm-rounds")):
        assert main(["bench", "--out", str(tmp_path / "o")] + args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
