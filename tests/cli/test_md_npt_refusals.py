"""`equikernels md --ensemble npt` refuses a structure ASE's MTK barostat cannot run (constraints, no
3-D periodic cell) in one line naming the reason, before the model loads and with nothing written."""
import pytest
from ase.build import bulk
from ase.constraints import FixAtoms
from ase.io import write

from cli_checks import one_line_error
from equikernels.calculators import MACECalculator
from equikernels.calculators.md import MDSettings, run_md
from equikernels.cli import main


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def _fixed_crystal():
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.set_constraint(FixAtoms(indices=[0]))
    return atoms


def test_md_npt_with_constraints_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    path = tmp_path / "fixed.traj"
    write(str(path), _fixed_crystal())
    out = tmp_path / "run"

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr("equikernels.calculators.calculator.MACECalculator.__init__", no_model)
    assert main(["md", str(path), "--ensemble", "npt", "--steps", "2", "--out", str(out), "--no-progress"]) == 2
    one_line_error(capsys, "ensemble 'npt'", "constraints", "FixAtoms")
    assert not out.exists()


def test_run_md_npt_with_constraints_names_them(cu_model, tmp_path):
    atoms = _fixed_crystal()
    atoms.calc = MACECalculator(cu_model, device="cpu")
    with pytest.raises(ValueError, match=r"ensemble 'npt'.*no constraints.*FixAtoms"):
        run_md(atoms, MDSettings(steps=2, ensemble="npt"), out_dir=str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run").exists()
