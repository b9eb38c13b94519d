"""The names mace-torch gives the state entries of a model of one configuration (``models.io``'s
config), so that weights move between the two: ``mace_key_names(cfg)`` maps our keys to theirs."""
from __future__ import annotations

from typing import Dict

from .blocks import INTERACTIONS


def mace_key_names(cfg: dict) -> Dict[str, str]:
    """Our state dict keys -> mace-torch's names for them, for a model of config ``cfg``."""
    out: Dict[str, str] = {}

    def take(ours: str, theirs: str) -> None:
        out[ours] = theirs

    def linear(ours: str, theirs: str) -> None:
        for k in ("weight", "bias", "output_mask"):
            take(f"{ours}.{k}", f"{theirs}.{k}")

    for k in ("atomic_numbers", "r_max", "num_interactions"):
        take(k, k)
    take("atomic_energies", "atomic_energies_fn.atomic_energies")
    linear("node_embedding", "node_embedding.linear")
    basis = {"bessel": ("bessel_weights", "prefactor"), "gaussian": ("gaussian_weights",), "chebyshev": ("n",)}
    for k in basis[cfg["radial_type"]]:
        take(f"radial_embedding.basis.{k}", f"radial_embedding.bessel_fn.{k}")
    for k in ("p", "r_max"):
        take(f"radial_embedding.cutoff.{k}", f"radial_embedding.cutoff_fn.{k}")
    if cfg["distance_transform"] != "None":
        agnesi = cfg["distance_transform"] == "Agnesi"
        keys = ("q", "p", "a", "covalent_radii") if agnesi else ("alpha", "covalent_radii")
        for k in keys:
            take(f"radial_embedding.transform.{k}", f"radial_embedding.distance_transform.{k}")
    if cfg["pair_repulsion"]:
        for k in ("c", "p", "covalent_radii", "a_exp", "a_prefactor"):
            take(f"pair_repulsion.{k}", f"pair_repulsion_fn.{k}")
    for i, ic in enumerate(cfg["interactions"]):
        p = f"interactions.{i}"
        linear(f"{p}.linear_up", f"{p}.linear_up")
        linear(f"{p}.linear", f"{p}.linear")
        take(f"{p}.skip.weight", f"{p}.skip_tp.weight")
        for j in range(len(ic["radial_mlp"]) + 1):
            take(f"{p}.radial_mlp.layers.{j}.weight", f"{p}.conv_tp_weights.layer{j}.weight")
        if INTERACTIONS[ic["type"]][1]:
            take(f"{p}.density_fn.layers.0.weight", f"{p}.density_fn.layer0.weight")
    for i, pc in enumerate(cfg["products"]):
        p = f"products.{i}"
        for o, corr in enumerate(pc["correlation"]):
            c = f"{p}.symmetric_contractions.contractions.{o}"
            for nu in range(1, corr + 1):
                take(f"{p}.symmetric_contraction.U_{o}_{nu}", f"{c}.U_matrix_{nu}")
                theirs = f"{c}.weights_max" if nu == corr else f"{c}.weights.{corr - 1 - nu}"
                take(f"{p}.symmetric_contraction.weights.{o}.{nu - 1}", theirs)
        linear(f"{p}.linear", f"{p}.linear")
    for i, rc in enumerate(cfg["readouts"]):
        p = f"readouts.{i}"
        if rc["type"] == "linear":
            linear(f"{p}.linear", f"{p}.linear")
        else:
            linear(f"{p}.linear_1", f"{p}.linear_1")
            linear(f"{p}.linear_2", f"{p}.linear_2")
    if cfg["model"] == "ScaleShiftMACE":
        take("scale", "scale_shift.scale")
        take("shift", "scale_shift.shift")
    return out
