"""Molecular dynamics with ASE: ensemble set-up, built-in example structures, and a runner with
trajectory/log output and a progress bar reporting ns/day. Used by ``equikernels md``, the
examples and the MD benchmark."""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Dict, Optional

import numpy as np
from ase import Atoms, units

ENSEMBLES = ("nve", "nvt-langevin", "npt")


@dataclass
class MDSettings:
    steps: int = 1000
    timestep_fs: float = 1.0
    temperature_K: float = 300.0
    ensemble: str = "nvt-langevin"
    pressure_bar: float = 1.0            # npt only
    friction_per_ps: float = 10.0        # nvt-langevin only
    tdamp_fs: Optional[float] = None     # npt thermostat time constant; default 100 timesteps
    pdamp_fs: Optional[float] = None     # npt barostat time constant; default 1000 timesteps
    seed: int = 0
    log_interval: int = 10
    traj_interval: int = 10

    def validate(self) -> None:
        if self.ensemble not in ENSEMBLES:
            raise ValueError(f"ensemble must be one of {ENSEMBLES}, got {self.ensemble!r}")
        if int(self.steps) != self.steps or self.steps < 0:
            raise ValueError(f"steps must be a non-negative integer, got {self.steps!r}")
        for name in ("timestep_fs", "friction_per_ps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if not self.temperature_K >= 0:
            raise ValueError(f"temperature_K must be >= 0, got {self.temperature_K!r}")
        if self.ensemble != "nve" and not self.temperature_K > 0:
            raise ValueError(f"ensemble {self.ensemble!r} needs a positive temperature_K, got {self.temperature_K!r}")
        for name in ("log_interval", "traj_interval"):
            if int(getattr(self, name)) != getattr(self, name) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a non-negative integer (0 disables), got {getattr(self, name)!r}")


# ---- built-in structures -------------------------------------------------------------------
def builtin_structure(name: str = "cu-fcc") -> Atoms:
    """Small example systems: ``cu-fcc`` (a 108-atom Cu crystal) and ``ethanol`` (a molecule,
    non-periodic)."""
    if name == "cu-fcc":
        from ase.build import bulk
        return bulk("Cu", "fcc", a=3.61, cubic=True).repeat((3, 3, 3))
    if name == "ethanol":
        from ase.build import molecule
        return molecule("CH3CH2OH")
    raise ValueError(f"unknown built-in structure {name!r}; choose 'cu-fcc' or 'ethanol'")


BUILTIN_STRUCTURES = ("cu-fcc", "ethanol")


# ---- dynamics ------------------------------------------------------------------------------
def initialise_velocities(atoms: Atoms, temperature_K: float, seed: int = 0) -> None:
    """Maxwell-Boltzmann velocities with no centre-of-mass drift (and no rotation for molecules)."""
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution, Stationary, ZeroRotation

    if temperature_K <= 0:
        atoms.set_momenta(np.zeros((len(atoms), 3)))
        return
    MaxwellBoltzmannDistribution(atoms, temperature_K=temperature_K, rng=np.random.default_rng(seed))
    Stationary(atoms)
    if not atoms.pbc.any() and len(atoms) > 2:
        ZeroRotation(atoms)


def make_dynamics(atoms: Atoms, settings: MDSettings):
    """The ASE integrator for ``settings.ensemble``: velocity Verlet (nve), Langevin
    (nvt-langevin), or isotropic Martyna-Tobias-Klein Nose-Hoover-chain NPT (npt)."""
    settings.validate()
    dt = settings.timestep_fs * units.fs
    if settings.ensemble == "nve":
        from ase.md.verlet import VelocityVerlet
        return VelocityVerlet(atoms, timestep=dt)
    if settings.ensemble == "nvt-langevin":
        from ase.md.langevin import Langevin
        return Langevin(atoms, timestep=dt, temperature_K=settings.temperature_K,
                        friction=settings.friction_per_ps / (1000.0 * units.fs), fixcm=False,
                        rng=np.random.default_rng(settings.seed))
    if not atoms.pbc.all() or abs(atoms.cell.volume) < 1e-8:
        raise ValueError("ensemble 'npt' needs a periodic structure with a 3-D cell (pbc=True in all directions)")
    from ase.md.nose_hoover_chain import IsotropicMTKNPT
    tdamp = (settings.tdamp_fs or 100 * settings.timestep_fs) * units.fs
    pdamp = (settings.pdamp_fs or 1000 * settings.timestep_fs) * units.fs
    return IsotropicMTKNPT(atoms, timestep=dt, temperature_K=settings.temperature_K,
                           pressure_au=settings.pressure_bar * units.bar, tdamp=tdamp, pdamp=pdamp)


class _Progress:
    """Per-step observer: tqdm bar with ns/day, measured from the end of the first step (so that
    one-off set-up such as kernel compilation is not counted)."""

    def __init__(self, dyn, total: int, timestep_fs: float, enabled: bool):
        self.dyn, self.timestep_fs = dyn, timestep_fs
        self.steps_done, self.t_first = 0, None
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="step", desc="md", mininterval=0.5)

    def __call__(self):
        if self.dyn.nsteps == 0:  # ASE also calls observers once before the first step
            return
        self.steps_done += 1
        now = time.perf_counter()
        if self.t_first is None:
            self.t_first = now
        if self.bar is not None:
            self.bar.update(1)
            if self.steps_done % 10 == 0:
                self.bar.set_postfix_str(f"{self.ns_per_day(now):.3f} ns/day", refresh=False)

    def ns_per_day(self, now: Optional[float] = None) -> float:
        if self.t_first is None or self.steps_done < 2:
            return float("nan")
        elapsed = (now or time.perf_counter()) - self.t_first
        return (self.steps_done - 1) * self.timestep_fs * 1e-6 / (elapsed / 86400.0) if elapsed > 0 else float("nan")

    def close(self):
        if self.bar is not None:
            self.bar.close()


def run_md(atoms: Atoms, settings: MDSettings, out_dir: Optional[str] = None, progress: bool = True,
           init_velocities: bool = True) -> Dict:
    """Run ``settings.steps`` of MD on ``atoms`` (its calculator must be set). With ``out_dir``,
    writes ``md.traj`` (ASE trajectory), ``md.log`` (ASE MDLogger) and ``summary.json``.
    Returns the summary: ns/day, wall time, energies, neighbour-list rebuilds."""
    if atoms.calc is None:
        raise ValueError("atoms has no calculator: set atoms.calc = MACECalculator(...) first")
    settings.validate()
    if init_velocities:
        initialise_velocities(atoms, settings.temperature_K, settings.seed)
    dyn = make_dynamics(atoms, settings)
    closers = []
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        if settings.traj_interval:
            from ase.io import Trajectory
            traj = Trajectory(os.path.join(out_dir, "md.traj"), "w", atoms)
            dyn.attach(traj.write, interval=settings.traj_interval)
            closers.append(traj.close)
        if settings.log_interval:
            from ase.md import MDLogger
            logger = MDLogger(dyn, atoms, os.path.join(out_dir, "md.log"), header=True,
                              stress=settings.ensemble == "npt", mode="w")
            dyn.attach(logger, interval=settings.log_interval)
            closers.append(logger.close)
    bar = _Progress(dyn, settings.steps, settings.timestep_fs, progress)
    dyn.attach(bar, interval=1)
    e_start = atoms.get_potential_energy() + atoms.get_kinetic_energy()
    t0 = time.perf_counter()
    try:
        dyn.run(settings.steps)
    finally:
        bar.close()
        for close in closers:
            close()
    wall = time.perf_counter() - t0
    e_end = atoms.get_potential_energy() + atoms.get_kinetic_energy()
    calc = atoms.calc
    summary = {
        "num_atoms": len(atoms), "settings": asdict(settings), "wall_s": wall,
        "ns_per_day": bar.ns_per_day(t0 + wall),
        "total_energy_start_eV": float(e_start), "total_energy_end_eV": float(e_end),
        "temperature_end_K": float(atoms.get_temperature()),
        "neighbor_list_builds": getattr(getattr(calc, "neighbors", None), "num_builds", None),
        "device": str(getattr(calc, "device", "")), "dtype": str(getattr(calc, "dtype", "")),
    }
    if out_dir is not None:
        with open(os.path.join(out_dir, "summary.json"), "w") as fh:
            json.dump(summary, fh, indent=2)
    return summary
