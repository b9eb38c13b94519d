"""`equikernels eval --out` in a folder that does not exist: refused by name before evaluating."""
import ase.io
from ase.build import bulk

from equikernels.cli import main
from cli_checks import one_line_error


def test_out_in_a_missing_folder_is_refused_before_evaluating(tmp_path, capsys):
    src = str(tmp_path / "in.xyz")
    ase.io.write(src, bulk("Cu", "fcc", a=3.6), format="extxyz")
    out = str(tmp_path / "no_such_folder" / "pred.xyz")
    assert main(["eval", src, "--out", out, "--no-progress", "--device", "cpu"]) == 2
    line = one_line_error(capsys, "--out", "no_such_folder", "does not exist")
    assert ".part" not in line
