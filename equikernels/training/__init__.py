"""Fine-tuning and training of MACE potentials: ASE-readable data, force/stress losses, AdamW,
schedules, EMA, exact-resume checkpoints, early stopping and DDP (``torchrun``).

    from equikernels.training import TrainConfig, fine_tune
    summary = fine_tune(TrainConfig(model="mace.model", train_file="data.xyz", epochs=20))

or ``equikernels fine-tune --model mace.model --train data.xyz --epochs 20``."""
from .config import DataKeys, TrainConfig
from .data import Config, DataError, read_configs
from .trainer import Trainer


def fine_tune(cfg: TrainConfig, resume: bool = False, **kwargs):
    """Train according to ``cfg``; returns the final metrics summary."""
    return Trainer(cfg, **kwargs).fit(resume=resume)


__all__ = ["Config", "DataError", "DataKeys", "TrainConfig", "Trainer", "fine_tune", "read_configs"]
