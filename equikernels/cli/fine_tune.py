"""``equikernels fine-tune``: train or fine-tune a MACE from a YAML file and/or flags (flags win).
Under ``torchrun --nproc_per_node N`` it trains on N devices with DDP.

Against forgetting when a foundation model is fine-tuned on a small data set: ``--replay FILE``
mixes structures from FILE into every epoch's training batches (their loss weighted by
``--replay-weight``; frames without labels are labelled by the starting model), ``--freeze``
keeps layers fixed, and ``--head-weight HEAD=W`` weights the loss of each head of a multi-head
model. SIGINT/SIGTERM stop after the current step with a checkpoint and the metrics so far
(exit status 130/143); ``--resume`` continues.

A command line copied from mace-torch's ``mace_run_train`` reads too: each flag is also taken with
underscores (``--batch_size``), and mace-torch's option names (``--max_num_epochs=6``, ``--E0s=...``,
``--swa``, ``--multiheads_finetuning=False``), as well as the YAML names of the training options
(``--weight_decay``), are translated, set aside or refused as in a YAML file
(``equikernels.training.mace_options``)."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import warnings

from .. import settings
from . import label_keys
from .switch_words import switch_value

# flag -> TrainConfig field, for the plain one-value options
_SIMPLE = {
    "model": "model", "train": "train_file", "valid": "valid_file", "valid_fraction": "valid_fraction",
    "epochs": "epochs", "max_steps": "max_steps", "out": "out_dir", "lr": "lr",
    "batch_size": "batch_size", "energy_weight": "energy_weight", "forces_weight": "forces_weight",
    "stress_weight": "stress_weight", "loss": "loss", "huber_delta": "huber_delta",
    "lr_schedule": "lr_schedule", "warmup_steps": "warmup_steps", "ema_decay": "ema_decay",
    "clip_grad_norm": "clip_grad_norm", "checkpoint_every": "checkpoint_every", "patience": "patience",
    "seed": "seed", "device": "device", "dtype": "dtype", "backend": "model_backend",
    "replay": "replay_file", "replay_weight": "replay_weight", "test": "test_file", "amsgrad": "amsgrad",
    "model_head": "model_head", "optimizer": "optimizer",
}


class _MaceName(argparse.Action):
    """A mace-torch option name or a training option's YAML name (``--max_num_epochs=6``, a bare
    ``--swa``): its text is kept in ``mace_options`` and translated as a YAML file's would be."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest="mace_options", nargs="?", const=True, default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):
        given = dict(getattr(namespace, "mace_options", {}))
        given[option_string[2:]] = values
        setattr(namespace, "mace_options", given)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fine-tune", help="fine-tune (or train) a MACE potential on ASE-readable data",
        allow_abbrev=False,  # whole names only: an abbreviation could silently take a mace-torch name for another
        description="Fine-tune a MACE model (mace-torch .model or equikernels) on labelled structures. "
                    "Options come from --config (YAML, keys as in equikernels.training.TrainConfig) "
                    "and are overridden by flags. Labels are read from the REF_* keys, or from the calculator "
                    "results ASE writes (energy, forces, stress) when those are absent; a frame without a "
                    "label leaves it out of its loss (config_weight and config_energy/forces/stress_weight "
                    "scale it, as in mace-torch, and so do --config-type-weights). The closing table shows "
                    "the starting and the fine-tuned model on the validation set (and on --test); model.pt is "
                    "the best validation epoch's weights and model_last.pt the last ones when they differ (plus "
                    "mace-torch .model files when mace-torch is installed). Ctrl-C/SIGTERM: checkpoint, metrics, exit; "
                    "--resume continues. Multi-GPU: torchrun --nproc_per_node N -m equikernels.cli fine-tune ... "
                    "A mace_run_train command line reads too: flags also with underscores (--batch_size), and "
                    "mace-torch's names (--max_num_epochs=6, --E0s=..., --multiheads_finetuning=False) translated, "
                    "set aside or refused as in a --config file.")
    taken = set()

    def a(*flags, **kw):  # each flag also with underscores, as mace-torch spells its options
        action = p.add_argument(*flags, **kw)
        spelled = ["--" + f[2:].replace("-", "_") for f in flags if f.startswith("--") and "-" in f[2:]]
        if spelled and not isinstance(action, argparse.BooleanOptionalAction):
            p.add_argument(*spelled, **{**kw, "dest": action.dest, "help": argparse.SUPPRESS})
        taken.update(flags, spelled)

    a("--config", help="YAML file of training options")
    a("--model", help="model file to fine-tune, or a foundation-model name (medium, small_off, ...; needs "
                       "mace-torch); default: the bundled default model")
    a("--model-head", metavar="HEAD", help="the head of a multi-head --model to fine-tune, alone, as a one-head "
                                           "model (mace-torch's --foundation_head)")
    a("--train", help="training structures (extxyz or any ASE-readable file)")
    a("--valid", help="validation structures (default: a random --valid-fraction of --train)")
    a("--test", metavar="FILE", help="held-out test structures: the starting and the fine-tuned model are "
                                      "evaluated on them (closing table, metrics.json), as mace-torch's test_file")
    a("--valid-fraction", type=float,
      help="fraction of --train held out for validation, 0 for none (default 0.1, as in mace-torch)")
    a("--epochs", type=int, help="number of epochs (default 10; mace-torch's max_num_epochs: 2048)")
    a("--max-steps", type=int, help="stop after this many optimiser steps in total")
    a("--out", help="output directory: checkpoints, model.pt, metrics.json, training.png (default fine_tune_out)")
    a("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    a("--overwrite", action="store_true", help="replace an earlier run in --out (its models, metrics and "
                                              "checkpoints); without --resume or this, such an --out is refused")
    a("--lr", type=float, help="learning rate (default 1e-3, for fine-tuning; mace-torch's: 0.01)")
    a("--optimizer", choices=("adamw", "adam"),
      help="default adamw (decoupled weight decay); adam: mace-torch's default, the decay added to the gradients")
    a("--amsgrad", action=argparse.BooleanOptionalAction,
      help="the AMSGrad variant (default on, as in mace-torch; --no-amsgrad or amsgrad: false for plain AdamW)")
    a("--batch-size", type=int, help="structures per device and step (default 4; mace-torch's: 10)")
    a("--energy-weight", type=float, help="loss weight of energy per atom (default 1)")
    a("--forces-weight", type=float, help="loss weight of forces (default 10; mace-torch's: 100)")
    a("--stress-weight", type=float, help="loss weight of stress, for frames with stress labels (default 1; "
                                          "mace-torch's default loss, weighted, leaves stress out)")
    a("--loss", metavar="{mse,huber}", help="penalty (default mse, as mace-torch's weighted and stress losses; "
                                             "mace-torch's weighted, stress and forces_only are translated)")
    a("--huber-delta", type=float, help="Huber delta (default 0.01)")
    a("--lr-schedule", choices=("cosine", "plateau", "constant"),
      help="default cosine; plateau: ReduceLROnPlateau, mace-torch's default (factor 0.8, patience 5 "
           "evaluations here, 50 in mace-torch)")
    a("--warmup-steps", type=int, help="linear learning-rate warm-up steps (default 0)")
    a("--ema-decay", type=float, help="EMA decay of the weights (default 0.99, as mace-torch's ema_decay)")
    a("--ema", action=argparse.BooleanOptionalAction,
      help="evaluate and save an exponential moving average of the weights (default on; mace-torch's is off "
           "unless --ema); --no-ema: the raw weights")
    a("--clip-grad-norm", type=float, help="gradient-norm clipping (default 10, as mace-torch's clip_grad)")
    a("--checkpoint-every", type=int, help="optimiser steps between checkpoints (default 100)")
    a("--patience", type=int, help="early stopping after this many evaluations without improvement (default: none)")
    a("--e0s", help="'foundation' (keep the model's), 'average' (least squares on --train), mace-torch's E0s "
                     "JSON file or a YAML mapping such as '{Cu: -3.5, Ni: -4.1}'; as in mace-torch, single-atom "
                     "frames of --train with config_type=IsolatedAtom are not trained on and give their element's "
                     "E0 (a mapping still wins)")
    a("--freeze", action="append", metavar="PREFIX",
      help="keep parameters whose name starts with PREFIX fixed (repeatable), e.g. interactions.0")
    a("--replay", metavar="FILE",
      help="replay structures mixed into every epoch's training batches, against forgetting (e.g. a sample "
           "of the foundation model's training data); frames without energy/forces labels get the starting "
           "model's predictions")
    a("--replay-weight", type=float, help="loss weight multiplier of the replay structures (default 1)")
    a("--head-weight", action="append", metavar="HEAD=W",
      help="loss weight multiplier of the structures of one head of a multi-head model (repeatable)")
    a("--config-type-weights", metavar="MAPPING",
      help="loss weight multipliers per config_type (info key), as mace-torch's: a YAML mapping such as "
           "'{Default: 1.0, surface: 2.0}'; frames of other config types keep weight 1")
    a("--seed", type=int, help="random seed (default 0; mace-torch's: 123)")
    a("--device", help="torch device (default cuda:LOCAL_RANK when available, else cpu)")
    a("--dtype", choices=("float32", "float64"),
      help="training precision (default: the model's own; mace-torch's default_dtype: float64)")
    a("--backend", choices=("auto", "equikernels", "mace"),
      help="model implementation to train (default auto: equikernels' when available)")
    label_keys.add_flags(p)
    for flag in label_keys.FLAGS:  # mace-torch's spelling, --energy_key
        p.add_argument("--" + flag, dest=flag, help=argparse.SUPPRESS)
        taken.update(("--" + flag, "--" + flag.replace("_", "-")))
    a("--no-progress", action="store_true", help="no progress bar")
    a("--no-plot", action="store_true", help="no training.png")
    from ..training import mace_options

    for name in sorted(mace_options.names() | set(_field_types())):
        if "--" + name not in taken:
            p.add_argument("--" + name, action=_MaceName)
    p.set_defaults(func=run)


def _field_types():
    """TrainConfig option -> (base type, optional) for its options of one plain type."""
    from ..training.config import TrainConfig

    out = {}
    for f in dataclasses.fields(TrainConfig):
        t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        optional = t.startswith("Optional[")
        base = t[len("Optional["):-1] if optional else t
        if base in ("int", "float", "bool", "str"):
            out[f.name] = (base, optional)
    return out


def _typed(name: str, text):
    """The value of ``--name`` (mace-torch's or a YAML name) as the type its option takes."""
    from ..training.mace_options import RENAMES, SAME_WHEN, SET_ASIDE, SWITCHES

    same = SAME_WHEN.get(name)  # a number mace-torch takes (--beta=0.9) read as one
    kind = ("float", False) if isinstance(same, float) else ("str", False)
    base, optional = _field_types().get(RENAMES.get(name, name), kind)
    switch = name in SWITCHES or base == "bool"
    if text is True:  # given without a value
        if switch or name in SET_ASIDE:
            return True
        raise ValueError(f"--{name}: expected a value (--{name}=VALUE)")
    if base in ("int", "float"):
        if optional and text.strip().lower() in ("none", "null"):
            return None
        try:
            return int(text) if base == "int" else float(text)
        except ValueError:
            if not switch:
                kind = "an integer" if base == "int" else "a number"
                raise ValueError(f"--{name}: expected {kind}, got {text!r}") from None
    if switch:
        value = switch_value(text)
        if value is None:
            raise ValueError(f"--{name}: expected true or false, got {text!r}")
        return value
    return text


def _mapping_text(flag: str, text: str, expected: str, example: str):
    """A mapping given on the command line, in mace-torch's Python form ('{1:-13.6, 8:-2042.0}') or as YAML."""
    import yaml

    value = None
    if text.strip().startswith("{"):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = None
    if not isinstance(value, dict):
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = None
    if isinstance(value, dict) and all(v is not None for v in value.values()):
        return value
    raise ValueError(f"{flag}: expected {expected} such as '{example}', got {text!r}")


def _command_line(args: argparse.Namespace):
    """The options given on the command line, named as in a YAML file (mace-torch's names still as given)."""
    values = {name: getattr(args, flag) for flag, name in _SIMPLE.items() if getattr(args, flag, None) is not None}
    if args.e0s is not None:
        word = args.e0s.strip()
        if word.endswith(".json"):
            from ..training.mace_options import e0s_file
            values["e0s"] = e0s_file(word, "--e0s")
        else:
            values["e0s"] = word if word in ("foundation", "average") else _mapping_text(
                "--e0s", args.e0s, "'foundation', 'average', a mace-torch E0s JSON file or a YAML mapping",
                "{Cu: -3.5, Ni: -4.1}")
    if args.config_type_weights is not None:
        values["config_type_weights"] = _mapping_text("--config-type-weights", args.config_type_weights,
                                                      "a YAML mapping", "{Default: 1.0, surface: 2.0}")
    if args.freeze:
        counts = [f for f in args.freeze if f.lstrip("-").isdigit()]  # mace-torch's freeze is a layer count
        values["freeze"] = int(counts[0]) if counts else list(args.freeze)
    if args.head_weight:
        weights = {}
        for item in args.head_weight:
            head, sep, w = item.rpartition("=")
            try:
                weights[head] = float(w)
            except ValueError:
                head = ""
            if not sep or not head:
                raise ValueError(f"--head-weight: expected HEAD=WEIGHT, e.g. Default=1.0, got {item!r}")
        values["head_weights"] = weights
    flags = {name: flag for flag, name in _SIMPLE.items()}
    for name, text in getattr(args, "mace_options", {}).items():
        if name in values:
            raise ValueError(f"--{name} and --{flags.get(name, name).replace('_', '-')} mean the same option; "
                             "give one")
        values[name] = _typed(name, text)
    return values


def _translated(args: argparse.Namespace):
    """The options of --config and of the command line, translated from mace-torch's names; their
    warnings are said once, by the first process of a torchrun job alone."""
    from ..training.config import read_yaml
    from ..training.mace_options import NEW_MODEL_SHAPE, RENAMES, REPLAY_NOTE, from_mace_options

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        written = read_yaml(args.config) if args.config else {}
        values = from_mace_options(written, args.config) if args.config else {}
        given = _command_line(args)
        cli = from_mace_options(given, "command line")
    if settings.get().rank == 0:
        noted = given.get("multiheads_finetuning") is False
        for w in said:
            if REPLAY_NOTE in str(w.message):
                if noted:
                    continue
                noted = True
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    args.new_model_shape = [name for name in NEW_MODEL_SHAPE if name in given or name in written]
    # our option -> the mace-torch name it was given by (the command line's over the file's), for errors
    args.renamed = {**{RENAMES[n]: n for n in written if n in RENAMES},
                    **{RENAMES[n]: "--" + n for n in getattr(args, "mace_options", {}) if n in RENAMES}}
    return values, cli


# a head's options that a command-line flag sets in every head of the file (the --*-key flags too)
_HEAD_FLAGS = ("train_file", "valid_file", "test_file", "valid_fraction", "e0s")


def _flags_over_heads(heads, cli, cli_keys):
    """The file's ``heads`` with the command line's options over each head's own: flags win over the
    file in every head (config_type_weights and label keys merged over the head's)."""
    out = {}
    for name, given in heads.items():
        head = dict(given) if isinstance(given, dict) else given
        if isinstance(head, dict):  # anything else: the config's own check names it
            # a head's valid_fraction stands for its valid_file (none: its own split)
            head.update({k: cli[k] for k in _HEAD_FLAGS if k in cli and (k in head or (
                k == "valid_file" and "valid_fraction" in head))})
            if isinstance(head.get("config_type_weights"), dict) and isinstance(cli.get("config_type_weights"), dict):
                head["config_type_weights"] = {**head["config_type_weights"], **cli["config_type_weights"]}
            if cli_keys and isinstance(head.get("keys"), dict):
                head["keys"] = {**head["keys"], **cli_keys}
        out[name] = head
    return out


def config_from_args(args: argparse.Namespace):
    from ..training.config import TrainConfig, pop_resume

    values, cli = _translated(args)
    for where, options in ((args.config, values), ("command line", cli)):
        args.resume = pop_resume(options, where) or args.resume
    cli_keys = {**dict(cli.pop("keys", None) or {}), **label_keys.given(args)}
    keys = {**dict(values.get("keys") or {}), **cli_keys}
    if keys:
        values["keys"] = keys
    if isinstance(values.get("heads"), dict) and "heads" not in cli:
        values["heads"] = _flags_over_heads(values["heads"], cli, cli_keys)
    for name in ("config_type_weights", "head_weights"):  # the command line's weights over the file's
        if isinstance(values.get(name), dict) and isinstance(cli.get(name), dict):
            cli[name] = {**values[name], **cli[name]}
    if isinstance(values.get("freeze"), list) and isinstance(cli.get("freeze"), list):
        cli["freeze"] = values["freeze"] + cli["freeze"]
    values.update(cli)
    if args.ema is False:
        values["ema_decay"] = None
    elif args.ema and "ema_decay" in values and values["ema_decay"] is None:  # --ema over a config's ema: false
        values["ema_decay"] = TrainConfig.ema_decay
    if args.no_progress:
        values["progress"] = False
    if args.no_plot:
        values["plot"] = False
    if values.get("model") is None and values.get("new_model") is None:
        if args.new_model_shape:  # a mace_run_train command line training from scratch
            raise ValueError(f"{', '.join(args.new_model_shape)}: mace-torch's options of a new "
                             "model; a new model's hyper-parameters are the entries of new_model in a --config "
                             "file (new_model: {r_max: 5.0, hidden_irreps: '128x0e+128x1o', ...}), or give --model "
                             "(mace-torch's --foundation_model) to fine-tune a model")
        from equikernels.default_model import default_model_path

        values["model"] = default_model_path()
        if settings.get().rank == 0:
            print(f"model: the bundled default model {os.path.basename(values['model'])}, a toy trained on EMT data "
                  "(--model names the model to fine-tune)", flush=True)
    try:
        return TrainConfig.from_dict(values).validate()
    except (ValueError, OSError) as exc:  # an option is named as it was given: flag, or mace-torch's name
        from . import option_names

        flags = {name: "--" + flag.replace("_", "-") for flag, name in _SIMPLE.items()
                 if getattr(args, flag, None) is not None}
        named = option_names(str(exc), {**args.renamed, **flags})
        if named == str(exc):
            raise
        raise type(exc)(named) from None


def run(args: argparse.Namespace) -> int:
    import sys

    import torch.distributed as dist

    from ..training import fine_tune, outputs
    from ..training.trainer import TrainingInterrupted

    cfg = config_from_args(args)
    outputs.check(cfg.out_dir, args.resume, args.overwrite, "--resume", "--overwrite", "--out", cfg.input_files())
    try:
        fine_tune(cfg, resume=args.resume, overwrite=args.overwrite)  # every rank returns together
    except TrainingInterrupted as stop:  # its one line is printed; checkpoint and metrics are written
        return 128 + int(stop.signum)
    finally:
        sys.stdout.flush()
        if dist.is_available() and dist.is_initialized():  # joined under torchrun
            dist.destroy_process_group()
    return 0
