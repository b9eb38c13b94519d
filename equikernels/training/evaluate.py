"""A MACE model's predictions on labelled or unlabelled structures, and its errors where labels exist.

    from equikernels.training import evaluate
    preds, metrics = evaluate.predict(model, configs, dtype=torch.float64, device="cuda")

or ``equikernels eval structures.xyz --model mace.model``. Units are ASE's (eV, eV/Å, eV/Å^3);
stress follows ASE's sign convention and is predicted for frames periodic in all three directions."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..calculators.mace_args import GRAPH_INPUTS, StructureInputs, class_name
from ..calculators.model_kinds import model_outputs
from . import model_factory as mf
from .config import DataKeys
from .data import Config, build_dataset, collate, config_from_atoms
from .loss import error_sums, metrics_from_sums

# metric columns of the tables: (key, heading); values are printed in meV units
METRIC_COLUMNS = (("rmse_energy_per_atom", "RMSE E/atom"), ("mae_energy_per_atom", "MAE E/atom"),
                  ("rmse_forces", "RMSE F"), ("mae_forces", "MAE F"), ("rmse_stress", "RMSE stress"),
                  ("mae_stress", "MAE stress"))
METRIC_UNITS = "energies meV/atom, forces meV/Å, stress meV/Å³"


def model_context(device: torch.device):
    """How the model runs in training and evaluation: on CPU with TorchScript's graph optimiser
    off, so that every call (the first one of a process included) takes the same arithmetic path."""
    if torch.device(device).type == "cpu":
        return torch.jit.optimized_execution(False)
    return contextlib.nullcontext()


# mace_run_train's info keys of the total charge and spin, which mace-torch's calculator (and so ours) does not read
TRAINING_INFO_KEYS = {"total_charge": "total_charge", "total_spin": "total_spin"}


def forward(model, batch: Dict[str, torch.Tensor], *, training: bool, stress: bool, caller: str = "fine-tuning"):
    """The model's outputs for ``batch``; an input the model reads that ``batch`` lacks (a charge or
    spin embedding's, a dipole model's charges) is refused naming the model, the input and ``caller``
    (what does not give it)."""
    device = batch["positions"].device
    with model_context(device):
        try:
            return model(dict(batch), training=training, compute_force=True, compute_stress=stress)
        except KeyError as exc:
            key = exc.args[0] if len(exc.args) == 1 else None
            if not isinstance(key, str) or key in batch:
                raise
            name = class_name(getattr(model, "module", model))  # DistributedDataParallel wraps the model
            what = (" (it trains models of energies, forces and stress that read no charge, spin or other "
                    "embedded input)" if caller == "fine-tuning" else "")
            raise ValueError(f"model: {name} reads the input {key!r}, which {caller} does not give{what}") from exc


@dataclasses.dataclass
class Prediction:
    """One structure's predicted energy (eV), forces [N, 3] (eV/Å) and, for a frame periodic in
    all three directions, stress [3, 3] (eV/Å^3, ASE's sign convention), as float64 arrays; and where
    ``predict`` was asked for them, the per-atom energies [N] (E0 included), the energy's terms
    (mace-torch's ``contributions``: E0, pair repulsion, then one per interaction layer) and the
    per-atom descriptors [N, D]; for a model that predicts dipoles too (mace-torch's
    ``EnergyDipolesMACE``), the total dipole [3] (in Debye for mace-torch's dipole models)."""
    energy: float
    forces: np.ndarray
    stress: Optional[np.ndarray] = None
    node_energies: Optional[np.ndarray] = None
    contributions: Optional[np.ndarray] = None
    descriptors: Optional[np.ndarray] = None
    dipole: Optional[np.ndarray] = None


@dataclasses.dataclass(frozen=True)
class Descriptors:
    """Which node features ``predict`` returns as descriptors: those of the first ``num_layers``
    interaction layers (-1: all), only their invariant (0e) channels with ``invariants_only``, in the
    order of the model's ``node_feats`` output (mace-torch's layout)."""
    num_layers: int = -1
    invariants_only: bool = True


def descriptor_columns(model: torch.nn.Module, spec: Descriptors) -> torch.Tensor:
    """Indices into the model's ``node_feats`` columns that ``spec`` selects; the layers' irreps are
    read from ``model.products[i].linear.irreps_out`` as in mace-torch's models."""
    from e3nn import o3

    products = getattr(model, "products", None)
    try:
        layers = [o3.Irreps(str(p.linear.irreps_out)) for p in products]
    except (TypeError, AttributeError, ValueError):
        raise ValueError(f"descriptors: {type(model).__name__} has no MACE product layers "
                         "(products[i].linear.irreps_out) to take node features from") from None
    n = spec.num_layers
    if n != -1 and not 1 <= n <= len(layers):
        raise ValueError(f"descriptors: num_layers must be -1 (all) or 1 to {len(layers)} (the model's interaction "
                         f"layers), got {n}")
    cols: List[int] = []
    start = 0
    for k, irreps in enumerate(layers):
        if n == -1 or k < n:
            for mul_ir, part in zip(irreps, irreps.slices()):
                if not spec.invariants_only or (mul_ir.ir.l == 0 and mul_ir.ir.p == 1):
                    cols.extend(range(start + part.start, start + part.stop))
        start += irreps.dim
    return torch.tensor(cols, dtype=torch.int64)


def _as_configs(configs) -> List[Config]:
    """``configs`` as checked Configs: ASE Atoms converted, anything else refused in one line."""
    from ase import Atoms  # noqa: PLC0415

    if isinstance(configs, Atoms):
        raise TypeError("configs: expected a sequence of structures, got one ase.Atoms (pass [atoms])")
    configs = list(configs)
    out = []
    for i, c in enumerate(configs):
        if isinstance(c, Atoms):
            c = config_from_atoms(c, DataKeys(), f"configs[{i}]")
        elif not isinstance(c, Config):
            raise TypeError(f"configs[{i}]: expected an ase.Atoms or a training.data.Config, got {type(c).__name__}")
        out.append(c)
    return out


class _Frame:
    """What ``StructureInputs`` reads of a structure, from its Config."""

    def __init__(self, config: Config):
        self.info, self.arrays, self._n = config.info, config.arrays, config.num_atoms

    def __len__(self) -> int:
        return self._n


def model_inputs(model: torch.nn.Module, configs: Sequence[Config], inputs: Optional[StructureInputs] = None
                 ) -> Optional[List[Dict[str, torch.Tensor]]]:
    """Per config, the inputs beyond the graph that ``model`` reads (total charge, spin, per-atom
    charges, ...; mace-torch's ``MACE`` / ``ScaleShiftMACE`` only those of its ``embedding_specs``),
    taken from the frames as mace-torch's calculator takes them (``inputs``: its keys, default
    ``StructureInputs()``), as float64 CPU tensors; None when it reads none. A frame holding the total
    charge or spin only under mace_run_train's key is refused, not evaluated as neutral."""
    embedded = getattr(model, "embedding_specs", None) or {}
    try:
        wanted = (inputs or StructureInputs()).for_model(model)
    except ValueError as exc:
        if inputs is not None:
            raise ValueError(f"model: {class_name(model)}: {exc}") from None
        other = [n for n, spec in embedded.items()
                 if n not in (GRAPH_INPUTS if isinstance(spec, dict) and spec.get("per") == "graph" else ("charges",))]
        raise ValueError(f"model: {class_name(model)} embeds {', '.join(map(repr, other))} (embedding_specs), which is "
                         "not taken from the frames: only the total charge, spin, external field and per-atom charges "
                         "are (atoms.info 'charge', 'spin', 'external_field'; atoms.arrays 'Qs')") from None
    if not (wanted.graph or wanted.atom):
        return None
    out = []
    for c in configs:
        for name, train_key in TRAINING_INFO_KEYS.items():
            key = wanted.info_keys.get(name)
            if name in embedded and key is not None and key not in c.info and train_key in c.info:
                raise ValueError(f"{c.source}: its {name.replace('_', ' ')} is under {train_key!r} (mace_run_train's "
                                 f"info key), not {key!r}, where mace-torch's calculator and this evaluation read it; "
                                 f"rename the key to {key!r}")
        try:
            out.append(wanted.tensors([_Frame(c)], torch.float64, torch.device("cpu")))
        except ValueError as exc:
            raise ValueError(f"{c.source}: {exc}") from None
    return out


def _batch_inputs(per_config: List[Dict[str, torch.Tensor]], dtype: torch.dtype, device) -> Dict[str, torch.Tensor]:
    return {name: torch.cat([p[name] for p in per_config]).to(device=device, dtype=dtype) for name in per_config[0]}


def predict(model: torch.nn.Module, configs: Sequence[Config], *, dtype: torch.dtype, device,
            batch_size: int = 8, stress: bool = True, node_energies: bool = False, contributions: bool = False,
            descriptors: Optional[Descriptors] = None, on_batch: Optional[Callable[[int], None]] = None,
            inputs: Optional[StructureInputs] = None) -> Tuple[List[Prediction], Dict[str, float]]:
    """Predictions for ``configs`` (in their order) with ``model`` (a MACE of mace-torch's call
    convention, already in ``dtype`` on ``device``), ``batch_size`` structures per call, and the
    MAE/RMSE per property over the labels the configs carry (an empty dict when none do). ``configs``:
    ``Config`` objects (``training.data.read_configs``) or ASE Atoms, whose labels are read with the
    default ``DataKeys``.
    ``stress``: predict the stress of periodic frames. ``node_energies`` / ``contributions`` /
    ``descriptors``: fill those fields of every prediction (see ``Prediction``). ``on_batch(n)``:
    called after each batch of n structures (progress). A model that reads the total charge, spin
    or per-atom charges (charge and spin embeddings, dipole models) gets them from each frame's
    ``atoms.info`` / ``atoms.arrays`` as mace-torch's calculator gives them (``inputs``: a
    ``calculators.mace_args.StructureInputs`` of other keys; default ``charge``, ``spin``, ``Qs``;
    absent: charge 0, spin multiplicity 1)."""
    if batch_size < 1:
        raise ValueError(f"batch_size: expected a positive number of structures, got {batch_size}")
    outputs = model_outputs(model, None)
    if not outputs.energy:
        raise ValueError(f"model: {class_name(model)} predicts dipoles only, no energies; evaluate it with "
                         "MACECalculator(model, model_type='DipoleMACE')")
    if node_energies and not outputs.per_atom_energies:
        raise ValueError(f"node_energies: {class_name(model)}'s per-atom energies are not its energy's terms "
                         "(mace-torch's returns only the isolated-atom energies there)")
    configs = _as_configs(configs)
    columns = descriptor_columns(model, descriptors) if descriptors is not None else None
    dataset = build_dataset(configs, mf.atomic_numbers(model), mf.r_max(model), mf.heads(model))
    extra_inputs = model_inputs(model, dataset.configs, inputs)
    sums = torch.zeros(3, 3, dtype=torch.float64)
    preds: List[Prediction] = []
    was_training = model.training
    model.eval()
    try:
        for k in range(0, len(dataset), batch_size):
            chunk = dataset.configs[k:k + batch_size]
            batch = collate(dataset.graphs[k:k + batch_size], dtype, device)
            if extra_inputs is not None:
                batch.update(_batch_inputs(extra_inputs[k:k + batch_size], dtype, device))
            want_stress = stress and any(c.pbc.all() for c in chunk)
            out = forward(model, batch, training=False, stress=want_stress, caller="evaluation")
            sums += error_sums(out, batch).cpu()
            ptr = batch["ptr"].tolist()
            energy = out["energy"].detach().double().cpu().numpy()
            forces = out["forces"].detach().double().cpu().numpy()
            s = out.get("stress") if want_stress else None
            s = s.detach().double().cpu().numpy() if s is not None else None
            dipole = out.get("dipole")
            dipole = dipole.detach().double().cpu().numpy() if dipole is not None else None
            extra = _extras(model, out, node_energies, contributions, columns)
            for j, c in enumerate(chunk):
                rows = slice(ptr[j], ptr[j + 1])
                preds.append(Prediction(
                    float(energy[j]), forces[rows].copy(), s[j].copy() if s is not None and c.pbc.all() else None,
                    node_energies=extra["node_energy"][rows].copy() if "node_energy" in extra else None,
                    contributions=extra["contributions"][j].copy() if "contributions" in extra else None,
                    descriptors=extra["node_feats"][rows].copy() if "node_feats" in extra else None,
                    dipole=dipole[j].copy() if dipole is not None else None))
            if on_batch is not None:
                on_batch(len(chunk))
    finally:
        model.train(was_training)
    return preds, metrics_from_sums(sums)


def _extras(model, out, node_energies: bool, contributions: bool, columns: Optional[torch.Tensor]
            ) -> Dict[str, np.ndarray]:
    """The model outputs asked for beyond energy, forces and stress, as float64 arrays."""
    wanted = {"node_energy": node_energies, "contributions": contributions, "node_feats": columns is not None}
    got: Dict[str, np.ndarray] = {}
    for key, asked in wanted.items():
        if not asked:
            continue
        value = out.get(key)
        if value is None:
            what = " (mace-torch's MACE models do, its ScaleShiftMACE models do not)" if key == "contributions" else ""
            raise ValueError(f"{key}: {type(model).__name__} does not return them{what}")
        if key == "node_feats":
            value = value.index_select(-1, columns.to(value.device))
        got[key] = value.detach().double().cpu().numpy()
    return got


def _number(value: float) -> str:
    """A metric in meV for a 13-wide column: fixed point, or exponent form where that would not fit."""
    text = f"{value:.3f}"
    return text if len(text) <= 12 else f"{value:.4g}"


def metrics_lines(rows: Sequence[Tuple[str, Dict[str, float]]]) -> List[str]:
    """A table of (label, metrics) rows in meV units under ``METRIC_COLUMNS``; rows with no metrics
    are left out."""
    width = max([len(label) for label, _ in rows] + [0]) + 2
    lines = [METRIC_UNITS, f"{'':<{width}}" + "".join(f"{name:>13}" for _, name in METRIC_COLUMNS)]
    for label, m in rows:
        if m:
            lines.append(f"{label:<{width}}" + "".join(
                f"{_number(1000 * m[k]):>13}" if k in m else f"{'-':>13}" for k, _ in METRIC_COLUMNS))
    return lines
