"""A run continued from another's last frame with its velocities (``init_velocities=False``, as
``equikernels md --keep-velocities`` does) keeps them, and its stochastic thermostat does not replay
the noise that run drew from the same seed, while staying reproducible."""
import numpy as np
import pytest
from ase import units
from ase.build import bulk
from ase.md.langevin import Langevin

from equikernels.calculators import md as md_module


@pytest.fixture(scope="module")
def calc(tmp_path_factory):
    from random_models import small_random_model
    from equikernels.calculators import MACECalculator
    from equikernels.models import save

    path = tmp_path_factory.mktemp("model") / "cu.model"
    save(small_random_model([29], seed=4), str(path))
    return MACECalculator(str(path), device="cpu")


def _continue(start, calc, settings):
    atoms = start.copy()
    atoms.calc = calc
    md_module.run_md(atoms, settings, progress=False, init_velocities=False)
    return atoms


def test_a_continued_langevin_run_draws_fresh_noise_reproducibly(calc, single_thread):
    settings = md_module.MDSettings(steps=4, ensemble="nvt-langevin", seed=0, log_interval=0, traj_interval=0)
    start = bulk("Cu", "fcc", a=3.61, cubic=True)
    start.calc = calc
    md_module.run_md(start, settings, progress=False)  # the earlier run, whose last frame is continued
    replay = start.copy()
    replay.calc = calc
    Langevin(replay, timestep=units.fs, temperature_K=300.0, friction=0.01 / units.fs, fixcm=False,
             rng=md_module.thermostat_rng(0)).run(4)  # the noise the earlier run drew
    first, again = _continue(start, calc, settings), _continue(start, calc, settings)
    np.testing.assert_array_equal(first.get_momenta(), again.get_momenta())
    assert not np.allclose(first.get_momenta(), replay.get_momenta())
