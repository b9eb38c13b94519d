"""`equikernels md` with an equikernels model file (no mace-torch): a structure file read by ASE,
outputs written (md.log to 1e-6 eV, a strict-JSON summary with model, structure, dtype, device and
versions, also on SIGTERM), a CPU default that runs briefly, errors before the run, and NPT with
one model evaluation per step and a reused neighbour list."""
import json
import os
import signal

import numpy as np
import pytest
from ase.build import bulk, molecule
from ase.io import read, write

from equikernels.calculators import md as md_module
from cli_checks import sigterm_after_step
from equikernels.cli import build_parser, main
from equikernels.cli.md import DEFAULT_STEPS


def _strict_json(path):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.fixture
def cu_file(tmp_path):
    path = tmp_path / "cu.extxyz"
    write(str(path), bulk("Cu", "fcc", a=3.61, cubic=True))
    return str(path)


def test_md_from_structure_file(cu_model, cu_file, tmp_path, single_thread):
    out = tmp_path / "run"
    assert main(["md", cu_file, "--model", cu_model, "--steps", "6", "--supercell", "1", "1", "2",
                 "--ensemble", "nve", "--traj-interval", "3", "--log-interval", "2", "--out", str(out),
                 "--no-progress", "--device", "cpu"]) == 0
    assert len(read(str(out / "md.traj"), ":")) == 3
    summary = _strict_json(out / "summary.json")
    assert summary["num_atoms"] == 8 and summary["neighbor_list_builds"] >= 1 and summary["status"] == "completed"
    assert summary["model"] == os.path.abspath(cu_model) and summary["structure"] == cu_file
    assert summary["device"] == "cpu" and summary["dtype"] == "float64"
    assert {"equikernels", "torch", "ase"} <= set(summary["versions"])
    rows = [ln.split() for ln in (out / "md.log").read_text().splitlines()[1:]]
    assert len(rows) == 4 and all(len(r[2].split(".")[1]) == 6 for r in rows)  # Etot to 1e-6 eV
    etot = np.array([float(r[2]) for r in rows])
    assert np.ptp(etot) < 1e-2  # NVE: the drift is visible at this precision, and small


def test_md_unknown_elements_fail_before_the_run(cu_model, tmp_path, capsys):
    path = tmp_path / "water.xyz"
    write(str(path), molecule("H2O"))
    assert main(["md", str(path), "--model", cu_model, "--steps", "1", "--out", str(tmp_path / "run"),
                 "--device", "cpu"]) == 2
    captured = capsys.readouterr()
    assert "does not know: H, O" in captured.err and "Traceback" not in captured.err
    assert "md:" not in captured.err.replace("equikernels md:", "")  # no progress bar was started
    assert not (tmp_path / "run").exists()


def test_cpu_default_steps_header_and_report(cu_model, cu_file, tmp_path, capsys, single_thread):
    assert build_parser().parse_args(["md"]).steps is None
    out = tmp_path / "run"
    assert main(["md", cu_file, "--model", cu_model, "--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert f"{DEFAULT_STEPS['cpu']} steps of 1 fs (the CPU default" in text
    assert "on cpu (float64, 1 thread)" in text and "estimated" in text
    assert "ns/day" in text and str(out / "md.traj") in text
    assert _strict_json(out / "summary.json")["steps_done"] == DEFAULT_STEPS["cpu"]


@pytest.mark.parametrize("steps", [0, 1])
def test_too_few_steps_for_a_rate_write_null(cu_model, cu_file, tmp_path, steps):
    out = tmp_path / "run"
    assert main(["md", cu_file, "--model", cu_model, "--steps", str(steps), "--out", str(out), "--no-progress",
                 "--device", "cpu"]) == 0
    summary = _strict_json(out / "summary.json")
    assert summary["ns_per_day"] is None and summary["steps_done"] == steps


def test_sigterm_still_writes_the_summary(cu_model, cu_file, tmp_path, capsys, monkeypatch):
    sigterm_after_step(monkeypatch, 3)
    out = tmp_path / "run"
    assert main(["md", cu_file, "--model", cu_model, "--steps", "50", "--out", str(out), "--no-progress",
                 "--device", "cpu"]) == 128 + signal.SIGTERM
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "SIGTERM" in err[0] and "summary" in err[0]
    summary = _strict_json(out / "summary.json")
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM" and summary["steps_done"] == 3
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler was restored


def test_builtin_structures_are_known_to_the_default_model():
    from equikernels.calculators.loading import default_model_path
    from equikernels.models import load

    try:
        known = {int(z) for z in load(default_model_path()).atomic_numbers}
    except FileNotFoundError:
        pytest.skip("no default model is bundled in this checkout")
    for name in md_module.BUILTIN_STRUCTURES:
        assert set(md_module.builtin_structure(name).numbers.tolist()) <= known, name


def test_md_out_of_the_box_with_the_default_model(tmp_path, single_thread):
    """No structure, no model: the built-in Cu crystal with the bundled default model."""
    from equikernels.calculators.loading import default_model_path

    try:
        default_model_path()
    except FileNotFoundError:
        pytest.skip("no default model is bundled in this checkout")
    out = tmp_path / "run"
    assert main(["md", "--steps", "3", "--out", str(out), "--no-progress", "--device", "cpu"]) == 0
    summary = _strict_json(out / "summary.json")
    assert summary["num_atoms"] == 108 and summary["temperature_end_K"] > 0


def test_npt_evaluates_once_per_step_and_reuses_the_neighbour_list(cu_model, single_thread):
    from equikernels.calculators import MACECalculator

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 1, 1))
    calc = MACECalculator(cu_model, device="cpu")
    calls = []
    forward = calc.model.forward
    calc.model.forward = lambda *a, **k: calls.append(k.get("compute_stress")) or forward(*a, **k)
    atoms.calc = calc
    steps = 8
    summary = md_module.run_md(atoms, md_module.MDSettings(steps=steps, ensemble="npt", log_interval=0,
                                                           traj_interval=0), progress=False)
    assert summary["status"] == "completed"
    assert len(calls) <= steps + 2 and all(calls[1:])  # one call per step, stress included
    assert summary["neighbor_list_builds"] <= 2


def _md(structure, model, out, *extra):
    return main(["md", structure, "--model", model, "--steps", "4", "--traj-interval", "2", "--log-interval", "2",
                 "--out", str(out), "--no-progress", "--device", "cpu", *extra])


def test_an_earlier_run_is_not_replaced_unless_asked(cu_model, cu_file, tmp_path, capsys, single_thread):
    out = tmp_path / "run"
    assert _md(cu_file, cu_model, out) == 0
    before = {n: (out / n).read_bytes() for n in ("md.traj", "md.log", "summary.json")}
    capsys.readouterr()
    assert _md(cu_file, cu_model, out, "--seed", "1") == 2
    err = capsys.readouterr().err
    assert "--out" in err and "holds an earlier run (md.traj, md.log, summary.json)" in err and "--overwrite" in err
    assert {n: (out / n).read_bytes() for n in before} == before
    # the earlier trajectory as the structure is the run's own input: not replaced even with --overwrite
    assert _md(str(out / "md.traj"), cu_model, out, "--seed", "1", "--overwrite") == 2
    assert "is the file this run writes its md.traj to in --out" in capsys.readouterr().err
    assert {n: (out / n).read_bytes() for n in before} == before
    assert _md(cu_file, cu_model, out, "--seed", "1", "--overwrite") == 0
    assert (out / "md.traj").read_bytes() != before["md.traj"]
    # replaced as a whole: a run writing no trajectory leaves none of the earlier one's
    assert _md(cu_file, cu_model, out, "--overwrite", "--traj-interval", "0") == 0
    assert sorted(p.name for p in out.iterdir()) == ["md.log", "summary.json"]


def test_run_md_refuses_an_earlier_run(cu_model, tmp_path, single_thread):
    from equikernels.calculators import MACECalculator

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.calc = MACECalculator(cu_model, device="cpu")
    settings = md_module.MDSettings(steps=2, log_interval=1, traj_interval=1)
    md_module.run_md(atoms, settings, out_dir=str(tmp_path), progress=False)
    log = (tmp_path / "md.log").read_bytes()
    with pytest.raises(FileExistsError, match="holds an earlier run .*overwrite=True"):
        md_module.run_md(atoms, settings, out_dir=str(tmp_path), progress=False)
    assert (tmp_path / "md.log").read_bytes() == log
    summary = md_module.run_md(atoms, settings, out_dir=str(tmp_path), progress=False, overwrite=True)
    assert summary["status"] == "completed"


def test_keep_velocities_continues_a_run(cu_model, cu_file, tmp_path, capsys, single_thread):
    first, second, fresh = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert _md(cu_file, cu_model, first, "--ensemble", "nve") == 0
    last = read(str(first / "md.traj"), -1)
    assert _md(str(first / "md.traj"), cu_model, second, "--ensemble", "nve", "--keep-velocities") == 0
    start = read(str(second / "md.traj"), 0)
    np.testing.assert_array_equal(start.positions, last.positions)
    np.testing.assert_array_equal(start.get_momenta(), last.get_momenta())
    assert _strict_json(second / "summary.json")["velocities"] == "from the structure"
    # without the flag the velocities are drawn again at --temperature
    assert _md(str(first / "md.traj"), cu_model, fresh, "--ensemble", "nve", "--seed", "3") == 0
    assert not np.allclose(read(str(fresh / "md.traj"), 0).get_momenta(), last.get_momenta())
    capsys.readouterr()
    assert _md(cu_file, cu_model, tmp_path / "d", "--keep-velocities") == 2
    err = capsys.readouterr().err
    assert "--keep-velocities" in err and "holds no velocities" in err and "Traceback" not in err


def _mean_temperature(cu_model, ensemble, steps=300, **settings):
    """Mean temperature over the second half of a run started hot (1,000 K) with a 100 K target."""
    from equikernels.calculators import MACECalculator

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat((2, 2, 1))
    atoms.calc = MACECalculator(cu_model, device="cpu")
    md_module.initialise_velocities(atoms, 1000.0, seed=0)
    cfg = md_module.MDSettings(steps=steps, temperature_K=100.0, ensemble=ensemble, log_interval=0,
                               traj_interval=0, **settings)
    dyn = md_module.make_dynamics(atoms, cfg)
    seen = []
    dyn.attach(lambda: seen.append(atoms.get_temperature()), interval=1)
    dyn.run(steps)
    return float(np.mean(seen[len(seen) // 2:]))


@pytest.mark.parametrize("ensemble", ["nvt-nose-hoover", "nvt-bussi"])
def test_deterministic_and_stochastic_thermostats_cool_a_hot_start(cu_model, ensemble, single_thread):
    """Nose-Hoover chains and Bussi's velocity rescaling bring a run started at 1,000 K to about its
    100 K target within a few of their time constants; NVE from the same start stays hot."""
    hot = _mean_temperature(cu_model, "nve")
    cooled = _mean_temperature(cu_model, ensemble, tdamp_fs=20.0)
    assert hot > 300.0 and cooled < 200.0, (hot, cooled)
    with pytest.raises(ValueError, match="tdamp_fs must be a positive number of fs"):
        md_module.MDSettings(ensemble=ensemble, tdamp_fs=0.0).validate()


def test_thermostat_flags_reach_the_run(cu_model, cu_file, tmp_path, capsys, single_thread):
    assert _md(cu_file, cu_model, tmp_path / "nh", "--ensemble", "nvt-nose-hoover", "--tdamp", "25") == 0
    settings = _strict_json(tmp_path / "nh" / "summary.json")["settings"]
    assert (settings["ensemble"], settings["tdamp_fs"], settings["pdamp_fs"]) == ("nvt-nose-hoover", 25.0, None)
    capsys.readouterr()
    assert _md(cu_file, cu_model, tmp_path / "npt", "--ensemble", "npt", "--pdamp", "-1") == 2
    err = capsys.readouterr().err
    assert "--pdamp must be a positive number of fs, got -1.0" in err and "Traceback" not in err
