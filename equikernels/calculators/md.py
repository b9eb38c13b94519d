"""Molecular dynamics with ASE: ensemble set-up, built-in example structures, and a runner with
trajectory/log output, a progress bar reporting ns/day and a ``summary.json`` that is written
however the run ends (completed, interrupted by SIGINT/SIGTERM, or stopped by an error). Used by
``equikernels md``, the examples and the MD benchmark."""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import signal
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional

import ase
import numpy as np
import torch
from ase import Atoms, units
from tqdm import tqdm

from .._files import atomic_write
from .._version import __version__

ENSEMBLES = ("nve", "nvt-langevin", "nvt-nose-hoover", "nvt-bussi", "npt")


@dataclass
class MDSettings:
    steps: int = 1000
    timestep_fs: float = 1.0
    temperature_K: float = 300.0
    ensemble: str = "nvt-langevin"
    pressure_bar: float = 1.0            # npt only
    friction_per_ps: float = 10.0        # nvt-langevin only
    tdamp_fs: Optional[float] = None     # nose-hoover, bussi and npt thermostat time constant; default 100 timesteps
    pdamp_fs: Optional[float] = None     # npt barostat time constant; default 1000 timesteps
    seed: int = 0
    log_interval: int = 10
    traj_interval: int = 10

    def validate(self) -> None:
        if self.ensemble not in ENSEMBLES:
            raise ValueError(f"ensemble must be one of {ENSEMBLES}, got {self.ensemble!r}")
        if int(self.steps) != self.steps or self.steps < 0:
            raise ValueError(f"steps must be a non-negative integer, got {self.steps!r}")
        for name in ("timestep_fs", "friction_per_ps", "temperature_K", "pressure_bar"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number, got {getattr(self, name)!r}")
        for name in ("timestep_fs", "friction_per_ps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("tdamp_fs", "pdamp_fs"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of fs, got {value!r}")
        if not self.temperature_K >= 0:
            raise ValueError(f"temperature_K must be >= 0, got {self.temperature_K!r}")
        if self.ensemble != "nve" and not self.temperature_K > 0:
            raise ValueError(f"temperature_K: ensemble {self.ensemble!r} needs a positive temperature, "
                             f"got {self.temperature_K!r}")
        if int(self.seed) != self.seed or self.seed < 0:  # numpy's generators take no negative seed
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        for name in ("log_interval", "traj_interval"):
            if int(getattr(self, name)) != getattr(self, name) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a non-negative integer (0 disables), got {getattr(self, name)!r}")


# ---- built-in structures -------------------------------------------------------------------
# every element here is one the bundled default model was trained on (Cu Ni Al Ag Au Pd Pt)
BUILTIN_STRUCTURES = {
    "cu-fcc": "a 108-atom Cu crystal (3x3x3 cubic fcc cells)",
    "cu3au": "a 108-atom ordered Cu3Au alloy (L1_2, 3x3x3 cubic cells)",
    "pt-surface": "a 36-atom Pt(111) slab, 4 layers, periodic in the surface plane only, 10 A of vacuum each side",
}


def builtin_structure(name: str = "cu-fcc") -> Atoms:
    """A built-in example system (``BUILTIN_STRUCTURES`` lists them)."""
    from ase.build import bulk, fcc111

    if name == "cu-fcc":
        return bulk("Cu", "fcc", a=3.61, cubic=True).repeat((3, 3, 3))
    if name == "cu3au":
        cell = bulk("Cu", "fcc", a=3.75, cubic=True)  # 4 atoms: the corner one becomes Au
        cell.symbols[0] = "Au"
        return cell.repeat((3, 3, 3))
    if name == "pt-surface":
        return fcc111("Pt", size=(3, 3, 4), a=3.92, vacuum=10.0)  # pbc (True, True, False)
    raise ValueError(f"unknown built-in structure {name!r}; choose one of {', '.join(BUILTIN_STRUCTURES)}")


# ---- dynamics ------------------------------------------------------------------------------
def initialise_velocities(atoms: Atoms, temperature_K: float, seed: int = 0) -> None:
    """Maxwell-Boltzmann velocities with no centre-of-mass drift (and no rotation for molecules).
    A single atom keeps its drawn velocity: removing its drift would leave no motion at all."""
    from ase.md import velocitydistribution as vd

    if temperature_K <= 0:
        atoms.set_momenta(np.zeros((len(atoms), 3)))
        return
    rng = np.random.default_rng(seed)
    if hasattr(vd, "thermalize_momenta"):  # ASE >= 3.29; the older name is deprecated there
        vd.thermalize_momenta(atoms, temperature_K, rng=rng)
    else:
        vd.MaxwellBoltzmannDistribution(atoms, temperature_K=temperature_K, rng=rng)
    if len(atoms) > 1:
        vd.Stationary(atoms)
    if not atoms.pbc.any() and len(atoms) > 2:
        vd.ZeroRotation(atoms)
    check_momenta(atoms, "initial velocities")


def check_momenta(atoms: Atoms, what: str) -> None:
    bad = np.flatnonzero(~np.isfinite(atoms.get_momenta()).all(axis=1))
    if bad.size:
        raise ValueError(f"{what}: the velocities of atoms {bad[:8].tolist()} are not finite (NaN or infinite)")


def thermostat_rng(seed: int, start: Optional[np.ndarray] = None) -> np.random.Generator:
    """The random stream of the stochastic thermostats for ``seed``: independent of the stream
    ``initialise_velocities`` draws from the same seed (were they one stream, the first Langevin
    kicks would repeat the initial velocities and heat the start by about a quarter). With
    ``start`` (the momenta a continued run starts from) the stream is keyed to them as well, so that
    a run continued from another's last frame does not replay that run's noise."""
    key = [int(seed), 1]
    if start is not None:
        digest = hashlib.sha256(np.ascontiguousarray(start, dtype=np.float64).tobytes()).digest()
        key.append(int.from_bytes(digest[:8], "little"))
    return np.random.default_rng(key)


def make_dynamics(atoms: Atoms, settings: MDSettings, continued: bool = False):
    """The ASE integrator for ``settings.ensemble``: velocity Verlet (nve), Langevin
    (nvt-langevin), a Nose-Hoover chain (nvt-nose-hoover), Bussi's stochastic velocity rescaling
    (nvt-bussi), or isotropic Martyna-Tobias-Klein Nose-Hoover-chain NPT (npt). ``continued``: the
    atoms' velocities come from an earlier run, whose thermostat noise is then not repeated."""
    settings.validate()
    dt = settings.timestep_fs * units.fs
    tdamp = (settings.tdamp_fs or 100 * settings.timestep_fs) * units.fs
    rng = thermostat_rng(settings.seed, atoms.get_momenta() if continued else None)
    if settings.ensemble == "nve":
        from ase.md.verlet import VelocityVerlet
        return VelocityVerlet(atoms, timestep=dt)
    if settings.ensemble == "nvt-langevin":
        from ase.md.langevin import Langevin
        return Langevin(atoms, timestep=dt, temperature_K=settings.temperature_K,
                        friction=settings.friction_per_ps / (1000.0 * units.fs), fixcm=False,
                        rng=rng)
    if settings.ensemble == "nvt-nose-hoover":
        from ase.md.nose_hoover_chain import NoseHooverChainNVT
        return NoseHooverChainNVT(atoms, timestep=dt, temperature_K=settings.temperature_K, tdamp=tdamp)
    if settings.ensemble == "nvt-bussi":
        from ase.md.bussi import Bussi
        return Bussi(atoms, timestep=dt, temperature_K=settings.temperature_K, taut=tdamp,
                     rng=rng)
    check_ensemble(atoms, settings)
    from ase.md.nose_hoover_chain import IsotropicMTKNPT
    pdamp = (settings.pdamp_fs or 1000 * settings.timestep_fs) * units.fs
    return IsotropicMTKNPT(atoms, timestep=dt, temperature_K=settings.temperature_K,
                           pressure_au=settings.pressure_bar * units.bar, tdamp=tdamp, pdamp=pdamp)


def check_ensemble(atoms: Atoms, settings: MDSettings) -> None:
    """Raise ``ValueError`` when ``atoms`` cannot run ``settings.ensemble`` (npt needs a 3-D periodic cell
    and no constraints: ASE's MTK barostat takes none)."""
    if settings.ensemble != "npt":
        return
    if not atoms.pbc.all() or abs(atoms.cell.volume) < 1e-8:
        raise ValueError(f"ensemble 'npt' needs a periodic structure with a 3-D cell (pbc=True in all directions); "
                         f"this one has pbc={atoms.pbc.tolist()} and a cell of volume {abs(atoms.cell.volume):.4g} A^3")
    if atoms.constraints:
        names = ", ".join(sorted({type(c).__name__ for c in atoms.constraints}))
        raise ValueError(f"ensemble 'npt' (ASE's IsotropicMTKNPT) takes no constraints, and this structure has "
                         f"{names}; remove them (atoms.set_constraint()) or choose another ensemble")


def evaluation_properties(settings: MDSettings):
    return ("energy", "forces", "stress") if settings.ensemble == "npt" else ("energy", "forces")


def time_one_step(atoms: Atoms, settings: MDSettings) -> float:
    """Evaluate ``atoms`` twice with its calculator (the first call also checks the structure and
    pays one-off set-up) and return the seconds of the second: a step's cost, for estimates. Errors
    a run would meet at its first step (unknown elements, a structure the model cannot run,
    non-finite results) are raised here."""
    from ase.calculators.calculator import all_changes

    if atoms.calc is None:
        raise ValueError("atoms has no calculator: set atoms.calc = MACECalculator(...) first")
    check_ensemble(atoms, settings)
    props = list(evaluation_properties(settings))
    atoms.calc.calculate(atoms, props, all_changes)
    t0 = time.perf_counter()
    atoms.calc.calculate(atoms, props, all_changes)
    return time.perf_counter() - t0


class _FiniteMomenta:
    """Per-step observer attached before the writers: a step whose velocities are not finite stops the
    run before its frame or log line is written."""

    def __init__(self, dyn, atoms):
        self.dyn, self.atoms = dyn, atoms

    def __call__(self):
        if self.dyn.nsteps:
            check_momenta(self.atoms, f"step {self.dyn.nsteps}")


class _Progress:
    """Per-step observer: tqdm bar with ns/day, measured from the end of the first step (so that
    one-off set-up such as kernel compilation is not counted)."""

    def __init__(self, dyn, atoms, total: int, timestep_fs: float, enabled: bool):
        self.dyn, self.atoms, self.timestep_fs = dyn, atoms, timestep_fs
        self.steps_done, self.t_first = 0, None
        self.bar = None
        if enabled:
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

    def ns_per_day(self, now: Optional[float] = None) -> Optional[float]:
        """Simulated ns per wall-clock day, or None before two steps have run."""
        if self.t_first is None or self.steps_done < 2:
            return None
        elapsed = (now or time.perf_counter()) - self.t_first
        return (self.steps_done - 1) * self.timestep_fs * 1e-6 / (elapsed / 86400.0) if elapsed > 0 else None

    def close(self):
        if self.bar is not None:
            self.bar.close()


class _Log:
    """md.log: one line per ``interval`` steps (and the last step) with energies to 1e-6 eV, enough to see drift."""

    def __init__(self, dyn, atoms: Atoms, path: str, stress: bool):
        self.dyn, self.atoms, self.stress = dyn, atoms, stress
        self.fh = open(path, "w")
        head = f"{'step':>8s} {'time[ps]':>10s} {'Etot[eV]':>18s} {'Epot[eV]':>18s} {'Ekin[eV]':>14s} {'T[K]':>9s}"
        if stress:
            head += f" {'volume[A^3]':>13s} {'pressure[GPa]':>13s}"
        self.fh.write(head + "\n")

    def __call__(self):
        epot, ekin = self.atoms.get_potential_energy(), self.atoms.get_kinetic_energy()
        line = (f"{self.dyn.nsteps:8d} {self.dyn.get_time() / (1000 * units.fs):10.4f} {epot + ekin:18.6f} "
                f"{epot:18.6f} {ekin:14.6f} {self.atoms.get_temperature():9.2f}")
        if self.stress:
            pressure = -float(np.mean(self.atoms.get_stress(include_ideal_gas=True)[:3])) / units.GPa
            line += f" {self.atoms.get_volume():13.4f} {pressure:13.5f}"
        self.fh.write(line + "\n")
        self.fh.flush()

    def close(self):
        self.fh.close()


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived during ``run_md``; ``signum`` says which."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


class _Signals:
    """SIGINT/SIGTERM inside the block (main thread only; handlers restored after): the first is
    recorded in ``received`` for the run to stop between two steps; a later one, while ``hard_stop``
    is set, raises ``Interrupted`` at once."""

    def __enter__(self):
        self.saved = {}
        self.received: Optional[int] = None
        self.hard_stop = True
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received is None:
            self.received = signum
        elif self.hard_stop:
            raise Interrupted(signum)

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        return False


class _TrajectoryOutput:
    """md.traj written frame by frame; a frame left unfinished by an error (a full disk) or a second
    signal is dropped on closing, so that every frame of the file is whole."""

    def __init__(self, path: str, atoms: Atoms):
        from ase.io import Trajectory

        self.traj = Trajectory(path, "w", atoms)
        self.unfinished = False

    def write(self) -> None:
        self.unfinished = True
        self.traj.write()
        self.unfinished = False

    def close(self) -> None:
        fd = getattr(getattr(self.traj, "backend", None), "fd", None)
        if self.unfinished and fd is not None:  # closing the writer would append the half frame
            fd.close()
        else:
            self.traj.close()


def versions() -> Dict[str, str]:
    return {"equikernels": __version__, "torch": torch.__version__, "ase": ase.__version__,
            "numpy": np.__version__, "python": platform.python_version()}


def _finite_or_none(x) -> Optional[float]:
    return float(x) if x is not None and math.isfinite(float(x)) else None


MD_FILES = ("md.traj", "md.log", "summary.json")


def earlier_md_run(out_dir: str) -> List[str]:
    """The files of an earlier run in ``out_dir`` that a run there would replace."""
    return [n for n in MD_FILES if os.path.isfile(os.path.join(out_dir, n))]


def _write_summary(path: str, summary: Dict, error: Optional[BaseException]) -> None:
    """Write ``summary`` to ``path`` in one piece; when that fails (a full disk) after the run itself
    failed, warn and leave the run's error to be raised: it says what went wrong first."""
    text = json.dumps(summary, indent=2, allow_nan=False)

    def write(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write(text)
    try:
        atomic_write(path, write)
    except OSError as exc:
        if error is None:
            raise OSError(f"{path} could not be written: {exc}") from exc
        warnings.warn(f"{path} could not be written ({exc}); the run's own error follows")


def _set_aside(out_dir: Optional[str], names: List[str]) -> Dict[str, str]:
    """Rename an earlier run's files out of the way; returns {name: temporary path}."""
    aside = {}
    try:
        for name in names:
            path = os.path.join(out_dir, name)
            tmp = os.path.join(out_dir, f".{name}.replaced-{os.getpid()}")
            os.replace(path, tmp)
            aside[name] = tmp
    except OSError:
        _restore(out_dir, aside)
        raise
    return aside


def _restore(out_dir: Optional[str], aside: Dict[str, str]) -> None:
    """Put set-aside files back under their names (over any file this run started)."""
    for name, tmp in aside.items():
        os.replace(tmp, os.path.join(out_dir, name))


def _discard(out_dir: Optional[str], aside: Dict[str, str]) -> None:
    for tmp in aside.values():
        os.remove(tmp)


def _open_outputs(dyn, atoms: Atoms, settings: MDSettings, out_dir: str, summary: Dict):
    """Open md.traj and md.log in ``out_dir`` and attach their writers to ``dyn``; returns (closers,
    finals). Nothing is left open when one cannot be opened."""
    closers, finals = [], []
    try:
        os.makedirs(out_dir, exist_ok=True)
        if settings.traj_interval:
            traj = _TrajectoryOutput(os.path.join(out_dir, "md.traj"), atoms)
            closers.append(traj.close)
            dyn.attach(traj.write, interval=settings.traj_interval)
            finals.append((traj.write, settings.traj_interval))
            summary["trajectory"] = os.path.join(out_dir, "md.traj")
        if settings.log_interval:
            log = _Log(dyn, atoms, os.path.join(out_dir, "md.log"), stress=settings.ensemble == "npt")
            closers.append(log.close)
            dyn.attach(log, interval=settings.log_interval)
            finals.append((log, settings.log_interval))
            summary["log"] = os.path.join(out_dir, "md.log")
    except BaseException:
        for close in closers:
            close()
        raise
    return closers, finals


def run_md(atoms: Atoms, settings: MDSettings, out_dir: Optional[str] = None, progress: bool = True,
           init_velocities: bool = True, info: Optional[Dict] = None,
           on_ready: Optional[Callable[[], None]] = None, overwrite: bool = False) -> Dict:
    """Run ``settings.steps`` of MD on ``atoms`` (its calculator must be set). With ``out_dir``,
    writes ``md.traj`` (ASE trajectory), ``md.log`` and ``summary.json`` (a completed run's last step is
    always in md.traj and md.log, whatever the intervals); ``info`` (e.g. model and
    structure names) is recorded in the summary. The first energy/forces evaluation happens before
    the progress bar starts (``on_ready`` is called after it), so a structure the model cannot run
    fails before the run. ``init_velocities=False`` keeps the atoms' velocities (a run continued from
    another's last frame); the stochastic thermostats' noise is then keyed to them as well as to the
    seed, so that it does not replay the earlier run's. Returns the summary: ns/day (None with fewer
    than 2 steps), wall time, energies, neighbour-list rebuilds, device, dtype and versions.

    ``summary.json`` is written however the run ends; ``status`` is "completed", "interrupted"
    (SIGINT/SIGTERM: the run stops once the step in progress is done, and that step is the last in
    md.traj and md.log, so the trajectory continues the run; a second signal stops at once; then
    ``Interrupted``, a ``KeyboardInterrupt``, is raised after writing) or "failed" (the error, such as
    a full disk, is raised after writing). md.traj holds only whole frames, however the run ends. An
    ``out_dir`` holding an earlier run's files is refused unless ``overwrite``, which replaces them
    once the run can start (its first evaluation done and its files open: a structure that cannot
    run, or an md.traj that cannot be opened, leaves them in place)."""
    if atoms.calc is None:
        raise ValueError("atoms has no calculator: set atoms.calc = MACECalculator(...) first")
    settings.validate()
    earlier = earlier_md_run(out_dir) if out_dir is not None else []
    if earlier and not overwrite:
        raise FileExistsError(f"out_dir {out_dir!r} holds an earlier run ({', '.join(earlier)}); "
                              "overwrite=True replaces it, or choose another out_dir")
    if init_velocities:
        initialise_velocities(atoms, settings.temperature_K, settings.seed)
    else:
        check_momenta(atoms, "atoms")
    continued = {} if init_velocities else {"continued": True}  # only when set: a wrapped make_dynamics keeps working
    dyn = make_dynamics(atoms, settings, **continued)
    for prop in evaluation_properties(settings):  # a structure the model cannot run fails here, not mid-run
        atoms.calc.get_property(prop, atoms)
    e_start = atoms.get_potential_energy() + atoms.get_kinetic_energy()
    # replaced as a whole, and only once this run's files are open: none is left beside this run's
    aside = _set_aside(out_dir, earlier)
    calc = atoms.calc
    summary = {"status": "running", "num_atoms": len(atoms), "formula": atoms.get_chemical_formula(),
               **(info or {}), "settings": asdict(settings),
               "device": str(getattr(calc, "device", "")),
               "dtype": str(getattr(calc, "dtype", "")).replace("torch.", ""),
               "threads": getattr(calc, "num_threads", None), "versions": versions()}
    dyn.attach(_FiniteMomenta(dyn, atoms), interval=1)  # observers run in order: before any writer
    closers, finals = [], []  # finals: (write, interval), the last step recorded whatever the interval
    if out_dir is not None:
        try:
            closers, finals = _open_outputs(dyn, atoms, settings, out_dir, summary)
        except BaseException:
            _restore(out_dir, aside)
            raise
    _discard(out_dir, aside)
    if on_ready is not None:
        on_ready()
    bar = _Progress(dyn, atoms, settings.steps, settings.timestep_fs, progress)
    dyn.attach(bar, interval=1)
    t0 = time.perf_counter()
    error: Optional[BaseException] = None
    whole_step = False  # the atoms hold a finished step (not one cut short by an error or a second signal)
    with _Signals() as signals:
        try:
            for _ in dyn.irun(settings.steps):
                if signals.received is not None:  # stop between two steps, so that the files end on a whole one
                    break
            for write, interval in finals:  # a run continued from the trajectory starts at its last frame
                if dyn.nsteps % interval:
                    write()
            whole_step = True
            if signals.received is not None:
                raise Interrupted(signals.received)
            summary["status"] = "completed"
        except KeyboardInterrupt as exc:
            summary["status"], error = "interrupted", exc
            summary["signal"] = signal.Signals(exc.signum).name if isinstance(exc, Interrupted) else "SIGINT"
        except Exception as exc:  # noqa: BLE001 (recorded, then raised again)
            summary["status"], error = "failed", exc
            summary["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            signals.hard_stop = False  # from here on the files are closed and the summary written, whatever arrives
            bar.close()
            for close in closers:
                try:
                    close()
                except Exception as exc:  # noqa: BLE001 (a full disk: recorded, the other files still closed)
                    if error is None:
                        summary["status"], error = "failed", exc
                        summary["error"] = f"{type(exc).__name__}: {exc}"
        wall = time.perf_counter() - t0
        e_end = None
        if whole_step and summary["status"] != "failed":
            e_end = atoms.get_potential_energy() + atoms.get_kinetic_energy()
        summary.update({
            "steps_done": bar.steps_done, "wall_s": wall, "ns_per_day": _finite_or_none(bar.ns_per_day(t0 + wall)),
            "total_energy_start_eV": _finite_or_none(e_start), "total_energy_end_eV": _finite_or_none(e_end),
            "temperature_end_K": _finite_or_none(atoms.get_temperature()),
            "neighbor_list_builds": getattr(getattr(calc, "neighbors", None), "num_builds", None),
        })
        if out_dir is not None:
            _write_summary(os.path.join(out_dir, "summary.json"), summary, error)
    if error is not None:
        raise error
    return summary
