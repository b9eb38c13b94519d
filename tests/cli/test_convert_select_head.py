"""`equikernels convert IN OUT --head NAME`: writes that head of a multi-head model as a single-head
model with the head's energies; an unknown name ends in one line listing the heads, before OUT is written;
with --to mace, mace-torch reads the single-head file and gives the same energy."""
import pytest
import torch

from cli_checks import one_line_error
from equikernels.cli import main
from equikernels.models import load, save
from mace_models import _batch, _crystal, _model, mace_torch_two_heads


@pytest.fixture(scope="module")
def two_heads(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "two.pt"
    model = _model(heads=["pt_head", "Default"])
    save(model, str(path))
    return str(path), model


def test_head_written_as_a_single_head_model(two_heads, tmp_path, capsys):
    path, model = two_heads
    out = str(tmp_path / "pt.pt")
    assert main(["convert", path, out, "--head", "pt_head"]) == 0
    assert "heads ['pt_head']" in capsys.readouterr().out
    single = load(out)
    assert single.heads == ["pt_head"]
    want = model(_batch([_crystal()], head="pt_head", heads=model.heads))["energy"]
    assert torch.allclose(single(_batch([_crystal()]))["energy"], want, rtol=1e-12, atol=1e-12)


def test_unknown_head_is_one_line_and_writes_nothing(two_heads, tmp_path, capsys):
    path, _ = two_heads
    out = tmp_path / "x.pt"
    assert main(["convert", path, str(out), "--head", "omat"]) == 2
    one_line_error(capsys, "--head", "'omat'", "['pt_head', 'Default']")
    assert not out.exists()


@pytest.mark.mace
def test_single_head_mace_file_read_by_mace_torch(tmp_path, single_thread):
    pytest.importorskip("mace")
    from mace.calculators import MACECalculator as MaceTorchCalculator

    path = mace_torch_two_heads(tmp_path / "two.model")
    out = str(tmp_path / "default.model")
    assert main(["convert", path, out, "--head", "default", "--to", "mace"]) == 0
    energies = []
    for file, head in ((path, "Default"), (out, None)):
        atoms = _crystal()
        atoms.calc = MaceTorchCalculator(model_paths=file, device="cpu", default_dtype="float64", head=head)
        energies.append(atoms.get_potential_energy())
    assert MaceTorchCalculator(model_paths=out, device="cpu", default_dtype="float64").models[0].heads == ["Default"]
    assert energies[1] == pytest.approx(energies[0], rel=1e-10)
