"""benchmarks/bench_conv.py on the CPU (a check of the harness, not a measurement): equikernels'
convolution is checked against e3nn float64 and timed; OpenEquivariance (GPU only) is reported
unavailable, not dropped."""
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_conv
    finally:
        sys.path.remove(str(BENCH))
    return bench_conv


def test_conv_cpu(tmp_path, single_thread):
    out = tmp_path / "conv.json"
    # r_cut 3 A keeps the 12 nearest neighbours of the 256-atom Cu cell: a graph of 3,072 edges
    rc = _bench().main(["--device", "cpu", "--problem", "nequip-water", "--atoms", "256", "--check-atoms", "256",
                        "--r-cut", "3.0", "--impls", "ek_det,oeq_det", "--dirs", "fwd", "--target-ms", "1",
                        "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["errors"]["ek_det"] < 1e-5  # float32 against e3nn float64
    assert "openequivariance needs a CUDA device" in res["errors"]["oeq_det"]
    (ours,) = [c for c in res["cells"] if c["impl"] == "ek_det"]
    assert ours["edges"] == 3072 and ours["dir"] == "fwd" and ours["ms"] > 0 and ours["peak_gib"] is None
    (oeq,) = [c for c in res["cells"] if c["impl"] == "oeq_det"]
    assert "CUDA" in oeq["error"]
