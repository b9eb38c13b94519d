"""MACE energy + forces (and stress), side by side: equikernels' MACE against mace-torch with e3nn,
with cuEquivariance and with OpenEquivariance, all converted from one mace-torch model of
MACE-MP-0-medium's shape with random weights (128x0e+128x1o, max_ell 3, correlation 3, two residual
interactions, r_max 6, 10 Bessel functions, radial MLP [64, 64, 64], 89 elements), or a model file
the user passes. One model call on a prebuilt graph of rattled Cu fcc per step, as in MD.
Correctness: energy, forces and stress against mace-torch (e3nn) in float64 with the same weights.
"""
from __future__ import annotations

import copy
from typing import Callable, Dict, Optional

import numpy as np
import torch

from . import timing as T
from .tp import Absent

IMPLS = ("equikernels", "mace-e3nn", "mace-cueq", "mace-oeq")
SYSTEMS = {1008: (6, 6, 7), 10192: (13, 14, 14)}
Z_ALL = list(range(1, 90))


def cu_atoms(atoms: int, element: int = 29, seed: int = 0):
    import ase.build
    if atoms not in SYSTEMS:
        raise ValueError(f"atoms: one of {sorted(SYSTEMS)}, got {atoms}")
    a = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True).repeat(SYSTEMS[atoms])
    a.rattle(0.05, seed=seed)
    a.numbers[:] = element
    return a


def import_mace():
    try:
        from mace import modules  # noqa: F401
    except Exception as exc:
        raise Absent(f"mace-torch not importable ({T.describe_exception(exc, 120)})") from None


def mace_model(avg_num_neighbors: float):
    """The mace-torch reference model, float64, random weights of a fixed seed."""
    import_mace()
    from mace import modules

    from .._compat import o3
    residual = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
    with T.default_dtype(torch.float64):
        torch.manual_seed(0)
        return modules.ScaleShiftMACE(
            r_max=6.0, num_bessel=10, num_polynomial_cutoff=5, max_ell=3, interaction_cls=residual,
            interaction_cls_first=residual, num_interactions=2, num_elements=len(Z_ALL),
            hidden_irreps=o3.Irreps("128x0e+128x1o"), MLP_irreps=o3.Irreps("16x0e"),
            atomic_energies=-np.random.default_rng(0).uniform(1, 5, len(Z_ALL)), avg_num_neighbors=avg_num_neighbors,
            atomic_numbers=Z_ALL, correlation=3, gate=torch.nn.functional.silu, radial_MLP=[64, 64, 64],
            atomic_inter_scale=1.2, atomic_inter_shift=0.1)


def build(impl: str, ref64, dtype, device) -> torch.nn.Module:
    """``impl`` made from the float64 mace-torch model ``ref64`` (not modified), in ``dtype``."""
    old = torch.get_default_dtype()
    try:
        m = copy.deepcopy(ref64).to(dtype)
        if impl == "equikernels":
            from ..models import from_mace
            return from_mace(m).to(device).eval()
        if impl == "mace-e3nn":
            return m.to(device).eval()
        if impl == "mace-cueq":
            try:
                import cuequivariance_torch  # noqa: F401
            except Exception as exc:
                raise Absent(f"cuequivariance_torch not importable ({T.describe_exception(exc, 120)})") from None
            from mace.cli.convert_e3nn_cueq import run
            return run(m, device=device.type, return_model=True).to(device).eval()
        if impl == "mace-oeq":
            try:
                import openequivariance  # noqa: F401
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                raise Absent(f"openequivariance not importable ({T.describe_exception(exc, 120)})") from None
            from mace.cli.convert_e3nn_oeq import run
            return run(m, device=device.type, return_model=True).to(device).eval()
        raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLS}")
    finally:
        torch.set_default_dtype(old)  # mace's converters change the global default dtype


def graph(atoms, r_max: float, atomic_numbers, dtype, device) -> Dict[str, torch.Tensor]:
    from ..models import atoms_to_data
    return atoms_to_data(atoms, r_max, atomic_numbers, device=device, dtype=dtype)


def step(model, data, stress: bool):
    return model(dict(data), compute_force=True, compute_stress=stress)


def errors(out: Dict[str, torch.Tensor], ref: Dict[str, torch.Tensor], stress: bool) -> Dict[str, float]:
    keys = ("energy", "forces", "stress") if stress else ("energy", "forces")
    return {k: T.rel_err(out[k], ref[k]) for k in keys}


def step_call(model, data, stress: bool) -> Callable[[int], object]:
    return lambda i: step(model, data, stress)


def model_file(path: str, dtype, device) -> Optional[torch.nn.Module]:
    from ..models import load
    return load(path, device=device, dtype=dtype).eval()
