"""`equikernels md` says how a run goes on: a structure's own velocities are named when they are
replaced (without --keep-velocities), and an interrupted run says how to continue from md.traj."""
import signal

from ase.build import bulk
from ase.io import write

from cli_checks import sigterm_after_step
from equikernels.cli import main


def _md(structure, model, out, *extra):
    return main(["md", str(structure), "--model", model, "--steps", "4", "--traj-interval", "2", "--out", str(out),
                 "--no-progress", "--device", "cpu", *extra])


def test_replaced_velocities_are_named(cu_model, tmp_path, capsys, single_thread):
    path = tmp_path / "cu.extxyz"
    write(str(path), bulk("Cu", "fcc", a=3.61, cubic=True))
    assert _md(path, cu_model, tmp_path / "a", "--ensemble", "nve") == 0
    assert "are replaced" not in capsys.readouterr().out
    traj = tmp_path / "a" / "md.traj"
    assert _md(traj, cu_model, tmp_path / "b") == 0
    assert f"the velocities in {traj} are replaced by ones drawn at 300 K (--keep-velocities" in capsys.readouterr().out
    assert _md(traj, cu_model, tmp_path / "c", "--keep-velocities") == 0
    assert "are replaced" not in capsys.readouterr().out


def test_an_interrupted_run_says_how_to_continue(cu_model, tmp_path, capsys, monkeypatch, single_thread):
    sigterm_after_step(monkeypatch, 3)
    out = tmp_path / "run"
    assert _md("cu-fcc", cu_model, out, "--steps", "50") == 128 + signal.SIGTERM
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "SIGTERM" in err[0]
    assert f"continue from its last frame with: equikernels md {out / 'md.traj'} --keep-velocities" in err[0]
