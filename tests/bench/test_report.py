"""The suite's harness on CPU at toy size (reference backend), and its report."""
import torch

from equikernels.bench import suite
from equikernels.bench.report import markdown, speedups


def test_tp_group_runs_checks_and_reports_absent_libraries():
    opts = suite.Options(problems=["nequip-water"], groups=["tp"], impls=["equikernels", "e3nn", "openequivariance"],
                         tp_rows=16, check_rows=16, target_ms=1.0, log=lambda s: None)
    data = suite.run_suite(opts, torch.device("cpu"))
    cells = {(c["id"], c["impl"]): c for c in data["cells"]}
    ours = cells[("tp/nequip-water/float32/16/dbwd", "equikernels")]
    assert ours["status"] == "ok" and ours["ms"] > 0 and ours["err"] < ours["tol"]
    assert cells[("tp/nequip-water/float32/16/fwd", "openequivariance")]["status"] == "absent"
    assert data["gpu_kind"] == "cpu" and data["schema"] == "equikernels-bench/1"
    assert data["host_probe"]["us_per_op"] > 0
    assert {c["host_us"] for c in data["cells"]} == {round(data["host_probe"]["us_per_op"], 3)}
    sp = speedups(data["cells"])
    assert {s["id"] for s in sp} == {f"tp/nequip-water/float32/16/{d}" for d in ("fwd", "bwd", "dbwd")}
    assert set(sp[0]["speedup"]) == {"e3nn"}
    md = markdown(data)
    assert "| nequip-water/float32/16/fwd |" in md and "absent" in md


def test_float64_cells_of_the_float64_problems_only(monkeypatch):
    monkeypatch.setattr(suite, "F64_PROBLEMS", ("nequip-water",))
    opts = suite.Options(problems=["nequip-water", "tetris-poly-1"], groups=["tp"], impls=["equikernels"],
                         tp_rows=16, check_rows=16, target_ms=1.0, log=lambda s: None)
    cells = {c["id"]: c for c in suite.run_suite(opts, torch.device("cpu"))["cells"]}
    f64 = {cid: c for cid, c in cells.items() if "/float64/" in cid}
    assert sorted(f64) == [f"tp/nequip-water/float64/16/{d}" for d in ("bwd", "dbwd", "fwd")]
    # checked at the float64 tolerance, so a float32 computation would fail it
    assert all(c["status"] == "ok" and c["tol"] == 1e-9 and c["err"] < 1e-12 for c in f64.values())
    quick = suite.Options(**dict(vars(opts), quick=True, started=opts.started))
    assert not any("/float64/" in c["id"] for c in suite.run_suite(quick, torch.device("cpu"))["cells"])


def test_mixed_precision_training_rows_compare_with_the_baselines_float32_step():
    def cell(cid, impl, ms):
        return {"id": cid, "group": "train", "impl": impl, "status": "ok", "ms": ms, "err": 1e-5}
    data = {"env": {}, "copy": {"gbps_median": 1.0}, "cells": [
        cell("train/fp32/10192atoms/E+F", "equikernels", 80.0), cell("train/fp32/10192atoms/E+F", "mace-cueq", 120.0),
        cell("train/fp32/10192atoms/E+F", "mace-oeq", 400.0),
        cell("train/bf16-mixed/10192atoms/E+F", "equikernels", 40.0),
        cell("train/bf16-mixed/1008atoms/E+F", "equikernels", 30.0)]}
    md = markdown(data)
    assert "| fp32/10192atoms/E+F | 80.00 | 120.0 | 400.0 | 1.50x | 1.0e-05 |" in md
    assert "| bf16-mixed/10192atoms/E+F | 40.00 | – | – | 3.00x† | 1.0e-05 |" in md
    assert "† against the other libraries' float32 step" in md
    # no float32 row of that size: nothing to compare with
    assert "| bf16-mixed/1008atoms/E+F | 30.00 | – | – | – | 1.0e-05 |" in md


def test_report_of_a_run_without_copy_bandwidth_or_cell_groups(tmp_path):
    from equikernels.bench.report import markdown, plots
    data = {"gpu_kind": "x", "cells": [{"id": "tp/p/float32/20000/fwd", "impl": "equikernels", "status": "ok",
                                        "ms": 1.0, "gbps": 100.0}]}
    md = markdown(data)
    assert "## Batched tensor product" in md and "| p/float32/20000/fwd | 1" in md
    assert all(not p.name.endswith("_bandwidth.png") for p in plots(data, tmp_path, "x"))
