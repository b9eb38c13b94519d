"""Import from mace-torch and our own storage format.

- ``from_mace(model)``: reads the structure of a mace-torch ``MACE``/``ScaleShiftMACE`` (irreps,
  instructions, radial settings, readouts...) into a JSON-able config, builds our model and copies
  every weight and buffer (U tensors included) through an explicit key map.
- ``save(model, path)`` / ``load(path)``: our format is one ``torch.save`` file holding the config
  as a JSON string and the state dict (plain tensors only, so it loads with ``weights_only=True``
  and without mace-torch); when ``path`` is a directory, ``config.json`` + ``weights.pt`` inside
  it. ``load`` also accepts mace-torch ``.model`` files (pickled modules: needs mace-torch, and
  unpickling runs code from the file, so load only files you trust; ``load`` warns before it
  does, and never unpickles a file that fails the format check).
"""
from __future__ import annotations

import importlib.util
import json
import os
import pickle
import pickletools
import warnings
import zipfile
from typing import Callable, Dict, Optional, Union

import torch

from .._compat import default_dtype, quiet_mace  # importing _compat also lets torch.load read e3nn objects
from .._files import atomic_write, remove_stale_temps
from .blocks import INTERACTIONS
from .foundations import foundation_checkpoint
from .mace_keys import mace_key_names
from .mace import CONFIG_VERSION, MACE, PRECISIONS, ScaleShiftMACE, resolve_precision

FORMAT = "equikernels.models.MACE"
CONFIG_FILE, WEIGHTS_FILE = "config.json", "weights.pt"
_GATE_NAMES = {"silu": "silu", "tanh": "tanh", "abs": "abs"}
_RADIAL = {"BesselBasis": "bessel", "GaussianBasis": "gaussian", "ChebychevBasis": "chebyshev"}
_TRANSFORMS = {"AgnesiTransform": "Agnesi", "SoftTransform": "Soft"}


def _irreps(x) -> str:
    return str(x)


def _gate_name(act) -> Optional[str]:
    if act is None:
        return "None"
    f = getattr(act, "f", act)
    name = getattr(f, "__name__", type(f).__name__).lower()
    if name not in _GATE_NAMES:
        raise ValueError(f"readout gate {name!r} is not supported (expected one of {tuple(_GATE_NAMES)} or None)")
    return _GATE_NAMES[name]


def _check_plain_e3nn(model) -> None:
    for name, mod in model.named_modules():
        cls = type(mod)
        if cls.__module__.split(".")[0] in ("cuequivariance_torch", "cuequivariance", "openequivariance"):
            raise ValueError(f"mace_model: module {name!r} is a {cls.__module__}.{cls.__name__}; convert the model "
                             "back to e3nn first (mace.cli.convert_cueq_e3nn / convert_oeq_e3nn)")


def _class_before_accelerate(model) -> type:
    """The class of ``model`` before ``equikernels.accelerate`` (its subclasses name their base ``_ek_base``)."""
    return getattr(type(model), "_ek_base", type(model))


def config_from_mace(model) -> dict:
    """The JSON-able structure of a mace-torch ``MACE``/``ScaleShiftMACE``."""
    from mace import modules as mm  # noqa: PLC0415 (optional dependency)

    cls = _class_before_accelerate(model)
    if cls not in (mm.MACE, mm.ScaleShiftMACE):
        raise TypeError(f"mace_model: expected a mace-torch MACE or ScaleShiftMACE, got {cls.__name__}")
    _check_plain_e3nn(model)
    if hasattr(model, "joint_embedding"):
        raise ValueError("mace_model: models with embedding_specs (joint embeddings) are not supported")
    if getattr(model, "lammps_mliap", False):
        raise ValueError("mace_model: LAMMPS ML-IAP models are not supported")
    re = model.radial_embedding
    basis = type(re.bessel_fn).__name__
    if basis not in _RADIAL:
        raise ValueError(f"mace_model: radial basis {basis} is not supported")
    transform = "None"
    if hasattr(re, "distance_transform"):
        name = type(re.distance_transform).__name__
        if name not in _TRANSFORMS:
            raise ValueError(f"mace_model: distance transform {name} is not supported")
        transform = _TRANSFORMS[name]
    sh = model.spherical_harmonics
    if not (sh.normalize and sh.normalization == "component"):
        raise ValueError("mace_model: expected spherical harmonics with normalize=True, normalization='component'")
    cfg = {
        "version": CONFIG_VERSION,
        "model": cls.__name__,
        "layout": "ir_mul",
        "r_max": float(model.r_max),
        "num_bessel": int(re.out_dim),
        "num_polynomial_cutoff": int(re.cutoff_fn.p),
        "radial_type": _RADIAL[basis],
        "distance_transform": transform,
        "apply_cutoff": bool(getattr(re, "apply_cutoff", True)),
        "pair_repulsion": bool(getattr(model, "pair_repulsion", False)),
        "sh_irreps": _irreps(sh.irreps_out),
        "atomic_numbers": [int(z) for z in model.atomic_numbers.tolist()],
        "heads": list(getattr(model, "heads", None) or ["Default"]),
        "num_elements": int(model.node_embedding.linear.irreps_in.dim),
        "node_feats_irreps": _irreps(model.node_embedding.linear.irreps_out),
        "atomic_energies_shape": list(model.atomic_energies_fn.atomic_energies.shape),
        "use_agnostic_product": bool(getattr(model, "use_agnostic_product", False)),
        "interactions": [_interaction_config(i) for i in model.interactions],
        "products": [_product_config(p) for p in model.products],
        "readouts": [_readout_config(r) for r in model.readouts],
    }
    if cfg["model"] == "ScaleShiftMACE":
        cfg["scale_shift_shape"] = list(model.scale_shift.scale.shape)
    return cfg


def _interaction_config(inter) -> dict:
    kind = type(inter).__name__
    if kind not in INTERACTIONS:
        raise ValueError(f"mace_model: interaction block {kind} is not supported (supported: {tuple(INTERACTIONS)})")
    tp = inter.conv_tp
    # equikernels.accelerate's own fusion keeps e3nn's product (and its instructions) on conv_tp
    if getattr(inter, "conv_fusion", None) and getattr(type(tp), "_ek_adapter", None) is None:
        raise ValueError("mace_model: fused-convolution (cuEquivariance/OpenEquivariance) blocks are not supported")
    instructions = [(i.i_in1, i.i_in2, i.i_out, i.connection_mode, bool(i.has_weight)) for i in tp.instructions]
    return {
        "type": kind,
        "node_feats_irreps": _irreps(inter.linear_up.irreps_in),
        "edge_irreps": _irreps(inter.linear_up.irreps_out),
        "irreps_mid": _irreps(tp.irreps_out),
        "instructions": instructions,
        "target_irreps": _irreps(inter.linear.irreps_out),
        "hidden_irreps": _irreps(inter.skip_tp.irreps_out),
        "radial_mlp": list(inter.conv_tp_weights.hs[1:-1]),
        "avg_num_neighbors": float(inter.avg_num_neighbors),
    }


def _product_config(prod) -> dict:
    sc = prod.symmetric_contractions
    contractions = list(sc.contractions)
    channels = contractions[0].num_features
    for mul, ir in sc.irreps_in:
        if mul != channels:
            raise ValueError(f"mace_model: symmetric contraction input {sc.irreps_in} has non-uniform multiplicities")
    return {
        "channels": int(channels),
        "ls_in": [ir.l for _, ir in sc.irreps_in],
        "ls_out": [ir.l for _, ir in sc.irreps_out],
        "correlation": [int(c.correlation) for c in contractions],
        "num_elements": int(contractions[0].weights_max.shape[0]),
        "use_sc": bool(prod.use_sc),
        "hidden_irreps": _irreps(prod.linear.irreps_out),
        "u_shapes": [[list(c.U_tensors(nu).shape) for nu in range(1, c.correlation + 1)] for c in contractions],
    }


def _readout_config(r) -> dict:
    kind = type(r).__name__
    if kind == "LinearReadoutBlock":
        return {"type": "linear", "irreps_in": _irreps(r.linear.irreps_in), "irreps_out": _irreps(r.linear.irreps_out)}
    if kind == "NonLinearReadoutBlock":
        acts = list(r.non_linearity.acts)
        if len(acts) != 1 or any(ir.l != 0 for _, ir in r.linear_1.irreps_out):
            raise ValueError(f"mace_model: readout MLP irreps {r.linear_1.irreps_out} must be a single block of "
                             "scalars")
        return {"type": "nonlinear", "irreps_in": _irreps(r.linear_1.irreps_in),
                "mlp_irreps": _irreps(r.linear_1.irreps_out), "gate": _gate_name(acts[0]),
                "irreps_out": _irreps(r.linear_2.irreps_out), "num_heads": int(getattr(r, "num_heads", 1))}
    raise ValueError(f"mace_model: readout {kind} is not supported (LinearReadoutBlock, NonLinearReadoutBlock)")


def mace_key_map(model, cfg: dict) -> Dict[str, str]:
    """Our state dict keys -> the mace-torch state dict keys they come from (each checked to be in
    ``model``'s state dict)."""
    src = model.state_dict()
    out = mace_key_names(cfg)
    for theirs in out.values():
        if theirs not in src:
            raise KeyError(f"mace_model: expected state entry {theirs!r}")
    return out


def _model_dtype(state: Dict[str, torch.Tensor]) -> torch.dtype:
    t = state.get("atomic_energies")
    return t.dtype if t is not None and t.is_floating_point() else torch.get_default_dtype()


def build(config: dict, state_dict: Dict[str, torch.Tensor]) -> MACE:
    """Our model from a config and a full state dict (in the state dict's dtype)."""
    cls = {"MACE": MACE, "ScaleShiftMACE": ScaleShiftMACE}.get(config.get("model"))
    if cls is None:
        raise ValueError(f"config['model']: expected 'MACE' or 'ScaleShiftMACE', got {config.get('model')!r}")
    with default_dtype(_model_dtype(state_dict)):
        model = cls(config)
    model.load_state_dict(state_dict, strict=True)
    return model


def check_normalisation(mace_model, model: MACE) -> None:
    """Raises ValueError unless every interaction of ``model`` has ``mace_model``'s conv_tp path weights
    (e3nn's default normalisation, which ``config_from_mace`` assumes)."""
    for theirs, inter in zip(mace_model.interactions, model.interactions):
        got = inter.problem.path_coefficients
        want = [float(i.path_weight) for i in theirs.conv_tp.instructions]
        if any(abs(a - b) > 1e-6 * max(1.0, abs(b)) for a, b in zip(got, want)):
            raise ValueError("mace_model: its conv_tp normalisation differs from e3nn's defaults; not supported")


def from_mace(mace_model, precision=None) -> MACE:
    """Rebuild a mace-torch ``MACE``/``ScaleShiftMACE`` (object) as an equikernels model with the
    same weights; returned in the same dtype, on the same device, in the same train/eval mode.
    ``precision`` ("fp64", "fp32", "bf16-mixed", "fp16-mixed"): ``MACE.set_precision`` on the result."""
    cfg = config_from_mace(mace_model)
    src = mace_model.state_dict()
    state = {ours: src[theirs] for ours, theirs in mace_key_map(mace_model, cfg).items()}
    model = build(cfg, {k: v.detach().clone() for k, v in state.items()})
    check_normalisation(mace_model, model)
    device = next(iter(state.values())).device
    model = model.to(device).train(mace_model.training)
    return model if precision is None else model.set_precision(precision)


def save(model: MACE, path: Union[str, os.PathLike]) -> None:
    """Write ``model`` in our format: one file, or ``config.json`` + ``weights.pt`` if ``path`` is a
    directory. Each file is written to a temporary name and renamed into place, the directory's pair
    only once both are written (an interrupted write leaves the previous files; its leftover is removed
    by the next save or load)."""
    if not isinstance(model, MACE):
        cls = _class_before_accelerate(model)
        hint = ("; a mace-torch model is saved as equikernels.models.save(equikernels.models.from_mace(model), path)"
                if cls.__module__.split(".")[0] == "mace" else "")
        raise TypeError(f"model: expected an equikernels.models.MACE/ScaleShiftMACE, got {cls.__module__}."
                        f"{cls.__name__}{hint}")
    path = os.fspath(path)
    if not path:
        raise ValueError("path: expected a file name or an existing directory, got ''")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"{path}: cannot write the model there, folder {parent} does not exist")
    config = json.dumps(model.config, indent=1)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if os.path.isdir(path):
        # the config renamed only once the weights are written whole: an interruption leaves the earlier pair
        _atomic_torch_save(os.path.join(path, WEIGHTS_FILE), state,
                           before_rename=lambda: _atomic_write_text(os.path.join(path, CONFIG_FILE), config))
    else:
        _atomic_torch_save(path, {"format": FORMAT, "config": config, "state_dict": state})


class CodeExecutionWarning(UserWarning):
    """Issued right before a file is unpickled in full, which runs code stored in it."""


def load(path: Union[str, os.PathLike], device: Union[str, torch.device, None] = None,
         dtype: Optional[torch.dtype] = None, precision=None) -> MACE:
    """Load our format (a file, or a directory with ``config.json`` + ``weights.pt``; no mace-torch
    needed) or a mace-torch ``.model`` file (needs mace-torch), or a foundation model by the name
    mace-torch knows it by ("medium", "small_off", ...; ``models.foundations``), downloaded into
    mace-torch's cache the first time.

    Every file is checked first: anything that is not a ``torch.save`` archive (empty, truncated,
    text, random bytes) is refused with a ``ValueError`` naming the file and what was expected.
    Our format is read with ``weights_only=True`` (no code runs). A mace-torch file is a pickled
    module: it is unpickled in full only after a ``CodeExecutionWarning`` saying that this runs
    code from the file (load only files you trust; ``equikernels convert`` writes a code-free copy).

    ``precision`` ("fp64", "fp32", "bf16-mixed", "fp16-mixed"; see ``MACE.set_precision``) is
    applied after ``dtype``; a mixed precision keeps float32 parameters, so it excludes float64."""
    if dtype is not None and dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype: expected torch.float32 or torch.float64, got {dtype} (for half-precision "
                         "node features give precision='bf16-mixed' or 'fp16-mixed')")
    if precision is not None:
        precision = resolve_precision(precision)
        if dtype is not None and dtype != PRECISIONS[precision][0]:
            raise ValueError(f"dtype={dtype} and precision={precision!r} disagree (that precision keeps "
                             f"{PRECISIONS[precision][0]} parameters); give one of them")
    path = os.fspath(path)
    path = foundation_checkpoint(path) or path  # "medium", "small_off", ...: mace-torch's foundation models
    if os.path.isdir(path):
        model = _load_directory(path)
    elif not os.path.exists(path):
        names = ("nor a foundation-model name mace-torch knows, such as 'medium' or 'small_off'"
                 if importlib.util.find_spec("mace") is not None else
                 "foundation-model names such as 'medium' need mace-torch: pip install mace-torch")
        raise FileNotFoundError(f"{path}: no such model file or directory ({names})")
    else:
        remove_stale_temps(path)
        _refuse_mliap(path)
        obj = _torch_load_safe(path, "an equikernels model file or a mace-torch .model file")
        if obj is _NEEDS_PICKLE and _pickled_class(path) in _OUR_CLASSES:
            model = _load_pickled_ours(path)
        elif obj is _NEEDS_PICKLE:
            model = _from_mace_file(path)
        elif isinstance(obj, dict) and obj.get("format") == FORMAT:
            model = _build_checked(path, obj.get("config"), obj.get("state_dict"))
        elif _our_state_dict(obj):
            raise ValueError(f"{path}: an equikernels state dict (weights without the model's structure): expected "
                             "a model file written by equikernels.models.save, or load_state_dict it into a model "
                             "that load() built")
        elif _mace_state_dict(obj) is not None:
            raise ValueError(f"{path}: {_mace_state_dict(obj)} (weights without the model's structure): expected the "
                             "mace-torch .model file its training writes, or build the mace-torch model, "
                             "load_state_dict into it and pass it to equikernels.models.from_mace")
        else:
            raise ValueError(f"{path}: a torch file holding {_describe(obj)}, not a model: expected an equikernels "
                             "model file (equikernels.models.save, equikernels convert) or a mace-torch .model file")
    if dtype is not None:
        model = model.to(dtype)
    if device is not None:
        model = model.to(device)
    if precision is not None:
        model.set_precision(precision)
    return model.eval()


_NEEDS_PICKLE = object()  # a valid torch archive that only a full unpickle can read
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"  # pre-1.6 torch.save
_MLIAP_MARK = b"equikernels.lammps.mliap"  # the module of the object export-lammps pickles


def is_mliap_file(path: str) -> bool:
    """Whether ``path`` is a file ``equikernels export-lammps`` wrote: its pickle names the ML-IAP class
    first (read without unpickling)."""
    if not os.path.isfile(path):
        return False
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                names = [n for n in archive.namelist() if n.endswith("/data.pkl")]
                if len(names) != 1:
                    return False
                with archive.open(names[0]) as f:
                    head = f.read(64)
        else:
            with open(path, "rb") as f:
                head = f.read(64)
    except (OSError, zipfile.BadZipFile):
        return False
    return head[:1] == b"\x80" and _MLIAP_MARK in head


def _refuse_mliap(path: str) -> None:
    """``ValueError`` for a file ``equikernels export-lammps`` wrote (what LAMMPS loads), not a model."""
    if is_mliap_file(path):
        raise ValueError(f"{path}: an ML-IAP file written by equikernels export-lammps (what LAMMPS loads), not a "
                         "model file; give the model file it was exported from")


def check_torch_file(path: str, expected: str) -> None:
    """Refuse (``ValueError`` naming ``path`` and ``expected``) a file that is not a ``torch.save``
    archive: empty, truncated, text or other bytes. Reads the file's head and zip directory only."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError as exc:
        raise OSError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if size == 0:
        what = "is empty"
    elif head.startswith(_LEGACY_MAGIC):
        return
    elif head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
        except (zipfile.BadZipFile, OSError, ValueError):
            names = None
        if names and any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
            return
        what = ("is a truncated or damaged zip archive" if names is None
                else "is a zip archive but not one written by torch.save")
    else:
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            what = "has unrecognised binary content"
        else:
            what = f"is text (starts {text.strip()[:30]!r})"
    raise ValueError(f"{path}: not a model file, it {what}; expected {expected}")


def _torch_load_safe(path: str, expected: str):
    """``torch.load(weights_only=True)`` after ``check_torch_file``; ``_NEEDS_PICKLE`` when the file
    is intact but holds objects only a full unpickle can build (a pickled module). A TorchScript
    archive is refused by name."""
    check_torch_file(path, expected)
    if _is_torchscript(path):
        raise ValueError(f"{path}: a TorchScript (compiled) model, which has lost the module structure a conversion "
                         f"reads; expected {expected} (mace-torch's training writes the .model file beside "
                         "its *_compiled.model)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights_only" in str(exc) or "Weights only" in str(exc):
            return _NEEDS_PICKLE
        raise ValueError(f"{path}: damaged torch file ({_first_line(exc)}); expected {expected}") from None
    except (RuntimeError, EOFError, ValueError, OSError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: damaged torch file ({_first_line(exc)}); expected {expected}") from None


def _is_torchscript(path: str) -> bool:
    """Whether ``path`` is a ``torch.jit.save`` archive (its zip holds the compiled code)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return False
    return any(n.endswith("/constants.pkl") or "/code/__torch__" in n for n in names)


_MACE_STATE_KEY = "atomic_energies_fn.atomic_energies"


def _mace_state_dict(obj) -> Optional[str]:
    """What a mace-torch state dict or training checkpoint ``obj`` is, in words; None for anything else."""
    if not isinstance(obj, dict):
        return None
    if _MACE_STATE_KEY in obj:
        return "a mace-torch state dict"
    inner = obj.get("model")
    if isinstance(inner, dict) and _MACE_STATE_KEY in inner:
        return "a mace-torch training checkpoint"
    return None


def _our_state_dict(obj) -> bool:
    """Whether ``obj`` is an equikernels MACE state dict (``model.state_dict()`` saved on its own)."""
    return isinstance(obj, dict) and all(k in obj for k in ("atomic_energies", "atomic_numbers", "r_max",
                                                             "node_embedding.weight"))


_OUR_CLASSES = {(MACE.__module__, MACE.__name__), (ScaleShiftMACE.__module__, ScaleShiftMACE.__name__)}


def _pickled_class(path: str) -> Optional[tuple]:
    """(module, name) of the class of the object pickled in the ``torch.save`` archive ``path``, read
    from the pickle's opcodes without running it; None when it cannot be told."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            data = zf.read(names[0]) if names else b""
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":  # torch.save's protocol 2: the root object's class comes first
                module, _, name = str(arg).partition(" ")
                return module, name
            if op.name in ("STACK_GLOBAL", "REDUCE", "BUILD", "STOP"):
                return None
    except (zipfile.BadZipFile, OSError, ValueError, IndexError):
        return None
    return None


def _load_pickled_ours(path: str) -> MACE:
    """An equikernels model saved whole (``torch.save(model, path)``): unpickled after the warning that
    this runs code from the file; mace-torch is not needed."""
    if os.path.realpath(path) not in _WARNED_PICKLES:
        _WARNED_PICKLES.add(os.path.realpath(path))
        warnings.warn(f"{path}: loading a pickled model, which runs code stored in the file; load only files you "
                      "trust (equikernels.models.save writes a copy that loads without running code)",
                      CodeExecutionWarning, stacklevel=3)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=False)
    except (ModuleNotFoundError, AttributeError) as exc:
        raise ImportError(f"{path}: the pickled model needs code that is not installed ({_first_line(exc)})") from None
    if not isinstance(obj, MACE):
        raise ValueError(f"{path}: holds {_describe(obj)}, expected an equikernels MACE or a mace-torch model")
    return obj


# mace-torch's dipole models: not converted (their readouts are not ours), run with our kernels
RUN_ACCELERATED = ("EnergyDipolesMACE", "AtomicDipolesMACE")


class UnconvertibleMaceModel(ValueError):
    """A mace-torch ``MACE`` / ``ScaleShiftMACE`` file whose structure ``from_mace`` does not read, or a
    dipole model (``RUN_ACCELERATED``):
    ``module`` is the unpickled mace-torch model, ``reason`` what was not read (one line)."""

    def __init__(self, message: str, module: torch.nn.Module, reason: str):
        super().__init__(message)
        self.module, self.reason = module, reason


def _from_mace_file(path: str) -> MACE:
    """``from_mace`` of the module pickled in ``path``; a model it cannot convert is refused naming ``path``."""
    module = _load_mace_file(path, stacklevel=4)  # the warning points at load's caller
    try:
        return from_mace(module)
    except (TypeError, ValueError, KeyError) as exc:
        text = str(exc.args[0]) if exc.args else type(exc).__name__
        text = text.strip().splitlines()[0].removeprefix("mace_model: ") if text.strip() else type(exc).__name__
        name = type(module).__name__
        if name in RUN_ACCELERATED:
            text = f"{name}'s dipole readouts"
        if name in RUN_ACCELERATED or (name in ("MACE", "ScaleShiftMACE") and not isinstance(exc, TypeError)):
            # its layers still run on our kernels
            raise UnconvertibleMaceModel(
                f"{path}: this mace-torch model cannot be converted: {text}; equikernels' MACECalculator and "
                "mace-torch's (after equikernels.accelerate(model) on each of calc.models) run it with "
                "equikernels' kernels", module, text) from exc
        kind = TypeError if isinstance(exc, TypeError) else ValueError
        raise kind(f"{path}: this mace-torch model cannot be converted: {text}") from exc


def _load_directory(path: str) -> MACE:
    cfg_path, w_path = os.path.join(path, CONFIG_FILE), os.path.join(path, WEIGHTS_FILE)
    missing = [name for name, p in ((CONFIG_FILE, cfg_path), (WEIGHTS_FILE, w_path)) if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"{path}: a model directory needs {CONFIG_FILE} and {WEIGHTS_FILE} "
                                f"(as equikernels convert writes); missing {' and '.join(missing)}")
    remove_stale_temps(cfg_path)
    remove_stale_temps(w_path)
    try:
        with open(cfg_path, "rb") as f:
            config = json.loads(f.read())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{cfg_path}: not a model configuration ({_first_line(exc)}); expected the JSON "
                         "that equikernels.models.save writes") from None
    state = _torch_load_safe(w_path, f"the weights that equikernels.models.save writes beside {CONFIG_FILE}")
    if state is _NEEDS_PICKLE:
        raise ValueError(f"{w_path}: holds pickled objects, not plain tensors; expected the weights that "
                         "equikernels.models.save writes (refusing to run code from it)")
    return _build_checked(path, config, state)


def _build_checked(path: str, config, state) -> MACE:
    if not isinstance(config, (str, dict)) or not isinstance(state, dict):
        raise ValueError(f"{path}: incomplete model (no config or no state_dict); expected an equikernels model")
    try:
        return build(json.loads(config) if isinstance(config, str) else config, state)
    except (ValueError, KeyError, TypeError, RuntimeError, AttributeError, IndexError) as exc:
        raise ValueError(f"{path}: the model's config and weights do not fit together "
                         f"({type(exc).__name__}: {_first_line(exc)}); was it written by another version?") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _describe(obj) -> str:
    if isinstance(obj, dict):
        return f"a dict with keys {sorted(map(str, obj))[:6]}"
    return f"a {type(obj).__name__}"


def load_mace_module(path: Union[str, os.PathLike]) -> Optional[torch.nn.Module]:
    """The mace-torch module pickled in ``path`` (checked and announced as ``load`` does), or None
    when ``path`` is in our own format; ``ValueError`` for a file that is neither."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        _refuse_mliap(path)
    if os.path.isdir(path) or _torch_load_safe(path, "a mace-torch .model file") is not _NEEDS_PICKLE:
        return None
    if _pickled_class(path) in _OUR_CLASSES:  # an equikernels model saved whole
        return None
    return _load_mace_file(path)


_WARNED_PICKLES: set = set()


def _load_mace_file(path: str, stacklevel: int = 3):
    try:
        quiet_mace()
        importlib.import_module("mace")  # registers the classes the pickle refers to
    except ImportError:
        raise ImportError(f"{path}: not an equikernels model file; loading a mace-torch .model file "
                          "needs mace-torch (pip install mace-torch)") from None
    if os.path.realpath(path) not in _WARNED_PICKLES:  # once per file and process (a run may load it twice)
        _WARNED_PICKLES.add(os.path.realpath(path))
        warnings.warn(f"{path}: loading a pickled model, which runs code stored in the file; load only files you "
                      "trust (equikernels convert writes a copy that loads without running code)",
                      CodeExecutionWarning, stacklevel=stacklevel)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=False)
    except (ModuleNotFoundError, AttributeError) as exc:
        raise ImportError(f"{path}: the pickled model needs code that is not installed ({_first_line(exc)})") from None
    if not isinstance(obj, torch.nn.Module):
        raise ValueError(f"{path}: holds {_describe(obj)}, expected a mace-torch model or an equikernels model file")
    return obj


def _atomic_torch_save(path: str, obj, before_rename: Optional[Callable[[], None]] = None) -> None:
    """``torch.save(obj)`` to a temporary name renamed onto ``path``; ``before_rename()`` runs once that
    file is written whole, before the rename (when it raises, ``path`` keeps its earlier content)."""
    def write(tmp: str) -> None:
        open(tmp, "wb").close()  # an unwritable place fails here with an OSError saying why
        torch.save(obj, tmp)
        if before_rename is not None:
            before_rename()
    _writing(path, write)


def _atomic_write_text(path: str, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)
    _writing(path, write)


def _writing(path: str, write) -> None:
    try:
        atomic_write(path, write)
    except OSError as exc:
        raise OSError(f"{path}: cannot write the model there ({exc.strerror or _first_line(exc)})") from exc
