"""Fine-tuning and training of MACE potentials: ASE-readable data, force/stress losses, AdamW or Adam,
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


def fine_tune(cfg: TrainConfig, resume: bool = False, overwrite: bool = False, **kwargs):
    """Train according to ``cfg``; returns the final metrics summary. An ``out_dir`` holding an
    earlier run is refused unless ``resume`` (continue it) or ``overwrite`` (replace it)."""
    from .outputs import check
    from .trainer import Trainer

    check(cfg.out_dir, resume, overwrite)  # before the data and the model are loaded
    return Trainer(cfg, **kwargs).fit(resume=resume, overwrite=overwrite)


__all__ = ["Config", "DataError", "DataKeys", "TrainConfig", "Trainer", "fine_tune", "read_configs"]
