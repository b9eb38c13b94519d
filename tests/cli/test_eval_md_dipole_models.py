"""mace-torch's dipole model files in ``equikernels eval`` and ``md``: an ``EnergyDipolesMACE``'s dipole
is written as ``<prefix>dipole`` beside its energies (mace-torch's calculator's numbers) and removed when
another model evaluates the file again; a dipole-only ``AtomicDipolesMACE`` is refused in one line by both commands."""
import ase.io
import numpy as np
import pytest
import torch

from cli_checks import one_line_error
from embedding_models import mace_torch_model, mixed_cell
from equikernels.cli import main

pytestmark = pytest.mark.mace


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def _frames():
    return [mixed_cell(seed=k) for k in range(3)]


def test_eval_writes_the_dipole_of_an_energy_and_dipole_model(tmp_path, capsys):
    model = mace_torch_model("EnergyDipolesMACE")
    from mace.calculators import MACECalculator as MaceTorchCalculator

    path, frames_file, out = (str(tmp_path / n) for n in ("ed.model", "s.xyz", "pred.xyz"))
    torch.save(model, path)
    ase.io.write(frames_file, _frames(), format="extxyz")
    with pytest.warns(RuntimeWarning, match="dipole readouts"):
        assert main(["eval", frames_file, "--model", path, "--out", out, "--no-progress", "--device", "cpu",
                     "--batch-size", "2"]) == 0
    calc = MaceTorchCalculator(models=model, device="cpu", default_dtype="float64", model_type="EnergyDipoleMACE")
    for frame, got in zip(_frames(), ase.io.read(out, ":")):
        calc.calculate(frame, ["energy", "forces", "dipole"])
        assert got.info["MACE_energy"] == pytest.approx(calc.results["energy"], abs=1e-9)
        np.testing.assert_allclose(got.info["MACE_dipole"], calc.results["dipole"], atol=1e-8)  # extxyz text
        assert np.abs(got.info["MACE_dipole"]).max() > 1e-4
    with pytest.warns(RuntimeWarning, match="dipole readouts"):
        assert main(["eval", frames_file, "--model", path, "--out", str(tmp_path / "n.xyz"), "--no-progress",
                     "--device", "cpu", "--return-node-energies"]) == 2
    one_line_error(capsys, "--return-node-energies: EnergyDipolesMACE's per-atom energies are not its energy's terms")
    # the file evaluated again with an energy model: the earlier model's dipoles must not pass for its own
    energy_model = str(tmp_path / "e.model")
    torch.save(mace_torch_model(), energy_model)
    assert main(["eval", out, "--model", energy_model, "--out", str(tmp_path / "again.xyz"), "--no-progress",
                 "--device", "cpu"]) == 0
    again = ase.io.read(tmp_path / "again.xyz", ":")
    assert all("MACE_dipole" not in f.info and "MACE_energy" in f.info for f in again)


def test_eval_and_md_refuse_a_dipole_only_model(tmp_path, capsys):
    path, frames_file = str(tmp_path / "dipole.model"), str(tmp_path / "s.xyz")
    torch.save(mace_torch_model("AtomicDipolesMACE"), path)
    ase.io.write(frames_file, _frames(), format="extxyz")
    with pytest.warns(RuntimeWarning, match="dipole readouts"):
        assert main(["eval", frames_file, "--model", path, "--out", str(tmp_path / "p.xyz"), "--no-progress",
                     "--device", "cpu"]) == 2
    one_line_error(capsys, f"--model {path}: AtomicDipolesMACE predicts dipoles only, no energies",
                   "model_type='DipoleMACE'")
    assert not (tmp_path / "p.xyz").exists()
    with pytest.warns(RuntimeWarning, match="dipole readouts"):
        assert main(["md", frames_file, "--model", path, "--out", str(tmp_path / "md"), "--steps", "2",
                     "--device", "cpu"]) == 2
    one_line_error(capsys, f"--model {path}: AtomicDipolesMACE predicts dipoles only, no forces")
