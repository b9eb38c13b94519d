"""How ``run_md`` ends when it is stopped from outside: a signal stops it between two steps, with that
step the last one in md.traj and md.log (so the trajectory continues the run) and no frame left half
written; a second signal stops it at once; a full disk keeps the frames written before and still
writes summary.json with the error."""
import json
import os
import signal
import sys

import ase.io.ulm
import numpy as np
import pytest
from ase.build import bulk
from ase.io import read

from equikernels.calculators import md as md_module


def _cu(cu_model):
    from equikernels.calculators import MACECalculator

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.calc = MACECalculator(cu_model, device="cpu")
    return atoms


def _signal_during_step(monkeypatch, atoms, step, signals):
    """Send ``signals`` to this process while the forces of ``step`` are evaluated."""
    done = []
    real_progress = md_module._Progress.__call__

    def progress(self):
        real_progress(self)
        done.append(self.steps_done)
    monkeypatch.setattr(md_module._Progress, "__call__", progress)
    real_calculate = atoms.calc.calculate

    def calculate(*args, **kwargs):
        if done and done[-1] == step - 1 and signals:
            for sig in signals:
                os.kill(os.getpid(), sig)
            signals.clear()
        return real_calculate(*args, **kwargs)
    atoms.calc.calculate = calculate


def _between_positions_and_momenta(monkeypatch, frame, action):
    """Call ``action`` while the ``frame``-th trajectory frame is written: its positions written, its
    momenta not yet."""
    real_write = ase.io.ulm.Writer.write
    seen = []

    def write(self, *args, **kwargs):
        if "momenta" in kwargs:
            seen.append(1)
            if len(seen) == frame:
                action()
        return real_write(self, *args, **kwargs)
    monkeypatch.setattr(ase.io.ulm.Writer, "write", write)


def _input_output_error():
    raise OSError(5, "Input/output error")


def _whole_frames(path):
    frames = read(str(path), ":")
    assert all(f.has("momenta") and "forces" in f.calc.results for f in frames)
    return frames


def _logged_steps(path):
    return [int(line.split()[0]) for line in path.read_text().splitlines()[1:]]


def test_a_signal_stops_after_the_step_in_progress_and_records_it(cu_model, tmp_path, monkeypatch, single_thread):
    atoms = _cu(cu_model)
    _signal_during_step(monkeypatch, atoms, 4, [signal.SIGTERM])
    settings = md_module.MDSettings(steps=50, ensemble="nve", traj_interval=3, log_interval=3)
    with pytest.raises(md_module.Interrupted, match="SIGTERM"):
        md_module.run_md(atoms, settings, out_dir=str(tmp_path), progress=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps_done"] == 4
    assert summary["total_energy_end_eV"] is not None
    frames = _whole_frames(tmp_path / "md.traj")
    assert len(frames) == 3  # steps 0, 3 and 4, where it stopped
    np.testing.assert_array_equal(frames[-1].positions, atoms.positions)
    np.testing.assert_array_equal(frames[-1].get_momenta(), atoms.get_momenta())
    assert _logged_steps(tmp_path / "md.log") == [0, 3, 4]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_signal_during_a_frame_write_leaves_the_frame_whole(cu_model, tmp_path, monkeypatch, single_thread):
    _between_positions_and_momenta(monkeypatch, 3, lambda: os.kill(os.getpid(), signal.SIGINT))  # step 2's frame
    atoms = _cu(cu_model)
    settings = md_module.MDSettings(steps=50, ensemble="nve", traj_interval=1, log_interval=1)
    with pytest.raises(md_module.Interrupted, match="SIGINT"):
        md_module.run_md(atoms, settings, out_dir=str(tmp_path), progress=False)
    frames = _whole_frames(tmp_path / "md.traj")
    assert len(frames) == 3
    np.testing.assert_array_equal(frames[-1].get_momenta(), atoms.get_momenta())
    assert _logged_steps(tmp_path / "md.log") == [0, 1, 2]


def test_a_second_signal_stops_at_once(cu_model, tmp_path, monkeypatch, single_thread):
    atoms = _cu(cu_model)
    _signal_during_step(monkeypatch, atoms, 4, [signal.SIGINT, signal.SIGINT])
    settings = md_module.MDSettings(steps=50, ensemble="nve", traj_interval=3, log_interval=3)
    with pytest.raises(md_module.Interrupted):
        md_module.run_md(atoms, settings, out_dir=str(tmp_path), progress=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps_done"] == 3
    assert summary["total_energy_end_eV"] is None  # the atoms hold a step cut short
    assert len(_whole_frames(tmp_path / "md.traj")) == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="file size limits as Linux sets them")
def test_a_full_disk_keeps_the_frames_and_writes_the_summary(cu_model, tmp_path, single_thread):
    import resource

    atoms = _cu(cu_model)
    settings = md_module.MDSettings(steps=40, ensemble="nve", traj_interval=1, log_interval=0)
    saved = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (6000, saved[0][1]))  # md.traj reaches it after a few frames
    try:
        with pytest.raises(OSError, match="File too large"):
            md_module.run_md(atoms, settings, out_dir=str(tmp_path), progress=False)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, saved[0])
        signal.signal(signal.SIGXFSZ, saved[1])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "File too large" in summary["error"]
    frames = _whole_frames(tmp_path / "md.traj")
    assert 2 <= len(frames) <= summary["steps_done"] + 1


def test_an_unwritable_summary_does_not_hide_the_runs_error(cu_model, tmp_path, monkeypatch, single_thread):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    def quota(*args, **kwargs):
        raise OSError(122, "Disk quota exceeded")
    monkeypatch.setattr(ase.io.ulm.Writer, "write", full)
    monkeypatch.setattr(md_module, "atomic_write", quota)
    settings = md_module.MDSettings(steps=3, ensemble="nve", traj_interval=2, log_interval=0)
    with pytest.warns(UserWarning, match="summary.json could not be written .*Disk quota exceeded"):
        with pytest.raises(OSError, match="No space left"):
            md_module.run_md(_cu(cu_model), settings, out_dir=str(tmp_path), progress=False)


def test_a_write_error_in_a_frame_leaves_no_half_frame(cu_model, tmp_path, monkeypatch, single_thread):
    _between_positions_and_momenta(monkeypatch, 3, _input_output_error)
    settings = md_module.MDSettings(steps=50, ensemble="nve", traj_interval=1, log_interval=1)
    with pytest.raises(OSError, match="Input/output error"):
        md_module.run_md(_cu(cu_model), settings, out_dir=str(tmp_path), progress=False)
    assert len(_whole_frames(tmp_path / "md.traj")) == 2
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed"


def test_a_non_finite_step_is_not_written(cu_model, tmp_path):
    """A calculator that gives NaN forces without raising (any ASE calculator may): the run stops
    naming the step, and md.traj / md.log end at the last finite step."""
    from ase.calculators.calculator import Calculator, all_changes

    class NaNAfter(Calculator):
        implemented_properties = ["energy", "forces"]

        def __init__(self, good: int):
            super().__init__()
            self.calls, self.good = 0, good

        def calculate(self, atoms=None, properties=None, system_changes=all_changes):
            super().calculate(atoms, properties, system_changes)
            self.calls += 1
            bad = self.calls > self.good
            self.results = {"energy": float("nan") if bad else 0.0,
                            "forces": np.full((len(atoms), 3), np.nan if bad else 0.0)}

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.calc = NaNAfter(good=4)
    settings = md_module.MDSettings(steps=8, ensemble="nve", traj_interval=1, log_interval=1)
    with pytest.raises(ValueError, match=r"step \d+: the velocities of atoms \[0, 1, 2, 3\] are not finite"):
        md_module.run_md(atoms, settings, out_dir=str(tmp_path / "out"), progress=False)
    frames = read(str(tmp_path / "out" / "md.traj"), ":")
    assert frames and all(np.isfinite(f.get_momenta()).all() for f in frames)
    lines = (tmp_path / "out" / "md.log").read_text().splitlines()
    assert not any("nan" in ln.lower() for ln in lines)
