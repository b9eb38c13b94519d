"""equikernels MACE -> mace-torch model object, so that a model fine-tuned (or converted) here can
be used by mace-torch's own tools again.

The mace-torch model is rebuilt from our config with mace-torch's constructor (or taken from a
mace-torch template file with the same structure), its structure is read back with the same
reader ``equikernels.models.from_mace`` uses and must equal ours, and every weight and buffer is
copied through the same key map, in the opposite direction."""
from __future__ import annotations

import importlib
import json
import warnings
from typing import Optional

import torch

_GATES = {"silu": torch.nn.functional.silu, "tanh": torch.tanh, "abs": torch.abs, "None": None}


def _plain(x):
    return json.loads(json.dumps(x))


def _differences(a: dict, b: dict):
    skip = {"version"}
    return sorted(k for k in (set(a) | set(b)) - skip if _plain(a.get(k)) != _plain(b.get(k)))


def _build(model) -> torch.nn.Module:
    import mace.modules as mm

    from .._compat import default_dtype, o3

    cfg = model.config
    inters, readouts = cfg["interactions"], cfg["readouts"]
    nonlinear = [r for r in readouts if r["type"] == "nonlinear"]
    heads = list(cfg["heads"])
    if nonlinear:
        mlp = o3.Irreps(nonlinear[0]["mlp_irreps"])
        mlp_irreps = o3.Irreps([(mul // len(heads), ir) for mul, ir in mlp])
        gate = _GATES[nonlinear[0]["gate"]]
    else:
        mlp_irreps, gate = o3.Irreps("16x0e"), torch.nn.functional.silu
    kwargs = dict(
        r_max=float(cfg["r_max"]), num_bessel=int(cfg["num_bessel"]),
        num_polynomial_cutoff=int(cfg["num_polynomial_cutoff"]),
        max_ell=max(ir.l for _, ir in o3.Irreps(cfg["sh_irreps"])),
        interaction_cls=getattr(mm, inters[min(1, len(inters) - 1)]["type"]),
        interaction_cls_first=getattr(mm, inters[0]["type"]),
        num_interactions=len(inters), num_elements=int(cfg["num_elements"]),
        # the products hold the hidden irreps; a first interaction that is not residual outputs others
        hidden_irreps=o3.Irreps(cfg["products"][0]["hidden_irreps"]), MLP_irreps=mlp_irreps,
        atomic_energies=model.atomic_energies.detach().cpu().double().numpy(),
        avg_num_neighbors=float(inters[0]["avg_num_neighbors"]),
        atomic_numbers=[int(z) for z in cfg["atomic_numbers"]],
        correlation=[int(p["correlation"][0]) for p in cfg["products"]], gate=gate,
        pair_repulsion=bool(cfg["pair_repulsion"]), apply_cutoff=bool(cfg["apply_cutoff"]),
        use_agnostic_product=bool(cfg["use_agnostic_product"]),
        distance_transform=cfg["distance_transform"], radial_MLP=list(inters[0]["radial_mlp"]),
        radial_type=cfg["radial_type"], heads=heads)
    dtype = model.atomic_energies.dtype
    with default_dtype(dtype), warnings.catch_warnings():
        # e3nn's scripted modules make TorchScript warn once per module about annotations, harmlessly
        warnings.filterwarnings("ignore", message=".*TorchScript type system", category=UserWarning)
        # nor can the user act on torch's deprecation of the torch.jit.script that e3nn 0.4.4 calls
        warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated")  # Deprecation- or FutureWarning
        if cfg["model"] == "ScaleShiftMACE":
            scale = model.scale.detach().cpu().double().numpy()
            shift = model.shift.detach().cpu().double().numpy()
            return mm.ScaleShiftMACE(atomic_inter_scale=scale.tolist() if scale.ndim else float(scale),
                                     atomic_inter_shift=shift.tolist() if shift.ndim else float(shift), **kwargs)
        return mm.MACE(**kwargs)


def _load_template(path: Optional[str]):
    """A mace-torch model object from ``path``, or None when it is not a mace-torch file."""
    if not path:
        return None
    try:
        from ..models.io import load_mace_module

        obj = load_mace_module(path)
    except (ImportError, ValueError, OSError):  # not a loadable mace-torch file: build from the config
        return None
    return obj if obj is not None and type(obj).__module__.startswith("mace.") else None


def to_mace(model, template: Optional[str] = None) -> torch.nn.Module:
    """A mace-torch ``MACE``/``ScaleShiftMACE`` with ``model``'s structure and weights (on the CPU,
    in the model's dtype, eval mode). ``template``: a mace-torch ``.model`` file of the same
    structure to fill in (e.g. the foundation model a fine-tuning started from); used when its
    structure matches, else the model is built from the config. Needs mace-torch."""
    try:
        importlib.import_module("mace")
    except ImportError:
        raise ImportError("writing a mace-torch model file needs mace-torch (pip install mace-torch)") from None
    from ..models.io import config_from_mace, mace_key_map
    from ..models.mace import MACE

    if not isinstance(model, MACE):
        raise TypeError(f"model: expected an equikernels MACE, got {type(model).__name__}")
    target = _load_template(template)
    if target is not None and _differences(config_from_mace(target), model.config):
        target = None
    if target is None:
        target = _build(model)
    theirs_cfg = config_from_mace(target)
    diff = _differences(theirs_cfg, model.config)
    if diff:
        why = ("; its symmetric contractions use another basis than mace-torch's (e.g. a model built by "
               "equikernels.models.builder, not read from mace-torch)") if "products" in diff else ""
        raise ValueError(f"this model cannot be written as a mace-torch model: mace-torch's constructor gives a "
                         f"different {', '.join(diff)}{why}")
    # in the model's dtype before the copy: a float32 template would round float64 weights
    target = target.to(dtype=model.atomic_energies.dtype)
    ours = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    state = target.state_dict()
    for mine, theirs in mace_key_map(target, theirs_cfg).items():
        if state[theirs].shape != ours[mine].shape:
            raise ValueError(f"{mine}: shape {tuple(ours[mine].shape)} does not fit mace-torch's {theirs} "
                             f"{tuple(state[theirs].shape)}")
        state[theirs] = ours[mine].to(state[theirs].dtype)
    target.load_state_dict(state)
    return target.cpu().eval()
