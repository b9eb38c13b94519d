"""A heads block on the command line: flags win over each head of the --config file, and
mace_run_train's ``--heads`` string reads as the YAML block."""
import pytest
import yaml

from cu_ni_frames import write_cu_ni_frames


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("a.xyz", "b.xyz", "v.xyz", "t.xyz", "x.xyz"):
        write_cu_ni_frames(name, 2, len(name))
    return tmp_path


def _config(argv):
    from equikernels.cli import build_parser
    from equikernels.cli.fine_tune import config_from_args
    from equikernels.default_model import default_model_path

    return config_from_args(build_parser().parse_args(["fine-tune", "--model", default_model_path()] + argv))


def _heads_file(heads):
    with open("cfg.yaml", "w") as fh:
        yaml.safe_dump({"device": "cpu", "heads": heads}, fh, sort_keys=False)
    return "cfg.yaml"


HEADS = {"dft_a": {"train_file": "a.xyz", "energy_key": "e_a", "E0s": "{29: -3.0}", "valid_fraction": 0.3,
                   "config_type_weights": '{"bulk": 3.0}'},
         "dft_b": {"train_file": "b.xyz", "valid_file": "v.xyz", "test_file": "t.xyz"}}


@pytest.mark.parametrize("flags", [
    ["--e0s", "average", "--valid-fraction", "0.2", "--energy-key", "E", "--config-type-weights", "{surface: 2}"],
    ["--E0s=average", "--valid_fraction=0.2", "--energy_key=E", "--config_type_weights={'surface': 2}"],
])
def test_value_flags_win_over_each_head_of_the_config_file(files, flags):
    heads = {h.name: h for h in _config(["--config", _heads_file(HEADS)] + flags).head_data()}
    for h in heads.values():
        assert h.e0s == "average" and h.valid_fraction == 0.2 and h.keys.energy == "E"
    assert heads["dft_a"].config_type_weights == {"bulk": 3.0, "surface": 2}  # added to the head's own
    assert heads["dft_b"].config_type_weights == {"surface": 2}


def test_file_flags_win_over_each_head_of_the_config_file(files):
    heads = _config(["--config", _heads_file(HEADS), "--train", "x.xyz", "--valid", "v.xyz", "--test", "x.xyz"])
    for h in heads.head_data():
        assert (h.train_file, h.valid_file, h.test_file) == ("x.xyz", "v.xyz", "x.xyz")
    kept = {h.name: h for h in _config(["--config", _heads_file(HEADS)]).head_data()}  # without flags: the file's
    assert (kept["dft_a"].train_file, kept["dft_a"].valid_file, kept["dft_a"].e0s) == ("a.xyz", None, {29: -3.0})
    assert (kept["dft_b"].valid_file, kept["dft_b"].test_file) == ("v.xyz", "t.xyz")


@pytest.mark.parametrize("text", [
    "{'dft_a': {'train_file': 'a.xyz', 'E0s': '{29: -3.0}'}, 'dft_b': {'train_file': 'b.xyz'}}",  # mace-torch's form
    "{dft_a: {train_file: a.xyz, E0s: '{29: -3.0}'}, dft_b: {train_file: b.xyz}}",  # as YAML
])
def test_mace_run_trains_heads_string_reads_as_the_yaml_block(files, text):
    heads = {h.name: h for h in _config(["--heads", text, "--E0s=average", "--device", "cpu"]).head_data()}
    assert heads["dft_a"].train_file == "a.xyz" and heads["dft_a"].e0s == {29: -3.0}  # a head keeps its own
    assert heads["dft_b"].train_file == "b.xyz" and heads["dft_b"].e0s == "average"


def test_a_heads_string_that_is_no_mapping_is_refused_in_one_line(files):
    with pytest.raises(ValueError, match=r"^command line: heads: expected a mapping head name -> its data options"):
        _config(["--heads", "[a.xyz]", "--device", "cpu"])


def test_heads_null_in_a_yaml_file_is_no_heads_block(files):
    with open("null.yaml", "w") as fh:
        yaml.safe_dump({"device": "cpu", "train_file": "a.xyz", "heads": None}, fh)
    cfg = _config(["--config", "null.yaml"])
    assert cfg.heads == {} and [h.train_file for h in cfg.head_data()] == ["a.xyz"]
