"""Fine-tuning and training of MACE potentials: ASE-readable data, force/stress losses, AdamW,
schedules, EMA, exact-resume checkpoints, early stopping and DDP (``torchrun``).

    from equikernels.training import TrainConfig, fine_tune
    summary = fine_tune(TrainConfig(model="mace.model", train_file="data.xyz", epochs=20))

or ``equikernels fine-tune --model mace.model --train data.xyz --epochs 20``."""
import importlib

from .config import DataKeys, TrainConfig

# the rest loads on first use: the command line reads the options' defaults from .config alone
_LAZY = {"Config": "data", "DataError": "data", "read_configs": "data", "Trainer": "trainer"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def fine_tune(cfg: TrainConfig, resume: bool = False, **kwargs):
    """Train according to ``cfg``; returns the final metrics summary."""
    from .trainer import Trainer

    return Trainer(cfg, **kwargs).fit(resume=resume)


__all__ = ["Config", "DataError", "DataKeys", "TrainConfig", "Trainer", "fine_tune", "read_configs"]
