"""`equikernels eval`: a label key given on the command line that no frame holds, an --out name ASE
would read as another format and a prefix that clashes with the labels are refused in one line (the
first two were run, the errors left out or the file unreadable)."""
import os

import ase.io
import numpy as np
import pytest
from ase.build import bulk

from equikernels.cli import main


@pytest.fixture()
def labelled(tmp_path):
    atoms = bulk("Cu", "fcc", a=3.62, cubic=True)
    atoms.rattle(0.05, seed=1)
    atoms.info["REF_energy"] = -1.0
    atoms.arrays["REF_forces"] = np.zeros((len(atoms), 3))
    path = str(tmp_path / "data.xyz")
    ase.io.write(path, atoms, format="extxyz")
    return path


def _error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("flag", ["--energy-key", "--forces-key", "--stress-key", "--virials-key"])
def test_a_label_key_no_frame_holds_is_refused(labelled, tmp_path, capsys, flag):
    out = str(tmp_path / "pred.xyz")
    err = _error(capsys, ["eval", labelled, "--out", out, "--no-progress", "--device", "cpu", flag, "dft_x"])
    assert err.startswith(f"equikernels eval: error: {flag} 'dft_x': no frame of {labelled} holds it"), err
    assert not os.path.exists(out)


def test_a_label_key_some_frame_holds_is_taken(labelled, tmp_path):
    out = str(tmp_path / "pred.xyz")
    assert main(["eval", labelled, "--out", out, "--no-progress", "--device", "cpu", "--energy-key", "REF_energy"]) == 0
    assert "MACE_energy" in ase.io.read(out).info


@pytest.mark.parametrize("name", ["pred.traj", "pred.cif", "pred.json"])
def test_an_out_name_of_another_format_is_refused(labelled, tmp_path, capsys, name):
    out = str(tmp_path / name)
    err = _error(capsys, ["eval", labelled, "--out", out, "--no-progress", "--device", "cpu"])
    assert err.startswith(f"equikernels eval: error: --out {out!r}: eval writes extended XYZ"), err
    assert not os.path.exists(out)


def test_the_clash_advice_names_another_prefix(labelled, tmp_path, capsys):
    err = _error(capsys, ["eval", labelled, "--out", str(tmp_path / "p.xyz"), "--energy-key", "MACE_energy"])
    assert "choose another prefix such as PRED_ (" in err, err


def test_a_stress_key_held_by_frames_not_periodic_is_taken(tmp_path, capsys):
    from ase.build import fcc111
    from ase.calculators.singlepoint import SinglePointCalculator

    slab = fcc111("Cu", (2, 2, 2), vacuum=4.0)  # periodic in two directions: the stress is read, not compared
    slab.info.pop("adsorbate_info", None)
    slab.calc = SinglePointCalculator(slab, energy=-1.0, forces=np.zeros((len(slab), 3)), stress=np.ones(6))
    path, out = str(tmp_path / "slab.xyz"), str(tmp_path / "pred.xyz")
    ase.io.write(path, slab, format="extxyz")
    assert main(["eval", path, "--out", out, "--no-progress", "--device", "cpu", "--stress-key", "stress"]) == 0
    said = capsys.readouterr().out
    assert "stress from 'stress' in 1 of 1 frames not used (their cell is not periodic in all three directions)" in said
    assert "MACE_energy" in ase.io.read(out).info
