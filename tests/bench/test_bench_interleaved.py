"""benchmarks/bench_interleaved.py on the CPU (reference path): every implementation is checked against
e3nn float64, timed in every round, and the round bookkeeping adds up; OpenEquivariance (GPU only) is
reported absent, not dropped."""
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_interleaved
    finally:
        sys.path.remove(str(BENCH))
    return bench_interleaved


def test_interleaved_cpu(tmp_path):
    rc = _bench().main(["--device", "cpu", "--backend", "reference", "--problems", "nequip-water",
                        "--directions", "dbwd", "--rows", "32", "--impls", "equikernels_ir_mul,e3nn,oeq",
                        "--rounds", "3", "--calls", "2", "--warmup", "1", "--check-rows", "8",
                        "--out", str(tmp_path)])
    assert rc == 0
    (js,) = tmp_path.glob("interleaved_*.json")
    (cell,) = json.loads(js.read_text())["cells"]
    ours, e3nn, oeq = (cell["impls"][k] for k in ("equikernels_ir_mul", "e3nn", "oeq"))
    assert oeq["status"] == "absent"
    for r in (ours, e3nn):
        assert r["status"] == "ok"
        assert r["rel_err"] < 1e-5  # float32 against e3nn float64
        assert r["n"] == 3 * 2 and len(r["round_medians_ms"]) == 3
        assert all(t > 0 for t in r["round_medians_ms"])
    assert ours["rounds_fastest"] + e3nn["rounds_fastest"] == 3
    md = next(tmp_path.glob("interleaved_*.md")).read_text()
    assert "| nequip-water | dbwd | 32 | equikernels_ir_mul |" in md and "absent" in md
