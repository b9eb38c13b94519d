"""The bundled default model: a small MACE trained by ``examples/train_default_model.py`` on EMT
data for Cu, Ni, Al, Ag, Au, Pd, Pt (bulk, alloys, strained/rattled cells, surfaces). Its
validation errors are in ``metrics.json`` next to it. A toy for demos and tests, not a
replacement for a foundation model."""
from __future__ import annotations

import os

MODEL_FILE = "mace_emt_small.pt"  # equikernels format: .model would say mace-torch reads it


def default_model_path() -> str:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), MODEL_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"the bundled default model {path} is missing from this installation; "
                                "run examples/train_default_model.py or pass a model file")
    return path
