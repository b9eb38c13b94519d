"""The suite's training-step group: every library in float32 and equikernels in bf16-mixed take
turns round after round, the fastest round is the cell's result, failures become cells; the full
suite adds an E/F/S loss cell per variant, its stress checked against the reference."""
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
    monkeypatch.setattr(TR, "forward", lambda model, data, stress: {})
    monkeypatch.setattr(TR, "step_call", lambda model, data, stress: Step(model))
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


def test_full_suite_adds_stress_loss_cells(monkeypatch):
    calls, checked = [], []

    class Step:
        def __init__(self, key):
            self.key = key

    monkeypatch.setattr(MC, "mace_model", lambda avg: "ref")
    monkeypatch.setattr(MC, "cu_atoms", lambda n: ["atom"] * 3)
    monkeypatch.setattr(MC, "graph", lambda *a, **k: {"edge_index": torch.zeros(2, 7, dtype=torch.long)})
    monkeypatch.setattr(MC, "build", lambda impl, ref, dtype, device: "ref64")
    monkeypatch.setattr(MC, "step", lambda model, data, stress: {"stress": torch.tensor(float(stress))})
    monkeypatch.setattr(MC, "errors", lambda out, ref, stress: checked.append((out, ref, stress)) or {"forces": 1e-6})
    monkeypatch.setattr(TR, "train_model", lambda impl, ref64, precision, device: (precision, impl))
    monkeypatch.setattr(TR, "forward", lambda model, data, stress: {"loss_stress": stress})
    monkeypatch.setattr(TR, "step_call", lambda model, data, stress: Step(model + (stress,)))
    monkeypatch.setattr(suite, "_timed", lambda call, device, target_ms: calls.append(call.key) or {
        "ms": 10.0 + call.key[2], "ms_p20": 1.0, "ms_p80": 1.0, "n": 5, "peak_gib": None})
    opts = suite.Options(quick=False, impls=("equikernels",), groups=("train",), mace_rounds=1, log=lambda s: None)
    cells = []
    suite.run_train(opts, torch.device("cpu"), cells)
    ids = sorted(c["id"] for c in cells)
    assert ids == sorted(f"train/{p}/{a}atoms/{m}" for p in ("fp32", "bf16-mixed") for a in (1008, 10192)
                         for m in ("E+F", "E+F+S"))
    assert all(c["status"] == "ok" for c in cells)
    # every E/F/S cell timed the stress loss, every E+F cell the plain one
    assert all(c["ms"] == (11.0 if c["id"].endswith("E+F+S") else 10.0) for c in cells)
    # the reference has stress, and each mode's forward is checked with its own flag
    assert all(float(ref["stress"]) == 1.0 for _, ref, _ in checked)
    assert sorted(out["loss_stress"] for out, _, _ in checked) == [False] * 4 + [True] * 4
    assert all(out["loss_stress"] == stress for out, _, stress in checked)


def test_atoms_option_restricts_the_systems(monkeypatch):
    sizes = []
    monkeypatch.setattr(MC, "mace_model", lambda avg: "ref")
    monkeypatch.setattr(MC, "cu_atoms", lambda n: sizes.append(n) or ["atom"] * 3)
    monkeypatch.setattr(MC, "graph", lambda *a, **k: {"edge_index": torch.zeros(2, 7, dtype=torch.long)})
    monkeypatch.setattr(MC, "build", lambda impl, ref, dtype, device: "ref64")
    monkeypatch.setattr(MC, "step", lambda model, data, stress: {})
    monkeypatch.setattr(MC, "errors", lambda out, ref, stress: {"forces": 1e-6})
    monkeypatch.setattr(TR, "train_model", lambda impl, ref64, precision, device: (precision, impl))
    monkeypatch.setattr(TR, "forward", lambda model, data, stress: {})
    monkeypatch.setattr(TR, "step_call", lambda model, data, stress: model)
    monkeypatch.setattr(suite, "_timed", lambda call, device, target_ms: {
        "ms": 1.0, "ms_p20": 1.0, "ms_p80": 1.0, "n": 5, "peak_gib": None})
    opts = suite.Options(quick=False, impls=("equikernels",), groups=("train",), mace_rounds=1, systems=(10192,),
                         log=lambda s: None)
    cells = []
    suite.run_train(opts, torch.device("cpu"), cells)
    assert {c["atoms"] for c in cells} == {10192}
    assert 10192 in sizes and sizes.count(1008) == 1  # the model's neighbour count still from 1,008 atoms


def test_atoms_option_names_a_bad_size(capsys):
    from equikernels.cli import main
    rc = main(["bench", "--atoms", "1008,500", "--groups", "train"])
    err = capsys.readouterr().err
    assert rc != 0 and "--atoms" in err and "500" in err and "Traceback" not in err
