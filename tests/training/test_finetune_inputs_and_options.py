"""Fine-tuning's inputs as a mace-torch user gives them: a model file inside ``--out`` under a name
the run writes is never replaced (not even with ``--overwrite``), a from-scratch ``mace_run_train``
command line is refused rather than fine-tuning the bundled model, the bundled model is named when it
is the one fine-tuned, malformed options are refused in one line naming them, structures in memory
may be ASE ``Atoms``, stress labels of frames that are not periodic are said to be unused, and the
starting model's rows say when its E0s were replaced."""
import hashlib
import shutil

import pytest
from ase.io import read, write

from emt_data import write_emt_dataset
from equikernels.cli import main
from equikernels.default_model import default_model_path
from equikernels.training import TrainConfig, Trainer
from equikernels.training import outputs
from equikernels.training.config import DataKeys
from equikernels.training.data import label_sources, read_configs
from equikernels.training.trainer import metrics_table


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    return write_emt_dataset(str(d / "train.xyz"), 4, seed=31, elements=("Cu", "Ni"), max_atoms=3)


def _digest(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


@pytest.mark.parametrize("name", [outputs.MODEL, outputs.MACE_MODEL])
def test_a_model_in_out_under_an_output_name_is_never_replaced(train_file, tmp_path, capsys, name):
    out = tmp_path / "run"
    out.mkdir()
    model = out / name
    shutil.copyfile(default_model_path(), model)
    before = _digest(model)
    for extra in ([], ["--overwrite"], ["--resume"]):
        status = main(["fine-tune", "--model", str(model), "--train", train_file, "--out", str(out), "--epochs", "1",
                       "--device", "cpu", "--no-progress", "--no-plot", *extra])
        err = capsys.readouterr().err
        assert status == 2, extra
        assert f"model {str(model)!r} is the file this run writes its {name} to" in err, (extra, err)
        assert _digest(model) == before, extra
    # the Python entry point refuses it as well, before any step
    with pytest.raises(FileExistsError, match="is the file this run writes"):
        outputs.check(str(out), False, True, inputs=TrainConfig(model=str(model), train_file=train_file,
                                                                out_dir=str(out)).input_files())


def test_inputs_elsewhere_are_not_taken_for_outputs(train_file, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / outputs.MODEL).write_bytes(b"an earlier run's model")
    cfg = TrainConfig(model=default_model_path(), train_file=train_file, out_dir=str(out))
    outputs.check(str(out), False, True, inputs=cfg.input_files())  # replaced on purpose: --overwrite
    assert ("model", default_model_path()) in cfg.input_files()


def test_a_from_scratch_mace_command_line_is_refused(train_file, tmp_path, capsys):
    status = main(["fine-tune", "--name=MACE", f"--train_file={train_file}", "--r_max=4.0", "--hidden_irreps=8x0e",
                   "--max_num_epochs=1", f"--work_dir={tmp_path / 'run'}", "--device", "cpu"])
    err = capsys.readouterr().err
    assert status == 2
    line = [x for x in err.splitlines() if "error:" in x]
    assert len(line) == 1 and "r_max, hidden_irreps: mace-torch's options of a new model" in line[0], err
    assert "new_model" in line[0] and "--foundation_model" in line[0]
    assert not (tmp_path / "run").exists()


def test_the_same_options_with_a_model_are_set_aside(train_file, tmp_path, recwarn, capsys):
    status = main(["fine-tune", f"--foundation_model={default_model_path()}", f"--train_file={train_file}",
                   "--r_max=4.0", "--max_num_epochs=1", "--multiheads_finetuning=False", f"--work_dir={tmp_path / 'run'}",
                   "--device", "cpu", "--no-progress", "--no-plot", "--batch-size", "2"])
    said = [str(w.message) for w in recwarn]
    assert status == 0
    assert any("set aside" in m and "r_max" in m for m in said), said
    assert not any("bundled default model" in m for m in said)
    assert "bundled default model" not in capsys.readouterr().out


def test_the_bundled_model_is_named_when_fine_tuned(train_file, tmp_path, capsys):
    status = main(["fine-tune", "--train", train_file, "--out", str(tmp_path / "run"), "--epochs", "1",
                   "--device", "cpu", "--no-progress", "--no-plot", "--batch-size", "2"])
    assert status == 0
    assert capsys.readouterr().out.startswith("model: the bundled default model mace_emt_small.pt, a toy")


@pytest.mark.parametrize("options, message", [
    (dict(keys=["a", "b"]), "keys must be a mapping"),
    (dict(keys={"energy": 5}), "keys: energy must be the name of an info or arrays key (mace-torch's energy_key), "
                               "got 5"),
    (dict(keys={"forces": ["x"]}), "keys: forces must be the name"),
    (dict(model=None, new_model=5), "new_model must be a mapping of hyper-parameters"),
    (dict(model=None, new_model={"r_max": "abc"}), "new_model: r_max must be a number > 0 (Angstrom), got 'abc'"),
    (dict(model=None, new_model={"num_interactions": 0}), "new_model: num_interactions must be an integer >= 1"),
    (dict(model=None, new_model={"radial_MLP": "[64]"}), "new_model: radial_MLP must be a list of layer widths"),
    (dict(model=None, new_model={"hidden": 1}), "unknown new_model option(s) ['hidden']"),
    (dict(new_model={"r_max": 4.0}), "and new_model both given"),
    (dict(device="gpu"), "device must be a torch device such as 'cpu', 'cuda' or 'cuda:1', got 'gpu'"),
    (dict(device="meta"), "device 'meta': training runs on 'cpu' or 'cuda' devices"),
])
def test_malformed_options_are_named(train_file, options, message):
    values = {"model": default_model_path(), "train_file": train_file, **options}
    with pytest.raises(ValueError) as info:
        TrainConfig(**values).validate()
    assert message in str(info.value)


def test_structures_in_memory_may_be_ase_atoms(train_file, tmp_path, single_thread):
    frames = read(train_file, ":")
    cfg = TrainConfig(model=default_model_path(), epochs=1, batch_size=2, valid_fraction=0.0,
                      out_dir=str(tmp_path / "run"), device="cpu", progress=False, plot=False)
    summary = Trainer(cfg, train_configs=frames, log=lambda *a: None).fit()
    assert summary["step"] == 2 and summary["train"]["rmse_forces"] > 0
    with pytest.raises(TypeError, match=r"train_configs\[1\]: expected an ase.Atoms or a training Config, got int"):
        Trainer(cfg, train_configs=[frames[0], 1])


def test_stress_of_frames_not_periodic_is_said_unused(train_file, tmp_path):
    frames = read(train_file, ":")
    for a in frames:
        a.pbc = [True, True, False]
    slab = str(tmp_path / "slab.xyz")
    write(slab, frames)
    said = label_sources(read_configs(slab, DataKeys()))
    assert f"stress from 'REF_stress' in {len(frames)} of {len(frames)} frames not used" in said
    assert "stress from 'REF_stress' in" in label_sources(read_configs(train_file, DataKeys()))
    assert "not used" not in label_sources(read_configs(train_file, DataKeys()))


def test_starting_rows_say_the_e0s_were_replaced():
    m = {"rmse_energy_per_atom": 0.1, "mae_energy_per_atom": 0.1}
    assert "valid, starting model with the new E0s" in metrics_table({"valid_start": m, "start_e0s_set": True})
    assert "with the new E0s" not in metrics_table({"valid_start": m, "start_e0s_set": False})


def test_average_e0s_on_a_loaded_model_mark_its_rows(train_file, tmp_path, capsys, single_thread):
    status = main(["fine-tune", "--train", train_file, "--out", str(tmp_path / "run"), "--epochs", "1",
                   "--device", "cpu", "--no-progress", "--no-plot", "--batch-size", "2", "--e0s", "average"])
    out = capsys.readouterr().out
    assert status == 0
    assert "valid, starting model with the new E0s" in out


def test_an_out_dir_below_a_file_is_named(train_file, tmp_path):
    (tmp_path / "afile").write_text("")
    out = str(tmp_path / "afile" / "run")
    with pytest.raises(ValueError, match=r"out_dir: '.*afile/run' cannot be made: '.*afile' is a file"):
        TrainConfig(model=default_model_path(), train_file=train_file, out_dir=out).validate()


def test_a_missing_model_file_is_named_by_the_options_check(train_file, tmp_path):
    for missing in (str(tmp_path / "nope.model"), "nope.pt"):
        with pytest.raises(FileNotFoundError, match=f"model: no such file {missing!r}"):
            TrainConfig(model=missing, train_file=train_file, out_dir=str(tmp_path / "run")).validate()


def test_a_model_url_or_name_is_left_to_the_model_loader(train_file, tmp_path):
    for remote in ("https://example.org/models/mace.model", "medium-mpa-0"):
        TrainConfig(model=remote, train_file=train_file, out_dir=str(tmp_path / "run")).validate()
