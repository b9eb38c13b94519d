"""Results of a committee of models, as mace-torch's calculator gives them for several models: the
mean of each property, and for energy, forces, stress and dipole each model's value
(``<name>_comm``) and the population variance across models (``<name>_var``), stresses there as 3x3
matrices."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
from ase.stress import full_3x3_to_voigt_6_stress, voigt_6_to_full_3x3_stress

SPREAD = ("energy", "forces", "stress", "dipole")  # the properties given per model and as a variance


def committee_properties(base: List[str]) -> List[str]:
    return list(base) + [f"{name}_{kind}" for name in SPREAD if name in base for kind in ("comm", "var")]


def member_properties(properties: Sequence[str], implemented: Sequence[str]) -> List[str]:
    """What each member calculates for a committee asked for ``properties``: those it implements,
    a per-model value or variance (``stress_comm``, ``forces_var``) through its property (``stress``);
    the first it implements (energy, or a dipole-only model's dipole) when none is left."""
    base: List[str] = []
    for name in properties:
        stem, _, kind = name.rpartition("_")
        if kind in ("comm", "var") and stem in SPREAD:
            name = stem
        if name in implemented and name not in base:
            base.append(name)
    return base or [implemented[0]]


def committee_results(members: List[Dict[str, object]], e0: Optional[np.ndarray]) -> Dict[str, object]:
    """The committee's results from its members' (same structure, same properties); ``e0``: the
    first model's isolated-atom energy of each atom (``node_energy`` is the mean per-atom energy
    less it, as mace-torch's calculator has it; None: no ``node_energy``)."""
    out: Dict[str, object] = {}
    if all("dipole" in r for r in members):
        dipole = np.stack([r["dipole"] for r in members])
        out["dipole"], out["dipole_comm"], out["dipole_var"] = dipole.mean(0), dipole, dipole.var(0)
    if "energy" not in members[0]:  # a dipole-only model's
        return out
    energy = np.array([float(r["energy"]) for r in members])
    out["energy"] = out["free_energy"] = float(energy.mean())
    out["energy_comm"], out["energy_var"] = energy, float(energy.var())
    if all("energies" in r for r in members):
        out["energies"] = np.mean([r["energies"] for r in members], axis=0)
        if e0 is not None:
            out["node_energy"] = out["energies"] - e0
    forces = np.stack([r["forces"] for r in members])
    out["forces"], out["forces_comm"], out["forces_var"] = forces.mean(0), forces, forces.var(0)
    for name in ("stresses", "virials"):  # per-atom, with compute_atomic_stresses: the mean only
        if all(name in r for r in members):
            out[name] = np.mean([r[name] for r in members], axis=0)
    if all("stress" in r for r in members):
        stress = np.stack([voigt_6_to_full_3x3_stress(r["stress"]) for r in members])
        out["stress"] = full_3x3_to_voigt_6_stress(stress.mean(0))
        out["stress_comm"], out["stress_var"] = stress, stress.var(0)
    return out
