"""LAMMPS picks torch.load only for names ending in lower-case .pt / .pth: any other name (x.PT) is
unpickled, so export writes such a file as a plain pickle, which LAMMPS and load_mliap read."""
import pickle

from equikernels.cli import main
from equikernels.default_model import default_model_path
from equikernels.lammps import EquikernelsMLIAP, export_mliap, load_mliap


def test_upper_case_suffix_is_a_pickle(tmp_path):
    out = tmp_path / "model-mliap.PT"
    export_mliap(default_model_path(), out)
    with open(out, "rb") as f:
        assert isinstance(pickle.load(f), EquikernelsMLIAP)  # as LAMMPS reads this name
    assert isinstance(load_mliap(out), EquikernelsMLIAP)


def test_no_torch_load_advice_for_upper_case(tmp_path, capsys):
    assert main(["export-lammps", default_model_path(), str(tmp_path / "m.PTH")]) == 0
    assert "torch.load" not in capsys.readouterr().out
