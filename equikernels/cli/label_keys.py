"""The ``--*-key`` flags of ``fine-tune`` and ``eval``: where each frame keeps its reference labels."""
from __future__ import annotations

import argparse
from typing import Dict

# flag -> DataKeys field
FLAGS = {"energy_key": "energy", "forces_key": "forces", "stress_key": "stress", "virials_key": "virials",
         "head_key": "head"}


def add_flags(parser: argparse.ArgumentParser) -> None:
    from ..training.config import DataKeys

    defaults = DataKeys()
    for flag, prop in FLAGS.items():
        what = "info key of a frame's head" if prop == "head" else f"label key for {prop}"
        parser.add_argument("--" + flag.replace("_", "-"), default=None,
                            help=f"{what} (default {getattr(defaults, prop)})")


def given(args: argparse.Namespace) -> Dict[str, str]:
    """DataKeys field -> key, for the flags given."""
    return {prop: getattr(args, flag) for flag, prop in FLAGS.items() if getattr(args, flag, None) is not None}
