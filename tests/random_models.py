"""Small MACE models with random weights for the tests: mace-torch's own classes (needs mace-torch,
imported lazily) or equikernels' models built without mace-torch. They give smooth, conservative
but unphysical potential energy surfaces: enough to exercise the calculator, not for science."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from equikernels.models.builder import mace_config, random_model

# small enough for CPU tests that run in seconds
SMALL = dict(r_max=4.5, num_bessel=8, num_polynomial_cutoff=5, max_ell=2, num_interactions=2,
             hidden_irreps="8x0e+8x1o", mlp_irreps="8x0e", correlation=2, radial_mlp=(16, 16))


def random_mace_model(atomic_numbers: Sequence[int], *, r_max: float, num_bessel: int, num_polynomial_cutoff: int,
                      max_ell: int, num_interactions: int, hidden_irreps: str, mlp_irreps: str, correlation: int,
                      radial_mlp: Sequence[int], avg_num_neighbors: float = 12.0, seed: int = 0,
                      dtype: torch.dtype = torch.float64, pair_repulsion: bool = True,
                      atomic_energies: Optional[Sequence[float]] = None,
                      atomic_inter_scale: float = 1.0) -> torch.nn.Module:
    """A mace-torch ``ScaleShiftMACE`` with random weights. ``pair_repulsion`` adds mace-torch's ZBL
    term, which keeps atoms from collapsing onto each other during MD with random weights;
    ``atomic_inter_scale`` scales the interaction energy (random weights give a very flat surface)."""
    from equikernels._compat import default_dtype, o3  # registers e3nn's safe globals first

    from mace import modules

    atomic_numbers = sorted(int(z) for z in atomic_numbers)
    rng = np.random.default_rng(seed)
    if atomic_energies is None:
        atomic_energies = -rng.uniform(1.0, 5.0, size=len(atomic_numbers))
    torch.manual_seed(seed)
    with default_dtype(dtype):  # e3nn builds its CG buffers in the default dtype
        model = modules.ScaleShiftMACE(
            r_max=r_max, num_bessel=num_bessel, num_polynomial_cutoff=num_polynomial_cutoff, max_ell=max_ell,
            interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            interaction_cls_first=modules.interaction_classes["RealAgnosticInteractionBlock"],
            num_interactions=num_interactions, num_elements=len(atomic_numbers),
            hidden_irreps=o3.Irreps(hidden_irreps), MLP_irreps=o3.Irreps(mlp_irreps),
            atomic_energies=np.asarray(atomic_energies, dtype=float), avg_num_neighbors=avg_num_neighbors,
            atomic_numbers=atomic_numbers, correlation=correlation, gate=torch.nn.functional.silu,
            pair_repulsion=pair_repulsion, radial_MLP=list(radial_mlp), atomic_inter_scale=atomic_inter_scale,
            atomic_inter_shift=0.0)
    return model.to(dtype)


def small_random_mace_model(atomic_numbers: Sequence[int], seed: int = 0, dtype: torch.dtype = torch.float64,
                            **overrides) -> torch.nn.Module:
    return random_mace_model(atomic_numbers, **{**SMALL, "seed": seed, "dtype": dtype, **overrides})


def small_random_model(atomic_numbers: Sequence[int], seed: int = 0, dtype: torch.dtype = torch.float64,
                       backend: str = "equikernels") -> torch.nn.Module:
    """The SMALL model with random weights: ``backend="equikernels"`` builds an
    ``equikernels.models`` model (no mace-torch needed), ``"mace-torch"`` a mace-torch one."""
    if backend == "mace-torch":
        return small_random_mace_model(atomic_numbers, seed=seed, dtype=dtype)
    if backend != "equikernels":
        raise ValueError(f"backend must be 'equikernels' or 'mace-torch', got {backend!r}")
    cfg = mace_config(r_max=SMALL["r_max"], num_bessel=SMALL["num_bessel"],
                      num_polynomial_cutoff=SMALL["num_polynomial_cutoff"], max_ell=SMALL["max_ell"],
                      interaction="RealAgnosticResidualInteractionBlock",
                      interaction_first="RealAgnosticInteractionBlock", num_interactions=SMALL["num_interactions"],
                      atomic_numbers=sorted(int(z) for z in atomic_numbers), hidden_irreps=SMALL["hidden_irreps"],
                      MLP_irreps=SMALL["mlp_irreps"], avg_num_neighbors=12.0, correlation=SMALL["correlation"],
                      radial_MLP=SMALL["radial_mlp"], pair_repulsion=True)
    return random_model(cfg, seed=seed, dtype=dtype)

