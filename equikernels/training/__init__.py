"""Fine-tuning and training of MACE potentials: ASE-readable data, force/stress losses, AdamW or Adam,
schedules, EMA, exact-resume checkpoints, early stopping and DDP (``torchrun``).

    from equikernels.training import TrainConfig, fine_tune
    summary = fine_tune(TrainConfig(model="mace.model", train_file="data.xyz", epochs=20))

or ``equikernels fine-tune --model mace.model --train data.xyz --epochs 20``."""
import importlib
import os
from typing import Any, Mapping, Union

from .config import DataKeys, TrainConfig

# the rest loads on first use: the command line reads the options' defaults from .config alone
_LAZY = {"Config": "data", "DataError": "data", "read_configs": "data", "Trainer": "trainer"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def fine_tune(cfg: Union[TrainConfig, Mapping[str, Any], str, os.PathLike], resume: bool = False,
              overwrite: bool = False, **kwargs):
    """Train according to ``cfg`` (a TrainConfig, a mapping of its options or the path of a YAML file
    of them, mace-torch's names translated as in ``--config``; ``resume: true`` there resumes);
    returns the final metrics summary. An ``out_dir`` holding an earlier run is refused unless
    ``resume`` (continue it) or ``overwrite`` (replace it)."""
    from .config import options_of, pop_resume
    from .outputs import check
    from .trainer import Trainer

    if not isinstance(cfg, TrainConfig):
        values = options_of(cfg)
        resume = pop_resume(values, "cfg") or resume
        cfg = TrainConfig.from_dict(values)
    check(cfg.out_dir, resume, overwrite)  # before the data and the model are loaded
    return Trainer(cfg, **kwargs).fit(resume=resume, overwrite=overwrite)


__all__ = ["Config", "DataError", "DataKeys", "TrainConfig", "Trainer", "fine_tune", "read_configs"]
