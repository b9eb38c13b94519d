"""A fine-tuning YAML written for mace-torch's training script: its options that mean what an option
here means are renamed to it, the foundation model's architecture, the script's output and
logging options, and the label keys and loss weights of quantities not trained here (``dipole_key``,
``charges_key``, ``polarizability_key``, ``dipole_weight``, ...) are set aside with one warning (the
model file fixes the architecture, ``out_dir`` holds every output, energies, forces and stress are
trained), switches such as ``swa: false`` or ``compute_atomic_dipole: false`` are accepted with the
value that is what fine-tuning here does, mace-torch's losses map onto ours (``weighted`` -> mse without stress,
``stress`` -> mse, ``huber``, ``forces_only``), and the rest stay as given, so the trainer's own
check names what it does not know. mace-torch's ``scheduler_patience`` or ``lr_factor`` without a
``scheduler`` select the plateau schedule, mace-torch's default, which they tune (ours is cosine).
``test_file`` and ``amsgrad`` mean what they mean here (``amsgrad`` defaults to true in both, and
``amsgrad: false`` turns it off here, where mace-torch's script reads that value as its default);
mace-torch's boolean ``keep_checkpoints`` becomes our count: ``true`` (keep all) -> ``None`` (every
checkpoint kept), ``false`` (only the newest) -> ``1``; an integer is ours and stays. mace-torch's
``test_dir`` (a folder of preprocessed ``*_test.h5`` files) is refused: give ``test_file``.

``E0s`` also takes mace-torch's JSON file of ``{Z: energy}``. mace-torch's ``distributed: true`` means
what running under ``torchrun`` means here, and is refused outside it. Its multi-head replay options
(``pt_train_file``, ...) are refused with ``replay_file`` as the alternative, and a ``foundation_model``
without ``multiheads_finetuning: false`` gets one note (``REPLAY_NOTE``): mace-torch would fine-tune
its Materials Project models with replay of their pretraining data by default, fine-tuning here
trains on the given data only; as in mace-torch, ``multiheads_finetuning: true`` with a foundation model
file and no ``pt_train_file`` is plain fine-tuning. Options at the values that mean "not given" in
mace-torch (``NOT_GIVEN``: ``pt_train_file: null``, ``freeze: null``, ...) read as absent, and the replay
options that only tune replay are set aside, so that a whole dump of mace-torch's options reads. A ``heads:`` block (data per head) reads with the names inside each head
translated as above; a head's statistics (``mean``, ``std``, ``statistics_file``, ...) are set aside."""
from __future__ import annotations

import ast
import json
import warnings
from typing import Any, Dict, FrozenSet

from .. import settings

RENAMES = {"foundation_model": "model", "max_num_epochs": "epochs", "default_dtype": "dtype",
           "clip_grad": "clip_grad_norm", "scheduler_patience": "plateau_patience", "lr_factor": "plateau_factor",
           "eval_interval": "eval_every_epochs", "work_dir": "out_dir", "restart_latest": "resume",
           "foundation_head": "model_head"}
KEYS = {"energy_key": "energy", "forces_key": "forces", "stress_key": "stress", "virials_key": "virials",
        "head_key": "head"}
ARCHITECTURES = {"MACE", "ScaleShiftMACE", "ScaleShiftBOTNet", "BOTNet", "AtomicDipolesMACE", "EnergyDipolesMACE"}
# mace-torch's options that shape a new model: here a new model's hyper-parameters are new_model's entries
NEW_MODEL_SHAPE = ("r_max", "radial_type", "num_radial_basis", "num_cutoff_basis", "interaction", "interaction_first",
                   "max_ell", "correlation", "num_interactions", "MLP_irreps", "radial_MLP", "hidden_irreps",
                   "num_channels", "max_L")
SET_ASIDE = {
    # the foundation model's architecture and statistics (read from the model file)
    "r_max", "radial_type", "num_radial_basis", "num_cutoff_basis", "pair_repulsion", "distance_transform",
    "apply_cutoff", "interaction", "interaction_first", "max_ell", "correlation", "num_interactions", "MLP_irreps",
    "radial_MLP", "hidden_irreps", "num_channels", "max_L", "gate", "scaling", "avg_num_neighbors",
    "compute_avg_num_neighbors", "atomic_numbers", "mean", "std", "compute_forces", "compute_stress",
    # where and how mace-torch's script writes and logs
    "name", "log_dir", "model_dir", "checkpoints_dir", "results_dir", "downloads_dir", "log_level", "error_table",
    "save_cpu", "plot_frequency", "wandb", "wandb_dir", "wandb_project", "wandb_entity", "wandb_name",
    "wandb_log_hypers",
    # data loading and kernel backends of mace-torch's script
    "num_workers", "pin_memory", "valid_batch_size", "enable_cueq", "enable_oeq", "only_cueq", "launcher",
    "multi_processed_test", "save_all_checkpoints", "plot_interaction_e", "statistics_file",
    # more of the architecture, and the elements kept (the model file fixes both)
    "edge_irreps", "embedding_specs", "use_agnostic_product", "use_edge_irreps_first", "use_embedding_readout",
    "use_last_readout_only", "use_reduced_cg", "use_so3", "foundation_filter_elements", "foundation_model_elements",
    "foundation_model_kwargs",
    # PolarMACE and LES models (the architectures refused above)
    "les_arguments", "add_local_electron_energy", "atomic_multipoles_max_l", "atomic_multipoles_smearing_width",
    "field_feature_max_l", "field_feature_norms", "field_feature_widths", "field_norm_factor", "field_readout_config",
    "field_si", "fixedpoint_update_config", "include_electrostatic_self_interaction", "kspace_cutoff_factor",
    "num_recursion_steps", "quadrupole_feature_corrections", "return_electrostatic_potentials",
    # settings of schedulers and optimisers other than the ones run here, and of LoRA (off, below)
    "lr_scheduler_gamma", "beta1_schedulefree", "beta2_schedulefree", "lora_rank", "lora_alpha",
}
# labels and loss weights of quantities no loss here trains (energies, forces and stress are trained; virials
# labels train the stress term, weighted by stress_weight), and inputs of charge- and spin-aware models
UNTRAINED = {"dipole_key", "charges_key", "polarizability_key", "elec_temp_key", "total_charge_key",
             "total_spin_key", "dipole_weight", "polarizability_weight", "virials_weight"}
# mace-torch's stage-two (swa) settings: without swa, which is refused, mace-torch does not use them either
STAGE_TWO = ("start_swa", "swa_lr", "swa_energy_weight", "swa_forces_weight", "swa_stress_weight", "swa_virials_weight",
             "start_stage_two", "stage_two_lr", "stage_two_energy_weight", "stage_two_forces_weight",
             "stage_two_stress_weight", "stage_two_virials_weight", "swa_dipole_weight", "swa_polarizability_weight",
             "stage_two_dipole_weight", "stage_two_polarizability_weight")
# mace-torch's multi-head replay fine-tuning (a second head trained on pretraining data): none here. These
# turn it on (refused when given a value); REPLAY_TUNING only tune it (set aside, unused without it)
REPLAY_OPTIONS = ("pt_train_file", "pt_valid_file", "pseudolabel_replay")
REPLAY_TUNING = ("weight_pt_head", "num_samples_pt", "subselect_pt", "filter_type_pt", "real_pt_data_ratio_threshold",
                 "force_mh_ft_lr", "allow_random_padding_pt", "disallow_random_padding_pt",
                 "pseudolabel_replay_compute_stress", "skip_evaluate_heads")
# mace-torch options that mean "not given" at these values (its defaults), so a full dump of its options reads
NOT_GIVEN = {"pt_train_file": None, "pt_valid_file": None, "pseudolabel_replay": False, "test_dir": None,
             "freeze": None, "heads": None, "foundation_model_kwargs": "{}", "lr_params_factors": None,
             "config": None, "E0s": None}
# mace-torch's Materials Project foundation models, which its multi-head fine-tuning replays by default
MP_FOUNDATIONS = ("small", "medium", "large")
REPLAY_NOTE = "fine-tuning here trains on the given structures only"


def from_mace_options(values: Dict[str, Any], source: str = "config") -> Dict[str, Any]:
    """``values`` with mace-torch's option names translated (module docstring); options already
    named as here are kept. Raises ``ValueError`` naming the option where a mace-torch value has no
    counterpart here."""
    out = {k: v for k, v in values.items() if not (k in NOT_GIVEN and _same(v, NOT_GIVEN[k]))}
    _lr_factors(out, source)
    if out.get("multiheads_finetuning") is True and _replay_off(out):
        out.pop("multiheads_finetuning")  # as mace-torch: a foundation file without pt_train_file is not replayed
    for name in REPLAY_OPTIONS:
        if name in out:
            raise ValueError(f"{source}: {name}: mace-torch's multi-head replay fine-tuning has no counterpart here; "
                             "replay_file (--replay) mixes structures such as a sample of the foundation model's "
                             "training data into the training batches, against forgetting")
    head_aside = _heads(out, source)
    if "E0s" in out and "e0s" in out:
        raise ValueError(f"{source}: E0s (mace-torch's name) and e0s mean the same option; give one")
    if "distributed" in out:
        _distributed(out.pop("distributed"), source)
    aside = [k for k in out if k in SET_ASIDE or k in STAGE_TWO or k in UNTRAINED or k in REPLAY_TUNING] + head_aside
    for k in aside:
        out.pop(k, None)
    if out.get("model") in ARCHITECTURES:
        if "foundation_model" not in out:
            raise ValueError(f"{source}: model: {out['model']!r} is a mace-torch architecture; give the model "
                             "file to fine-tune (model, or mace-torch's foundation_model)")
        aside.append("model")
        out.pop("model")
    for old, new in RENAMES.items():
        if old in out:
            if new in out:
                raise ValueError(f"{source}: {old} (mace-torch's name) and {new} mean the same option; give one")
            out[new] = out.pop(old)
    if "E0s" in out:
        out["e0s"] = _e0s(out.pop("E0s"), source)
    if isinstance(out.get("e0s"), str):
        out["e0s"] = e0s_file(out["e0s"], f"{source}: e0s")
    if isinstance(out.get("config_type_weights"), str):  # mace-torch's form: '{"Default": 1.0}'
        out["config_type_weights"] = _mapping(out["config_type_weights"], "config_type_weights", source)
    keys = {KEYS[k]: out.pop(k) for k in list(out) if k in KEYS}
    if keys:
        out["keys"] = {**keys, **dict(out.get("keys") or {})}
    if "ema" in out:
        if not isinstance(out["ema"], bool):
            raise ValueError(f"{source}: ema: expected true or false, got {out['ema']!r}")
        if not out.pop("ema"):
            out["ema_decay"] = None
    if "scheduler" in out:
        s = out.pop("scheduler")
        if s != "ReduceLROnPlateau":
            raise ValueError(f"{source}: scheduler: only mace-torch's 'ReduceLROnPlateau' has a counterpart here "
                             f"(lr_schedule: plateau; also cosine, constant), got {s!r}")
        out["lr_schedule"] = "plateau"
    elif "lr_schedule" not in out and any(k in values for k in PLATEAU_OPTIONS):
        out["lr_schedule"] = "plateau"  # mace-torch's default scheduler, the one these options tune
    for name, value in SAME_WHEN.items():
        if name in out:
            if out[name] != value or type(out[name]) is not type(value):
                raise ValueError(f"{source}: {name}: {out[name]!r} has no counterpart here (only {value!r}, "
                                 f"what fine-tuning here does){HINTS.get(name, '')}")
            out.pop(name)
    if out.get("optimizer") not in (None, "adam", "adamw"):
        raise ValueError(f"{source}: optimizer: {out['optimizer']!r} has no counterpart here (adamw or adam; "
                         "mace-torch's schedulefree is not offered)")
    if "test_dir" in out:
        raise ValueError(f"{source}: test_dir: mace-torch's folder of preprocessed *_test.h5 files has no "
                         "counterpart here; give test_file (one ASE-readable file of labelled structures)")
    if isinstance(out.get("keep_checkpoints"), bool):  # mace-torch's switch: keep all, or only the newest
        out["keep_checkpoints"] = None if out["keep_checkpoints"] else 1
    if "loss" in out:
        out.update(_loss(out.pop("loss"), source))
    if "freeze" in out and not isinstance(out["freeze"], list):
        raise ValueError(f"{source}: freeze: expected a list of parameter-name prefixes (mace-torch's layer "
                         f"count has no counterpart here), got {out['freeze']!r}")
    if aside:
        untrained = ", energies, forces and stress are what is trained here" if UNTRAINED & set(aside) else ""
        warnings.warn(f"{source}: mace-torch options set aside (the model file fixes the architecture, out_dir "
                      f"holds the outputs, stage two needs swa{untrained}): {', '.join(sorted(aside))}",
                      UserWarning, stacklevel=2)
    if "foundation_model" in values and "multiheads_finetuning" not in values:
        warnings.warn(f"{source}: foundation_model: {REPLAY_NOTE} (mace-torch adds replay of the pretraining data "
                      "to fine-tuning its Materials Project models unless multiheads_finetuning is false, which "
                      "silences this note); replay_file (--replay) mixes in structures against forgetting",
                      UserWarning, stacklevel=2)
    return out


# a head's statistics: mace-torch computes or reads them per head; here the model file (or, for a new model,
# the head's own training frames) gives them
HEAD_SET_ASIDE = {"statistics_file", "atomic_numbers", "mean", "std", "avg_num_neighbors", "compute_avg_num_neighbors"}


def _heads(out: Dict[str, Any], source: str) -> list:
    """mace-torch's names inside each entry of ``out['heads']`` translated in place; returns the
    options set aside, as ``heads: NAME: OPTION``."""
    if out.get("heads", {}) is None:  # mace-torch's default: no heads block
        out.pop("heads")
    if isinstance(out.get("heads"), str):  # mace-torch's command line: --heads="{'dft': {'train_file': ...}}"
        out["heads"] = _heads_text(out["heads"], source)
    if not isinstance(out.get("heads"), dict):
        return []
    aside = []
    out["heads"] = dict(out["heads"])
    for name, given in list(out["heads"].items()):
        if not isinstance(given, dict):
            continue  # the config's own check names it
        where = f"{source}: heads: {name}"
        head = dict(given)
        if "test_dir" in head:
            raise ValueError(f"{where}: test_dir: mace-torch's folder of preprocessed *_test.h5 files has no "
                             "counterpart here; give test_file")
        if head.pop("keep_isolated_atoms", False) is not False:
            raise ValueError(f"{where}: keep_isolated_atoms: only false has a counterpart here{HINTS['keep_isolated_atoms']}")
        for k in sorted(set(head) & (HEAD_SET_ASIDE | UNTRAINED)):
            head.pop(k)
            aside.append(f"heads: {name}: {k}")
        if "E0s" in head:
            if "e0s" in head:
                raise ValueError(f"{where}: E0s (mace-torch's name) and e0s mean the same option; give one")
            head["e0s"] = _e0s(head.pop("E0s"), where)
        if isinstance(head.get("e0s"), str):
            head["e0s"] = e0s_file(head["e0s"], f"{where}: e0s")
        if isinstance(head.get("config_type_weights"), str):
            head["config_type_weights"] = _mapping(head["config_type_weights"], "config_type_weights", where)
        keys = {KEYS[k]: head.pop(k) for k in list(head) if k in KEYS}
        if keys:
            head["keys"] = {**keys, **dict(head.get("keys") or {})}
        out["heads"][name] = head
    return aside


def _heads_text(value: str, source: str) -> Dict[str, Any]:
    """mace-torch's ``heads`` string (a Python dict, as its script reads it), or the same as YAML."""
    import yaml  # noqa: PLC0415

    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = None
    if not isinstance(parsed, dict):
        raise ValueError(f"{source}: heads: expected a mapping head name -> its data options, such as "
                         f"\"{{'dft': {{'train_file': 'train.xyz'}}}}\", got {value!r}")
    return parsed


def _same(value, default) -> bool:
    return value is default if default is None or isinstance(default, bool) else value == default


def _replay_off(out: Dict[str, Any]) -> bool:
    """Whether mace-torch would turn its multi-head fine-tuning off: a foundation model other than its
    Materials Project names, and no pretraining data given."""
    foundation = out.get("foundation_model")
    return foundation is not None and foundation not in MP_FOUNDATIONS and out.get("pt_train_file") is None


def _lr_factors(out: Dict[str, Any], source: str) -> None:
    """mace-torch's per-block learning-rate factors: accepted (and dropped) when every factor is 1."""
    if "lr_params_factors" not in out:
        return
    value = out["lr_params_factors"]
    factors = _mapping(value, "lr_params_factors", source) if isinstance(value, str) else value
    if not isinstance(factors, dict) or any(f != 1 for f in factors.values()):
        raise ValueError(f"{source}: lr_params_factors: per-block learning-rate factors have no counterpart here "
                         f"(only every factor 1), got {value!r}; freeze keeps chosen blocks fixed")
    out.pop("lr_params_factors")


def _distributed(value, source: str) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{source}: distributed: expected true or false, got {value!r}")
    if value and settings.get().world_size < 2:  # torchrun sets it; with two or more processes they train with DDP
        raise ValueError(f"{source}: distributed: multi-GPU training here runs under torchrun: torchrun "
                         "--nproc_per_node N -m equikernels.cli fine-tune ... (one process per GPU, with DDP)")


# mace-torch's options of its default scheduler (ReduceLROnPlateau): given without a scheduler, they select it
PLATEAU_OPTIONS = ("scheduler_patience", "lr_factor")
# mace-torch switches accepted only with the value that is what fine-tuning here does
SAME_WHEN = {"swa": False, "stage_two": False, "multiheads_finetuning": False, "keep_isolated_atoms": False,
             "lora": False, "lbfgs": False, "dry_run": False, "foundation_model_readout": True, "beta": 0.9,
             "compute_atomic_dipole": False, "compute_polarizability": False}
HINTS = {         "lora": "; fine-tuning here trains every weight (freeze keeps chosen ones fixed)",
         "lbfgs": "; the optimisers here are AdamW and Adam (optimizer)",
         "beta": "; the optimiser's first-moment decay here",
         "foundation_model_readout": "; fine-tuning here starts from the model's own readouts",
         "multiheads_finetuning": "; against forgetting use replay_file (--replay) with a sample of the foundation "
                                  "model's training data",
         "keep_isolated_atoms": "; isolated-atom frames (config_type=IsolatedAtom) give E0s and are not trained on",
         "compute_atomic_dipole": "; fine-tuning here trains energies, forces and stress only",
         "compute_polarizability": "; fine-tuning here trains energies, forces and stress only"}
# mace-torch options that its command line takes as switches (--ema, or --swa=False) with a meaning here
SWITCHES = ("ema", "amsgrad", "keep_checkpoints", "restart_latest", "distributed", "swa", "stage_two",
            "multiheads_finetuning", "keep_isolated_atoms", "compute_atomic_dipole", "compute_polarizability",
            "lora", "lbfgs", "dry_run", "foundation_model_readout", "pseudolabel_replay")
# mace-torch losses -> ours: "weighted" has no stress term, "forces_only" only the forces term
LOSSES = {"weighted": {"loss": "mse", "stress_weight": 0.0}, "stress": {"loss": "mse"}, "huber": {"loss": "huber"},
          "forces_only": {"loss": "mse", "energy_weight": 0.0, "stress_weight": 0.0}}


def _loss(value, source: str) -> Dict[str, Any]:
    if value in ("mse", "huber"):  # already ours
        return {"loss": value}
    if value not in LOSSES:
        raise ValueError(f"{source}: loss: mace-torch's {value!r} has no counterpart here; mace-torch's "
                         f"{', '.join(repr(k) for k in LOSSES)} do (or ours: 'mse', 'huber')")
    return dict(LOSSES[value])


def _mapping(value: str, name: str, source: str) -> Dict[str, Any]:
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        parsed = None
    if not isinstance(parsed, dict):
        raise ValueError(f"{source}: {name}: expected a mapping such as '{{\"Default\": 1.0}}', got {value!r}")
    return parsed


def names() -> FrozenSet[str]:
    """Every mace-torch option name that ``from_mace_options`` translates, sets aside or refuses by name."""
    return frozenset({*RENAMES, *KEYS, *SET_ASIDE, *UNTRAINED, *STAGE_TWO, *REPLAY_OPTIONS, *REPLAY_TUNING,
                      *PLATEAU_OPTIONS, *SAME_WHEN, *SWITCHES, *NOT_GIVEN,
                      "E0s", "scheduler", "test_dir", "loss", "freeze", "config_type_weights", "heads"})


def e0s_file(value, label: str):
    """``value`` read as mace-torch's JSON file of {Z: energy} where it names one (a string ending in
    .json), else ``value`` as is; ``label``: what errors are named by (the option, and where it is from)."""
    if not (isinstance(value, str) and value.strip().endswith(".json")):
        return value
    try:
        with open(value.strip()) as fh:
            value = json.load(fh)
    except OSError as exc:
        raise ValueError(f"{label}: cannot read {value!r} ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{label}: {value!r} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{label}: expected a JSON mapping atomic number -> energy, got {type(value).__name__}")
    return value


def _e0s(value, source: str):
    if isinstance(value, str) and value.strip().endswith(".json"):  # mace-torch's file of {Z: energy}
        return e0s_file(value, f"{source}: E0s")
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise ValueError(f"{source}: E0s: expected 'average', 'foundation' or a mapping such as "
                             f"{{29: -3.5}}, got {value!r}") from None
    if value == "estimated":
        raise ValueError(f"{source}: E0s: mace-torch's 'estimated' has no counterpart here; use 'average' "
                         "(least squares on the training set), 'foundation' or a mapping")
    return value
