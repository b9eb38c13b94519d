"""benchmarks/bench_train.py (the training-step benchmark): the --tiny CPU plumbing check, in process.

A tiny MACE (8 channels) on 2 x 8 rattled Cu atoms: ek-fp32 and ek-bf16 (reference backend on CPU) must
give finite times and losses, float32 errors against the float64 reference at float32 level and
bf16-mixed errors at bfloat16 level, and the markdown table."""
import json
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("mace")
pytest.importorskip("vesin")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench_train():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_train
    finally:
        sys.path.remove(str(BENCH))
    return bench_train


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_train") / "t.json"
    rc = _bench_train().main(["--device", "cpu", "--tiny", "--impls", "ek-fp32,ek-bf16", "--atoms-per-batch", "16",
                              "--steps", "2", "--warmup", "0", "--out", str(out)])
    assert rc == 0
    return json.loads(out.read_text())


def _by_impl(report):
    return {r["impl"]: r for r in report["results"]}


def test_structure_and_reference(report):
    s = report["system"]
    assert s["structures"] == 2 and s["atoms"] == 16 and s["edges"] > 0
    ref = report["references"]["ek-fp64"]
    assert math.isfinite(ref["loss"]) and ref["loss"] > 0
    assert abs(ref["mean_abs_force_eV_A"] - 0.5) < 1e-6  # --force-scale 0.5 applied
    assert [r["impl"] for r in report["results"]] == ["ek-fp32", "ek-bf16"]


def test_times_and_losses_finite(report):
    for r in report["results"]:
        assert r["status"] == "ok", r
        assert r["n"] == 2 and len(r["times_ms"]) == 2
        assert all(math.isfinite(t) and t > 0 for t in r["times_ms"])
        assert math.isfinite(r["ms_median"]) and r["ms_median"] > 0
        assert math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"])
        assert r["peak_gib"] is None  # CPU: no CUDA memory statistics


def test_fp32_errors_at_float32_level(report):
    r = _by_impl(report)["ek-fp32"]
    acc, g = r["accuracy"], r["grad"]
    assert acc["dF_rel"] < 1e-4
    assert acc["dE_mae_meV_atom"] < 0.1  # |E| is a few eV/atom: ~1e-7 relative
    assert acc["loss_rel"] < 1e-3
    assert r["grad_ref"] == "ek-fp64" and g["tensors"] == g["ref_tensors"] and g["finite"]
    assert g["rel"] < 1e-2 and g["cos"] > 0.9999


def test_bf16_errors_at_bfloat16_level(report):
    r = _by_impl(report)["ek-bf16"]
    fp32 = _by_impl(report)["ek-fp32"]
    acc = r["accuracy"]
    # bfloat16 keeps 8 bits: errors well above float32's, forces still within a few percent
    assert 1e-4 < acc["dF_rel"] < 0.1
    assert acc["dE_mae_meV_atom"] > 10 * fp32["accuracy"]["dE_mae_meV_atom"]
    assert r["grad"]["finite"] and r["grad"]["rel"] > fp32["grad"]["rel"]
    assert r["loss_scale"] == 1.0  # no loss scaling for bf16


def test_markdown_table(report):
    text = _bench_train().table(report)
    assert "| ek-fp32 | ok |" in text and "| ek-bf16 | ok |" in text
