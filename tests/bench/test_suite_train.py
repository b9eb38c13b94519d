"""The suite's training-step group: every library in float32 and equikernels in bf16-mixed take
turns round after round, the fastest round is the cell's result, failures become cells."""
import torch

from equikernels.bench import mace as MC
from equikernels.bench import suite
from equikernels.bench import train as TR


def test_train_cells_keep_their_fastest_round_and_report_failures(monkeypatch):
    order = []
    scripted = {("fp32", "equikernels"): [50.0, 47.0], ("bf16-mixed", "equikernels"): [30.0, 31.0],
                ("fp32", "mace-cueq"): [120.0, 118.0]}

    class Step:
        def __init__(self, key):
            self.key = key

    def train_model(impl, ref64, precision, device):
        if impl == "mace-oeq":
            raise RuntimeError("CUDA out of memory")
        return (precision, impl)

    def timed(call, device, target_ms):
        order.append(call.key)
        ms = scripted[call.key][sum(1 for k in order if k == call.key) - 1]
        return {"ms": ms, "ms_p20": ms, "ms_p80": ms, "n": 5, "peak_gib": None}

    monkeypatch.setattr(MC, "mace_model", lambda avg: "ref")
    monkeypatch.setattr(MC, "cu_atoms", lambda n: ["atom"] * 3)
    monkeypatch.setattr(MC, "graph", lambda *a, **k: {"edge_index": torch.zeros(2, 7, dtype=torch.long)})
    monkeypatch.setattr(MC, "build", lambda impl, ref, dtype, device: "ref64")
    monkeypatch.setattr(MC, "step", lambda model, data, stress: {})
    monkeypatch.setattr(MC, "errors", lambda out, ref, stress: {"forces": 3e-6})
    monkeypatch.setattr(TR, "train_model", train_model)
    monkeypatch.setattr(TR, "forward", lambda model, data: {})
    monkeypatch.setattr(TR, "step_call", lambda model, data: Step(model))
    monkeypatch.setattr(suite, "_timed", timed)
    opts = suite.Options(quick=True, impls=("equikernels", "cuequivariance", "openequivariance"), groups=("train",),
                         mace_rounds=2, log=lambda s: None)
    cells = []
    suite.run_train(opts, torch.device("cpu"), cells)
    turn = [("fp32", "equikernels"), ("fp32", "mace-cueq"), ("bf16-mixed", "equikernels")]
    assert order == turn * 2
    by = {(c["id"], c["impl"]): c for c in cells}
    ours = by[("train/fp32/1008atoms/E+F", "equikernels")]
    assert ours["ms"] == 47.0 and ours["ms_rounds"] == [50.0, 47.0] and ours["err"] == 3e-6
    assert ours["tol"] == suite.MACE_TOL["float32"]
    bf16 = by[("train/bf16-mixed/1008atoms/E+F", "equikernels")]
    assert bf16["ms"] == 30.0 and bf16["tol"] == suite.BF16_TOL
    assert by[("train/fp32/1008atoms/E+F", "mace-cueq")]["ms"] == 118.0
    assert by[("train/fp32/1008atoms/E+F", "mace-oeq")]["status"] == "oom"
