"""Opt-in paths that measured slower than the defaults, kept for their memory savings and for
further work: the radial MLP as fused Triton kernels (``mlp``, kernels in ``codegen_mlp``) and the
convolution with the radial MLP's last layer fused in (``radial_conv``, kernels in
``codegen_radial_conv``; ``radial_fusion`` decides per interaction block).

The default paths never import this package. ``enable()`` registers its paths in
``equikernels.models.hooks``; importing equikernels calls it when EQUIKERNELS_RADIAL_CONV or
EQUIKERNELS_FUSED_MLP asks for one of them. Which path runs is then decided per call by those
settings and the block's ``radial_fusion`` attribute.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from .. import settings
from ..models import hooks
from .mlp import radial_mlp
from .radial_fusion import message


def _radial_mlp(mlp, x: torch.Tensor, weights: List[torch.Tensor]) -> Optional[torch.Tensor]:
    return radial_mlp(x, weights, 1.0, backend=mlp.backend)  # the activation constant is in the weights


def enable() -> None:
    """Lets the models run the experimental paths their settings ask for (idempotent)."""
    hooks.register(message, _radial_mlp)


def disable() -> None:
    """Back to the default paths only."""
    hooks.register(None, None)


def requested() -> bool:
    """Whether the settings in force ask for an experimental path."""
    s = settings.get()
    return s.radial_conv != "0" or s.fused_mlp
