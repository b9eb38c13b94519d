"""The MACE training step, side by side: equikernels' MACE (float32, and bf16-mixed with float32
master parameters) against mace-torch with e3nn, cuEquivariance and OpenEquivariance, all made from
one mace-torch model of MACE-MP-0 medium's shape.

One step: ``zero_grad``; forward with ``training=True, compute_force=True`` (and
``compute_stress=True`` for an E/F/S loss; derivatives with ``create_graph=True``, as mace-torch
trains); loss ``mean((E / N)^2) + mean(F^2) (+ mean(S^2))`` (the terms of mace-torch's weighted
energy-forces(-stress) loss, with zero targets: the targets do not change the work); ``backward``
into the parameters; ``Adam.step``. Correctness: forces (and stress) of the training-mode forward
against mace-torch's model in float64.
"""
from __future__ import annotations

from typing import Callable, Dict

import torch

from . import mace as MC

PRECISIONS = ("fp32", "bf16-mixed")


def train_model(impl: str, ref64: torch.nn.Module, precision: str, device: torch.device) -> torch.nn.Module:
    """``impl`` made from the float64 mace-torch model ``ref64`` (left unchanged) with float32
    parameters that require gradients, in training mode. ``precision`` other than "fp32": equikernels only."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    if precision != "fp32" and impl != "equikernels":
        raise ValueError(f"precision={precision!r}: only the equikernels model has a mixed-precision mode")
    model = MC.build(impl, ref64, torch.float32, device, frozen=False)
    if precision != "fp32":
        model.set_precision(precision)
    return model.train()


def loss_of(out: Dict[str, torch.Tensor], num_atoms: int, stress: bool = False) -> torch.Tensor:
    loss = (out["energy"].float() / num_atoms).pow(2).mean() + out["forces"].float().pow(2).mean()
    return loss + out["stress"].float().pow(2).mean() if stress else loss


def _clear_input_grads(data: Dict[str, torch.Tensor]) -> None:
    # the models make positions require grad, and backward fills their .grad: dropped every step
    for v in data.values():
        if isinstance(v, torch.Tensor) and v.is_leaf and v.grad is not None:
            v.grad = None


def forward(model, data: Dict[str, torch.Tensor], stress: bool = False) -> Dict[str, torch.Tensor]:
    return model(dict(data), training=True, compute_force=True, compute_stress=stress)


def step_call(model, data: Dict[str, torch.Tensor], stress: bool = False,
              lr: float = 1e-4) -> Callable[[int], torch.Tensor]:
    """The timed call: one training step per call (an E/F/S loss with ``stress``); returns the loss
    (not synchronised)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    n = int(data["positions"].shape[0])

    def step(i: int) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        _clear_input_grads(data)
        loss = loss_of(forward(model, data, stress), n, stress)
        loss.backward()
        opt.step()
        return loss.detach()
    return step
