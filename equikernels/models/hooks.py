"""Hook points for the opt-in paths of ``equikernels.experimental``: ``experimental.enable()``
registers them here, so the default model paths never import the experimental package.

``message(block, h, edge_attrs, edge_feats, cutoff, graph)`` returns an interaction block's
message, or None to leave the call to the default path. ``radial_mlp(mlp, x, weights)`` returns
the radial MLP chain of ``x`` through the scaled ``weights``, or None likewise.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .. import settings

message: Optional[Callable[..., Optional[torch.Tensor]]] = None
radial_mlp: Optional[Callable[..., Optional[torch.Tensor]]] = None


def register(message_hook: Optional[Callable[..., Optional[torch.Tensor]]],
             radial_mlp_hook: Optional[Callable[..., Optional[torch.Tensor]]]) -> None:
    """Installs the opt-in paths (``equikernels.experimental.enable()``; None: the default only)."""
    global message, radial_mlp
    message, radial_mlp = message_hook, radial_mlp_hook


def check_message_unrequested(radial_fusion: Optional[str]) -> None:
    """Raises when ``radial_fusion`` or EQUIKERNELS_RADIAL_CONV asks for the experimental message
    path while it is not enabled (it would otherwise be ignored silently)."""
    if radial_fusion not in (None, "0") or settings.get().radial_conv != "0":
        raise RuntimeError(f"radial_fusion / EQUIKERNELS_RADIAL_CONV = {radial_fusion or settings.get().radial_conv!r} "
                           f"{_HOW}")


def check_mlp_unrequested() -> None:
    """Raises when EQUIKERNELS_FUSED_MLP asks for the experimental radial MLP while it is not enabled."""
    if settings.get().fused_mlp:
        raise RuntimeError(f"EQUIKERNELS_FUSED_MLP = 1 {_HOW}")


_HOW = ("asks for an experimental path: call equikernels.experimental.enable() first (done when equikernels "
        "is imported with the variable set)")
