"""The training loop: data, model, AdamW (or Adam) + schedule + EMA + clipping, evaluation, checkpoints with
exact resume, early stopping, DDP, replay data, a held-out test set, clean stop on SIGINT/SIGTERM.

Exact resume: a checkpoint holds the model, optimiser, scheduler, EMA, best-model and
early-stopping state, the history, every RNG state, and the position in the epoch. The order of
structures in an epoch is a pure function of (seed, epoch), so a resumed run visits exactly the
batches the uninterrupted run would have, and reproduces it bit for bit wherever the model's own
arithmetic is deterministic (CPU; on CUDA, atomic scatter-adds differ in the last bits from run
to run, resumed or not). On CPU the model runs with TorchScript's graph optimiser off: e3nn's
scripted functions (spherical harmonics) otherwise take a different, symbolically differentiated
path from their second call on, so the first step of a fresh process would differ in the last bit.

Processes: every rank runs the same sequence of collectives; work only rank 0 does (files, the
plot, the table) goes through ``distributed.on_main``, which shares its result and its errors."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import random
import signal
import threading
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from tqdm.auto import tqdm

from . import checkpoint as ckpt
from . import distributed as dist_utils
from . import model_factory as mf
from . import outputs
from .config import IN_MEMORY, TrainConfig, options_of, pop_resume
from ..models.data import head_index
from .data import (Config, DataError, GraphDataset, build_dataset, check_elements, collate, frame_head, label_sources,
                   config_from_atoms, read_configs)
from .ema import EMA
from .head_frames import load_head
from .evaluate import forward, metrics_lines, predict
from .loss import error_sums, local_counts, loss_terms, metrics_from_sums, reduce_sums
from .statistics import avg_num_neighbors, average_e0s, parse_given_e0s, scale_shift

_DTYPES = {"float32": torch.float32, "float64": torch.float64}

# options a resumed run may change (the rest decide the data, the model or the batch order)
RESUMABLE_CHANGES = ("epochs", "max_steps", "lr", "out_dir", "checkpoint_every", "keep_checkpoints",
                     "eval_every_epochs", "patience", "save_best", "progress", "plot", "device",
                     "clip_grad_norm", "weight_decay", "energy_weight", "forces_weight", "stress_weight",
                     "loss", "huber_delta", "min_lr_ratio", "plateau_factor", "plateau_patience", "test_file")


class TrainingInterrupted(Exception):
    """A run stopped by SIGINT/SIGTERM, after writing a checkpoint and the metrics so far (or, when
    the stop came while the results were written, after writing them whole)."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def epoch_batches(n: int, batch_size: int, epoch: int, seed: int, rank: int = 0,
                  world: int = 1) -> List[List[int]]:
    """This rank's batches for one epoch. A global batch of ``batch_size * world`` structures is
    drawn from a permutation that depends only on (seed, epoch); rank r takes its r-th share."""
    perm = np.random.default_rng([seed, epoch]).permutation(n).tolist()
    step = batch_size * world
    out = []
    for start in range(0, n, step):
        chunk = perm[start:start + step]
        if len(chunk) < world:  # every rank must take part in every step (DDP)
            break
        out.append(np.array_split(np.array(chunk), world)[rank].tolist())
    return out


def backward_step(model, batch: Dict[str, torch.Tensor], cfg: TrainConfig, stop: bool = False):
    """Forward, loss and backward for one (local share of a) batch; gradients end up in .grad.
    Under DDP each process's gradients are averaged; the loss is scaled so that the average equals
    the gradient of the global-batch loss. ``stop`` (this process wants to stop) rides along in
    the reduction of the loss, so all processes learn whether any wants to, without an extra
    collective. Returns (global loss, its parts, any process wants to stop), detached."""
    counts = reduce_sums(local_counts(batch))
    out = forward(model, batch, training=True, stress=cfg.stress_weight > 0)
    loss, parts = loss_terms(out, batch, cfg, counts)
    (loss * dist_utils.world_size()).backward()
    flag = loss.new_tensor(1.0 if stop else 0.0).detach()
    stats = torch.stack([loss.detach()] + [p.detach() for p in parts.values()] + [flag])
    stats = reduce_sums(stats)
    return float(stats[0]), {k: float(v) for k, v in zip(parts, stats[1:-1])}, bool(stats[-1] > 0)


def _without_tests(heads: Dict) -> Dict:
    """``heads`` without each head's ``test_file``, which a resumed run may change as the run's own."""
    return {name: {k: v for k, v in h.items() if k != "test_file"} if isinstance(h, dict) else h
            for name, h in (heads or {}).items()}


def _names_a_head(name: str, heads: List[str]) -> bool:
    try:
        head_index(name, heads)
    except ValueError:
        return False
    return True


def _head_weights(given: Dict[str, float], heads: List[str]) -> Dict[str, float]:
    """``given`` keyed by the model's own head names (matched by ``head_index``'s rule)."""
    out: Dict[str, float] = {}
    for name, weight in given.items():
        head = heads[head_index(name, heads, unknown="head_weights: {head!r} is not one of the model's heads {heads}")]
        if head in out:
            raise ValueError(f"head_weights: two weights for the head {head!r}; give one")
        out[head] = weight
    return out


def _as_configs(given: Optional[Sequence], name: str, keys) -> Optional[List[Config]]:
    """``given`` structures as training configs: ASE ``Atoms`` are read with the label ``keys``."""
    if given is None:
        return None
    from ase import Atoms  # noqa: PLC0415

    out = []
    for i, item in enumerate(given):
        if isinstance(item, Atoms):
            item = config_from_atoms(item, keys, f"{name}[{i}]")
        elif not isinstance(item, Config):
            raise TypeError(f"{name}[{i}]: expected an ase.Atoms or a training Config, got {type(item).__name__}")
        out.append(item)
    return out


def _config_of(given: Any) -> TrainConfig:
    """The TrainConfig of a mapping of options or a YAML file's path; resuming is an argument of fit."""
    values = options_of(given)
    if pop_resume(values, "cfg"):
        raise ValueError("cfg: resume (mace-torch's restart_latest) is an argument of Trainer.fit or of fine_tune, "
                         "not a training option")
    return TrainConfig.from_dict(values)


def _check_validation_set(cfg: TrainConfig, has_one: bool) -> None:
    """Raises when an option that acts at evaluations has no validation set to evaluate."""
    if not has_one and (cfg.patience is not None or cfg.lr_schedule == "plateau"):
        what = f"patience {cfg.patience}" if cfg.patience is not None else "lr_schedule 'plateau'"
        raise ValueError(f"{what} needs a validation set, which this run has none of; give valid_file (--valid) "
                         "or valid_fraction > 0 (--valid-fraction)")


class Trainer:
    """``Trainer(cfg).fit()``. ``cfg`` is a TrainConfig, a mapping of its options or the path of a YAML
    file of them (mace-torch's names translated as in ``--config``; resuming is ``fit(resume=True)``).
    ``train_configs``/``valid_configs``/``test_configs`` let Python callers pass structures instead of files."""

    def __init__(self, cfg: Union[TrainConfig, Mapping[str, Any], str, os.PathLike], *,
                 train_configs: Optional[Sequence[Config]] = None,
                 valid_configs: Optional[Sequence[Config]] = None,
                 test_configs: Optional[Sequence[Config]] = None, log=print):
        if not isinstance(cfg, TrainConfig):
            cfg = _config_of(cfg)
        if cfg.heads and not (train_configs is None and valid_configs is None and test_configs is None):
            raise ValueError("heads: each head's frames are read from its files; give heads or structures in "
                             "memory (train_configs, valid_configs, test_configs), not both")
        if train_configs is not None and cfg.train_file is None:
            cfg = copy.deepcopy(cfg)
            cfg.train_file = IN_MEMORY
        self.cfg = cfg.validate()
        _check_validation_set(cfg, valid_configs is not None or any(h.valid_file or h.valid_fraction > 0
                                                                   for h in cfg.head_data()))
        train_configs, valid_configs, test_configs = (
            _as_configs(given, name, cfg.keys) for given, name in ((train_configs, "train_configs"),
                                                                   (valid_configs, "valid_configs"),
                                                                   (test_configs, "test_configs")))
        self.log = log
        device = torch.device(cfg.device) if cfg.device else dist_utils.default_device()
        self.dist = dist_utils.setup(device)
        self.device = self.dist.device or device
        seed_everything(cfg.seed)
        self._stop_signal: Optional[int] = None
        self._load_data(train_configs, valid_configs, test_configs)
        self._build_model()
        self._build_optimiser()
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.epoch_evaluated = False
        self.history: Dict[str, List] = {"train": [], "valid": []}
        self.best = {"loss": math.inf, "step": None, "epoch": None, "state": None, "bad_evals": 0}
        self.stopped_early = False
        self.resumed = False  # a checkpoint was loaded (resume): fit continues that run

    # ---- setup --------------------------------------------------------------------------------
    def _read(self, path: str, keys=None) -> List[Config]:
        configs = read_configs(path, keys or self.cfg.keys)
        self._say(f"{path}: {len(configs)} structures; {label_sources(configs)}")
        return configs

    def _load_data(self, train_configs, valid_configs, test_configs=None):
        cfg = self.cfg
        for name in ("train_file", "valid_file", "test_file"):  # heads that give their own leave the run's unread
            own = ("valid_file", "valid_fraction") if name == "valid_file" else (name,)  # a head's fraction: its split
            if cfg.heads and getattr(cfg, name) is not None and all(set(own) & set(h) for h in cfg.heads.values()):
                self._say(f"{name} {getattr(cfg, name)!r} is not read: every head of heads gives its own "
                          + " or ".join(own))
        self.head_frames = [load_head(head, cfg, self._read, self._say, train_configs, valid_configs, test_configs)
                            for head in cfg.head_data()]
        self.isolated_configs = [c for g in self.head_frames for c in g.isolated]
        train = [c for g in self.head_frames for c in g.train]
        valid = [c for g in self.head_frames for c in g.valid]
        test = [c for g in self.head_frames for c in g.test]
        if not valid:  # an empty validation set given in memory
            _check_validation_set(cfg, False)
        self.replay_configs = self._read(cfg.replay_file) if cfg.replay_file else []
        self.train_configs, self.valid_configs, self.test_configs = train, valid, test

    def _build_model(self):
        cfg = self.cfg
        if cfg.model is not None:
            model = mf.load_model(cfg.model, cfg.model_backend)
            if cfg.model_head is not None:
                model = mf.one_head(model, cfg.model_head)
            z_table = mf.atomic_numbers(model)
        else:
            zs = sorted({int(z) for c in self.train_configs + self.valid_configs + self.replay_configs
                         + self.isolated_configs for z in c.atomic_numbers})
            z_table, model = zs, None
        dtype = _DTYPES[cfg.dtype] if cfg.dtype else (mf.model_dtype(model) if model is not None else torch.float64)
        cutoff = (mf.r_max(model) if model is not None
                  else float((cfg.new_model or {}).get("r_max", mf.DEFAULT_NEW_MODEL["r_max"])))
        named = [g.head.name for g in self.head_frames if g.head.name is not None]
        if model is None:
            head_names = named or ["Default"]
        else:
            head_names = mf.heads(model)
            if len(named) == 1 and len(head_names) == 1 and not _names_a_head(named[0], head_names):
                self._say(f"heads: the model's one head {head_names[0]!r} is trained as {named[0]!r}, the name "
                          "the fine-tuned model gives it (as mace-torch's does)")
                mf.rename_heads(model, named)
                head_names = named
            for name in named:  # before any frame is matched, so that the message names the option
                head_index(name, head_names, unknown="heads: {head!r} is not one of the model's heads {heads} (a "
                                                     "model's heads are fixed by its file; a new model gets the "
                                                     "heads given)")
        self.head_names = head_names
        self.head_weights = _head_weights(cfg.head_weights, head_names)

        row_e0s = self._row_e0s(model, z_table, head_names)
        if model is None:
            # one row per head: mace-torch's constructor sizes its E0 table by the rows it is given
            e0_rows = np.array([[row_e0s.get(r, {}).get(z, 0.0) for z in z_table] for r in range(len(head_names))])
            e0_vec = e0_rows[0] if len(head_names) == 1 else e0_rows
            by_row: Dict[int, List[Config]] = {}
            for c in self.train_configs:
                by_row.setdefault(frame_head(c, head_names), []).append(c)
            stats = [scale_shift(by_row.get(r, []), row_e0s.get(r, {})) for r in range(len(head_names))]
            scale, shift = ((stats[0][0], stats[0][1]) if len(stats) == 1
                            else ([s for s, _ in stats], [t for _, t in stats]))
            graphs = build_dataset(self.train_configs, z_table, cutoff, head_names).graphs
            with _default_dtype(dtype):
                model = mf.build_new_model(cfg.new_model, z_table, e0_vec, avg_num_neighbors(graphs),
                                           scale, shift, head_names, cfg.model_backend)
        # the starting model's errors are with the E0s set here: the rows say so where a loaded model's changed
        self.start_e0s_set = cfg.model is not None and any(row_e0s.values())
        if any(row_e0s.values()):
            table = mf.get_e0s(model)
            for row, values in row_e0s.items():
                for z, e in values.items():
                    table[row, z_table.index(z)] = e
            mf.set_e0s(model, table)
        model = model.to(device=self.device, dtype=dtype)
        self.model, self.dtype = model, dtype
        replay = self._label_replay(self.replay_configs)
        train = [self._weighted(c, self._frame_factor(c, g.head.config_type_weights))
                 for g in self.head_frames for c in g.train]
        train += [self._weighted(c, cfg.replay_weight * self._frame_factor(c, cfg.config_type_weights)) for c in replay]
        self.train_set = build_dataset(train, z_table, cutoff, head_names)
        trained = {self._head_of(c) for c in self.train_configs + replay}
        idle = sorted(h for h, w in self.head_weights.items() if h not in trained and w != 1)
        if idle:
            how = ("the heads block names each head's files" if cfg.heads
                   else f"a frame names its head in info '{cfg.keys.head}'")
            self._say(f"head_weights: no training frame is of head {', '.join(map(repr, idle))} (the frames' "
                      f"heads: {', '.join(map(repr, sorted(trained)))}; {how})")
        own = [g for g in self.head_frames
               if g.head.name is not None and "config_type_weights" in cfg.heads[g.head.name]]
        uses = [(f"heads: {g.head.name}: ", g.head.config_type_weights, g.train) for g in own]
        uses.append(("", cfg.config_type_weights,
                     [c for g in self.head_frames if all(g is not o for o in own) for c in g.train] + replay))
        for where, weights, frames in uses:  # each mapping against the frames it weights
            types = {c.config_type for c in frames}
            unused = sorted(str(k) for k, w in weights.items() if str(k) not in types and w != 1)
            if unused and frames:
                self._say(f"{where}config_type_weights: no training frame has config_type "
                          f"{', '.join(map(repr, unused))} (the frames have {', '.join(map(repr, sorted(types)))})")
        self.valid_set = build_dataset(self.valid_configs, z_table, cutoff, head_names)
        self.test_set = build_dataset(self.test_configs, z_table, cutoff, head_names)
        if cfg.freeze:
            frozen = mf.freeze(model, cfg.freeze)
            self._say(f"frozen {len(frozen)} parameter tensors ({', '.join(cfg.freeze)})")
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.ddp = dist_utils.wrap_ddp(model, self.params, self.device) if self.dist.enabled else model

    def _frame_factor(self, c: Config, type_weights: Dict) -> float:
        """A training frame's loss-weight multiplier from its head and its config_type."""
        by_type = {str(k): float(w) for k, w in type_weights.items()}
        return self.head_weights.get(self._head_of(c), 1.0) * by_type.get(c.config_type, 1.0)

    def _head_of(self, c: Config) -> str:
        """The model head a frame trains (a frame naming no head, 'Default', trains a single-head model's one)."""
        return self.head_names[frame_head(c, self.head_names)]

    @staticmethod
    def _weighted(c: Config, factor: float) -> Config:
        return c if factor == 1.0 else dataclasses.replace(c, weight=c.weight * factor)

    def _label_replay(self, configs: List[Config]) -> List[Config]:
        """Replay frames as given; those without an energy or forces label get the starting
        model's predictions for the missing ones (and its stress, for periodic frames)."""
        missing = [i for i, c in enumerate(configs) if c.energy is None or c.forces is None]
        if not missing:
            return configs
        out = list(configs)
        preds, _ = predict(self.model, [configs[i] for i in missing], dtype=self.dtype, device=self.device,
                           batch_size=self.cfg.batch_size)
        for i, p in zip(missing, preds):
            c = configs[i]
            out[i] = dataclasses.replace(
                c, energy=c.energy if c.energy is not None else p.energy,
                forces=c.forces if c.forces is not None else p.forces,
                stress=c.stress if c.stress is not None else p.stress)
        self._say(f"{self.cfg.replay_file}: {len(missing)} of {len(configs)} replay frames labelled by the "
                  "starting model")
        return out

    def _row_e0s(self, model, z_table, head_names) -> Dict[int, Dict[int, float]]:
        """Head row -> E0s to write ({} keeps the model's own), for the rows the training frames name
        only, since the other heads are not trained and must keep their predictions. Per head's data:
        given values win over its isolated-atom frames, which win over 'foundation'; 'average' (and
        any new model) is fitted on the head's frames, per row where they name several heads."""
        from ase.data import chemical_symbols

        out: Dict[int, Dict[int, float]] = {}
        for g in self.head_frames:
            check_elements(g.isolated, z_table)
            mode, isolated = g.head.e0s, g.isolated_e0s
            rows: Dict[int, List[Config]] = {}
            for c in g.train:
                rows.setdefault(frame_head(c, head_names), []).append(c)
            try:
                out.update(self._head_e0s(g, mode, isolated, rows, model, z_table))
            except ValueError as exc:  # name the head whose E0s they are
                if g.head.name is None or isinstance(exc, DataError):
                    raise
                raise ValueError(f"heads: {g.head.name}: {exc}") from None
            if isolated:  # said after the given e0s are read: they win over these frames
                given = parse_given_e0s(mode, z_table) if isinstance(mode, dict) else {}
                used = {z: e for z, e in isolated.items() if z not in given}
                words = ["E0s from the isolated-atom frames (config_type=IsolatedAtom): " + ", ".join(
                    f"{chemical_symbols[z]} {e:.6g} eV" for z, e in sorted(used.items()))] if used else []
                if len(used) < len(isolated):
                    words.append("the given e0s replace the isolated-atom frames' " + ", ".join(
                        f"{chemical_symbols[z]} {e:.6g} eV" for z, e in sorted(isolated.items()) if z in given))
                of = f"heads: {g.head.name}: " if g.head.name is not None else ""
                self._say(of + "; ".join(words))
        return out

    @staticmethod
    def _head_e0s(g, mode, isolated, rows, model, z_table) -> Dict[int, Dict[int, float]]:
        """Head row -> E0s for the rows (``rows``: row -> frames) of one head's data ``g``."""
        if isinstance(mode, dict):
            values = {**isolated, **parse_given_e0s(mode, z_table)}
            return {row: values for row in rows}
        if mode != "average" and model is not None:
            return {row: dict(isolated) for row in rows}
        if len(rows) == 1:
            return {row: average_e0s(g.train, z_table, fixed=isolated) for row in rows}
        return {row: average_e0s(configs, z_table, fixed=isolated) for row, configs in rows.items()
                if isolated or any(c.energy is not None for c in configs)}

    def _schedule_factor(self, step: int) -> float:
        cfg = self.cfg
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        total = cfg.epochs * self.steps_per_epoch
        t = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    def _build_optimiser(self):
        cfg = self.cfg
        adam = torch.optim.Adam if cfg.optimizer == "adam" else torch.optim.AdamW
        self.optimizer = adam(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay, amsgrad=cfg.amsgrad)
        self.steps_per_epoch = len(epoch_batches(len(self.train_set), cfg.batch_size, 0, cfg.seed,
                                                 self.dist.rank, self.dist.world_size))
        if self.steps_per_epoch == 0:
            raise ValueError(f"{len(self.train_set)} training structure(s) cannot fill one step on "
                             f"{self.dist.world_size} process(es)")
        if cfg.lr_schedule == "plateau":
            self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
                self.optimizer, factor=cfg.plateau_factor, patience=cfg.plateau_patience)
        else:
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._schedule_factor)
        self.ema = EMA(self.params, cfg.ema_decay) if cfg.ema_decay else None

    # ---- state --------------------------------------------------------------------------------
    @property
    def ckpt_dir(self) -> str:
        return outputs.checkpoint_dir(self.cfg.out_dir)

    def state_dict(self) -> Dict:
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "ema": self.ema.state_dict() if self.ema else None,
            "step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            "epoch_evaluated": self.epoch_evaluated, "history": self.history, "best": self.best,
            "stopped_early": self.stopped_early, "rng": ckpt.rng_states(), "config": self.cfg.to_dict(),
            "world_size": self.dist.world_size,
        }

    def _check_resumable(self, saved: Dict, optimizer_state: Optional[Dict] = None) -> List[str]:
        """Options changed since the checkpoint: refuse those that would change the data, the
        model or the batch order; return the honoured ones. Options added since the checkpoint was
        written count as their defaults, except ``amsgrad``: what the checkpoint's optimiser ran."""
        now = self.cfg.to_dict()
        before = TrainConfig().to_dict()
        groups = (optimizer_state or {}).get("param_groups") or [{}]
        if "amsgrad" in groups[0]:
            before["amsgrad"] = bool(groups[0]["amsgrad"])
        saved = {**before, **saved}
        changed = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        refused = [k for k in changed if k not in RESUMABLE_CHANGES
                   and not (k == "heads" and _without_tests(saved[k]) == _without_tests(now[k]))]
        if refused:
            what = ", ".join(f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in refused)
            hint = (" (amsgrad defaults to true, as in mace-torch: a run of plain AdamW continues with --no-amsgrad "
                    "or amsgrad: false)" if "amsgrad" in refused and not saved["amsgrad"] else "")
            raise ValueError(f"cannot resume with changed {what}: the checkpoint's run used the old value(s), "
                             f"and continuing would not be the same run; restore them{hint}, or start a new run "
                             "in another --out directory")
        return [k for k in changed if k != "out_dir"]

    def load_state_dict(self, state: Dict) -> None:
        if state["world_size"] != self.dist.world_size:
            raise ValueError(f"checkpoint was written by {state['world_size']} process(es); resuming with "
                             f"{self.dist.world_size} would change the data order")
        honoured = self._check_resumable(state["config"], state.get("optimizer")) if state.get("config") else []
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None and state["ema"] is not None:
            self.ema.load_state_dict(state["ema"])
        for key in ("step", "epoch", "batch_in_epoch", "epoch_evaluated", "history", "best", "stopped_early"):
            setattr(self, key, state[key])
        self.best.setdefault("epoch", None)
        ckpt.set_rng_states(state["rng"])
        if "lr" in honoured:
            self._set_base_lr(self.cfg.lr)
        for key in ("weight_decay",):
            if key in honoured:
                for group in self.optimizer.param_groups:
                    group[key] = getattr(self.cfg, key)
        if honoured:
            old = state["config"]
            self._say("resuming with changed " + ", ".join(
                f"{k} {old.get(k)!r} -> {getattr(self.cfg, k)!r}" for k in honoured))

    def _set_base_lr(self, lr: float) -> None:
        """A new base learning rate for the rest of the run: the schedule continues from where it
        was, scaled to the new base (plateau: the new value, reductions start again)."""
        for group in self.optimizer.param_groups:
            group["initial_lr"] = lr
            group["lr"] = lr
        if isinstance(self.scheduler, torch.optim.lr_scheduler.LambdaLR):
            self.scheduler.base_lrs = [lr] * len(self.optimizer.param_groups)
            factor = self._schedule_factor(self.scheduler.last_epoch)
            for group in self.optimizer.param_groups:
                group["lr"] = lr * factor
            self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def save_checkpoint(self) -> None:
        state = self.state_dict() if self.dist.is_main else None
        dist_utils.on_main(lambda: ckpt.save(self.ckpt_dir, self.step, state, self.cfg.keep_checkpoints))

    def resume(self, path: Optional[str] = None) -> bool:
        """Continue from ``path`` or the newest checkpoint in out_dir; False when there is none."""
        path = path or ckpt.latest(self.ckpt_dir)
        if path is None:
            return False
        self.load_state_dict(ckpt.load(path))
        self.resumed = True
        self._say(f"resumed from {path} at step {self.step}, continuing with epoch {self.epoch + 1}")
        return True

    # ---- evaluation ---------------------------------------------------------------------------
    def evaluate(self, dataset: GraphDataset, batch_size: Optional[int] = None) -> Dict[str, float]:
        """RMSE/MAE over ``dataset`` with the weights now in the model, shared across processes."""
        return self._metrics(self._error_sums(dataset, batch_size).sum(0))

    def evaluate_heads(self, dataset: GraphDataset, batch_size: Optional[int] = None
                       ) -> Tuple[Dict[str, float], Dict[str, Dict[str, float]]]:
        """``evaluate``'s errors over ``dataset``, and the same per model head (name -> errors) over
        that head's frames, for the heads with frames in ``dataset``; one pass over the frames."""
        sums = self._error_sums(dataset, batch_size)
        rows = sorted({int(g.head) for g in dataset.graphs})
        return self._metrics(sums.sum(0)), {self.head_names[r]: self._metrics(sums[r]) for r in rows}

    def _error_sums(self, dataset: GraphDataset, batch_size: Optional[int] = None) -> torch.Tensor:
        """``error_sums`` over ``dataset``, [head rows, 3, 3], summed across processes."""
        sums = torch.zeros(len(self.head_names), 3, 3, dtype=torch.float64, device=self.device)
        mine = list(range(self.dist.rank, len(dataset), self.dist.world_size))
        bs = batch_size or self.cfg.batch_size
        need_stress = any(dataset.graphs[i].stress_weight > 0 for i in mine)
        by_row: Dict[int, List[int]] = {}
        for i in mine:  # one head's frames per batch, so that each head's sums stay apart
            by_row.setdefault(int(dataset.graphs[i].head), []).append(i)
        self.model.eval()
        for row, idx in sorted(by_row.items()):
            for k in range(0, len(idx), bs):
                batch = collate([dataset.graphs[i] for i in idx[k:k + bs]], self.dtype, self.device)
                out = forward(self.model, batch, training=False, stress=need_stress)
                sums[row] += error_sums(out, batch)
        self.model.train()
        return reduce_sums(sums)

    def _metrics(self, sums: torch.Tensor) -> Dict[str, float]:
        """MAE/RMSE from [3, 3] error sums, and the validation loss they make."""
        result = metrics_from_sums(sums)
        cfg = self.cfg
        result["loss"] = (cfg.energy_weight * result.get("rmse_energy_per_atom", 0.0) ** 2
                          + cfg.forces_weight * result.get("rmse_forces", 0.0) ** 2
                          + cfg.stress_weight * result.get("rmse_stress", 0.0) ** 2)
        return result

    def _ema_context(self):
        return self.ema.average_parameters() if self.ema is not None else contextlib.nullcontext()

    def _evaluate_start(self) -> None:
        """The starting model's validation and test errors, once, before the first step."""
        for key, dataset, what in (("valid_start", self.valid_set, ""), ("test_start", self.test_set, " (test)")):
            if key in self.history or not len(dataset):
                continue
            metrics, heads = self.evaluate_heads(dataset)
            self.history[key] = metrics
            if self._per_head():
                self.history.setdefault("per_head_start", {})[key] = heads
            self._say(f"{_start_label(self.start_e0s_set)}{what}: " + _format_metrics(metrics))

    def _per_head(self) -> bool:
        """Whether errors are also reported per head: the frames evaluated (training, validation and
        test sets) are of more than one head."""
        return len({int(g.head) for d in (self.train_set, self.valid_set, self.test_set) for g in d.graphs}) > 1

    def _per_head_summary(self, by_key: Dict[str, Dict[str, Dict]]) -> Dict[str, Dict[str, Dict]]:
        """Summary key -> head -> errors, as head -> summary key -> errors in the model's head order."""
        return {h: {k: heads[h] for k, heads in by_key.items() if h in heads}
                for h in self.head_names if any(h in heads for heads in by_key.values())}

    def _end_of_epoch(self) -> None:
        cfg = self.cfg
        if not len(self.valid_set) or (self.epoch + 1) % cfg.eval_every_epochs:
            return
        with self._ema_context():
            metrics = self.evaluate(self.valid_set)
            improved = metrics["loss"] < self.best["loss"]
            if improved:
                self.best.update(loss=metrics["loss"], step=self.step, epoch=self.epoch + 1, bad_evals=0,
                                 state={k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()})
        if not improved:
            self.best["bad_evals"] += 1
        if cfg.lr_schedule == "plateau":
            self.scheduler.step(metrics["loss"])
        self.history["valid"].append({"step": self.step, "epoch": self.epoch + 1, **metrics})
        self._say(f"epoch {self.epoch + 1}: " + _format_metrics(metrics))
        if cfg.patience is not None and self.best["bad_evals"] >= cfg.patience:
            self.stopped_early = True
            self._say(f"early stop: no improvement in {cfg.patience} evaluation(s)")

    # ---- signals ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _stop_on_signals(self):
        """SIGINT/SIGTERM ask the loop to stop after the current step; a second one stops at once."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = [signal.SIGINT, signal.SIGTERM]
        old = {s: signal.getsignal(s) for s in sigs}

        def handler(signum, frame):
            self._stop_signal = signum
            for s in sigs:  # the next one acts at once
                signal.signal(s, old[s] if callable(old[s]) else signal.SIG_DFL)

        for s in sigs:
            signal.signal(s, handler)
        try:
            yield
        finally:
            for s in sigs:
                signal.signal(s, old[s])

    def _stop_requested(self) -> bool:
        """Whether any process has been asked to stop; every process calls it at the same points."""
        if not self.dist.enabled:
            return self._stop_signal is not None
        flag = torch.tensor([1.0 if self._stop_signal is not None else 0.0], dtype=torch.float64, device=self.device)
        return bool(reduce_sums(flag)[0] > 0)

    def _interrupted(self, where: Optional[str] = None, checkpointed: bool = False) -> None:
        """Write a checkpoint (unless the newest one already holds this state) and the metrics so far,
        then raise ``TrainingInterrupted``; ``where`` names the phase when it is not a training step."""
        signum = self._stop_signal or signal.SIGTERM
        name = signal.Signals(signum).name
        if not checkpointed:
            self.save_checkpoint()
        summary = {"interrupted": name, "step": self.step, "epoch": self.epoch,
                   "valid_start": self.history.get("valid_start"), "test_start": self.history.get("test_start"),
                   "start_e0s_set": self.start_e0s_set}
        if self.history.get("per_head_start"):
            summary["per_head"] = self._per_head_summary(self.history["per_head_start"])
        metrics = dist_utils.on_main(lambda: self._write_metrics(summary))
        at = where or f"at step {self.step} (epoch {self.epoch + 1})"
        msg = (f"stopped by {name} {at}: checkpoint in {self.ckpt_dir}, metrics so far in {metrics}; "
               "continue with --resume")
        self._say(msg)
        raise TrainingInterrupted(signum, msg)

    # ---- the loop -----------------------------------------------------------------------------
    def fit(self, resume: bool = False, overwrite: bool = False) -> Dict:
        """Train; ``resume`` continues from the newest checkpoint in out_dir, ``overwrite`` replaces an
        earlier run there (without either, an out_dir holding one is refused: outputs.check). In a
        multi-process run every rank returns together, so a caller may close the process group at once."""
        outputs.check(self.cfg.out_dir, resume or self.resumed, overwrite, inputs=self.cfg.input_files())
        if overwrite:
            removed = dist_utils.on_main(lambda: outputs.clear(self.cfg.out_dir))
            if removed:
                self._say(f"removed the earlier run in {self.cfg.out_dir}: {outputs.describe(removed)}")
        dist_utils.on_main(self._prepare_out_dir)
        if resume and not self.resume():
            self._say(f"no checkpoint in {self.ckpt_dir}; starting from the beginning")
        with self._stop_on_signals():  # a stop asked for in any phase ends the run with TrainingInterrupted
            if self.step == 0 and self.batch_in_epoch == 0:
                self._evaluate_start()
                if self._stop_requested():
                    self._interrupted("during the starting model's evaluation, before the first step")
            self._loop()
            if self._stop_requested():  # asked during the last evaluation: the final one is not run
                self._interrupted(f"after step {self.step}, before the final evaluation and model files",
                                  checkpointed=True)
            summary = self._finish()
        dist_utils.barrier()  # a rank that closes its connections while a peer still reads aborts it (gloo)
        return summary

    def _prepare_out_dir(self) -> None:
        os.makedirs(self.cfg.out_dir, exist_ok=True)
        removed = ckpt.remove_stale_temporaries([self.cfg.out_dir, self.ckpt_dir])
        if removed:
            self._say(f"removed {len(removed)} unfinished file(s) of an interrupted run: "
                      + ", ".join(os.path.basename(p) for p in removed))

    def _loop(self) -> None:
        cfg = self.cfg
        self.ddp.train()
        while self.epoch < cfg.epochs and not self.stopped_early and not self._budget_spent():
            batches = epoch_batches(len(self.train_set), cfg.batch_size, self.epoch, cfg.seed,
                                    self.dist.rank, self.dist.world_size)
            bar = tqdm(total=len(batches), initial=self.batch_in_epoch, desc=f"epoch {self.epoch + 1}/{cfg.epochs}",
                       disable=not (cfg.progress and self.dist.is_main), leave=False, dynamic_ncols=True)
            try:
                while self.batch_in_epoch < len(batches) and not self._budget_spent():
                    batch = collate([self.train_set.graphs[i] for i in batches[self.batch_in_epoch]],
                                    self.dtype, self.device)
                    loss, parts, stop = self._train_step(batch)
                    self.batch_in_epoch += 1
                    self.history["train"].append({"step": self.step, "epoch": self.epoch, "loss": loss,
                                                  "lr": self.optimizer.param_groups[0]["lr"], **parts})
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.4g}")
                    if stop:
                        bar.close()
                        self._interrupted()
                    if self.step % cfg.checkpoint_every == 0:
                        self.save_checkpoint()
            finally:
                bar.close()
            if self.batch_in_epoch < len(batches):
                break  # max_steps reached mid-epoch
            if not self.epoch_evaluated:
                self._end_of_epoch()
                self.epoch_evaluated = True
            self.epoch += 1
            self.batch_in_epoch = 0
            self.epoch_evaluated = False
        self.save_checkpoint()

    def _budget_spent(self) -> bool:
        return self.cfg.max_steps is not None and self.step >= self.cfg.max_steps

    def _train_step(self, batch):
        cfg = self.cfg
        # under DDP the gradients stay views of its buckets (distributed.wrap_ddp): zeroed, not dropped
        self.optimizer.zero_grad(set_to_none=not self.dist.enabled)
        loss, parts, stop = backward_step(self.ddp, batch, cfg, stop=self._stop_signal is not None)
        if not math.isfinite(loss):
            raise FloatingPointError(f"training loss is {loss} at step {self.step + 1} (epoch {self.epoch + 1}); "
                                     "lower lr or check the data")
        if cfg.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, cfg.clip_grad_norm)
        self.optimizer.step()
        if cfg.lr_schedule != "plateau":
            self.scheduler.step()
        if self.ema is not None:
            self.ema.update()
        self.step += 1
        return loss, parts, stop

    def _last_state(self) -> Dict[str, torch.Tensor]:
        """The weights at the end of training (the EMA's, when there is one)."""
        with self._ema_context():
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def load_final_weights(self) -> torch.nn.Module:
        """Put the weights to ship into the model, in place (training is over; continue a run
        with a new Trainer and ``resume``): the best validation weights when tracked, else the
        EMA weights, else the last ones. No copy of the model is made: some modules (e3nn's
        generated code, compiled kernels) do not survive deepcopy/pickling on every setup."""
        if self.cfg.save_best and self.best["state"] is not None:
            self.model.load_state_dict(self.best["state"])
        elif self.ema is not None:
            with torch.no_grad():
                for p, s in zip(self.ema.params, self.ema.shadow):
                    p.copy_(s)
        return self.model

    def _finish(self) -> Dict:
        """Evaluate (training, validation and test sets) and save the shipped model (best validation
        epoch, or the last weights) and, when they differ, the last weights too; every rank takes part
        in every evaluation, so the test set never leaves a process waiting."""
        cfg = self.cfg
        last = self._last_state()
        final = self.load_final_weights()
        best_is_last = self.best["step"] == self.step
        saved = "best" if cfg.save_best and self.best["state"] is not None and not best_is_last else "last"
        by_key: Dict[str, Dict[str, Dict]] = {}  # summary key -> head -> errors

        def evaluate(key: str, dataset: GraphDataset) -> None:
            summary[key], by_key[key] = self.evaluate_heads(dataset)

        summary: Dict = {}
        evaluate("train", self.train_set)
        if len(self.valid_set):
            evaluate("valid", self.valid_set)
        if len(self.test_set):
            evaluate("test", self.test_set)
        if self._stop_requested():  # the model now holds the final weights: the loop's checkpoint stays
            self._interrupted(f"after step {self.step}, during the final evaluation (no model file written)",
                              checkpointed=True)
        for key in ("valid_start", "test_start"):
            if key in self.history:
                summary[key] = self.history[key]
                if key in self.history.get("per_head_start", {}):
                    by_key[key] = self.history["per_head_start"][key]
        summary["start_e0s_set"] = self.start_e0s_set
        summary.update(step=self.step, epochs_completed=self.epoch, stopped_early=self.stopped_early,
                       best_step=self.best["step"], best_epoch=self.best.get("epoch"), saved=saved)
        summary.update(dist_utils.on_main(lambda: self._save_models(final, outputs.MODEL, outputs.MACE_MODEL)))
        if saved == "best":  # keep the last weights as well
            self.model.load_state_dict(last)
            evaluate("valid_last", self.valid_set)
            if len(self.test_set):
                evaluate("test_last", self.test_set)
            paths = dist_utils.on_main(
                lambda: self._save_models(self.model, outputs.MODEL_LAST, outputs.MACE_MODEL_LAST))
            summary.update({k.replace("_path", "_last_path"): v for k, v in paths.items()})
            self.model.load_state_dict(self.best["state"])
        else:  # an earlier, interrupted part of this run may have left last weights that are not these
            dist_utils.on_main(lambda: self._remove_outputs(outputs.MODEL_LAST, outputs.MACE_MODEL_LAST))
        if self._per_head():
            summary["per_head"] = self._per_head_summary(by_key)
        summary.update(dist_utils.on_main(lambda: self._report(summary)))
        if self._stop_requested():  # the files were written whole; the run still ends as interrupted
            signum = self._stop_signal or signal.SIGTERM
            msg = (f"stopped by {signal.Signals(signum).name} while the results were written; they are complete "
                   f"(model and metrics in {cfg.out_dir})")
            self._say(msg)
            raise TrainingInterrupted(signum, msg)
        return summary

    def _save_models(self, model, name: str, mace_name: str) -> Dict[str, str]:
        cfg = self.cfg
        out = {"model_path": mf.save_model(model, os.path.join(cfg.out_dir, name))}
        if mf.have_mace():  # also usable by mace-torch's own tools
            try:
                out["mace_model_path"] = mf.save_mace_torch(model, os.path.join(cfg.out_dir, mace_name),
                                                            template=cfg.model)
            except Exception as exc:  # a model mace-torch cannot express; ours is the product
                self._remove_outputs(mace_name)  # never leave an earlier part of the run's file in its place
                warnings.warn(f"could not also save a mace-torch model file: {exc}", stacklevel=2)
        elif self._remove_outputs(mace_name):  # an earlier part of the run's file would not hold these weights
            warnings.warn(f"removed {os.path.join(cfg.out_dir, mace_name)}, written by an earlier part of this run: "
                          f"mace-torch is not installed to write it for these weights (with mace-torch, "
                          f"`equikernels convert {out['model_path']} OUT.model --to mace` writes it)", stacklevel=2)
        return out

    def _remove_outputs(self, *names: str) -> List[str]:
        """Remove the run's files ``names`` that exist; returns their paths."""
        removed = []
        for name in names:
            path = os.path.join(self.cfg.out_dir, name)
            if os.path.isfile(path):
                os.remove(path)
                removed.append(path)
        return removed

    def _write_metrics(self, summary: Dict) -> str:
        path = os.path.join(self.cfg.out_dir, outputs.METRICS)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump({"summary": summary, "history": self.history}, fh, indent=1)
        os.replace(tmp, path)
        return path

    def _report(self, summary: Dict) -> Dict[str, str]:
        cfg = self.cfg
        out = {}
        self._write_metrics(summary)
        if cfg.plot and self.history["train"]:
            from .plot import plot_history

            out["plot_path"] = plot_history(self.history, os.path.join(cfg.out_dir, outputs.PLOT))
        self._say(metrics_table({**summary, **out}))
        return out

    def _say(self, msg: str) -> None:
        if self.dist.is_main and self.log is not None:
            self.log(msg)


class _default_dtype:
    """mace-torch builds its constants in the default dtype: build in the training dtype."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.old = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.old)


def _format_metrics(m: Dict[str, float]) -> str:
    parts = [f"loss {m['loss']:.4g}"]
    for prop, unit in (("energy_per_atom", "meV/atom"), ("forces", "meV/Å"), ("stress", "meV/Å³")):
        if f"rmse_{prop}" in m:
            parts.append(f"RMSE {prop} {1000 * m[f'rmse_{prop}']:.2f} {unit}")
    return ", ".join(parts)


def _start_label(e0s_set: bool) -> str:
    return "starting model with the new E0s" if e0s_set else "starting model"


def metrics_table(summary: Dict) -> str:
    """The closing table: the starting and the saved model on the validation set and on the test
    set (and the last weights when the saved ones are the best epoch's), and the saved model on the
    training set; then the same rows per head (``per_head``) where the frames are of several heads."""
    saved = summary.get("saved", "last")
    which = (f"best validation epoch ({summary.get('best_epoch')})" if saved == "best"
             else "last weights")
    start = _start_label(summary.get("start_e0s_set", False))
    rows = [("valid_start", f"valid, {start}"), ("valid", f"valid, saved = {which}"),
            ("valid_last", "valid, last weights"), ("test_start", f"test, {start}"),
            ("test", f"test, saved = {which}"), ("test_last", "test, last weights"), ("train", "train, saved model")]
    blocks = [("", summary)] + [(f"head {head}: ", m) for head, m in summary.get("per_head", {}).items()]
    lines = metrics_lines([(prefix + label, block.get(key)) for prefix, block in blocks for key, label in rows])
    if "model_path" in summary:
        lines.append(f"saved: {summary['model_path']} ({which})"
                     + (f", {summary['model_last_path']} (last weights)" if "model_last_path" in summary else "")
                     + (f"; mace-torch: {summary['mace_model_path']}" if "mace_model_path" in summary else ""))
    return "\n".join(lines)
