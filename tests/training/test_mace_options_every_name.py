"""Every option of mace-torch's training script reads here: translated, set aside with a warning, or
refused by name; options at the values that mean "not given" (mace-torch's defaults) read as absent,
so a whole dump of mace-torch's options fine-tunes."""
import dataclasses
import warnings

import pytest
import yaml

from equikernels.training.config import TrainConfig
from equikernels.training.mace_options import from_mace_options, names

FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}


def _quiet(values):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = from_mace_options(values, "cfg")
    return out, [str(w.message) for w in caught]


def _mace_defaults(*argv):
    parser = pytest.importorskip("mace.tools.arg_parser")
    return vars(parser.build_default_arg_parser().parse_args(["--name", "x", *argv]))


@pytest.mark.mace
def test_each_mace_torch_option_at_its_default_reads_or_is_refused_by_name():
    defaults = _mace_defaults("--train_file", "t.xyz")
    assert set(defaults) - {"name", "restart_latest"} <= names() | FIELDS
    for name, value in defaults.items():
        try:
            out, _ = _quiet({name: value})
        except ValueError as exc:
            assert str(exc).startswith(f"cfg: {name}: "), str(exc)
            continue
        assert set(out) - {"resume"} <= FIELDS, (name, value, out)


@pytest.mark.mace
def test_a_whole_dump_of_mace_torchs_options_fine_tunes(tmp_path):
    from emt_data import write_emt_dataset

    from equikernels.cli import main
    from equikernels.default_model import default_model_path

    train = write_emt_dataset(str(tmp_path / "train.xyz"), 4, seed=1, elements=("Cu", "Ni"), max_atoms=3)
    values = _mace_defaults("--train_file", train)
    values.update(foundation_model=default_model_path(), max_num_epochs=1, device="cpu",
                  work_dir=str(tmp_path / "run"), batch_size=2, valid_fraction=0.25)
    (tmp_path / "all.yaml").write_text(yaml.safe_dump(values))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fine-tune", "--config", str(tmp_path / "all.yaml"), "--no-progress", "--no-plot"]) == 0
    assert (tmp_path / "run" / "model.pt").is_file()


@pytest.mark.parametrize("name, value", [("pt_train_file", None), ("pt_valid_file", None), ("test_dir", None),
                                         ("freeze", None), ("heads", None), ("pseudolabel_replay", False),
                                         ("foundation_model_kwargs", "{}"), ("config", None), ("E0s", None),
                                         ("lr_params_factors", '{"embedding_lr_factor": 1.0, "readouts_lr_factor": 1}')])
def test_values_that_mean_not_given_read_as_absent(name, value):
    assert _quiet({name: value}) == ({}, [])


def test_replay_tuning_without_replay_is_set_aside():
    out, said = _quiet({"weight_pt_head": 2.0, "num_samples_pt": 100, "subselect_pt": "fps"})
    assert out == {} and len(said) == 1
    assert "num_samples_pt, subselect_pt, weight_pt_head" in said[0]


@pytest.mark.parametrize("values, needle", [
    ({"lr_params_factors": '{"readouts_lr_factor": 0.1}'}, r"lr_params_factors: per-block learning-rate factors"),
    ({"lora": True}, r"lora: True has no counterpart here .*every weight"),
    ({"beta": 0.95}, r"beta: 0.95 has no counterpart here \(only 0.9"),
    ({"foundation_model_readout": False}, r"foundation_model_readout: False has no counterpart"),
    ({"pseudolabel_replay": True}, r"pseudolabel_replay: mace-torch's multi-head replay"),
    ({"foundation_model": "medium", "multiheads_finetuning": True}, r"multiheads_finetuning: True has no counterpart"),
    ({"foundation_model": "x.model", "pt_train_file": "pt.xyz", "multiheads_finetuning": True},
     r"pt_train_file: mace-torch's multi-head replay"),
])
def test_values_that_ask_for_what_is_not_done_here_are_refused(values, needle):
    with pytest.raises(ValueError, match=rf"^cfg: {needle}"):
        _quiet(values)


def test_multi_head_fine_tuning_of_a_model_file_without_pretraining_data_is_plain_fine_tuning():
    # mace-torch turns it off for a foundation model file given without pt_train_file
    out, said = _quiet({"foundation_model": "x.model", "multiheads_finetuning": True})
    assert out == {"model": "x.model"} and said == []
