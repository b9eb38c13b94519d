"""Per-head data (mace-torch's ``heads:`` block): each head's files train that head with the head's
own label keys, E0s and config_type weights; a new model gets the heads, with E0s, scale and shift
fitted on each head's frames; a model file must have them."""
import numpy as np
import pytest
import torch
import yaml

from cu_ni_frames import two_head_model as _two_head_model
from cu_ni_frames import write_cu_ni_frames as _frames


def _config(tmp_path, values):
    from equikernels.training import TrainConfig
    from equikernels.training.config import load_yaml

    base = {"epochs": 1, "batch_size": 2, "out_dir": str(tmp_path / "out"), "progress": False, "plot": False,
            "device": "cpu", "valid_fraction": 0.0, "lr": 1e-6, "ema_decay": None}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**base, **values}, sort_keys=False))
    return TrainConfig.from_dict(load_yaml(str(path)))


NEW = {"hidden_irreps": "4x0e+4x1o", "MLP_irreps": "4x0e", "num_interactions": 1, "correlation": 2, "max_ell": 1,
       "r_max": 4.0, "radial_MLP": [8], "builder": "equikernels"}


def test_each_heads_files_train_that_head_with_its_own_keys_e0s_and_weights(tmp_path):
    from equikernels.training import Trainer
    from equikernels.training import model_factory as mf

    model = _two_head_model(str(tmp_path / "two.pt"))
    a = _frames(str(tmp_path / "a.xyz"), 4, 0, energy_key="dft_energy", head="Default", config_type="bulk")
    b = _frames(str(tmp_path / "b.xyz"), 2, 10)
    cfg = _config(tmp_path, {"model": model, "heads": {
        "pt_head": {"train_file": a, "energy_key": "dft_energy", "E0s": "{28: -3.0, 29: -4.0}",
                    "config_type_weights": '{"bulk": 3.0}'},
        "Default": {"train_file": b}}})
    t = Trainer(cfg, log=None)
    assert [c.head for c in t.train_configs] == ["pt_head"] * 4 + ["Default"] * 2  # the file's head, not the frame's
    np.testing.assert_array_equal(t.train_set.graphs[0].head.item(), 0)
    assert sorted({int(g.head) for g in t.train_set.graphs[4:]}) == [1]
    import ase.io
    energies = [f.info["dft_energy"] for f in ase.io.read(a, ":")]
    np.testing.assert_allclose([c.energy for c in t.train_configs[:4]], energies)  # read with the head's key
    assert [c.weight for c in t.train_set.configs] == [3.0] * 4 + [1.0] * 2
    table = mf.get_e0s(t.model).double().numpy()
    np.testing.assert_array_equal(table[0], [-3.0, -4.0])  # pt_head: its given E0s
    np.testing.assert_array_equal(table[1], [-1.5, -2.5])  # Default: "foundation", the model's own row


def test_a_new_model_gets_the_heads_with_e0s_scale_and_shift_of_each_heads_frames(tmp_path):
    from equikernels.training import Trainer
    from equikernels.training import model_factory as mf
    from equikernels.training.data import read_configs
    from equikernels.training.config import DataKeys
    from equikernels.training.statistics import average_e0s, scale_shift

    a = _frames(str(tmp_path / "a.xyz"), 6, 0)
    b = _frames(str(tmp_path / "b.xyz"), 6, 20, shift=0.7)
    cfg = _config(tmp_path, {"new_model": NEW, "heads": {"dft_a": {"train_file": a}, "dft_b": {"train_file": b}}})
    t = Trainer(cfg, log=None)
    assert mf.heads(t.model) == ["dft_a", "dft_b"]
    table = mf.get_e0s(t.model).double().numpy()
    for row, path in enumerate((a, b)):
        configs = read_configs(path, DataKeys())
        e0s = average_e0s(configs, [28, 29])
        np.testing.assert_allclose(table[row], [e0s[28], e0s[29]], rtol=1e-12)
        scale, shift = scale_shift(configs, e0s)
        assert float(t.model.scale[row]) == pytest.approx(scale, rel=1e-12)
        assert float(t.model.shift[row]) == pytest.approx(shift, rel=1e-9, abs=1e-12)
    assert not np.allclose(table[0], table[1])  # the heads' data differ by 0.7 eV per atom


def test_a_run_gives_a_head_what_the_head_leaves_out(tmp_path):
    from equikernels.training import Trainer

    a = _frames(str(tmp_path / "a.xyz"), 5, 0)
    v = _frames(str(tmp_path / "v.xyz"), 2, 30)
    cfg = _config(tmp_path, {"new_model": NEW, "train_file": a, "valid_file": v,
                             "heads": {"one": {}, "two": {"valid_fraction": 0.4, "valid_file": None}}})
    t = Trainer(cfg, log=None)
    assert [c.head for c in t.train_configs].count("one") == 5
    assert [c.head for c in t.valid_configs] == ["one", "one", "two", "two"]  # two: 40 % of a's 5 frames


@pytest.mark.parametrize("heads, needle", [
    ({"pt_head": {"train_file": "A"}, "other": {"train_file": "A"}},
     r"^heads: 'other' is not one of the model's heads \['pt_head', 'Default'\]"),
    ({"pt_head": {"train_file": "A", "stress_weight": 1}}, r"^heads: pt_head: unknown option\(s\) \['stress_weight'\]"),
    ({"pt_head": {}}, r"^heads: pt_head: no train_file, and the run gives none"),
    ({"pt_head": {"train_file": "A"}, "PT_HEAD": {"train_file": "A"}}, r"^heads: 'pt_head' and 'PT_HEAD' name the same"),
    ({"pt_head": {"train_file": "missing.xyz"}}, r"^heads: pt_head: train_file: no such file 'missing.xyz'"),
    ({"pt_head": {"train_file": "A", "head_key": "h"}}, r"^heads: pt_head: keys: head: every frame read for this head"),
    ({"pt_head": {"train_file": "A", "valid_fraction": 1.0}}, r"^heads: pt_head: valid_fraction must be in \[0, 1\)"),
])
def test_bad_heads_are_refused_in_one_line(tmp_path, heads, needle):
    from equikernels.training import Trainer

    model = _two_head_model(str(tmp_path / "two.pt"))
    a = _frames(str(tmp_path / "a.xyz"), 2, 0)
    heads = {k: {o: (a if v == "A" else v) for o, v in h.items()} for k, h in heads.items()}
    with pytest.raises((ValueError, FileNotFoundError), match=needle) as info:
        Trainer(_config(tmp_path, {"model": model, "heads": heads}), log=None)
    assert "\n" not in str(info.value)


def test_heads_and_structures_in_memory_are_refused_together(tmp_path):
    from equikernels.training import Trainer
    from equikernels.training.data import read_configs
    from equikernels.training.config import DataKeys

    model = _two_head_model(str(tmp_path / "two.pt"))
    a = _frames(str(tmp_path / "a.xyz"), 2, 0)
    cfg = _config(tmp_path, {"model": model, "heads": {"pt_head": {"train_file": a}}})
    with pytest.raises(ValueError, match=r"^heads: each head's frames are read from its files"):
        Trainer(cfg, train_configs=read_configs(a, DataKeys()), log=None)


def test_the_fine_tune_command_reads_a_heads_block(tmp_path, capsys):
    from equikernels.cli import main
    from equikernels.training import model_factory as mf

    model = _two_head_model(str(tmp_path / "two.pt"))
    a = _frames(str(tmp_path / "a.xyz"), 2, 0)
    b = _frames(str(tmp_path / "b.xyz"), 2, 5)
    path = tmp_path / "heads.yaml"
    path.write_text(yaml.safe_dump({"foundation_model": model, "multiheads_finetuning": False, "max_num_epochs": 1,
                                    "batch_size": 2, "valid_fraction": 0.0, "device": "cpu",
                                    "work_dir": str(tmp_path / "run"), "heads": {
                                        "pt_head": {"train_file": a, "E0s": {28: -3.0, 29: -4.0}},
                                        "Default": {"train_file": b, "mean": 0.1, "std": 1.0}}}))
    with pytest.warns(UserWarning, match=r"heads: Default: mean, heads: Default: std"):
        assert main(["fine-tune", "--config", str(path), "--no-progress", "--no-plot"]) == 0
    out = mf.load_model(str(tmp_path / "run" / "model.pt"), "equikernels")
    np.testing.assert_array_equal(mf.get_e0s(out).double()[0].numpy(), [-3.0, -4.0])


def test_one_head_given_for_a_one_head_model_trains_it_under_the_given_name(tmp_path):
    from equikernels.cli import main
    from equikernels.training import model_factory as mf
    from equikernels.default_model import default_model_path

    train = _frames(str(tmp_path / "a.xyz"), 4, 0)
    test = _frames(str(tmp_path / "t.xyz"), 2, 40)
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump({"foundation_model": default_model_path(), "multiheads_finetuning": False,
                                    "max_num_epochs": 1, "batch_size": 2, "device": "cpu", "lr": 1e-6,
                                    "work_dir": str(tmp_path / "run"),
                                    "heads": {"my_dft": {"train_file": train, "valid_fraction": 0.5,
                                                         "test_file": test}}}))
    assert main(["fine-tune", "--config", str(path), "--no-progress", "--no-plot"]) == 0
    out = mf.load_model(str(tmp_path / "run" / "model.pt"), "equikernels")
    assert mf.heads(out) == ["my_dft"]
    start = mf.load_model(default_model_path(), "equikernels")
    from equikernels.training.data import read_configs
    from equikernels.training.config import DataKeys
    from equikernels.training.evaluate import predict
    configs = read_configs(test, DataKeys())
    before, _ = predict(start, configs, dtype=torch.float64, device="cpu")
    after, _ = predict(out, configs, dtype=torch.float64, device="cpu")
    np.testing.assert_allclose([p.energy for p in after], [p.energy for p in before], rtol=1e-3)  # lr 1e-6


def test_a_head_weight_for_a_head_without_files_says_where_heads_come_from(tmp_path):
    from equikernels.training import Trainer

    model = _two_head_model(str(tmp_path / "two.pt"))
    a = _frames(str(tmp_path / "a.xyz"), 2, 0)
    said = []
    Trainer(_config(tmp_path, {"model": model, "heads": {"pt_head": {"train_file": a}},
                               "head_weights": {"Default": 2.0}}), log=said.append)
    assert ("head_weights: no training frame is of head 'Default' (the frames' heads: 'pt_head'; the heads block "
            "names each head's files)") in said
