"""Build MACE configs (and random models) from mace-torch's constructor arguments, without
mace-torch.

``mace_config`` follows the layer wiring of mace-torch's ``MACE.__init__`` (interaction irreps,
the uvu instructions of each convolution, which blocks have skips, which readout is non-linear).
``coupled_u_matrices`` gives equivariant U tensors for the symmetric contraction by coupling
Clebsch-Gordan tensors pairwise, ((l1 x l2) -> l12) x l3 -> ... -> L, one column per coupling
path. They span the same polynomials as mace-torch's reduced basis but are neither orthogonal nor
minimal, so a model built with them is a valid, exactly equivariant MACE with its own weights,
not a mace-torch checkpoint: use it for tests and benchmarks; import real models with ``from_mace``.
"""
from __future__ import annotations

import contextlib
import functools
from typing import List, Optional, Sequence

import torch

from .._compat import default_dtype, o3
from .blocks import INTERACTIONS
from .mace import CONFIG_VERSION, MACE, ScaleShiftMACE


def _conv_irreps_and_instructions(irreps1: o3.Irreps, irreps2: o3.Irreps, target: o3.Irreps):
    """Output irreps of the uvu convolution (one segment per path, sorted) and its instructions."""
    outs, instr = [], []
    for i, (mul, ir_in) in enumerate(irreps1):
        for j, (_, ir_edge) in enumerate(irreps2):
            for ir_out in ir_in * ir_edge:
                if ir_out in target:
                    instr.append((i, j, len(outs), "uvu", True))
                    outs.append((mul, ir_out))
    irreps_out, perm, _ = o3.Irreps(outs).sort()
    instr = sorted(((a, b, perm[k], m, t) for a, b, k, m, t in instr), key=lambda x: x[2])
    return irreps_out, instr


def coupled_u_matrices(irreps_in, irreps_out, correlation: int) -> List[List[torch.Tensor]]:
    """U tensors [2L+1, d, .., d, K] (nu = 1..correlation) per output irrep; d = sum of input dims."""
    cached = _coupled_u(str(o3.Irreps(irreps_in)), str(o3.Irreps(irreps_out)), int(correlation))
    return [[u.clone() for u in per] for per in cached]


@functools.lru_cache(maxsize=32)
def _coupled_u(irreps_in: str, irreps_out: str, correlation: int):
    irreps_in, irreps_out = o3.Irreps(irreps_in), o3.Irreps(irreps_out)
    irs = [ir for _, ir in irreps_in]
    offs, d = [], 0
    for ir in irs:
        offs.append(d)
        d += ir.dim
    result = []
    for _, ir_out in irreps_out:
        per_nu = []
        for nu in range(1, correlation + 1):
            cols = []
            for segs in _sorted_tuples(len(irs), nu):
                for t in _couplings([irs[s] for s in segs], ir_out):
                    full = torch.zeros([ir_out.dim] + [d] * nu, dtype=torch.float64)
                    idx = tuple(slice(offs[s], offs[s] + irs[s].dim) for s in segs)
                    full[(slice(None),) + idx] = t
                    cols.append(full)
            if not cols:  # no path: one zero column, like mace-torch's zeroed weights
                cols.append(torch.zeros([ir_out.dim] + [d] * nu, dtype=torch.float64))
            u = torch.stack(cols, dim=-1)
            per_nu.append(u[0] if ir_out.l == 0 else u)
        result.append(per_nu)
    return result


def _sorted_tuples(n: int, k: int):
    if k == 0:
        yield ()
        return
    for first in range(n):
        for rest in _sorted_tuples(n - first, k - 1):
            yield (first,) + tuple(first + r for r in rest)


def _couplings(irs: Sequence[o3.Irrep], ir_out: o3.Irrep):
    """Every left-to-right coupling of irs to ir_out, as tensors [2L+1, d1, .., dnu] (normalised)."""
    states = [(irs[0], torch.eye(irs[0].dim, dtype=torch.float64))]  # (irrep, tensor [dim_state, d1..])
    for ir in irs[1:]:
        nxt = []
        for ir_a, t in states:
            for ir_c in ir_a * ir:
                cg = o3.wigner_3j(ir_a.l, ir.l, ir_c.l, dtype=torch.float64)  # [a, b, c]
                nxt.append((ir_c, torch.tensordot(t, cg, dims=([0], [0])).movedim(-1, 0)))  # [c, d1.., b]
        states = nxt
    out = []
    for ir, t in states:
        if ir == ir_out:
            out.append(t / t.norm())
    return out


def mace_config(*, r_max: float, num_bessel: int, num_polynomial_cutoff: int, max_ell: int,
                interaction: str, interaction_first: str, num_interactions: int, atomic_numbers: Sequence[int],
                hidden_irreps: str, MLP_irreps: str, avg_num_neighbors: float, correlation,
                gate: Optional[str] = "silu", heads: Optional[Sequence[str]] = None,
                radial_MLP: Sequence[int] = (64, 64, 64), model: str = "ScaleShiftMACE", radial_type: str = "bessel",
                distance_transform: str = "None", pair_repulsion: bool = False, apply_cutoff: bool = True,
                use_last_readout_only: bool = False, use_agnostic_product: bool = False) -> dict:
    """Config of a mace-torch-shaped model; the arguments are mace-torch's (interaction classes by name)."""
    for name, value in (("interaction", interaction), ("interaction_first", interaction_first)):
        if value not in INTERACTIONS:
            raise ValueError(f"{name}: expected one of {tuple(INTERACTIONS)}, got {value!r}")
    if model not in ("MACE", "ScaleShiftMACE"):
        raise ValueError(f"model: expected 'MACE' or 'ScaleShiftMACE', got {model!r}")
    if not isinstance(num_interactions, int) or num_interactions < 1:
        raise ValueError(f"num_interactions: expected an int >= 1, got {num_interactions!r}")
    hidden = o3.Irreps(hidden_irreps)
    if hidden.count(o3.Irrep(0, -1)) > 0:
        raise ValueError("hidden_irreps: odd scalars (0o) are not supported by this builder")
    heads = list(heads or ["Default"])
    corr = [correlation] * num_interactions if isinstance(correlation, int) else list(correlation)
    num_elements = len(atomic_numbers)
    channels = hidden.count(o3.Irrep(0, 1))
    for mul, _ in hidden:
        if mul != channels:
            raise ValueError(f"hidden_irreps: every irrep needs the same multiplicity ({channels}), got {hidden}")
    sh = o3.Irreps.spherical_harmonics(max_ell)
    inter_irreps = (sh * channels).sort()[0].simplify()
    node_feats = o3.Irreps(f"{channels}x0e")
    heads_out = f"{len(heads)}x0e"
    interactions, products, readouts = [], [], []
    for i in range(num_interactions):
        last = i == num_interactions - 1
        kind = interaction_first if i == 0 else interaction
        hidden_out = o3.Irreps(str(hidden[0])) if last else hidden  # the last layer keeps scalars only
        feats_in = node_feats if i == 0 else hidden
        mid, instr = _conv_irreps_and_instructions(feats_in, sh, inter_irreps)
        residual = INTERACTIONS[kind][0]
        interactions.append({
            "type": kind, "node_feats_irreps": str(feats_in), "edge_irreps": str(feats_in), "irreps_mid": str(mid),
            "instructions": instr, "target_irreps": str(inter_irreps),
            "hidden_irreps": str(hidden_out if residual else inter_irreps), "radial_mlp": list(radial_MLP),
            "avg_num_neighbors": float(avg_num_neighbors)})
        us = coupled_u_matrices(inter_irreps, hidden_out, corr[i])
        products.append({
            "channels": channels, "ls_in": [ir.l for _, ir in inter_irreps], "ls_out": [ir.l for _, ir in hidden_out],
            "correlation": [corr[i]] * len(hidden_out), "num_elements": 1 if use_agnostic_product else num_elements,
            "use_sc": bool(i > 0 or residual), "hidden_irreps": str(hidden_out),
            "u_shapes": [[list(u.shape) for u in per] for per in us]})
        if last:
            readouts.append({"type": "nonlinear", "irreps_in": str(hidden_out),
                             "mlp_irreps": str((len(heads) * o3.Irreps(MLP_irreps)).simplify()),
                             "gate": "None" if gate is None else gate, "irreps_out": heads_out,
                             "num_heads": len(heads)})
        elif not use_last_readout_only:
            readouts.append({"type": "linear", "irreps_in": str(hidden_out), "irreps_out": heads_out})
    cfg = {
        "version": CONFIG_VERSION, "model": model, "layout": "ir_mul", "r_max": float(r_max),
        "num_bessel": num_bessel, "num_polynomial_cutoff": num_polynomial_cutoff, "radial_type": radial_type,
        "distance_transform": distance_transform, "apply_cutoff": apply_cutoff, "pair_repulsion": pair_repulsion,
        "sh_irreps": str(sh), "atomic_numbers": [int(z) for z in atomic_numbers], "heads": heads,
        "num_elements": num_elements, "node_feats_irreps": str(node_feats),
        "atomic_energies_shape": [len(heads), num_elements] if len(heads) > 1 else [num_elements],
        "use_agnostic_product": use_agnostic_product,
        "interactions": interactions, "products": products, "readouts": readouts,
    }
    if model == "ScaleShiftMACE":
        cfg["scale_shift_shape"] = [len(heads)] if len(heads) > 1 else []
    return cfg


def random_model(config: dict, seed: int = 0, dtype: Optional[torch.dtype] = None) -> MACE:
    """A model of ``config`` with coupled-CG U tensors and random weights, E0, scale and shift."""
    dtype = dtype or torch.get_default_dtype()
    us = []
    for inter, prod in zip(config["interactions"], config["products"]):
        us.append(coupled_u_matrices(inter["target_irreps"], prod["hidden_irreps"], max(prod["correlation"])))
    cls = ScaleShiftMACE if config["model"] == "ScaleShiftMACE" else MACE
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=[]))
        stack.enter_context(default_dtype(dtype))
        torch.manual_seed(seed)
        model = cls(config, u_matrices=[[[u.to(dtype) for u in per] for per in p] for p in us])
        with torch.no_grad():
            model.atomic_energies.copy_(-torch.rand_like(model.atomic_energies) * 5)
            if isinstance(model, ScaleShiftMACE):
                model.scale.copy_(0.5 + torch.rand_like(model.scale))
                model.shift.copy_(torch.randn_like(model.shift) * 0.1)
    return model
