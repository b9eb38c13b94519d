"""What a model predicts, by its class and mace-torch's ``model_type``: energies (with forces and
stress), dipoles, or both. mace-torch's ``EnergyDipolesMACE`` predicts both, its
``AtomicDipolesMACE`` dipoles only; every other model passed to the calculator predicts energies."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .mace_args import class_name

ENERGY_AND_DIPOLE = "EnergyDipolesMACE"
DIPOLE_ONLY = "AtomicDipolesMACE"
# mace-torch's models not evaluated here, and the model_type its calculator runs them as
NOT_EVALUATED = {"AtomicDielectricMACE": "DipolePolarizabilityMACE"}
# mace-torch 0.3.16's EnergyDipolesMACE returns the isolated-atom energies E0 alone as its node_energy
NO_PER_ATOM_ENERGIES = (ENERGY_AND_DIPOLE,)


class Outputs(NamedTuple):
    energy: bool  # energy, forces and stress
    dipole: bool  # the total dipole [3]
    per_atom_energies: bool  # the model's node_energy sums to its energy


def model_outputs(model: torch.nn.Module, model_type: Optional[str]) -> Outputs:
    """What ``model`` predicts; ``model_type`` (one of ``mace_args.MODEL_TYPES``, None: from the model's
    class) must agree with its class."""
    name = class_name(model)
    if name in NOT_EVALUATED:
        raise ValueError(f"model: {name} predicts dipoles and polarizabilities (mace-torch's model_type="
                         f"{NOT_EVALUATED[name]!r}), which MACECalculator does not evaluate")
    own = {DIPOLE_ONLY: "DipoleMACE", ENERGY_AND_DIPOLE: "EnergyDipoleMACE"}.get(name, "MACE")
    # mace-torch runs an energy-and-dipole model as 'MACE' too, and gives its dipole there as well
    fits = model_type in (None, own) or (own == "EnergyDipoleMACE" and model_type == "MACE")
    if not fits:
        what = {"DipoleMACE": "predicts dipoles only", "EnergyDipoleMACE": "predicts energies and dipoles",
                "MACE": "predicts energies, not dipoles"}[own]
        raise ValueError(f"model_type={model_type!r} does not fit the model: {name} {what} "
                         f"(model_type={own!r}, or leave model_type out)")
    return Outputs(energy=own != "DipoleMACE", dipole=own != "MACE",
                   per_atom_energies=own != "DipoleMACE" and name not in NO_PER_ATOM_ENERGIES)
