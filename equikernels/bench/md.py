"""Molecular dynamics as users run it, side by side: ASE's Langevin integrator (1 fs, 300 K) driving
equikernels' ``MACECalculator`` (its defaults: neighbour list with skin, CUDA graphs where the
calculator takes them) and mace-torch's ``MACECalculator`` (plain e3nn or ``enable_cueq=True``),
both on one mace-torch MACE of MACE-MP-0 medium's shape. Everything a user pays is timed: neighbour
lists, host<->device copies, the integrator and the model. Correctness (``force_error``): forces of
every calculator on the starting structure against mace-torch's model in float64.
"""
from __future__ import annotations

import copy
import time
from typing import Callable, Dict, Optional

import numpy as np
import torch

from . import mace as MC

# the suite's implementation names -> how the calculator is made
CALCULATORS = ("equikernels", "mace-e3nn", "mace-cueq")
TIMESTEP_FS = 1.0
WARMUP_STEPS = 10


def md_model(dtype: torch.dtype, **shape) -> torch.nn.Module:
    """The mace-torch model every calculator runs (``shape``: as ``mace.mace_model``). Random
    weights at unit scale give forces near 1e-4 eV/A, too flat for the force check to mean much;
    the interaction energy scaled by 1000 gives forces of a few tenths of eV/A, like a crystal at
    300 K."""
    return MC.mace_model(40.0, dtype, first_interaction="RealAgnosticInteractionBlock", atomic_inter_scale=1000.0,
                         atomic_inter_shift=0.0, **shape)


def calculator(impl: str, model: torch.nn.Module, dtype_name: str, device: torch.device):
    """An ASE calculator of implementation ``impl`` on a copy of ``model`` (left unchanged)."""
    model = copy.deepcopy(model)
    if impl == "equikernels":
        from ..calculators import MACECalculator  # noqa: PLC0415
        from ..models import from_mace  # noqa: PLC0415
        return MACECalculator(from_mace(model), device=device, default_dtype=dtype_name)
    if impl not in CALCULATORS:
        raise ValueError(f"impl: expected one of {CALCULATORS}, got {impl!r}")
    cueq = impl == "mace-cueq"
    if cueq:
        try:
            import cuequivariance_torch  # noqa: F401, PLC0415
        except Exception as exc:
            raise MC.Absent(f"cuequivariance_torch not importable ({type(exc).__name__})") from None
    from mace.calculators import MACECalculator as MaceTorchCalculator  # noqa: PLC0415
    old = torch.get_default_dtype()
    try:  # mace-torch's calculator sets the process's default dtype
        return MaceTorchCalculator(models=model, device=str(device), default_dtype=dtype_name, enable_cueq=cueq)
    finally:
        torch.set_default_dtype(old)


def force_error(calc, atoms, ref_forces: np.ndarray) -> float:
    """max |F - F_ref| / max |F_ref| of ``calc`` on ``atoms``."""
    a = atoms.copy()
    a.calc = calc
    f = a.get_forces()
    return float(np.abs(f - ref_forces).max() / max(np.abs(ref_forces).max(), 1e-12))


class Run:
    """One Langevin trajectory of ``atoms`` under ``calc``: ``steps(n)`` advances n steps and
    returns the wall time per step in ms (the calculator's results reach the host every step)."""

    def __init__(self, calc, atoms, seed: int = 0):
        from ase import units  # noqa: PLC0415
        from ase.md.langevin import Langevin  # noqa: PLC0415
        from ase.md.velocitydistribution import MaxwellBoltzmannDistribution  # noqa: PLC0415
        self.atoms = atoms.copy()
        self.atoms.calc = calc
        MaxwellBoltzmannDistribution(self.atoms, temperature_K=300.0, rng=np.random.default_rng(seed))
        self.dyn = Langevin(self.atoms, timestep=TIMESTEP_FS * units.fs, temperature_K=300.0,
                            friction=0.01 / units.fs, fixcm=False, rng=np.random.default_rng(seed + 1))

    def steps(self, n: int) -> float:
        t = time.perf_counter()
        self.dyn.run(n)
        return (time.perf_counter() - t) / n * 1e3

    def temperature(self) -> float:
        return float(self.atoms.get_temperature())


def ns_per_day(ms_per_step: float) -> float:
    return TIMESTEP_FS * 1e-6 / (ms_per_step * 1e-3) * 86400.0


def timed_steps(run: Run, target_ms: float, min_steps: int = 10, max_steps: int = 200,
                warmup: int = WARMUP_STEPS) -> Dict[str, float]:
    """``warmup`` untimed steps (compilation, capture, tuning), then as many timed steps as fit in
    about ``target_ms`` (between ``min_steps`` and ``max_steps``)."""
    est = run.steps(warmup) if warmup else run.steps(1)
    n = int(min(max_steps, max(min_steps, target_ms / max(est, 1e-3))))
    ms = run.steps(n)
    return {"ms": ms, "ns_per_day": ns_per_day(ms), "steps": n, "temperature_K": run.temperature()}


def step_runner(calc, atoms) -> Callable[[float], Dict[str, float]]:
    """A callable ``f(target_ms)`` that times the next steps of one trajectory (rounds continue it)."""
    run: Optional[Run] = None

    def f(target_ms: float) -> Dict[str, float]:
        nonlocal run
        first = run is None
        if first:
            run = Run(calc, atoms)
        return timed_steps(run, target_ms, warmup=WARMUP_STEPS if first else 0)
    return f
