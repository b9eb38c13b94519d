"""The suite's MD group: calculators take turns round after round, the fastest round is the cell's
result, a calculator that cannot be made is reported as a cell, never dropped."""
import pytest
import torch

from equikernels.bench import md as MD
from equikernels.bench import suite
from equikernels.bench.tp import Absent


def test_md_cells_keep_their_fastest_round_and_report_absent_calculators(monkeypatch):
    order = []
    scripted = {"equikernels": [6.0, 5.5, 5.8], "mace-e3nn": [300.0, 290.0, 295.0]}

    def calculator(impl, model, dtype_name, device):
        if impl == "mace-cueq":
            raise Absent("cuequivariance_torch not importable (ImportError)")
        return impl

    def step_runner(calc, atoms):
        def f(target_ms):
            order.append(calc)
            ms = scripted[calc][sum(1 for i in order if i == calc) - 1]
            return {"ms": ms, "ns_per_day": MD.ns_per_day(ms), "steps": 10, "temperature_K": 300.0}
        return f

    monkeypatch.setattr(MD, "md_model", lambda dtype: "ref")
    monkeypatch.setattr(suite.MC, "build", lambda impl, ref, dtype, device: "model64")
    monkeypatch.setattr(suite.MC, "cu_atoms", lambda n: ["atom"] * 3)
    monkeypatch.setattr(suite.MC, "graph", lambda *a, **k: {})
    # as mace-torch's output: what was not asked for is None
    monkeypatch.setattr(suite.MC, "step", lambda model, data, stress: {
        "energy": torch.ones(1), "forces": torch.ones(3, 3), "stress": None, "virials": None})
    monkeypatch.setattr(MD, "calculator", calculator)
    monkeypatch.setattr(MD, "step_runner", step_runner)
    monkeypatch.setattr(MD, "force_error", lambda calc, atoms, ref: 2e-6)
    opts = suite.Options(quick=True, impls=("equikernels", "e3nn", "cuequivariance", "openequivariance"),
                         groups=("md",), mace_rounds=3, log=lambda s: None)
    cells = []
    suite.run_md(opts, torch.device("cpu"), cells)
    assert order == ["equikernels", "mace-e3nn"] * 3
    by_impl = {c["impl"]: c for c in cells}
    assert set(by_impl) == {"equikernels", "mace-e3nn", "mace-cueq"}  # OpenEquivariance has no calculator
    assert all(c["id"] == "md/float32/1008atoms/step" and c["group"] == "md" for c in cells)
    assert by_impl["equikernels"]["ms"] == 5.5 and by_impl["equikernels"]["ms_rounds"] == [6.0, 5.5, 5.8]
    assert by_impl["equikernels"]["ns_per_day"] == MD.ns_per_day(5.5) and by_impl["equikernels"]["err"] == 2e-6
    assert by_impl["mace-e3nn"]["ms"] == 290.0
    assert by_impl["mace-cueq"]["status"] == "absent"


def test_ns_per_day_of_a_one_femtosecond_step():
    assert abs(MD.ns_per_day(86.4) - 1.0) < 1e-12  # 1e6 steps of 1 fs a day at 86.4 ms per step


def test_md_cells_are_timed_when_the_reference_cannot_run(monkeypatch):
    def no_reference(model, data, stress):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(MD, "md_model", lambda dtype: "ref")
    monkeypatch.setattr(suite.MC, "build", lambda impl, ref, dtype, device: "model64")
    monkeypatch.setattr(suite.MC, "cu_atoms", lambda n: ["atom"] * 3)
    monkeypatch.setattr(suite.MC, "graph", lambda *a, **k: {})
    monkeypatch.setattr(suite.MC, "step", no_reference)
    monkeypatch.setattr(MD, "calculator", lambda impl, model, dtype_name, device: impl)
    monkeypatch.setattr(MD, "step_runner", lambda calc, atoms: lambda target_ms: {
        "ms": 7.0, "ns_per_day": MD.ns_per_day(7.0), "steps": 10, "temperature_K": 300.0})
    monkeypatch.setattr(MD, "force_error", lambda calc, atoms, ref: pytest.fail("compared with no reference"))
    logged = []
    opts = suite.Options(quick=True, impls=("equikernels",), groups=("md",), mace_rounds=1, log=logged.append)
    cells = []
    suite.run_md(opts, torch.device("cpu"), cells)
    assert [(c["impl"], c["status"], c["ms"], c["err"]) for c in cells] == [("equikernels", "ok", 7.0, None)]
    assert any("reference at 1008 atoms failed" in line for line in logged)
