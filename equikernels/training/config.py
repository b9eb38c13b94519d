"""All training options in one place: a dataclass that a YAML file, CLI flags or Python fill in.
Unknown or ill-typed options are rejected with the option's name.

Defaults are mace-torch's (``mace_run_train`` 0.3) where an option means the same there: AdamW's
AMSGrad variant on (``amsgrad: false`` / ``--no-amsgrad`` turns it off), weight decay 5e-7, EMA decay
0.99, gradient clipping 10, plateau factor 0.8, energy and stress weights 1, Huber delta 0.01,
validation fraction 0.1, an evaluation every epoch. Others are set for fine-tuning a trained model,
where mace-torch's are set for training from scratch (theirs in brackets): ``lr`` 1e-3 (0.01),
``epochs`` 10 (2048), ``batch_size`` 4 (10), ``forces_weight`` 10 (100), ``lr_schedule`` cosine
(ReduceLROnPlateau with patience 50; our ``plateau_patience`` is 5, for runs of a few epochs), EMA on
(off unless ``ema``), ``loss`` mse with the stress term wherever frames have stress labels (``weighted``:
energies and forces only), ``dtype`` the model's own (``default_dtype`` float64), ``seed`` 0 (123),
``checkpoint_every`` 100 steps (each evaluation), ``keep_checkpoints`` 2 (the newest only),
``optimizer`` AdamW (adam: mace-torch's default, Adam with the decay added to the gradients; AdamW's
is decoupled), its weight decay on every trainable parameter (mace-torch's: on the interactions'
linear and product weights)."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import yaml

from .frames import split_selection
from .mace_options import from_mace_options

LR_SCHEDULES = ("cosine", "plateau", "constant")
E0_MODES = ("foundation", "average")  # or a {symbol or Z: energy} mapping
LOSSES = ("mse", "huber")
OPTIMIZERS = ("adamw", "adam")
# what each entry of `heads` may set; an option a head does not set is the run's own
# the train_file of a run whose structures a Python caller passes in memory (Trainer(train_configs=...))
IN_MEMORY = "<in memory>"
HEAD_OPTIONS = ("train_file", "valid_file", "test_file", "valid_fraction", "e0s", "config_type_weights", "keys")


@dataclass
class DataKeys:
    """Where labels live in each ASE frame (atoms.info / atoms.arrays / calculator results)."""
    energy: str = "REF_energy"
    forces: str = "REF_forces"
    stress: str = "REF_stress"
    virials: str = "REF_virials"
    head: str = "head"
    weight: str = "config_weight"


@dataclass
class TrainConfig:
    # data
    train_file: Optional[str] = None
    valid_file: Optional[str] = None
    valid_fraction: float = 0.1
    # held-out structures, as mace-torch's test_file: the starting and the saved model are evaluated
    # on them (closing table, metrics.json); they take no part in training or model selection
    test_file: Optional[str] = None
    keys: DataKeys = field(default_factory=DataKeys)
    # replay: structures mixed into every epoch's training batches so that fine-tuning does not
    # forget them (e.g. a sample of the foundation model's own training data). Frames without
    # energy/forces labels are labelled by the starting model, which then anchors the model to
    # its own starting predictions there. Their loss weight is multiplied by replay_weight.
    replay_file: Optional[str] = None
    replay_weight: float = 1.0
    # per-head loss weight multipliers of a multi-head model, e.g. {"Default": 1.0, "pt_head": 0.1}
    head_weights: Dict[str, float] = field(default_factory=dict)
    # loss weight multipliers per config_type (info key), as mace-torch's config_type_weights:
    # a frame's weight is its config_weight times this (1 for config types not listed)
    config_type_weights: Dict[str, float] = field(default_factory=dict)
    # per-head data, as mace-torch's `heads:` block: head name -> {train_file, valid_file, test_file,
    # valid_fraction, e0s, config_type_weights, keys}. Every frame read for a head trains that head; an
    # option a head leaves out is the run's own. A new model gets these heads; a model file must have them
    # (one head given for a one-head model names that head).
    heads: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # model: a model file to fine-tune (mace-torch .model or ours), or None to build `new_model`
    model: Optional[str] = None
    new_model: Optional[Dict[str, Any]] = None  # hyper-parameters of a model trained from scratch
    # the head of a multi-head model file to fine-tune: the run trains that head alone, as a one-head model
    # (mace-torch's foundation_head; the model file is read as `equikernels convert --head` reads it)
    model_head: Optional[str] = None
    model_backend: str = "auto"   # "auto" | "equikernels" | "mace"
    dtype: Optional[str] = None   # "float32" | "float64"; default: the model's own
    device: Optional[str] = None  # default: cuda:LOCAL_RANK when available, else cpu
    freeze: List[str] = field(default_factory=list)  # parameter-name prefixes kept fixed
    # isolated-atom frames of train_file (config_type=IsolatedAtom) override the E0s of "foundation" and
    # "average" for their elements, as in mace-torch; a mapping wins over them
    e0s: Union[str, Dict[Any, float]] = "foundation"
    # loss
    loss: str = "mse"
    huber_delta: float = 0.01
    energy_weight: float = 1.0
    forces_weight: float = 10.0
    stress_weight: float = 1.0
    # optimisation
    epochs: int = 10
    max_steps: Optional[int] = None  # stop after this many optimiser steps in total
    batch_size: int = 4              # structures per process and step
    lr: float = 1e-3
    weight_decay: float = 5e-7
    amsgrad: bool = True             # the AMSGrad variant, on as in mace-torch (false: plain AdamW / Adam)
    optimizer: str = "adamw"         # or "adam", mace-torch's default
    lr_schedule: str = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.01       # cosine floor, as a fraction of lr
    plateau_factor: float = 0.8
    plateau_patience: int = 5
    ema_decay: Optional[float] = 0.99  # None disables EMA
    clip_grad_norm: Optional[float] = 10.0
    # bookkeeping
    seed: int = 0
    out_dir: str = "fine_tune_out"
    checkpoint_every: int = 100      # optimiser steps between checkpoints
    keep_checkpoints: Optional[int] = 2  # the newest ones kept; None keeps every checkpoint
    eval_every_epochs: int = 1
    patience: Optional[int] = None   # early stopping: evaluations without improvement
    save_best: bool = True           # final model = best validation loss (else: the last)
    progress: bool = True
    plot: bool = True

    def __post_init__(self):
        if isinstance(self.keys, dict):
            key_names = {f.name for f in dataclasses.fields(DataKeys)}
            bad = sorted(set(self.keys) - key_names)
            if bad:
                raise ValueError(f"unknown data key option(s) {bad}; known: {sorted(key_names)}")
            self.keys = DataKeys(**self.keys)
        if not isinstance(self.keys, DataKeys):
            raise ValueError(f"keys must be a mapping such as {{energy: REF_energy, forces: REF_forces}}, "
                             f"got {self.keys!r}")
        for f in dataclasses.fields(DataKeys):
            value = getattr(self.keys, f.name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"keys: {f.name} must be the name of an info or arrays key (mace-torch's "
                                 f"{f.name}_key), got {value!r}")

    def head_data(self) -> List["HeadData"]:
        """One entry per head of ``heads`` with the run's own options filled in where the head gives
        none (a head's ``valid_fraction`` splits its frames, whatever the run's ``valid_file``); without
        ``heads``, one entry whose frames train the head each names (``name`` None)."""
        own = {n: getattr(self, n) for n in HEAD_OPTIONS}
        if not self.heads:
            return [HeadData(name=None, **own)]
        out = []
        for name, given in self.heads.items():
            values = {**own, **{k: v for k, v in given.items() if k != "keys"}}
            if "valid_fraction" in given and "valid_file" not in given:  # the head's split, not the run's file
                values["valid_file"] = None
            keys = {**dataclasses.asdict(self.keys), **dict(given.get("keys") or {})}
            out.append(HeadData(name=str(name), **{**values, "keys": DataKeys(**keys)}))
        return out

    def validate(self) -> "TrainConfig":
        def need(cond: bool, msg: str):
            if not cond:
                raise ValueError(msg)

        _check_types(self)
        need(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        need(0.0 <= self.valid_fraction < 1.0,
             f"valid_fraction must be in [0, 1) (0: no validation set), got {self.valid_fraction}")
        need(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        need(self.lr > 0, f"lr must be > 0, got {self.lr}")
        need(self.max_steps is None or self.max_steps >= 1, f"max_steps must be >= 1, got {self.max_steps}")
        need(self.lr_schedule in LR_SCHEDULES, f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        need(self.loss in LOSSES, f"loss must be one of {LOSSES}, got {self.loss!r}")
        need(self.model_backend in ("auto", "equikernels", "mace"),
             f"model_backend must be 'auto', 'equikernels' or 'mace', got {self.model_backend!r}")
        need(self.dtype in (None, "float32", "float64"), f"dtype must be 'float32' or 'float64', got {self.dtype!r}")
        need(isinstance(self.e0s, dict) or self.e0s in E0_MODES,
             f"e0s must be one of {E0_MODES} or a mapping element -> energy, got {self.e0s!r}")
        need(self.ema_decay is None or 0.0 <= self.ema_decay < 1.0,
             f"ema_decay must be in [0, 1), got {self.ema_decay}")
        need(self.checkpoint_every >= 1, f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        need(self.eval_every_epochs >= 1, f"eval_every_epochs must be >= 1, got {self.eval_every_epochs}")
        need(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        need(self.warmup_steps == 0 or self.lr_schedule != "plateau",  # plateau sets the rate at evaluations only
             f"warmup_steps {self.warmup_steps}: the plateau schedule has no warm-up here; give lr_schedule "
             "cosine or constant for a warm-up, or warmup_steps 0")
        need(0.0 <= self.min_lr_ratio <= 1.0, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        need(0.0 < self.plateau_factor < 1.0, f"plateau_factor must be in (0, 1), got {self.plateau_factor}")
        need(self.optimizer in OPTIMIZERS, f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        need(self.plateau_patience >= 0, f"plateau_patience must be >= 0, got {self.plateau_patience}")
        # a negative norm would flip the gradients' sign: training would climb the loss
        need(self.clip_grad_norm is None or self.clip_grad_norm >= 0,
             f"clip_grad_norm must be >= 0 (0 or null: no clipping), got {self.clip_grad_norm}")
        need(self.loss != "huber" or self.huber_delta > 0,
             f"huber_delta must be > 0 for loss 'huber', got {self.huber_delta}")
        need(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        need(self.keep_checkpoints is None or self.keep_checkpoints >= 1,
             f"keep_checkpoints must be >= 1 (or null: keep every checkpoint), got {self.keep_checkpoints}")
        need(self.patience is None or self.patience >= 1, f"patience must be >= 1, got {self.patience}")
        for name in ("energy_weight", "forces_weight", "stress_weight", "huber_delta", "weight_decay",
                     "replay_weight"):
            need(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        need(self.replay_weight == 1.0 or self.replay_file is not None,
             f"replay_weight {self.replay_weight} given without replay_file (--replay): there are no replay "
             "structures to weight")
        need(self.energy_weight + self.forces_weight + self.stress_weight > 0,
             "energy_weight, forces_weight and stress_weight are all 0: the loss would be exactly 0 "
             "and nothing would be trained; give at least one a positive weight")
        for name, what in (("head_weights", "head"), ("config_type_weights", "config_type")):
            weights = getattr(self, name)
            need(isinstance(weights, dict), f"{name} must be a mapping {what} -> weight, got {weights!r}")
            for key, w in weights.items():
                need(isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0,
                     f"{name}[{key!r}] must be a number >= 0, got {w!r}")
        _check_heads(self.heads)
        need(self.train_file is not None or bool(self.heads), "train_file is required (the structures to train on)")
        for head in self.head_data() if self.heads else []:
            need(head.train_file is not None, f"heads: {head.name}: no train_file, and the run gives none")
            need(0.0 <= head.valid_fraction < 1.0,
                 f"heads: {head.name}: valid_fraction must be in [0, 1), got {head.valid_fraction}")
            need(isinstance(head.e0s, dict) or head.e0s in E0_MODES,
                 f"heads: {head.name}: e0s must be one of {E0_MODES} or a mapping element -> energy, got {head.e0s!r}")
        need(self.model_head is None or self.model is not None,
             f"model_head {self.model_head!r} names a head of the model file to fine-tune; give the file (model)")
        need(self.model is not None or self.new_model is not None,
             "give a model file to fine-tune (model) or the hyper-parameters of a new one (new_model)")
        need(self.model is None or self.new_model is None,
             f"model {self.model!r} and new_model both given: give the model to fine-tune (model) or the "
             "hyper-parameters of a new one (new_model), not both")
        if self.new_model is not None:
            from .new_model_options import check_new_model  # noqa: PLC0415

            check_new_model(self.new_model)
        for name, path in self._data_files():
            if path is not None:  # FILE@INDEX (ASE's frame selection) names FILE
                try:
                    path = split_selection(path)[0]
                except ValueError as exc:
                    raise ValueError(f"{name}: {exc}") from None
            if path == IN_MEMORY:
                continue
            if path is not None and os.path.isdir(path):
                raise IsADirectoryError(f"{name}: {path!r} is a directory, expected a file of structures")
            if path is not None and not os.path.exists(path):
                raise FileNotFoundError(f"{name}: no such file {path!r}")
        if isinstance(self.model, str) and not os.path.exists(self.model) and "://" not in self.model and (
                os.sep in self.model or os.path.splitext(self.model)[1]):  # a path, not a model name or URL
            raise FileNotFoundError(f"model: no such file {self.model!r}")
        if self.model is not None and os.path.isfile(self.model):  # before the data is read
            from .checkpoint import refuse_as_model  # noqa: PLC0415 (torch is loaded only to train)

            refuse_as_model(self.model)
        need(not os.path.exists(self.out_dir) or os.path.isdir(self.out_dir),
             f"out_dir: {self.out_dir!r} exists and is not a directory")
        above = os.path.dirname(os.path.abspath(self.out_dir))
        while not os.path.exists(above):
            above = os.path.dirname(above)
        need(os.path.isdir(above), f"out_dir: {self.out_dir!r} cannot be made: {above!r} is a file, not a directory")
        if self.device is not None:
            import torch  # noqa: PLC0415 (only to read the device and ask whether CUDA is there)

            try:
                kind = torch.device(self.device).type
            except (RuntimeError, TypeError, ValueError):
                raise ValueError(f"device must be a torch device such as 'cpu', 'cuda' or 'cuda:1', "
                                 f"got {self.device!r}") from None
            need(kind in ("cpu", "cuda"), f"device {self.device!r}: training runs on 'cpu' or 'cuda' devices "
                 "(such as 'cuda:1')")
            if str(self.device).startswith("cuda"):
                need(torch.cuda.is_available(), f"device: {self.device!r} asked, but torch sees no CUDA device here")
        return self

    def _data_files(self) -> List[Tuple[str, Optional[str]]]:
        files = [(name, getattr(self, name)) for name in ("train_file", "valid_file", "test_file", "replay_file")]
        return files + [(f"heads: {h.name}: {name}", getattr(h, name)) for h in (self.head_data() if self.heads else [])
                        for name in ("train_file", "valid_file", "test_file")]

    def input_files(self) -> List[Tuple[str, str]]:
        """(option, path) of every existing file the run reads: the model and the structures."""
        given = [("model", self.model)] + [(n, split_selection(p)[0] if p else p) for n, p in self._data_files()]
        return [(n, p) for n, p in given if p is not None and p != IN_MEMORY and os.path.isfile(p)]

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown training option(s) {unknown}; known: {sorted(names)}")
        return cls(**values)


@dataclass
class HeadData:
    """The data options of one head (``TrainConfig.head_data``)."""
    name: Optional[str]
    train_file: Optional[str]
    valid_file: Optional[str]
    test_file: Optional[str]
    valid_fraction: float
    e0s: Union[str, Dict[Any, float]]
    config_type_weights: Dict[str, float]
    keys: DataKeys


def _check_heads(heads: Any) -> None:
    """``heads`` is a mapping of distinct head names to mappings of ``HEAD_OPTIONS``."""
    if not isinstance(heads, dict):
        raise ValueError(f"heads must be a mapping head name -> its data options, got {heads!r}")
    seen: Dict[str, str] = {}
    key_names = {f.name for f in dataclasses.fields(DataKeys)}
    for name, given in heads.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"heads: head names must be non-empty strings, got {name!r}")
        if name.lower() in seen:  # heads are matched by name without regard to case
            raise ValueError(f"heads: {seen[name.lower()]!r} and {name!r} name the same head; give one")
        seen[name.lower()] = name
        if not isinstance(given, dict):
            raise ValueError(f"heads: {name}: expected a mapping of {', '.join(HEAD_OPTIONS)}, got {given!r}")
        unknown = sorted(set(given) - set(HEAD_OPTIONS))
        if unknown:
            raise ValueError(f"heads: {name}: unknown option(s) {unknown}; known: {list(HEAD_OPTIONS)}")
        for option in ("train_file", "valid_file", "test_file"):
            if given.get(option) is not None and not isinstance(given[option], str):
                raise ValueError(f"heads: {name}: {option} must be a file name, got {given[option]!r}")
        fraction = given.get("valid_fraction", 0.0)
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            raise ValueError(f"heads: {name}: valid_fraction must be a number, got {fraction!r}")
        weights = given.get("config_type_weights", {})
        if not isinstance(weights, dict) or any(isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0
                                                for w in weights.values()):
            raise ValueError(f"heads: {name}: config_type_weights must map config_type -> a number >= 0, "
                             f"got {weights!r}")
        keys = given.get("keys") or {}
        if not isinstance(keys, dict) or set(keys) - key_names:
            raise ValueError(f"heads: {name}: keys must be a mapping with names among {sorted(key_names)}, "
                             f"got {keys!r}")
        if "head" in keys:
            raise ValueError(f"heads: {name}: keys: head: every frame read for this head trains it; no head key "
                             "is read")


_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _check_types(cfg: "TrainConfig") -> None:
    """Each option of a plain type (int, float, bool, str, or Optional of one) holds that type."""
    for f in dataclasses.fields(cfg):
        t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        optional = t.startswith("Optional[")
        base = t[len("Optional["):-1] if optional else t
        if base not in _TYPES:
            continue
        v = getattr(cfg, f.name)
        if v is None and optional:
            continue
        if base == "float" and isinstance(v, str):  # YAML reads 1e-3 (no dot) as a string
            try:
                v = float(v)
                setattr(cfg, f.name, v)
            except ValueError:
                pass
        if not isinstance(v, _TYPES[base]) or (isinstance(v, bool) and base != "bool"):
            kind = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}[base]
            raise ValueError(f"{f.name} must be {kind}, got {v!r}")


def load_yaml(path: str) -> Dict[str, Any]:
    """The training options of a YAML file; mace-torch's training-script names are translated
    (``mace_options``)."""
    return from_mace_options(read_yaml(path), path)  # a YAML written for mace-torch's training script reads too


def options_of(given: Any) -> Dict[str, Any]:
    """The training options of ``given``, a mapping of them or the path of a YAML file of them, with
    mace-torch's option names translated as in a ``--config`` file."""
    if isinstance(given, (str, os.PathLike)):
        return load_yaml(os.fspath(given))
    if isinstance(given, Mapping):
        return from_mace_options(dict(given), "options")
    raise TypeError(f"cfg: expected a TrainConfig, a mapping of training options or the path of a YAML file of them, "
                    f"got {type(given).__name__}")


def pop_resume(values: Dict[str, Any], where: str) -> bool:
    """``resume`` taken out of ``values`` (a run option, not a training one: mace-torch's
    restart_latest); ``where`` names their source in the error."""
    resume = values.pop("resume", False)
    if not isinstance(resume, bool):
        raise ValueError(f"{where}: resume (mace-torch's restart_latest): expected true or false, got {resume!r}")
    return resume


def read_yaml(path: str) -> Dict[str, Any]:
    """The options of a YAML file as written, checked to be a mapping."""
    try:
        with open(path) as fh:
            values = yaml.safe_load(fh) or {}
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path!r}: no such file") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"config file {path!r} is a directory, expected a YAML file") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ValueError(f"config file {path!r}: not valid YAML{at} ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of training options, got {type(values).__name__}")
    return values
