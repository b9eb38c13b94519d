"""The suite's MACE loop: every cell timed once per round with the implementations taking turns;
the fastest round is the cell's result and every round's median is kept."""
import torch

from equikernels.bench import mace as MC
from equikernels.bench import suite


def test_mace_cells_keep_their_fastest_round(monkeypatch):
    order = []
    scripted = {"equikernels": [12.0, 9.0, 11.0], "mace-cueq": [30.0, 31.0, 29.0]}

    class Model:
        def __init__(self, impl):
            self.impl = impl

    def timed(call, device, target_ms):
        impl = call.impl
        order.append(impl)
        ms = scripted[impl][sum(1 for i in order if i == impl) - 1]
        return {"ms": ms, "ms_p20": ms - 1, "ms_p80": ms + 1, "n": 5, "peak_gib": None}

    monkeypatch.setattr(MC, "mace_model", lambda avg: "ref")
    monkeypatch.setattr(MC, "cu_atoms", lambda n: ["atom"] * 3)
    monkeypatch.setattr(MC, "graph", lambda *a, **k: {"edge_index": torch.zeros(2, 7, dtype=torch.long)})
    monkeypatch.setattr(MC, "build", lambda impl, ref, dtype, device: Model(impl))
    monkeypatch.setattr(MC, "step", lambda model, data, stress: {})
    monkeypatch.setattr(MC, "errors", lambda out, ref, stress: {"energy": 1e-7})
    monkeypatch.setattr(MC, "step_call", lambda model, data, stress: model)
    monkeypatch.setattr(suite, "_timed", timed)
    opts = suite.Options(quick=True, impls=("equikernels", "cuequivariance"), groups=("mace",), mace_rounds=3,
                         log=lambda s: None)
    cells = []
    suite.run_mace(opts, torch.device("cpu"), cells)
    assert order == ["equikernels", "mace-cueq"] * 3  # turns, not one implementation's rounds back to back
    by_impl = {c["impl"]: c for c in cells}
    assert len(cells) == 2
    assert by_impl["equikernels"]["ms"] == 9.0 and by_impl["equikernels"]["ms_p80"] == 10.0
    assert by_impl["equikernels"]["ms_rounds"] == [12.0, 9.0, 11.0]
    assert by_impl["mace-cueq"]["ms"] == 29.0 and by_impl["mace-cueq"]["err"] == 1e-7
