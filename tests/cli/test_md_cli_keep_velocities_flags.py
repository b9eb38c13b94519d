"""`equikernels md --keep-velocities`: --temperature and --seed are refused by name where nothing reads
them (nve takes its velocities from the file; only Langevin and Bussi draw noise), and taken where a
thermostat does."""
import json

import numpy as np
import pytest
from ase.build import bulk
from ase.io import write

from cli_checks import one_line_error
from equikernels.cli import main


@pytest.fixture
def moving_cu(tmp_path):
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.set_momenta(np.random.default_rng(0).normal(scale=0.1, size=(len(atoms), 3)))
    path = tmp_path / "moving.extxyz"
    write(str(path), atoms)
    return str(path)


@pytest.mark.parametrize("flags, needles", [
    (["--ensemble", "nve", "--temperature", "500"], ["--temperature: not read", "--ensemble nve"]),
    (["--ensemble", "nve", "--seed", "3"], ["--seed: not read", "--ensemble nve"]),
    (["--ensemble", "nvt-nose-hoover", "--seed", "3"], ["--seed: not read", "nvt-nose-hoover"]),
    (["--ensemble", "npt", "--temperature", "400", "--seed", "1"], ["--seed: not read", "npt"]),
])
def test_unread_flag_with_kept_velocities_is_refused(cu_model, moving_cu, tmp_path, capsys, flags, needles):
    out = tmp_path / "run"
    assert main(["md", moving_cu, "--keep-velocities", "--model", cu_model, "--out", str(out), "--no-progress",
                 *flags]) == 2
    one_line_error(capsys, *needles)
    assert not out.exists()


def test_thermostat_flags_with_kept_velocities_reach_the_run(cu_model, moving_cu, tmp_path, capsys, single_thread):
    out = tmp_path / "run"
    assert main(["md", moving_cu, "--keep-velocities", "--model", cu_model, "--out", str(out), "--no-progress",
                 "--steps", "1", "--temperature", "450", "--seed", "7", "--device", "cpu"]) == 0
    assert "nvt-langevin at 450 K" in capsys.readouterr().out
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert settings["temperature_K"] == 450 and settings["seed"] == 7
