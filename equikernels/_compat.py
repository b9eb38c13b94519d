"""Import e3nn safely on every supported torch/e3nn pair.

e3nn 0.4.4 (pinned by mace-torch) calls ``torch.load`` on its bundled constants at import time;
with torch >= 2.6 (``weights_only=True`` by default) that fails unless ``slice`` is an allowed
global. We register it before the first e3nn import so users never see the error.
"""
import torch

_add = getattr(getattr(torch, "serialization", None), "add_safe_globals", None)
if _add is not None:
    _add([slice])

import e3nn  # noqa: E402
from e3nn import o3  # noqa: E402

E3NN_VERSION = tuple(int(p) for p in e3nn.__version__.split(".")[:3] if p.isdigit())

__all__ = ["o3", "e3nn", "E3NN_VERSION"]
