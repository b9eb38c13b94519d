"""`equikernels eval` with mace_eval_configs' --compute_bec and --compute_stress: the first is refused in
one line before anything is read, the second says which structures get no stress (mace_eval_configs
writes one for every frame, ours only for frames periodic in all three directions)."""
import ase.io
from ase import Atoms
from ase.build import bulk

from equikernels.cli import main
from cli_checks import one_line_error


def test_compute_bec_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "o.xyz"
    assert main(["eval", str(tmp_path / "missing.xyz"), "--out", str(out), "--compute_bec", "--no-progress"]) == 2
    one_line_error(capsys, "--compute-bec", "not supported")
    assert not out.exists()


def test_compute_stress_names_the_frames_without_stress(tmp_path, capsys):
    src, out = str(tmp_path / "frames.xyz"), str(tmp_path / "o.xyz")
    slab = bulk("Cu", "fcc", a=3.62, cubic=True)
    slab.pbc = [True, True, False]
    ase.io.write(src, [bulk("Cu", "fcc", a=3.62), slab, Atoms("Cu", positions=[[0, 0, 0]])], format="extxyz")
    assert main(["eval", "--configs", src, "--output", out, "--compute_stress", "--no-progress", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "no MACE_stress for the 2 structure(s) not periodic in all three directions, first" in printed
    assert "frame 1" in printed
    assert ["MACE_stress" in a.info for a in ase.io.read(out, ":")] == [True, False, False]
