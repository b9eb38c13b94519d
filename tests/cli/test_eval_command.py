"""`equikernels eval`: the predictions it writes are the ASE calculator's for every frame (periodic,
molecule, lone atom), under keys that read back as training labels; on a validation file it prints
the errors of fine-tuning's closing table; bad input ends in one line and leaves the structures
file as it was."""
import os

import ase.io
import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, molecule

from equikernels.cli import main
from equikernels.training import DataKeys, read_configs
from equikernels.training.evaluate import predict
from emt_data import write_emt_dataset
from cli_checks import one_line_error


def _frames():
    """A labelled periodic frame (EMT), an unlabelled rattled crystal, a molecule and a lone atom."""
    from ase.calculators.emt import EMT

    cu = bulk("Cu", "fcc", a=3.62, cubic=True)
    cu.rattle(0.05, seed=1)
    cu.calc = EMT()
    cu.info["REF_energy"] = cu.get_potential_energy()
    cu.arrays["REF_forces"] = cu.get_forces()
    cu.info["REF_stress"] = cu.get_stress(voigt=False)
    cu.calc = None
    alloy = bulk("Ni", "fcc", a=3.5, cubic=True) * (1, 1, 2)
    alloy.numbers[::3] = 29
    alloy.rattle(0.08, seed=2)
    dimer = Atoms("CuNi", positions=[[0, 0, 0], [0, 0, 2.4]])
    lone = Atoms("Cu", positions=[[0, 0, 0]])
    return [cu, alloy, dimer, lone]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    d = tmp_path_factory.mktemp("eval")
    src = str(d / "frames.xyz")
    ase.io.write(src, _frames(), format="extxyz")
    out = str(d / "pred.xyz")
    assert main(["eval", src, "--out", out, "--no-progress", "--device", "cpu", "--batch-size", "3"]) == 0
    return src, out


def test_predictions_are_the_calculators(evaluated):
    from equikernels.calculators import MACECalculator

    src, out = evaluated
    calc = MACECalculator(None, device="cpu")
    got = ase.io.read(out, ":")
    assert len(got) == 4
    for k, (a, ref) in enumerate(zip(got, _frames())):
        np.testing.assert_allclose(a.positions, ref.positions, atol=1e-8)
        ref.positions = a.positions  # as eval read them: extxyz keeps 8 decimals
        ref.calc = calc
        assert a.info["MACE_energy"] == pytest.approx(ref.get_potential_energy(), abs=1e-8), k
        np.testing.assert_allclose(a.arrays["MACE_forces"], ref.get_forces(), rtol=0, atol=1e-8)
        if ref.pbc.all():
            np.testing.assert_allclose(np.reshape(a.info["MACE_stress"], (3, 3)), ref.get_stress(voigt=False),
                                       atol=1e-9)
        else:
            assert "MACE_stress" not in a.info, k
    # the file read in is left as it was, the frames' own labels travel to the output
    assert [len(a) for a in ase.io.read(src, ":")] == [4, 8, 2, 1]
    assert got[0].info["REF_energy"] == pytest.approx(_frames()[0].info["REF_energy"])


def test_written_predictions_read_back_as_labels(evaluated):
    from equikernels.calculators.loading import resolve_model

    _, out = evaluated
    configs = read_configs(out, DataKeys(energy="MACE_energy", forces="MACE_forces", stress="MACE_stress"))
    assert [c.stress is not None for c in configs] == [True, True, False, False]
    model = resolve_model(None, torch.device("cpu"))
    _, metrics = predict(model, configs, dtype=torch.float64, device="cpu", batch_size=2)
    assert set(metrics) == {f"{m}_{p}" for m in ("mae", "rmse") for p in ("energy_per_atom", "forces", "stress")}
    assert max(metrics.values()) < 1e-8, metrics  # forces: the 8 decimals extxyz keeps


def test_unlabelled_file_and_default_output_name(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ase.io.write("crystal.cif", bulk("Cu", "fcc", a=3.6))
    assert main(["eval", "crystal.cif", "--no-progress", "--device", "cpu", "--prefix", "EK_", "--no-stress"]) == 0
    text = capsys.readouterr().out
    assert "no reference labels" in text and "crystal_eval.xyz" in text
    a = ase.io.read("crystal_eval.xyz")
    assert "EK_energy" in a.info and a.arrays["EK_forces"].shape == (1, 3) and "EK_stress" not in a.info


@pytest.mark.parametrize("case", ["missing", "same-file", "unknown-element", "bad-head", "batch-size"])
def test_bad_input_is_one_line(case, tmp_path, capsys):
    src = str(tmp_path / "in.xyz")
    ase.io.write(src, bulk("Cu", "fcc", a=3.6), format="extxyz")
    before = open(src).read()
    args = {"missing": [str(tmp_path / "nope.xyz")],
            "same-file": [src, "--out", src],
            "unknown-element": [str(tmp_path / "h2o.xyz")],
            "bad-head": [src, "--head", "nope"],
            "batch-size": [src, "--batch-size", "0"]}[case]
    if case == "unknown-element":
        ase.io.write(args[0], molecule("H2O"))
    assert main(["eval", *args, "--no-progress", "--device", "cpu"]) == 2
    needles = {"missing": ("nope.xyz", "does not exist"), "same-file": ("--out", "structures file itself"),
               "unknown-element": ("h2o.xyz, frame 0", "H (Z=1)"), "bad-head": ("'nope'", "heads"),
               "batch-size": ("--batch-size",)}[case]
    one_line_error(capsys, *needles)
    assert open(src).read() == before
    assert not os.path.exists(str(tmp_path / "in_eval.xyz"))


def test_eval_of_the_fine_tuned_model_gives_the_closing_tables_errors(tmp_path, capsys):
    from equikernels.default_model import default_model_path
    from equikernels.training import TrainConfig, fine_tune

    train = write_emt_dataset(str(tmp_path / "train.xyz"), 4, seed=21, elements=("Cu", "Ni"), max_atoms=3)
    valid = write_emt_dataset(str(tmp_path / "valid.xyz"), 3, seed=22, elements=("Cu", "Ni"), max_atoms=3)
    summary = fine_tune(TrainConfig(model=default_model_path(), train_file=train, valid_file=valid, epochs=1,
                                    batch_size=2, lr=1e-2, out_dir=str(tmp_path / "ft"), progress=False,
                                    plot=False, device="cpu"))
    capsys.readouterr()
    out = str(tmp_path / "valid_pred.xyz")
    assert main(["eval", valid, "--model", summary["model_path"], "--out", out, "--no-progress",
                 "--device", "cpu"]) == 0
    row = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("model ")]
    expected = summary["valid"]
    printed = [float(v) for v in row[0][1:]]
    names = ("rmse_energy_per_atom", "mae_energy_per_atom", "rmse_forces", "mae_forces")
    assert printed[:4] == pytest.approx([1000 * expected[k] for k in names], abs=2e-3)
    assert expected["rmse_forces"] > 1e-4
