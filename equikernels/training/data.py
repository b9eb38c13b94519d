"""Training data: read labelled structures from any ASE-readable file, check them, and turn them
into torch-geometric graphs with mace-torch's keys.

Every check names the file and the frame index, because a bad frame in a 10,000-frame extxyz is
otherwise impossible to find. Units are ASE's (eV, Å, eV/Å^3); stress follows ASE's sign
convention (the same as mace-torch's ``stress`` output)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from vesin import NeighborList

from .._compat import pyg_data
from ..models.data import head_index
from .config import DataKeys
from .frames import select, split_selection


UNUSED_STRESS = "unused stress"  # label_keys entry: a stress label of a frame not periodic in all directions


class DataError(ValueError):
    """A training structure that cannot be used; the message names the file and the frame."""


@dataclass
class Config:
    """One labelled structure, checked, in float64 numpy arrays."""
    atomic_numbers: np.ndarray          # [N] int
    positions: np.ndarray               # [N, 3]
    cell: np.ndarray                    # [3, 3]
    pbc: np.ndarray                     # [3] bool
    energy: Optional[float] = None
    forces: Optional[np.ndarray] = None  # [N, 3]
    stress: Optional[np.ndarray] = None  # [3, 3], ASE sign convention
    weight: float = 1.0
    head: str = "Default"
    config_type: str = "Default"        # mace-torch's ``config_type`` info key
    property_weights: Dict[str, float] = field(default_factory=dict)  # mace-torch's config_<prop>_weight
    source: str = ""                    # "file, frame i" for error messages
    label_keys: Dict[str, str] = field(default_factory=dict)  # property -> where its label was found
    available: str = ""                 # the frame's label-like keys, for "label not found" messages
    # the frame's atoms.info and per-atom arrays: a model's inputs beyond the graph (total charge, spin)
    info: Dict[str, Any] = field(default_factory=dict, repr=False)
    arrays: Dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def num_atoms(self) -> int:
        return int(len(self.atomic_numbers))


def _where(path: str, index: int) -> str:
    return f"{path}, frame {index}"


def _lookup(atoms, key: str):
    """A label from atoms.info / atoms.arrays, or from an attached calculator's results (ASE's
    extxyz reader moves keys named energy/forces/stress there)."""
    if key in atoms.info:
        return atoms.info[key]
    if key in atoms.arrays:
        return atoms.arrays[key]
    calc = getattr(atoms, "calc", None)
    results = getattr(calc, "results", None) or {}
    return results.get(key)


# ASE's own names: extxyz, traj and db files keep a calculator's results under these
_CALC_NAMES = {"energy": "energy", "forces": "forces", "stress": "stress"}


def _find(atoms, keys: DataKeys, prop: str):
    """(value, where) of one label: the configured key, else (when that key is the default
    ``REF_*`` one, i.e. not chosen by the user) ASE's calculator result of the same property."""
    key = getattr(keys, prop)
    value = _lookup(atoms, key)
    if value is not None:
        return value, repr(key)
    fallback = _CALC_NAMES.get(prop)
    if fallback is not None and key == getattr(DataKeys(), prop):
        value = _lookup(atoms, fallback)
        if value is not None:
            return value, f"{fallback!r} (calculator results)"
    return None, None


def _available_keys(atoms) -> str:
    info = sorted(k for k in atoms.info if k not in ("pbc",))
    arrays = sorted(k for k in atoms.arrays if k not in ("numbers", "positions"))
    calc = getattr(atoms, "calc", None)
    results = sorted(getattr(calc, "results", None) or {})
    return f"info keys {info}, per-atom arrays {arrays}, calculator results {results}"


def _as_float_array(value, what: str, where: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{where}: {what} is not numeric ({value!r})") from exc
    if not np.all(np.isfinite(arr)):
        raise DataError(f"{where}: {what} contains NaN or infinite values")
    return arr


def _stress_3x3(value, what: str, where: str) -> np.ndarray:
    arr = _as_float_array(value, what, where).reshape(-1)
    if arr.size == 9:
        return arr.reshape(3, 3)
    if arr.size == 6:  # Voigt order xx, yy, zz, yz, xz, xy
        xx, yy, zz, yz, xz, xy = arr
        return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    raise DataError(f"{where}: {what} has {arr.size} values; expected 6 (Voigt) or 9 (3x3)")


def config_from_atoms(atoms, keys: DataKeys, where: str) -> Config:
    """Check one ASE Atoms and extract its labels."""
    n = len(atoms)
    if n == 0:
        raise DataError(f"{where}: the structure has no atoms")
    positions = _as_float_array(atoms.get_positions(), "positions", where)
    cell = _as_float_array(atoms.get_cell().array, "cell", where)
    pbc = np.asarray(atoms.get_pbc(), dtype=bool)

    used = {}
    energy, used["energy"] = _find(atoms, keys, "energy")
    if energy is not None:
        e = _as_float_array(energy, f"energy '{keys.energy}'", where).reshape(-1)
        if e.size != 1:
            raise DataError(f"{where}: energy '{keys.energy}' has {e.size} values; expected one number")
        energy = float(e[0])

    forces, used["forces"] = _find(atoms, keys, "forces")
    if forces is not None:
        forces = _as_float_array(forces, f"forces '{keys.forces}'", where)
        if forces.shape != (n, 3):
            raise DataError(f"{where}: forces '{keys.forces}' have shape {tuple(forces.shape)}; "
                            f"expected ({n}, 3) for {n} atoms")

    stress, used["stress"] = _find(atoms, keys, "stress")
    if stress is not None:
        stress = _stress_3x3(stress, f"stress '{keys.stress}'", where)
    else:
        virials = _lookup(atoms, keys.virials)
        if virials is not None:
            virials = _stress_3x3(virials, f"virials '{keys.virials}'", where)
            volume = abs(np.linalg.det(cell))
            if not pbc.all() or volume <= 0:
                raise DataError(f"{where}: virials '{keys.virials}' given for a structure without "
                                "a periodic cell of nonzero volume")
            stress = -virials / volume  # mace-torch: virials = -stress * volume
            used["stress"] = f"{keys.virials!r} (virials)"
    if stress is not None and not pbc.all():
        stress = None  # a stress is meaningless without a periodic cell; never fit it
        used[UNUSED_STRESS], used["stress"] = used["stress"], None

    weight = atoms.info.get(keys.weight, 1.0)
    weight = float(_as_float_array(weight, f"weight '{keys.weight}'", where).reshape(-1)[0])
    if weight < 0:
        raise DataError(f"{where}: weight '{keys.weight}' is {weight}; expected >= 0")
    head = str(atoms.info.get(keys.head, "Default"))
    config_type = str(atoms.info.get("config_type", "Default"))
    property_weights = {}
    from_virials = used["stress"] == f"{keys.virials!r} (virials)"
    for prop in ("energy", "forces", "stress"):
        name = f"config_{'virials' if prop == 'stress' and from_virials else prop}_weight"
        if name in atoms.info:
            w = float(_as_float_array(atoms.info[name], f"weight '{name}'", where).reshape(-1)[0])
            if w < 0:
                raise DataError(f"{where}: weight '{name}' is {w}; expected >= 0")
            property_weights[prop] = w
    return Config(atomic_numbers=np.asarray(atoms.get_atomic_numbers(), dtype=np.int64),
                  positions=positions, cell=cell, pbc=pbc, energy=energy, forces=forces,
                  stress=stress, weight=weight, head=head, config_type=config_type,
                  property_weights=property_weights, source=where,
                  label_keys={k: v for k, v in used.items() if v is not None},
                  available=_available_keys(atoms), info=dict(atoms.info),
                  arrays={k: v for k, v in atoms.arrays.items() if k not in ("numbers", "positions")})


def read_frames(path: str, *, index: Union[int, str] = ":") -> list:
    """The ASE ``Atoms`` of an ASE-readable file (at least one): the frames ASE's ``index`` picks (default
    every frame), or, for ``FILE@INDEX`` (ASE's selection, e.g. ``FILE@-1``, ``FILE@:100``), the frames that
    selection picks from the whole file."""
    file, selection = split_selection(path)
    if file == path:
        return _read_file(file, index)
    return select(_read_file(file, ":"), selection, path)


def _read_file(path: str, index: Union[int, str]) -> list:
    import ase.io

    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory; expected a structure file (extxyz or any ASE-readable format)")
    try:
        # a selection was split off already (split_selection): an '@' left is part of the file's name
        frames = ase.io.read(path, index=index, do_not_split_by_at_sign=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"structure file {path!r} does not exist") from None
    except Exception as exc:  # ASE raises many types for unreadable files
        text = str(exc).strip().splitlines()
        raise DataError(f"{path}: ASE cannot read it ({type(exc).__name__}: {text[0] if text else ''}); expected a "
                        "structure file such as .xyz, .extxyz, .cif, POSCAR") from exc
    if not isinstance(frames, list):
        frames = [frames]
    if not frames:
        raise DataError(f"{path}: contains no structures")
    return frames


def configs_from_frames(frames: Sequence, keys: DataKeys, path: str) -> List[Config]:
    """The checked configs of the frames ``read_frames(path)`` returned."""
    return [config_from_atoms(a, keys, _where(path, i)) for i, a in enumerate(frames)]


def read_configs(path: str, keys: DataKeys, *, index: str = ":") -> List[Config]:
    """Every frame of an ASE-readable file, checked."""
    return configs_from_frames(read_frames(path, index=index), keys, path)


def check_labels(configs: Sequence[Config], path: str, *, need_energy: bool, need_forces: bool,
                 need_stress: bool, keys: Optional[DataKeys] = None) -> None:
    """Labels the loss needs must be there, in at least one frame (as in mace-torch, a frame without
    a label only leaves that label out of its loss; a key found in no frame is a wrong key). Stress:
    in at least one periodic frame, unless ``keys`` are given and hold the default stress and virials
    keys: then data without any stress (molecules, energy and forces only) trains without that term."""
    for prop, needed in (("energy", need_energy), ("forces", need_forces)):
        if needed and configs and all(getattr(c, prop) is None for c in configs):
            c = configs[0]
            raise DataError(f"{c.source}: no {prop} label (looked for {_wanted(keys, prop)}), nor in any other "
                            f"frame; the frame has {c.available}; set the {prop} key (--{prop}-key) "
                            f"or {prop}_weight: 0")
    chosen = keys is None or keys.stress != DataKeys().stress or keys.virials != DataKeys().virials
    if need_stress and chosen and configs and all(c.stress is None for c in configs):
        raise DataError(f"{path}: no frame has a stress or virials label (and a periodic cell), "
                        "but the stress loss weight is nonzero; set the stress/virials key or "
                        "stress_weight: 0")


def isolated_atom_e0s(configs: Sequence[Config]) -> Dict[int, float]:
    """E0s (element -> energy) from the frames mace-torch takes for isolated atoms: one atom,
    ``config_type=IsolatedAtom``, with an energy label."""
    e0s = {}
    for c in configs:
        if is_isolated_atom(c):
            if c.energy is None:
                raise DataError(f"{c.source}: marked config_type=IsolatedAtom but has no energy label; "
                                "give its energy or remove the frame")
            e0s[int(c.atomic_numbers[0])] = c.energy
    return e0s


def is_isolated_atom(config: Config) -> bool:
    return config.num_atoms == 1 and config.config_type == "IsolatedAtom"


def _wanted(keys: Optional[DataKeys], prop: str) -> str:
    key = getattr(keys or DataKeys(), prop)
    if key == getattr(DataKeys(), prop):
        return f"{key!r} and the calculator's {prop!r}"
    return repr(key)


def label_sources(configs: Sequence[Config]) -> str:
    """Which keys the labels came from, e.g. "energy from 'energy' (calculator results) in 16 of
    16 frames; forces from 'REF_forces' in 16 of 16 frames"."""
    parts = []
    for prop in ("energy", "forces", "stress", UNUSED_STRESS):
        counts: Dict[str, int] = {}
        for c in configs:
            where = c.label_keys.get(prop)
            if where is not None:
                counts[where] = counts.get(where, 0) + 1
        for where, n in counts.items():
            if prop == UNUSED_STRESS:
                parts.append(f"stress from {where} in {n} of {len(configs)} frames not used (their cell is not "
                             "periodic in all three directions)")
            else:
                parts.append(f"{prop} from {where} in {n} of {len(configs)} frames")
    return "; ".join(parts) if parts else "no energy, forces or stress labels"


def check_elements(configs: Sequence[Config], atomic_numbers: Sequence[int]) -> None:
    from ase.data import chemical_symbols

    known = set(int(z) for z in atomic_numbers)
    for c in configs:
        unknown = sorted(set(int(z) for z in c.atomic_numbers) - known)
        if unknown:
            names = ", ".join(f"{chemical_symbols[z]} (Z={z})" for z in unknown)
            have = " ".join(chemical_symbols[z] for z in sorted(known))
            raise DataError(f"{c.source}: element(s) {names} unknown to the model, which knows: {have}")


def frame_head(config: Config, heads: Sequence[str]) -> int:
    """Index of the model head a frame trains, by ``head_index``'s rule; a frame naming no head reads
    'Default' (as in mace-torch), which is no head given unless a head is called exactly that."""
    name = None if config.head == "Default" and "Default" not in heads else config.head
    where = config.source.replace("{", "{{").replace("}", "}}")  # the messages are format strings
    try:
        return head_index(name, heads, unknown=where + ": head {head!r} is not one of the model's heads {heads}",
                          missing=where + ": no head named (or 'Default') and none of the model's heads {heads} "
                                          "is called 'default': name the frame's head")
    except ValueError as exc:
        raise DataError(str(exc)) from None


def check_heads(configs: Sequence[Config], heads: Sequence[str]) -> None:
    for c in configs:
        frame_head(c, heads)


def usable_cell(cell: np.ndarray, pbc: np.ndarray) -> np.ndarray:
    """The cell, with zero rows along non-periodic directions filled in so that its volume is
    nonzero. Those rows never enter an edge vector (their integer shifts are 0) but a zero volume
    would put NaNs into the stress (virial / volume) and from there into every gradient."""
    cell = np.array(cell, dtype=np.float64)
    if abs(np.linalg.det(cell)) > 1e-8:
        return cell
    if not pbc.any():
        return np.eye(3)
    for k in range(3):
        if not pbc[k] and np.linalg.norm(cell[k]) < 1e-8:
            a, b = cell[(k + 1) % 3], cell[(k + 2) % 3]
            normal = np.cross(a, b)
            norm = np.linalg.norm(normal)
            cell[k] = normal / norm if norm > 1e-8 else np.eye(3)[k]
    if abs(np.linalg.det(cell)) <= 1e-8:
        raise DataError("the periodic cell vectors are degenerate (zero volume)")
    return cell


def neighbour_graph(positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float):
    """[sender, receiver] edges within ``cutoff`` and their integer cell shifts, with mace-torch's
    convention vec = pos[receiver] - pos[sender] + unit_shifts @ cell."""
    i, j, s = NeighborList(cutoff=float(cutoff), full_list=True).compute(
        points=positions, box=cell, periodic=[bool(p) for p in pbc], quantities="ijS")
    # a fixed edge order makes every run (and every resumed run) sum in the same order
    order = np.lexsort((s[:, 2], s[:, 1], s[:, 0], i, j))
    edge_index = np.stack([i[order], j[order]]).astype(np.int64)
    return edge_index, s[order].astype(np.float64)


def config_to_data(config: Config, z_table: Sequence[int], cutoff: float, heads: Sequence[str]):
    """A torch-geometric ``Data`` with the keys mace-torch models read, plus labels and per-graph
    loss weights (0 where a label is missing)."""
    index = {int(z): k for k, z in enumerate(z_table)}
    n = config.num_atoms
    one_hot = torch.zeros(n, len(z_table), dtype=torch.float64)
    one_hot[torch.arange(n), torch.tensor([index[int(z)] for z in config.atomic_numbers])] = 1.0
    try:
        fixed_cell = usable_cell(config.cell, config.pbc)
    except DataError as exc:
        raise DataError(f"{config.source}: {exc}") from None
    edge_index, unit_shifts = neighbour_graph(config.positions, fixed_cell, config.pbc, cutoff)
    cell = torch.tensor(fixed_cell, dtype=torch.float64)
    unit_shifts_t = torch.tensor(unit_shifts, dtype=torch.float64)
    head = frame_head(config, heads)
    f64 = dict(dtype=torch.float64)
    _, Data = pyg_data()  # imported on first use: importing torch-geometric breaks TorchScript of index_select
    return Data(
        num_nodes=n,
        positions=torch.tensor(config.positions, **f64),
        node_attrs=one_hot,
        edge_index=torch.tensor(edge_index),
        unit_shifts=unit_shifts_t,
        shifts=torch.tensor(unit_shifts @ fixed_cell, **f64),  # numpy: tiny torch matmuls are slow on busy CPUs
        cell=cell,
        head=torch.tensor(head, dtype=torch.long),
        weight=torch.tensor(config.weight, **f64),
        energy=torch.tensor(config.energy if config.energy is not None else 0.0, **f64),
        forces=torch.tensor(config.forces if config.forces is not None else np.zeros((n, 3)), **f64),
        stress=torch.tensor(config.stress if config.stress is not None else np.zeros((3, 3)), **f64).unsqueeze(0),
        energy_weight=torch.tensor(_label_weight(config, "energy"), **f64),
        forces_weight=torch.tensor(_label_weight(config, "forces"), **f64),
        stress_weight=torch.tensor(_label_weight(config, "stress"), **f64),
    )


def _label_weight(config: Config, prop: str) -> float:
    """A label's weight in its frame's loss: 0 where the frame has none, else its config_<prop>_weight."""
    return 0.0 if getattr(config, prop) is None else config.property_weights.get(prop, 1.0)


@dataclass
class GraphDataset:
    """Graphs ready for batching, and the configs they came from."""
    graphs: List = field(default_factory=list)
    configs: List[Config] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.graphs)


def build_dataset(configs: Sequence[Config], z_table: Sequence[int], cutoff: float,
                  heads: Sequence[str]) -> GraphDataset:
    check_elements(configs, z_table)
    check_heads(configs, heads)
    return GraphDataset([config_to_data(c, z_table, cutoff, heads) for c in configs], list(configs))


def collate(graphs: Sequence, dtype: torch.dtype, device) -> Dict[str, torch.Tensor]:
    """One torch-geometric ``Batch`` as the dict a mace-torch-style model reads."""
    Batch, _ = pyg_data()
    batch = Batch.from_data_list(list(graphs))
    out = {}
    for key, value in batch.to_dict().items():
        if torch.is_tensor(value):
            value = value.to(device=device, dtype=dtype if value.is_floating_point() else value.dtype)
        out[key] = value
    return out


def split_train_valid(configs: List[Config], fraction: float, seed: int):
    """A reproducible random split: ``fraction`` of the frames (at least one) become validation."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"valid_fraction must be in (0, 1), got {fraction}")
    if len(configs) < 2:
        raise ValueError(f"valid_fraction {fraction}: cannot split {len(configs)} structure(s) into training and "
                         "validation sets; give a validation file (--valid) or valid_fraction 0 (--valid-fraction 0)")
    perm = np.random.default_rng(seed).permutation(len(configs))
    n_valid = min(max(1, int(round(fraction * len(configs)))), len(configs) - 1)
    valid_idx = set(perm[:n_valid].tolist())
    train = [c for i, c in enumerate(configs) if i not in valid_idx]
    valid = [c for i, c in enumerate(configs) if i in valid_idx]
    return train, valid
