"""mace-torch's ``MACECalculator`` arguments, so that a script written for it runs with ours: the
ones with a meaning here are returned (its input keys through ``StructureInputs``, for models that
read a charge, a spin or per-atom charges), the ones about its own kernels and compilation are taken
without effect (ours runs compiled kernels), and values that cannot be honoured are refused by name."""
from __future__ import annotations

import copy
import glob
import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

MODEL_TYPES = ("MACE", "EnergyDipoleMACE", "DipoleMACE")  # the ones of mace-torch's calculator evaluated here
NO_EFFECT = ("enable_cueq", "enable_oeq", "compile_mode", "fullgraph", "pad_num_atoms", "pad_num_edges", "warmup")
INPUT_KEYS = ("charges_key", "info_keys", "arrays_keys")
NAMES = ("model_paths", "model_path", "models", "model_type", "energy_units_to_eV", "length_units_to_A",
         "compute_atomic_stresses") + INPUT_KEYS + NO_EFFECT
# mace-torch's calculator: model input -> atoms.info key, when info_keys is not given
DEFAULT_INFO_KEYS = {"total_spin": "spin", "total_charge": "charge", "external_field": "external_field"}
# mace-torch's AtomicData: each per-structure input's shape and its value where atoms.info lacks it
GRAPH_INPUTS = {"total_charge": ((), 0.0), "total_spin": ((), 1.0), "elec_temp": ((), 0.0),
                "fermi_level": ((), 0.0), "external_field": ((3,), 0.0)}


def _boolean(name: str, value: Any) -> bool:
    """``value`` of switch ``name``: True or False (numpy's too); a string such as "no" is refused, not
    taken for True."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name}: expected True or False, got {value!r}")


def take_mace_torch_arguments(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """Remove mace-torch's calculator arguments from ``kwargs``; returns ``models``, ``model_path``
    (its older name of ``model_paths``: both go through ``model_files``), ``compute_atomic_stresses``,
    ``model_type`` (None where not given: the model's class decides) and ``inputs`` (a
    ``StructureInputs`` of its input keys)."""
    stresses = kwargs.pop("compute_atomic_stresses", False)
    taken = {"models": kwargs.pop("models", None), "model_path": kwargs.pop("model_path", None),
             "compute_atomic_stresses": _boolean("compute_atomic_stresses", stresses),
             "inputs": StructureInputs(kwargs.pop("info_keys", None), kwargs.pop("arrays_keys", None),
                                       kwargs.pop("charges_key", "Qs"))}
    taken["model_type"] = kwargs.pop("model_type", None)  # checked against the model in ``model_kinds``
    if taken["model_type"] is not None and taken["model_type"] not in MODEL_TYPES:
        raise ValueError(f"model_type: expected one of {MODEL_TYPES} (or leave it out: the model's class decides), "
                         f"got {taken['model_type']!r}")
    for name in ("energy_units_to_eV", "length_units_to_A"):
        value = kwargs.pop(name, 1.0)
        if value != 1.0:
            raise ValueError(f"{name}: only 1.0 is supported (a model in eV and Angstrom), got {value!r}")
    for name in NO_EFFECT:
        kwargs.pop(name, None)
    return taken


def model_files(model_paths, model_path=None, name: Optional[str] = None):
    """mace-torch's ``model_paths``, or its older name ``model_path`` (not both), as its calculator
    reads them: a wildcard pattern such as ``"mace_*.model"`` that is not itself a file becomes the
    sorted list of the files it matches (several make a committee); anything else is returned as is.
    ``name``: the argument named in errors (default the one given)."""
    name = name or ("model_paths" if model_path is None else "model_path")
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


class StructureInputs:
    """The model inputs beyond positions, elements and cell that mace-torch's calculator takes from
    the structure, for models that read them (charge and spin embeddings, dipole models): per
    structure ``total_charge``, ``total_spin``, ``elec_temp``, ``fermi_level``, ``external_field`` and
    any per-structure embedding from ``atoms.info`` through ``info_keys`` (input name -> info key;
    default ``charge``, ``spin``, ``external_field``), per atom ``charges`` from
    ``atoms.arrays[charges_key]`` (default ``Qs``) and per-atom embeddings through ``arrays_keys``;
    absent ones take mace-torch's defaults (charge 0, spin multiplicity 1, zeros)."""

    def __init__(self, info_keys=None, arrays_keys=None, charges_key="Qs"):
        for name, value in (("info_keys", info_keys), ("arrays_keys", arrays_keys)):
            if value is not None and not (isinstance(value, dict) and all(isinstance(v, str) for v in value.values())):
                raise ValueError(f"{name}: expected a dict of model input name -> atoms key (str), got {value!r}")
        if not isinstance(charges_key, str):
            raise ValueError(f"charges_key: expected the atoms.arrays key of per-atom charges (str), got "
                             f"{charges_key!r}")
        self.info_keys = dict(DEFAULT_INFO_KEYS if info_keys is None else info_keys)
        self.arrays_keys = {"charges": charges_key, **(arrays_keys or {})}  # arrays_keys' own 'charges' wins there
        self.graph: List[str] = list(GRAPH_INPUTS)
        self.atom: List[str] = ["charges"]

    def for_model(self, model: torch.nn.Module) -> "StructureInputs":
        """A copy for ``model``: mace-torch's ``MACE`` and ``ScaleShiftMACE`` read only their embeddings
        (``embedding_specs``), other models all these inputs; an embedding without a default or an
        atoms key (``info_keys`` / ``arrays_keys``) is refused by name."""
        out = copy.copy(self)
        plain = class_name(model) in ("MACE", "ScaleShiftMACE")
        out.graph, out.atom = ([], []) if plain else (list(self.graph), list(self.atom))
        specs = getattr(model, "embedding_specs", None) or {}
        for name, spec in specs.items():
            per = spec.get("per") if isinstance(spec, dict) else None
            if per not in ("graph", "atom"):
                raise ValueError(f"model: embedding {name!r} is per {per!r}; expected 'graph' or 'atom'")
            names, known, keys, where = ((out.graph, GRAPH_INPUTS, self.info_keys, "info_keys") if per == "graph"
                                         else (out.atom, ("charges",), self.arrays_keys, "arrays_keys"))
            if name not in known and name not in keys:
                raise ValueError(f"{where}: the model embeds {name!r}; name its atoms key, e.g. {where}="
                                 f"{{{name!r}: {name!r}}}")
            if name not in names:
                names.append(name)
        return out

    def read_info(self, atoms) -> list:
        """The atoms.info values the per-structure inputs come from (None where absent)."""
        return [atoms.info.get(self.info_keys[n]) if n in self.info_keys else None for n in self.graph]

    def read_arrays(self, atoms) -> list:
        """The atoms.arrays values the per-atom inputs come from (None where absent)."""
        return [atoms.arrays.get(self.arrays_keys.get(n, n)) for n in self.atom]

    def changed(self, old, new) -> bool:
        """Whether an atoms.info or atoms.arrays value the model reads differs between ``old`` and ``new``."""
        return (any(not _same(a, b) for a, b in zip(self.read_info(old), self.read_info(new)))
                or any(not _same(a, b) for a, b in zip(self.read_arrays(old), self.read_arrays(new))))

    def tensors(self, atoms_list: Sequence, dtype: torch.dtype, device: torch.device) -> Dict[str, torch.Tensor]:
        """The inputs of a batch of structures: per structure [G] (``external_field`` [G, 3]), per atom [N]."""
        out = {}
        for name in self.graph:
            shape, default = GRAPH_INPUTS.get(name, ((), None))
            rows = []
            for k, atoms in enumerate(atoms_list):
                key = self.info_keys.get(name)
                value = atoms.info.get(key) if key is not None else None
                if value is None and default is None:
                    raise ValueError(f"atoms.info[{key!r}]: the model reads {name!r}, which structure {k} lacks")
                rows.append(np.full(shape, default) if value is None else _values(value, shape, f"atoms.info[{key!r}]"))
            out[name] = torch.as_tensor(np.stack(rows), dtype=dtype).to(device)
        for name in self.atom:
            key = self.arrays_keys.get(name, name)
            parts = []
            for k, atoms in enumerate(atoms_list):
                value = atoms.arrays.get(key)
                if value is None and name != "charges":
                    raise ValueError(f"atoms.arrays[{key!r}]: the model reads {name!r}, which structure {k} lacks")
                parts.append(np.zeros(len(atoms)) if value is None else np.asarray(value, dtype=np.float64))
            out[name] = torch.as_tensor(np.concatenate(parts), dtype=dtype).to(device)
        return out


def class_name(model: torch.nn.Module) -> str:
    """The model's class name, before ``equikernels.accelerate`` gave it a subclass."""
    return getattr(type(model), "_ek_base", type(model)).__name__


def _values(value, shape: tuple, where: str) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected a number, got {value!r}") from None
    if array.size != int(np.prod(shape)):
        raise ValueError(f"{where}: expected {'a number' if not shape else f'{shape[0]} numbers'}, got {value!r}")
    return array.reshape(shape)


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    except (TypeError, ValueError):
        return a == b
