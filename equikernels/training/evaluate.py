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

from . import model_factory as mf
from .data import Config, build_dataset, collate
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


def forward(model, batch: Dict[str, torch.Tensor], *, training: bool, stress: bool):
    device = batch["positions"].device
    with model_context(device):
        return model(dict(batch), training=training, compute_force=True, compute_stress=stress)


@dataclasses.dataclass
class Prediction:
    """One structure's predicted energy (eV), forces [N, 3] (eV/Å) and, for a frame periodic in
    all three directions, stress [3, 3] (eV/Å^3, ASE's sign convention), as float64 arrays."""
    energy: float
    forces: np.ndarray
    stress: Optional[np.ndarray] = None


def predict(model: torch.nn.Module, configs: Sequence[Config], *, dtype: torch.dtype, device,
            batch_size: int = 8, stress: bool = True,
            on_batch: Optional[Callable[[int], None]] = None) -> Tuple[List[Prediction], Dict[str, float]]:
    """Predictions for ``configs`` (in their order) with ``model`` (a MACE of mace-torch's call
    convention, already in ``dtype`` on ``device``), ``batch_size`` structures per call, and the
    MAE/RMSE per property over the labels the configs carry (an empty dict when none do).
    ``stress``: predict the stress of periodic frames. ``on_batch(n)``: called after each batch of
    n structures (progress)."""
    if batch_size < 1:
        raise ValueError(f"batch_size: expected a positive number of structures, got {batch_size}")
    dataset = build_dataset(configs, mf.atomic_numbers(model), mf.r_max(model), mf.heads(model))
    sums = torch.zeros(3, 3, dtype=torch.float64)
    preds: List[Prediction] = []
    was_training = model.training
    model.eval()
    try:
        for k in range(0, len(dataset), batch_size):
            chunk = dataset.configs[k:k + batch_size]
            batch = collate(dataset.graphs[k:k + batch_size], dtype, device)
            want_stress = stress and any(c.pbc.all() for c in chunk)
            out = forward(model, batch, training=False, stress=want_stress)
            sums += error_sums(out, batch).cpu()
            ptr = batch["ptr"].tolist()
            energy = out["energy"].detach().double().cpu().numpy()
            forces = out["forces"].detach().double().cpu().numpy()
            s = out.get("stress") if want_stress else None
            s = s.detach().double().cpu().numpy() if s is not None else None
            for j, c in enumerate(chunk):
                preds.append(Prediction(float(energy[j]), forces[ptr[j]:ptr[j + 1]].copy(),
                                        s[j].copy() if s is not None and c.pbc.all() else None))
            if on_batch is not None:
                on_batch(len(chunk))
    finally:
        model.train(was_training)
    return preds, metrics_from_sums(sums)


def metrics_lines(rows: Sequence[Tuple[str, Dict[str, float]]]) -> List[str]:
    """A table of (label, metrics) rows in meV units under ``METRIC_COLUMNS``; rows with no metrics
    are left out."""
    width = max([len(label) for label, _ in rows] + [0]) + 2
    lines = [METRIC_UNITS, f"{'':<{width}}" + "".join(f"{name:>13}" for _, name in METRIC_COLUMNS)]
    for label, m in rows:
        if m:
            lines.append(f"{label:<{width}}" + "".join(
                f"{1000 * m[k]:>13.3f}" if k in m else f"{'-':>13}" for k, _ in METRIC_COLUMNS))
    return lines
