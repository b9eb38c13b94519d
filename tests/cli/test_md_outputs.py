"""MD outputs a run can be continued from: the last step is in md.traj and md.log whatever the
intervals, an earlier run is kept when the new one cannot start or open its files, and errors that name the
ensemble or the model flag before any evaluation."""
import urllib.error

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk
from ase.io import read, write

from equikernels.calculators import md as md_module
from equikernels.cli import main


def _cu(cu_model):
    from equikernels.calculators import MACECalculator

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.calc = MACECalculator(cu_model, device="cpu")
    return atoms


def test_last_step_is_written_when_the_interval_does_not_divide_the_steps(cu_model, tmp_path, single_thread):
    atoms = _cu(cu_model)
    settings = md_module.MDSettings(steps=5, ensemble="nve", traj_interval=3, log_interval=2)
    md_module.run_md(atoms, settings, out_dir=str(tmp_path), progress=False)
    frames = read(str(tmp_path / "md.traj"), ":")
    assert len(frames) == 3  # steps 0, 3 and the last, 5
    np.testing.assert_array_equal(frames[-1].positions, atoms.positions)
    np.testing.assert_array_equal(frames[-1].get_momenta(), atoms.get_momenta())
    steps = [int(line.split()[0]) for line in (tmp_path / "md.log").read_text().splitlines()[1:]]
    assert steps == [0, 2, 4, 5]


def test_overwrite_keeps_the_earlier_run_when_the_new_one_cannot_start(cu_model, tmp_path, single_thread):
    settings = md_module.MDSettings(steps=1, ensemble="nve")
    md_module.run_md(_cu(cu_model), settings, out_dir=str(tmp_path), progress=False)
    before = (tmp_path / "summary.json").read_text()
    gold = _cu(cu_model)
    gold.numbers[0] = 79  # an element the model does not know: the first evaluation fails
    with pytest.raises(ValueError, match="Au"):
        md_module.run_md(gold, settings, out_dir=str(tmp_path), progress=False, overwrite=True)
    assert (tmp_path / "summary.json").read_text() == before and (tmp_path / "md.traj").is_file()


def test_overwrite_keeps_the_earlier_run_when_its_files_cannot_be_opened(cu_model, tmp_path, single_thread,
                                                                         monkeypatch):
    settings = md_module.MDSettings(steps=1, ensemble="nve")
    md_module.run_md(_cu(cu_model), settings, out_dir=str(tmp_path), progress=False)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def no_log(*args, **kwargs):
        raise OSError("md.log: read-only file system")
    monkeypatch.setattr(md_module, "_Log", no_log)  # after md.traj was opened
    with pytest.raises(OSError, match="read-only"):
        md_module.run_md(_cu(cu_model), settings, out_dir=str(tmp_path), progress=False, overwrite=True)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_npt_of_a_molecule_names_the_ensemble(cu_model, tmp_path, capsys):
    path = tmp_path / "cu2.xyz"
    write(str(path), Atoms("Cu2", positions=[[0.0, 0.0, 0.0], [2.5, 0.0, 0.0]]))
    assert main(["md", str(path), "--model", cu_model, "--ensemble", "npt", "--steps", "2",
                 "--out", str(tmp_path / "out"), "--no-progress", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "ensemble 'npt'" in err and "pbc=[False, False, False]" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_failed_foundation_download_names_the_model_flag(tmp_path, capsys, monkeypatch):
    from equikernels.models import foundations

    def offline():
        raise urllib.error.URLError("Name or service not known")
    monkeypatch.setattr(foundations, "foundation_checkpoint", lambda name: foundations._fetched(name, offline))
    assert main(["md", "cu-fcc", "--model", "medium", "--steps", "1", "--out", str(tmp_path / "out"),
                 "--no-progress", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--model 'medium'" in err and "could not be fetched" in err and "Name or service" in err
    assert "Traceback" not in err
