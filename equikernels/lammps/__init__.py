"""equikernels models in LAMMPS through the ML-IAP "unified" Python interface
(``pair_style mliap unified FILE 0``).

- ``EquikernelsMLIAP``: the object LAMMPS unpickles; ``compute_forces(data)`` evaluates the model
  on LAMMPS's pair list and hands back per-pair forces, per-atom energies and the energy.
- ``export_mliap(model, path)``: writes that object (config + weights, no pickled modules).

See docs/lammps.md for building LAMMPS and the input lines.
"""
from .export import export_mliap, load_mliap
from .mliap import EquikernelsMLIAP

__all__ = ["EquikernelsMLIAP", "export_mliap", "load_mliap"]
