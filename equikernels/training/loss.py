"""Weighted energy-per-atom, force and stress losses, and validation error sums.

Each term is a *sum* over the local batch divided by a count over the *global* batch (all
processes), so that the gradients averaged by DDP equal those of one process on the whole batch."""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from . import distributed as dist_utils


def _penalty(diff: torch.Tensor, kind: str, delta: float) -> torch.Tensor:
    if kind == "huber":
        return torch.nn.functional.huber_loss(diff, torch.zeros_like(diff), reduction="none", delta=delta)
    return diff.square()


def _num_atoms(batch: Dict[str, torch.Tensor]) -> torch.Tensor:
    return (batch["ptr"][1:] - batch["ptr"][:-1]).to(batch["energy"].dtype)


def local_counts(batch: Dict[str, torch.Tensor]) -> torch.Tensor:
    """[labelled graphs with energy, force components, stress components] of this batch."""
    n_atoms = _num_atoms(batch)
    per_atom_fw = batch["forces_weight"][batch["batch"]]
    return torch.stack([
        (batch["energy_weight"] > 0).sum().to(n_atoms.dtype),
        3.0 * (per_atom_fw > 0).sum().to(n_atoms.dtype),
        9.0 * (batch["stress_weight"] > 0).sum().to(n_atoms.dtype),
    ])


def loss_terms(out: Dict[str, torch.Tensor], batch: Dict[str, torch.Tensor], cfg,
               counts: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Total weighted loss and its unweighted parts. ``counts`` = global ``local_counts``."""
    w_graph = batch["weight"]
    denom = counts.clamp(min=1.0)
    parts = {}
    n_atoms = _num_atoms(batch)
    de = (out["energy"] - batch["energy"]) / n_atoms
    parts["energy"] = (w_graph * batch["energy_weight"] * _penalty(de, cfg.loss, cfg.huber_delta)).sum() / denom[0]
    if cfg.forces_weight > 0:
        w_atom = (w_graph * batch["forces_weight"])[batch["batch"]].unsqueeze(-1)
        df = out["forces"] - batch["forces"]
        parts["forces"] = (w_atom * _penalty(df, cfg.loss, cfg.huber_delta)).sum() / denom[1]
    if cfg.stress_weight > 0:
        ws = (w_graph * batch["stress_weight"]).view(-1, 1, 1)
        ds = out["stress"] - batch["stress"]
        parts["stress"] = (ws * _penalty(ds, cfg.loss, cfg.huber_delta)).sum() / denom[2]
    total = cfg.energy_weight * parts["energy"]
    if "forces" in parts:
        total = total + cfg.forces_weight * parts["forces"]
    if "stress" in parts:
        total = total + cfg.stress_weight * parts["stress"]
    return total, parts


# ---- validation metrics -----------------------------------------------------------------------
# sums kept per property: [sum |err|, sum err^2, count]
METRIC_PROPS = ("energy_per_atom", "forces", "stress")


def error_sums(out: Dict[str, torch.Tensor], batch: Dict[str, torch.Tensor]) -> torch.Tensor:
    """[3 properties, 3 sums] (float64) for one batch; only labelled values count."""
    sums = torch.zeros(3, 3, dtype=torch.float64, device=batch["energy"].device)
    n_atoms = _num_atoms(batch)
    e_mask = batch["energy_weight"] > 0
    de = ((out["energy"].detach() - batch["energy"]) / n_atoms)[e_mask].double()
    f_mask = (batch["forces_weight"] > 0)[batch["batch"]]
    df = (out["forces"].detach() - batch["forces"])[f_mask].double()
    rows = [de, df]
    if out.get("stress") is not None:
        s_mask = batch["stress_weight"] > 0
        rows.append((out["stress"].detach() - batch["stress"])[s_mask].double())
    for k, d in enumerate(rows):
        sums[k] = torch.stack([d.abs().sum(), d.square().sum(), torch.tensor(float(d.numel()), dtype=torch.float64, device=d.device)])
    return sums


def metrics_from_sums(sums: torch.Tensor) -> Dict[str, float]:
    """MAE and RMSE per property (eV/atom, eV/Å, eV/Å^3); properties with no labels are left out."""
    result = {}
    for k, name in enumerate(METRIC_PROPS):
        abs_sum, sq_sum, n = (float(v) for v in sums[k])
        if n > 0:
            result[f"mae_{name}"] = abs_sum / n
            result[f"rmse_{name}"] = (sq_sum / n) ** 0.5
    return result


def reduce_sums(sums: torch.Tensor) -> torch.Tensor:
    return dist_utils.all_reduce_sum(sums)
