"""Per-head data: what a head gives wins over the run's options (and is said when it leaves one
unread or unused), messages name the head, and a run with heads resumes exactly."""
import pytest
import torch

from cu_ni_frames import write_cu_ni_frames

NEW = {"hidden_irreps": "4x0e+4x1o", "MLP_irreps": "4x0e", "num_interactions": 1, "correlation": 2, "max_ell": 1,
       "r_max": 4.0, "radial_MLP": [8], "builder": "equikernels"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("heads_data")
    return {name: write_cu_ni_frames(str(d / f"{name}.xyz"), n, seed, config_type="bulk")
            for name, n, seed in (("a", 4, 0), ("b", 4, 10), ("v", 2, 20))}


def _cfg(tmp_path, heads, **kw):
    from equikernels.training import TrainConfig

    base = dict(new_model=NEW, epochs=1, batch_size=2, lr=1e-6, out_dir=str(tmp_path / "out"), progress=False,
                plot=False, device="cpu", valid_fraction=0.0, ema_decay=None, heads=heads)
    base.update(kw)
    return TrainConfig(**base)


def test_a_heads_valid_fraction_splits_its_frames_whatever_the_runs_valid_file(data, tmp_path):
    cfg = _cfg(tmp_path, {"a": {"train_file": data["a"], "valid_fraction": 0.5}, "b": {"train_file": data["b"]}},
               valid_file=data["v"])
    heads = {h.name: h for h in cfg.head_data()}
    assert heads["a"].valid_file is None and heads["a"].valid_fraction == 0.5
    assert heads["b"].valid_file == data["v"]


def test_the_runs_files_that_no_head_reads_are_said(data, tmp_path):
    from equikernels.training import Trainer

    said = []
    Trainer(_cfg(tmp_path, {"a": {"train_file": data["a"], "test_file": data["v"], "valid_fraction": 0.5},
                            "b": {"train_file": data["b"], "test_file": data["v"], "valid_file": data["v"]}},
                 train_file=data["v"], valid_file=data["a"], test_file=data["a"]), log=said.append)
    assert f"train_file {data['v']!r} is not read: every head of heads gives its own train_file" in said
    assert (f"valid_file {data['a']!r} is not read: every head of heads gives its own valid_file or valid_fraction"
            in said)
    assert f"test_file {data['a']!r} is not read: every head of heads gives its own test_file" in said


def test_a_heads_e0s_error_names_the_head(data, tmp_path):
    from equikernels.training import Trainer

    cfg = _cfg(tmp_path, {"a": {"train_file": data["a"]}, "b": {"train_file": data["b"], "e0s": {"Fe": -1.0}}})
    with pytest.raises(ValueError, match=r"^heads: b: e0s: element 'Fe' is not one of the model's elements"):
        Trainer(cfg, log=None)


def test_a_heads_config_type_weights_without_frames_of_that_type_are_said(data, tmp_path):
    from equikernels.training import Trainer

    said = []
    t = Trainer(_cfg(tmp_path, {"a": {"train_file": data["a"], "config_type_weights": {"bulk": 2.0, "surfce": 3.0}},
                                "b": {"train_file": data["b"]}}), log=said.append)
    assert "heads: a: config_type_weights: no training frame has config_type 'surfce' (the frames have 'bulk')" in said
    assert [c.weight for c in t.train_set.configs] == [2.0] * 4 + [1.0] * 4


def test_a_run_with_heads_resumes_exactly_and_refuses_a_changed_heads_block(data, tmp_path, single_thread):
    from equikernels.training import Trainer

    heads = {"a": {"train_file": data["a"], "valid_fraction": 0.25, "e0s": "average"},
             "b": {"train_file": data["b"], "valid_file": data["v"]}}
    kw = dict(epochs=2, lr=1e-2, ema_decay=0.9, checkpoint_every=1, head_weights={"b": 2.0})
    full = Trainer(_cfg(tmp_path / "full", heads, **kw), log=None)
    full.fit()
    part = Trainer(_cfg(tmp_path / "part", heads, max_steps=5, **kw), log=None)
    part.fit()
    assert part.steps_per_epoch == 4 and part.batch_in_epoch == 1  # stopped mid-epoch 2
    resumed = Trainer(_cfg(tmp_path / "part", heads, **kw), log=None)
    resumed.fit(resume=True)
    assert resumed.resumed
    assert [r["loss"] for r in resumed.history["train"]] == [r["loss"] for r in full.history["train"]]
    assert resumed.history["valid"] == full.history["valid"]
    assert all(torch.equal(full.model.state_dict()[k], v) for k, v in resumed.model.state_dict().items())
    tested = {**heads, "a": {**heads["a"], "test_file": data["v"]}}  # as the run's own test_file: honoured
    again = Trainer(_cfg(tmp_path / "part", tested, **kw), log=None)
    summary = again.fit(resume=True)
    assert "test" in summary and "a" in summary["per_head"]
    changed = {**heads, "b": {**heads["b"], "e0s": "average"}}
    with pytest.raises(ValueError, match=r"^cannot resume with changed heads "):
        Trainer(_cfg(tmp_path / "part", changed, **kw), log=None).fit(resume=True)
