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

import ase.build
import numpy as np
import torch

from .._compat import o3
from ..models import atoms_to_data, from_mace, load
from . import timing as T
from .tp import Absent

IMPLS = ("equikernels", "mace-e3nn", "mace-cueq", "mace-oeq")
SYSTEMS = {1008: (6, 6, 7), 10192: (13, 14, 14)}
Z_ALL = list(range(1, 90))


def cu_atoms(atoms: int, element: int = 29, seed: int = 0):
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


# MACE-MP-0 "medium": the model shape every MACE benchmark times
MP0_MEDIUM = dict(r_max=6.0, num_bessel=10, num_polynomial_cutoff=5, max_ell=3, num_interactions=2,
                  hidden_irreps="128x0e+128x1o", MLP_irreps="16x0e", correlation=3, radial_MLP=[64, 64, 64])
# the same model with 8 channels: CPU runs that check a benchmark's plumbing, not its numbers
TINY = dict(hidden_irreps="8x0e+8x1o", radial_MLP=[16, 16])


def mace_model(avg_num_neighbors: float, dtype: torch.dtype = torch.float64, *,
               first_interaction: str = "RealAgnosticResidualInteractionBlock", atomic_inter_scale: float = 1.2,
               atomic_inter_shift: float = 0.1, **shape) -> torch.nn.Module:
    """A mace-torch ``ScaleShiftMACE`` with random weights of a fixed seed, 89 elements, in ``dtype``:
    MACE-MP-0 medium's shape, with ``shape`` replacing entries of ``MP0_MEDIUM`` (e.g. ``**TINY``)."""
    unknown = sorted(set(shape) - set(MP0_MEDIUM))
    if unknown:
        raise TypeError(f"mace_model: unknown shape arguments {unknown}; expected some of {sorted(MP0_MEDIUM)}")
    hp = {**MP0_MEDIUM, **shape}
    import_mace()
    from mace import modules
    with T.default_dtype(dtype):
        torch.manual_seed(0)
        return modules.ScaleShiftMACE(
            r_max=hp["r_max"], num_bessel=hp["num_bessel"], num_polynomial_cutoff=hp["num_polynomial_cutoff"],
            max_ell=hp["max_ell"], interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            interaction_cls_first=modules.interaction_classes[first_interaction],
            num_interactions=hp["num_interactions"], num_elements=len(Z_ALL),
            hidden_irreps=o3.Irreps(hp["hidden_irreps"]), MLP_irreps=o3.Irreps(hp["MLP_irreps"]),
            atomic_energies=-np.random.default_rng(0).uniform(1, 5, len(Z_ALL)), avg_num_neighbors=avg_num_neighbors,
            atomic_numbers=Z_ALL, correlation=hp["correlation"], gate=torch.nn.functional.silu,
            radial_MLP=list(hp["radial_MLP"]), atomic_inter_scale=atomic_inter_scale,
            atomic_inter_shift=atomic_inter_shift).to(dtype)


def build(impl: str, ref64, dtype, device, frozen: bool = True) -> torch.nn.Module:
    """``impl`` made from the float64 mace-torch model ``ref64`` (not modified), in ``dtype``, in
    eval mode with its parameters frozen (``frozen``), as the ASE calculators (ours and mace-torch's) run it."""
    model = _build(impl, ref64, dtype, device)
    for param in model.parameters():
        param.requires_grad_(not frozen)
    return model


def _build(impl: str, ref64, dtype, device) -> torch.nn.Module:
    old = torch.get_default_dtype()
    try:
        m = copy.deepcopy(ref64).to(dtype)
        if impl == "equikernels":
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
    return atoms_to_data(atoms, r_max, atomic_numbers, device=device, dtype=dtype)


def step(model, data, stress: bool):
    return model(dict(data), compute_force=True, compute_stress=stress)


def errors(out: Dict[str, torch.Tensor], ref: Dict[str, torch.Tensor], stress: bool) -> Dict[str, float]:
    keys = ("energy", "forces", "stress") if stress else ("energy", "forces")
    return {k: T.rel_err(out[k], ref[k]) for k in keys}


def step_call(model, data, stress: bool) -> Callable[[int], object]:
    return lambda i: step(model, data, stress)


def model_file(path: str, dtype, device) -> Optional[torch.nn.Module]:
    return load(path, device=device, dtype=dtype).eval()
