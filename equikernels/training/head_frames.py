"""The frames of one head's data (``TrainConfig.head_data``): its training, validation and test
frames read with the head's label keys, its isolated-atom frames set apart (they give E0s), and,
for a named head, every frame tagged with that head."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

from .config import HeadData, TrainConfig
from .data import Config, DataError, check_labels, is_isolated_atom, isolated_atom_e0s, split_train_valid


@dataclass
class HeadFrames:
    head: HeadData
    train: List[Config]
    isolated: List[Config]  # config_type=IsolatedAtom frames of train_file: E0s, not trained on
    isolated_e0s: Dict[int, float]
    valid: List[Config]
    test: List[Config]


def load_head(head: HeadData, cfg: TrainConfig, read: Callable[[str, object], List[Config]],
              say: Callable[[str], None], train_configs: Optional[Sequence[Config]] = None,
              valid_configs: Optional[Sequence[Config]] = None,
              test_configs: Optional[Sequence[Config]] = None) -> HeadFrames:
    """``head``'s frames; ``read(path, keys)`` reads a file. Raises ``DataError`` naming the file
    where labels the loss needs are missing."""
    train = list(train_configs) if train_configs is not None else read(head.train_file, head.keys)
    # as mace-torch: isolated-atom frames of the training data give E0s and are not trained on
    isolated_e0s = isolated_atom_e0s(train)
    isolated = [c for c in train if is_isolated_atom(c)]
    if isolated:
        train = [c for c in train if not is_isolated_atom(c)]
        if not train:
            raise DataError(f"{head.train_file}: holds only isolated-atom frames (config_type=IsolatedAtom), "
                            "which give E0s; add structures to train on")
    if valid_configs is not None:
        valid = list(valid_configs)
    elif head.valid_file:
        valid = read(head.valid_file, head.keys)
    elif head.valid_fraction > 0:
        train, valid = split_train_valid(train, head.valid_fraction, cfg.seed)
    else:
        valid = []
    need = dict(need_energy=cfg.energy_weight > 0, need_forces=cfg.forces_weight > 0,
                need_stress=cfg.stress_weight > 0, keys=head.keys)
    check_labels(train, head.train_file, **need)
    if valid:
        check_labels(valid, head.valid_file or head.train_file, **{**need, "need_stress": False})
    if cfg.stress_weight > 0 and all(c.stress is None for c in train):
        say(f"{head.train_file}: no frame has a stress label (and a periodic cell): training on "
            "energies and forces only")
    if test_configs is not None:
        test = list(test_configs)
    else:
        test = read(head.test_file, head.keys) if head.test_file else []
    if test and all(c.energy is None and c.forces is None and c.stress is None for c in test):
        raise DataError(f"test_file: {head.test_file or '<in memory>'}: no frame has an energy, forces or stress "
                        f"label, so there are no test errors to report (a frame has {test[0].available}); "
                        "set the label keys, or predict unlabelled structures with `equikernels eval`")
    frames = HeadFrames(head, train, isolated, isolated_e0s, valid, test)
    if head.name is not None:  # a head's files train that head, whatever head their frames name
        for field in ("train", "isolated", "valid", "test"):
            setattr(frames, field, [dataclasses.replace(c, head=head.name) for c in getattr(frames, field)])
    return frames
