"""`equikernels md` refuses, in one line and before the model loads, a structure file that is one of
the files the run writes into --out (even with --overwrite, which would replace it) and a
--supercell along a lattice vector the structure does not have."""
import hashlib

from ase import Atoms

from equikernels.cli import main


def _error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_structure_in_out_under_a_run_output_name_is_refused(tmp_path, capsys, single_thread):
    out = tmp_path / "run"
    assert main(["md", "--steps", "2", "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    capsys.readouterr()
    traj = out / "md.traj"
    before = hashlib.sha256(traj.read_bytes()).hexdigest()
    for spec in (str(traj), f"{traj}@-1"):
        err = _error(capsys, ["md", spec, "--keep-velocities", "--out", str(out), "--overwrite", "--steps", "2",
                              "--device", "cpu", "--no-progress"])
        assert err.startswith(f"equikernels md: error: structure {spec!r} is the file this run writes its md.traj "
                              f"to in --out {str(out)!r}"), err
    assert hashlib.sha256(traj.read_bytes()).hexdigest() == before
    # the same file copied elsewhere continues the run
    copy = tmp_path / "start.traj"
    copy.write_bytes(traj.read_bytes())
    assert main(["md", str(copy), "--keep-velocities", "--out", str(out), "--overwrite", "--steps", "2",
                 "--device", "cpu", "--no-progress"]) == 0


def test_a_supercell_along_a_missing_lattice_vector_is_refused(tmp_path, capsys):
    path = tmp_path / "pair.xyz"
    Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 2.5]], cell=[6.0, 0, 0], pbc=[True, False, False]).write(str(path))
    err = _error(capsys, ["md", str(path), "--supercell", "2", "2", "1", "--steps", "1", "--out",
                          str(tmp_path / "run"), "--device", "cpu"])
    assert err.startswith("equikernels md: error: --supercell 2 2 1: ") and "no lattice vector b to repeat along" in err
    assert main(["md", str(path), "--supercell", "2", "1", "1", "--steps", "1", "--out", str(tmp_path / "run"),
                 "--device", "cpu", "--no-progress", "--ensemble", "nve"]) == 0
