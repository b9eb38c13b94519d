"""mace-torch's ``MACECalculator`` arguments, so that a script written for it runs with ours: the
ones with a meaning here are returned, the ones about its own kernels, compilation and input keys
are taken without effect (ours runs compiled kernels, and a MACE energy model reads no charges),
and values that cannot be honoured are refused by name."""
from __future__ import annotations

import glob
import os
from typing import Any, Dict

import numpy as np

NO_EFFECT = ("enable_cueq", "enable_oeq", "compile_mode", "fullgraph", "pad_num_atoms", "pad_num_edges", "warmup",
             "charges_key", "info_keys", "arrays_keys")
NAMES = ("model_paths", "model_path", "models", "model_type", "energy_units_to_eV", "length_units_to_A",
         "compute_atomic_stresses") + NO_EFFECT


def _boolean(name: str, value: Any) -> bool:
    """``value`` of switch ``name``: True or False (numpy's too); a string such as "no" is refused, not
    taken for True."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name}: expected True or False, got {value!r}")


def take_mace_torch_arguments(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """Remove mace-torch's calculator arguments from ``kwargs``; returns ``models``, ``model_path``
    (its older name of ``model_paths``: both go through ``model_files``) and ``compute_atomic_stresses``."""
    stresses = kwargs.pop("compute_atomic_stresses", False)
    taken = {"models": kwargs.pop("models", None), "model_path": kwargs.pop("model_path", None),
             "compute_atomic_stresses": _boolean("compute_atomic_stresses", stresses)}
    model_type = kwargs.pop("model_type", "MACE")
    if model_type != "MACE":
        raise ValueError(f"model_type: only 'MACE' (energy, forces, stress) is supported, got {model_type!r}")
    for name in ("energy_units_to_eV", "length_units_to_A"):
        value = kwargs.pop(name, 1.0)
        if value != 1.0:
            raise ValueError(f"{name}: only 1.0 is supported (a model in eV and Angstrom), got {value!r}")
    for name in NO_EFFECT:
        kwargs.pop(name, None)
    return taken


def model_files(model_paths, model_path=None):
    """mace-torch's ``model_paths``, or its older name ``model_path`` (not both), as its calculator
    reads them: a wildcard pattern such as ``"mace_*.model"`` that is not itself a file becomes the
    sorted list of the files it matches (several make a committee); anything else is returned as is."""
    name = "model_paths" if model_path is None else "model_path"
    if model_path is not None:
        if model_paths is not None:
            raise ValueError("model_path and model_paths: give one of them (model_path is mace-torch's older name "
                             "of model_paths)")
        model_paths = model_path
    if isinstance(model_paths, str) and glob.has_magic(model_paths) and not os.path.exists(model_paths):
        matches = sorted(glob.glob(os.path.expanduser(model_paths)))
        if not matches:
            raise FileNotFoundError(f"{name}: no model file matches the pattern {model_paths!r}")
        return matches
    return model_paths
