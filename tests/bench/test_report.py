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
