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


def _cuet_available() -> bool:
    """Whether mace-torch can build its reduced Clebsch-Gordan basis (it needs cuequivariance)."""
    try:
        from mace.modules.wrapper_ops import CUET_AVAILABLE
    except ImportError:
        return False
    return bool(CUET_AVAILABLE)


def _options(cfg: dict) -> dict:
    """mace-torch constructor options that the structure in ``cfg`` shows (each as mace-torch's
    ``MACE.__init__`` wires it), left at their defaults where the structure is the default one."""
    from .._compat import o3

    inters, products, readouts = cfg["interactions"], cfg["products"], cfg["readouts"]
    n = len(inters)
    out = {}
    # use_so3 gives spherical harmonics of parity +1 for every l
    if any(ir.p != (-1) ** ir.l for _, ir in o3.Irreps(cfg["sh_irreps"])):
        out["use_so3"] = True
    # one readout per layer unless only the last layer's is kept (none at all for a single layer)
    if len(readouts) != n:
        out["use_last_readout_only"] = True
    hidden = o3.Irreps(products[0]["hidden_irreps"])
    if n > 1 and hidden != o3.Irreps(str(hidden[0])) and o3.Irreps(products[-1]["hidden_irreps"]) == hidden:
        out["keep_last_layer_irreps"] = True
    edge = None
    if n > 1 and o3.Irreps(inters[1]["edge_irreps"]) != o3.Irreps(inters[1]["node_feats_irreps"]):
        edge = o3.Irreps(inters[1]["edge_irreps"])
    if o3.Irreps(inters[0]["edge_irreps"]) != o3.Irreps(inters[0]["node_feats_irreps"]):
        # the first layer then takes the scalars of edge_irreps
        out["use_edge_irreps_first"] = True
        edge = edge if edge is not None else o3.Irreps(inters[0]["edge_irreps"])
    if edge is not None:
        out["edge_irreps"] = edge
    return out


def _products_match(target, cfg: dict) -> bool:
    from ..models.io import config_from_mace

    return _plain(config_from_mace(target)["products"]) == _plain(cfg["products"])


def _u_match(target, model) -> bool:
    """Whether ``target``'s symmetric-contraction U tensors are ``model``'s (same basis)."""
    from ..models.mace_keys import mace_key_names

    ours, theirs = model.state_dict(), target.state_dict()
    for mine, name in mace_key_names(model.config).items():
        if ".U_" in mine:
            a, b = ours[mine].detach().cpu().double(), theirs[name].detach().cpu().double()
            if a.shape != b.shape or not torch.allclose(a, b, rtol=1e-5, atol=1e-6):
                return False
    return True


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
        radial_type=cfg["radial_type"], heads=heads, **_options(cfg))
    if cfg["model"] == "ScaleShiftMACE":
        scale = model.scale.detach().cpu().double().numpy()
        shift = model.shift.detach().cpu().double().numpy()
        kwargs.update(atomic_inter_scale=scale.tolist() if scale.ndim else float(scale),
                      atomic_inter_shift=shift.tolist() if shift.ndim else float(shift))
    cls = mm.ScaleShiftMACE if cfg["model"] == "ScaleShiftMACE" else mm.MACE

    def construct(use_reduced_cg: bool) -> torch.nn.Module:
        with default_dtype(model.atomic_energies.dtype), warnings.catch_warnings():
            # e3nn's scripted modules make TorchScript warn once per module about annotations, harmlessly
            warnings.filterwarnings("ignore", message=".*TorchScript type system", category=UserWarning)
            # nor can the user act on torch's deprecation of the torch.jit.script that e3nn 0.4.4 calls
            warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated")  # Deprecation/Future
            built = cls(use_reduced_cg=use_reduced_cg, **kwargs)
        # mace-torch's fine-tuning may give each layer its own average neighbour count
        for inter, c in zip(built.interactions, inters):
            inter.avg_num_neighbors = float(c["avg_num_neighbors"])
        return built

    # mace-torch's training default; without cuequivariance mace-torch builds this basis whatever the flag
    built = construct(False)
    if _cuet_available() and not (_products_match(built, cfg) and _u_match(built, model)):
        reduced = construct(True)
        if _products_match(reduced, cfg) and (_u_match(reduced, model) or not _products_match(built, cfg)):
            built = reduced
    return built


def _basis_only(theirs: dict, ours: dict) -> bool:
    """Whether the products of two configs differ in their U tensors' shapes only."""
    strip = [[{k: v for k, v in p.items() if k != "u_shapes"} for p in c["products"]] for c in (theirs, ours)]
    return _plain(strip[0]) == _plain(strip[1])


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
    structure matches, else the model is built from the config, with the constructor options
    (``use_so3``, ``use_last_readout_only``, ``keep_last_layer_irreps``, ``edge_irreps``,
    ``use_edge_irreps_first``, ``use_reduced_cg``) that its structure shows. Needs mace-torch."""
    from .._compat import quiet_mace

    quiet_mace()
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
        why = ""
        if diff == ["products"] and _basis_only(theirs_cfg, model.config):
            why = ("; its symmetric contractions use another basis than mace-torch's with use_reduced_cg=False or "
                   "True (e.g. a model built by equikernels.models.builder, not read from mace-torch)"
                   if _cuet_available() else
                   "; its symmetric contractions use another basis than mace-torch's with use_reduced_cg=False "
                   "(use_reduced_cg=True needs cuequivariance: pip install cuequivariance-torch; a model built by "
                   "equikernels.models.builder has a basis of its own)")
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
