#!/usr/bin/env python
"""MACE training-step benchmark: equikernels' MACE in fp32 / bf16-mixed / fp16-mixed next to
mace-torch + cuEquivariance in fp32 and under mixed precision, speed and accuracy in one table.

One training step = ``optimizer.zero_grad()``; forward with ``training=True, compute_force=True`` (the
forces are ``-dE/dpos`` with ``create_graph=True``, as in mace-torch's training); loss
``w_E * mean(((E - E_t) / N)^2) + w_F * mean((F - F_t)^2)`` (energy per atom and force MSE, as mace's
``WeightedEnergyForcesLoss``); ``loss.backward()`` into the parameters; ``Adam.step()``. Timed with a pair
of CUDA events around every step after warm-up (as ``common.time_calls``, for a fixed step count; its
statistics); median of ``--steps`` steps; peak memory = ``torch.cuda.max_memory_allocated`` over the timed
steps (model, Adam state, activations; only the implementation being timed is on the GPU).

Model: the MACE-MP-0-medium-shaped ScaleShiftMACE of ``bench_mace.py`` (random weights, 128x0e+128x1o,
max_ell 3, correlation 3, 2 residual interactions, r_max 6, radial MLP [64, 64, 64], 89 elements), built by
mace-torch in float64 and once in float32 with the same weights. The readout scale is set so that the
reference's mean |F| on the batch is ``--force-scale`` eV/A (random weights give tiny forces; relative
errors do not depend on it, absolute ones in meV do). Batch: ``--structures`` periodic rattled Cu fcc
cells (lattice constant 3.6 A +- 1 %, rattle 0.1 A, one seed each) of ``--atoms-per-batch`` atoms in
total (``--mixed``: elements drawn from Cu Ni Pd Ag Au Al Fe). Targets: fixed, the float64 reference's
energies and forces plus Gaussian noise (``--noise-e`` eV/atom, ``--noise-f`` eV/A), so that the loss
residuals look like a model in training rather than 1e3-eV offsets.

Implementations (``--impls``), each built from the same weights, one after the other in one process:

* ``ek-fp32``, ``ek-bf16``, ``ek-fp16``: ``equikernels.models.from_mace`` then ``set_precision("fp32" |
  "bf16-mixed" | "fp16-mixed")``: float32 master parameters, node features / per-edge weights / products
  in the half type, float32 accumulation, geometry, readouts, energies and forces (README "MACE models").
  ek-fp32 is equikernels' default float32 path (on CUDA its radial-MLP kernels use 3-pass TF32 dots, about
  float32 accuracy); torch's own float32 matmuls run with the process defaults (``env`` in the JSON).
* ``mace-cueq-fp32``: mace-torch converted with ``mace.cli.convert_e3nn_cueq.run`` (cuEquivariance
  kernels, fused convolution on CUDA), float32.
* ``mace-cueq-bf16``, ``mace-cueq-fp16``: cuEquivariance's mixed-precision path, see below.
* ``mace-oeq-fp32``: mace-torch converted with ``mace.cli.convert_e3nn_oeq.run`` (OpenEquivariance
  kernels, fused atomic convolution on CUDA), float32; it has no mixed-precision path.
* ``mace-e3nn-fp32`` (not in the default set; slow): plain mace-torch (e3nn).

What "mixed precision" is for a cuEquivariance MACE (mace-torch 0.3.16, cuequivariance 0.13): mace-torch
itself has no mixed-precision mode. ``run_train``'s ``--default_dtype`` accepts only float32 / float64 and
sets the global default dtype; nothing in the package uses ``torch.autocast`` or a ``GradScaler``;
``convert_e3nn_cueq.run`` builds the cue model in the source model's parameter dtype, and every cue module
in ``mace/modules/wrapper_ops.py`` (``cuet.ChannelWiseTensorProduct`` / the fused-convolution
``cuet.SegmentedPolynomial(method="uniform_1d")``, ``cuet.SymmetricContraction``) gets
``dtype = math_dtype = torch.get_default_dtype()``; ``cuet.Linear`` / ``FullyConnectedTensorProduct`` use
``method="naive"`` (torch einsums). A half default dtype is therefore not an option either: the
``uniform_1d`` method accepts only math_dtype float32 / float64. What cuEquivariance does offer is
half-precision *operands*: its CUDA segmented-polynomial kernels take a dtype per operand (float16 /
bfloat16 / float32 / float64), compute in ``math_dtype`` (float32 here) and give each output the dtype of
the operand it is mapped to (operand 0 by default). The closest faithful mixed-precision path, reachable
without changing mace-torch, is therefore PyTorch's automatic mixed precision around the float32 cue
model — what a user (or Lightning's "bf16-mixed" / "16-mixed") does:

    with torch.autocast(device.type, dtype=torch.bfloat16 | torch.float16):
        out = model(batch, training=True, compute_force=True)   # forces by autograd inside autocast
    loss = loss_fn(out.float(), targets)                        # outside autocast, float32
    scaler.scale(loss).backward(); scaler.step(opt); scaler.update()   # fp16: GradScaler; bf16: plain

Parameters and Adam stay float32 (masters); autocast runs the matmul-type torch ops (radial MLP, the
einsum-based cue Linear layers, readouts) in the half type, so the per-edge weights and node features
reach the cue kernels in bf16/fp16 and those kernels compute in float32; everything else (spherical
harmonics, scatters, elementwise ops) runs in the dtype of its inputs. The fp16 variants (ours too) use
``torch.amp.GradScaler`` with the initial scale that gave finite first-step gradients (2^16 first, then
smaller), the standard fp16 recipe; bf16 needs none. If the cue kernels refuse mixed operand dtypes in
some version, that implementation is reported as ``error`` with the exception, not dropped.

cuEquivariance compiles its ``uniform_1d`` kernels with NVRTC on first use, for every candidate
algorithm. For the bf16 autocast step that took more than 10 minutes on a fresh H200 without finishing
one pass. ``CUEQUIVARIANCE_OPS_U1D_ALGOS=0`` (an environment variable of cuEquivariance's) limits it
to algorithm 0: the first pass then took 2-3 minutes. Results measured that way say so.

Accuracy (same table): every implementation's first-step forward (before any optimizer step, so the
weights are identical) against an equikernels float64 reference on the same batch: energy per atom (MAE
and max, meV/atom), forces (RMSE and max |dF| in meV/A, ||dF|| / ||F64||), loss; and its parameter
gradients of that first step against a float64 model of the same parameterisation: ek-* and
mace-e3nn-fp32 against the equikernels float64 model (whose parameters are mace-torch's, one to one),
mace-cueq-* against mace-cueq converted in float64 (cue's symmetric-contraction weights are a projection
of mace's, so they are compared in cue's own parameterisation). ``grad rel`` = ||g - g64|| / ||g64|| over
all parameters concatenated, for the whole loss and for its energy and force terms separately (how much
of the error comes through the energy, whose low-precision rounding competes with the residuals
E - E_t; the gradient errors scale roughly inversely with the residuals, i.e. with ``--noise-e`` /
``--noise-f``: 0.05 eV/atom and 0.1 eV/A stand for a model part-way through training). ``rel d(ΣE)/dθ``
is the gradient of the summed energy itself, free of residual weighting: the model's own derivative
error (bf16-mixed, CPU tiny model: 2.8e-3 there, while a ~10 meV/atom energy offset made the loss
gradient's relative error 0.74); the JSON also has
the worst single tensor, the cosine, and a cross-family
number over the parameters every implementation shares (mace-torch names) against the equikernels
float64 gradients. The float64 cue model's energies/forces against the equikernels float64 reference are
reported as a check of the two references.

Usage (GPU):  python benchmarks/bench_train.py --out results/train.json
Debug (CPU):  python benchmarks/bench_train.py --device cpu --tiny --impls ek-fp32,ek-bf16 --out /tmp/t.json
              (--tiny: 8x0e+8x1o, max_ell 2, correlation 2, 2 x 16 atoms; a plumbing check, not a measurement)
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
for _p in (str(HERE), str(HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import common as C  # noqa: E402
from bench_mace import MIXED_ELEMENTS  # noqa: E402

from equikernels.bench import mace as MC  # noqa: E402

Z = list(range(1, 90))
R_MAX = 6.0
FLOAT_KEYS = ("positions", "node_attrs", "shifts", "unit_shifts", "cell")
# name -> (family, precision): ek precision names are MACE.set_precision's; cueq/e3nn: autocast dtype or None
SPECS = {
    "ek-fp32": ("ek", "fp32"),
    "ek-bf16": ("ek", "bf16-mixed"),
    "ek-fp16": ("ek", "fp16-mixed"),
    "mace-cueq-fp32": ("cueq", None),
    "mace-cueq-bf16": ("cueq", torch.bfloat16),
    "mace-cueq-fp16": ("cueq", torch.float16),
    "mace-e3nn-fp32": ("e3nn", None),
    "mace-oeq-fp32": ("oeq", None),
}
REFERENCES = {"ek-fp64": ("ek", "fp64"), "mace-cueq-fp64": ("cueq", None)}  # not timed
DEFAULT_IMPLS = ("ek-fp32", "ek-bf16", "ek-fp16", "mace-cueq-fp32", "mace-cueq-bf16", "mace-cueq-fp16",
                 "mace-oeq-fp32")
BASELINE = "mace-cueq-fp32"
LOSS_SCALES = (2.0 ** 16, 2.0 ** 12, 2.0 ** 8, 2.0 ** 4, 1.0)  # fp16: first-step scales tried, largest first


# --- structures and data -------------------------------------------------------------------------
def cell_repeats(target_atoms: int) -> tuple:
    """(a, b, c) with 4abc (cubic fcc cells) closest to target_atoms, most cubic first."""
    best = None
    for a in range(1, 40):
        for b in range(a, 40):
            for c in range(b, 40):
                key = (abs(4 * a * b * c - target_atoms), c - a)
                if best is None or key < best[0]:
                    best = (key, (a, b, c))
                if 4 * a * b * c > 2 * target_atoms:
                    break
    return best[1]


def make_structures(n: int, atoms_per_batch: int, mixed: bool, seed: int = 0) -> List:
    import ase.build

    reps = cell_repeats(max(4, atoms_per_batch // max(1, n)))
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        a = 3.6 * (1.0 + 0.01 * rng.uniform(-1.0, 1.0))
        atoms = ase.build.bulk("Cu", "fcc", a=a, cubic=True).repeat(reps)
        atoms.rattle(0.1, seed=seed + 1 + k)
        if mixed:
            atoms.numbers = rng.choice(MIXED_ELEMENTS, size=len(atoms))
        out.append(atoms)
    return out


def cast_data(base: Dict[str, torch.Tensor], dtype: torch.dtype, device) -> Dict[str, torch.Tensor]:
    """A fresh copy of the batch (its own positions leaf) in ``dtype`` on ``device``."""
    return {k: (v.to(device=device, dtype=dtype) if k in FLOAT_KEYS else v.to(device)).clone()
            for k, v in base.items()}


# --- models --------------------------------------------------------------------------------------
@contextlib.contextmanager
def keep_default_dtype():
    old = torch.get_default_dtype()
    try:
        yield
    finally:
        torch.set_default_dtype(old)  # mace's converters change the global default dtype


def build_mace_model(dtype: torch.dtype, tiny: bool, avg_num_neighbors: float):
    """bench_mace's MACE-MP-0-medium-shaped model; --tiny: 8x0e+8x1o, max_ell 2, correlation 2 (the
    CPU reference path's cost is in the correlation-3 contraction; this is a plumbing check)."""
    return MC.mace_model(avg_num_neighbors, dtype, **({**MC.TINY, "max_ell": 2, "correlation": 2} if tiny else {}))


def to_cueq(mace_model, device: torch.device):
    import cuequivariance_torch  # noqa: F401  (absent -> ImportError -> "absent")
    from mace.cli.convert_e3nn_cueq import run

    with keep_default_dtype():
        return run(copy.deepcopy(mace_model), device=device.type, return_model=True).to(device)


def to_oeq(mace_model, device: torch.device):
    import openequivariance  # noqa: F401  (absent -> ImportError -> "absent")
    from mace.cli.convert_e3nn_oeq import run

    with keep_default_dtype():
        return run(copy.deepcopy(mace_model), device=device.type, return_model=True).to(device)


def build_impl(name: str, ek64_cpu, m32, device: torch.device):
    family, prec = SPECS[name]
    if family == "ek":
        return copy.deepcopy(ek64_cpu).set_precision(prec).to(device).train()
    if family == "cueq":
        return to_cueq(m32, device).train()
    if family == "oeq":
        return to_oeq(m32, device).train()
    return copy.deepcopy(m32).to(device).train()


def param_dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


# --- one step ------------------------------------------------------------------------------------
def loss_terms(out, tgt, w_e: float, w_f: float):
    """(w_E * MSE of the energy per atom, w_F * MSE of the forces), in the targets' dtype."""
    dt = tgt["energy"].dtype
    de = (out["energy"].to(dt) - tgt["energy"]) / tgt["n_atoms"]
    df = out["forces"].to(dt) - tgt["forces"]
    return w_e * de.pow(2).mean(), w_f * df.pow(2).mean()


def loss_of(out, tgt, w_e: float, w_f: float) -> torch.Tensor:
    le, lf = loss_terms(out, tgt, w_e, w_f)
    return le + lf


def autocast_ctx(name: str, device: torch.device):
    family, prec = spec(name)
    if family in ("cueq", "e3nn") and prec is not None:
        return torch.autocast(device_type=device.type, dtype=prec)
    return contextlib.nullcontext()


def spec(name: str) -> tuple:
    return SPECS[name] if name in SPECS else REFERENCES[name]


def needs_scaler(name: str) -> bool:
    return spec(name)[1] in ("fp16-mixed", torch.float16)


def clear_data_grads(data) -> None:
    """mace-torch makes positions and node_attrs require grad; backward fills their .grad: drop it."""
    for v in data.values():
        if v.is_leaf and v.grad is not None:
            v.grad = None


def forward(model, data, name, device):
    with autocast_ctx(name, device):
        return model(dict(data), training=True, compute_force=True)


def first_pass(model, data, tgt, name, device, w_e, w_f):
    """Forward + loss + gradients (no optimizer step), of the energy and force terms separately and of
    their sum; fp16: the largest loss scale in LOSS_SCALES with finite gradients."""
    scales = LOSS_SCALES if needs_scaler(name) else (1.0,)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]

    def as_dict(gs, scale):
        return {n: (g.detach().double() / scale).cpu() if g is not None else torch.zeros(p.shape, dtype=torch.float64)
                for (n, p), g in zip(named, gs)}

    for scale in scales:
        model.zero_grad(set_to_none=True)
        clear_data_grads(data)
        out = forward(model, data, name, device)
        le, lf = loss_terms(out, tgt, w_e, w_f)
        g_e = torch.autograd.grad(le * scale, params, retain_graph=True, allow_unused=True)
        g_f = torch.autograd.grad(lf * scale, params, retain_graph=True, allow_unused=True)
        # d(sum of energies)/d(params): no residual weighting, so it isolates the model's own
        # derivative error (the loss gradients near a fit are dominated by small residuals, which a
        # systematic energy offset of a few meV/atom can flip)
        # (unscaled: its gradients are O(1), a loss scale chosen for the small loss overflows fp16)
        g_s = torch.autograd.grad(out["energy"].sum(), params, allow_unused=True)
        grads_e, grads_f = as_dict(g_e, scale), as_dict(g_f, scale)
        grads = {n: grads_e[n] + grads_f[n] for n in grads_e}
        finite = all(torch.isfinite(g).all() for g in grads.values())
        if finite:
            break
    model.zero_grad(set_to_none=True)
    clear_data_grads(data)
    return {"energy": out["energy"].detach().double().cpu(), "forces": out["forces"].detach().double().cpu(),
            "loss": float((le + lf).detach()), "loss_terms": (float(le.detach()), float(lf.detach())),
            "grads": grads, "grads_e": grads_e, "grads_f": grads_f, "grads_esum": as_dict(g_s, 1.0),
            "loss_scale": scale, "grads_finite": finite}


def time_steps(fn, device: torch.device, steps: int, warmup: int) -> Dict[str, object]:
    """``common.time_calls`` for a fixed number of calls (without its estimate burst): ``warmup``
    untimed calls, then ``steps`` calls each between its own pair of CUDA events (perf_counter on
    CPU); the same statistics (median, min, p20, p80, ...) and the raw times."""
    for i in range(warmup):
        fn(i)
    C.synchronize(device)
    times = C.call_times(fn, steps, device.type == "cuda", first=warmup)
    out: Dict[str, object] = dict(C._stats(times))
    out["times_ms"] = [round(t, 6) for t in times]
    return out


def make_step(model, data, tgt, name, device, w_e, w_f, lr, init_scale):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale) if needs_scaler(name) else None
    last = {}

    def step(i: int) -> None:
        opt.zero_grad(set_to_none=True)
        clear_data_grads(data)
        out = forward(model, data, name, device)
        loss = loss_of(out, tgt, w_e, w_f)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        last["loss"] = loss.detach()

    return step, opt, scaler, last


# --- accuracy ------------------------------------------------------------------------------------
def force_energy_errors(res, ref, n_atoms: torch.Tensor) -> Dict[str, float]:
    de = (res["energy"] - ref["energy"]).abs() / n_atoms * 1e3
    df = res["forces"] - ref["forces"]
    return {"dE_mae_meV_atom": float(de.mean()), "dE_max_meV_atom": float(de.max()),
            "dF_rmse_meV_A": float(df.pow(2).mean().sqrt() * 1e3),
            "dF_max_meV_A": float(df.norm(dim=1).max() * 1e3),
            "dF_rel": float(df.norm() / ref["forces"].norm()),
            "loss_rel": abs(res["loss"] - ref["loss"]) / abs(ref["loss"])}


def grad_errors(g: Dict[str, torch.Tensor], ref: Dict[str, torch.Tensor]) -> Dict[str, object]:
    names = [k for k in ref if k in g and g[k].numel() == ref[k].numel()]
    if not names:
        return {"error": "no parameters in common"}
    a = torch.cat([g[k].reshape(-1) for k in names])
    b = torch.cat([ref[k].reshape(-1) for k in names])
    bn = float(b.norm())
    worst, worst_name = 0.0, None
    for k in names:
        rn = float(ref[k].norm())
        if rn > 1e-6 * bn:  # tensors with (nearly) zero reference gradient, e.g. absent elements, skipped
            r = float((g[k].reshape(-1) - ref[k].reshape(-1)).norm()) / rn
            if r > worst:
                worst, worst_name = r, k
    return {"rel": float((a - b).norm()) / bn if bn > 0 else float((a - b).norm()),
            "cos": float(a @ b) / max(float(a.norm()) * bn, 1e-300),
            "worst_tensor_rel": worst, "worst_tensor": worst_name,
            "tensors": len(names), "ref_tensors": len(ref), "finite": bool(torch.isfinite(a).all())}


def to_mace_names(name: str, grads: Dict[str, torch.Tensor], key_map: Dict[str, str]) -> Dict[str, torch.Tensor]:
    """Gradients keyed by mace-torch parameter names (ek's parameters are mace's, one to one)."""
    if spec(name)[0] == "ek":
        return {key_map[k]: v for k, v in grads.items() if k in key_map}
    return grads


# --- driver --------------------------------------------------------------------------------------
def run_impl(name, ek64_cpu, m32_fn, base_data, tgt64, ref, cue_ref, key_map, device, args) -> Dict[str, object]:
    family, _ = SPECS[name]
    entry: Dict[str, object] = {"impl": name, "family": family}
    t0 = time.perf_counter()
    try:
        model = build_impl(name, ek64_cpu, m32_fn() if family != "ek" else None, device)
    except ImportError as exc:
        return {**entry, "status": "absent", "error": C.describe_exception(exc)}
    except Exception as exc:
        return {**entry, "status": "error", "stage": "build", "error": C.describe_exception(exc)}
    entry["build_s"] = time.perf_counter() - t0
    dtype = param_dtype(model)
    data = cast_data(base_data, dtype, device)
    tgt = {k: v.to(device=device, dtype=dtype) for k, v in tgt64.items()}
    try:
        t0 = time.perf_counter()
        res = first_pass(model, data, tgt, name, device, args.w_energy, args.w_forces)
        C.synchronize(device)
        entry["first_pass_s"] = time.perf_counter() - t0  # includes Triton / cue JIT compilation
        entry["loss_first"] = res["loss"]
        entry["loss_terms_first"] = res["loss_terms"]
        entry["loss_scale"] = res["loss_scale"]
        entry["accuracy"] = force_energy_errors(res, ref, tgt64["n_atoms"].double())
        own_ref = cue_ref if family == "cueq" else ref
        if own_ref is not None and own_ref.get("grads") is not None:
            for key, out_key in (("grads", "grad"), ("grads_e", "grad_energy_term"), ("grads_f", "grad_force_term"),
                                 ("grads_esum", "grad_energy_sum")):
                entry[out_key] = grad_errors(to_mace_names(name, res[key], key_map),
                                             to_mace_names(own_ref["impl"], own_ref[key], key_map))
            entry["grad_ref"] = own_ref["impl"]
        else:
            entry["grad"] = None
            entry["grad_ref"] = "unavailable (mace-cueq float64 reference failed or disabled)"
        entry["grad_common_vs_ek64"] = grad_errors(to_mace_names(name, res["grads"], key_map),
                                                   to_mace_names("ek-fp64", ref["grads"], key_map))
        if not (math.isfinite(res["loss"]) and res["grads_finite"]):
            entry["status"] = "nonfinite"
            entry["error"] = f"loss {res['loss']}, finite gradients: {res['grads_finite']}"
            return entry
    except Exception as exc:
        entry.update(status="oom" if C.is_oom(exc) else "error", stage="first pass",
                     error=C.describe_exception(exc))
        del model
        C.free_memory(device)
        return entry
    try:
        step, opt, scaler, last = make_step(model, data, tgt, name, device, args.w_energy, args.w_forces, args.lr,
                                            res["loss_scale"])
        C.free_memory(device)
        C.reset_peak(device)
        t = time_steps(step, device, args.steps, args.warmup)
        entry.update({k: v for k, v in t.items()})
        entry["peak_gib"] = C.peak_gib(device)
        entry["loss_last"] = float(last["loss"])
        if scaler is not None:
            entry["loss_scale_last"] = float(scaler.get_scale())
        entry["status"] = "ok" if math.isfinite(entry["loss_last"]) else "nonfinite"
        if entry["status"] != "ok":
            entry["error"] = f"loss after {t['n']} steps: {entry['loss_last']}"
    except Exception as exc:
        entry.update(status="oom" if C.is_oom(exc) else "error", stage="timing", error=C.describe_exception(exc))
    finally:
        opt = scaler = step = last = None  # noqa: F841
        del model, data
        C.free_memory(device)
    return entry


def reference_pass(name, model, base_data, tgt64, device, args):
    data = cast_data(base_data, torch.float64, device)
    tgt = {k: v.to(device) for k, v in tgt64.items()}
    res = first_pass(model, data, tgt, name, device, args.w_energy, args.w_forces)
    res["impl"] = name
    return res


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON results path")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--impls", default=",".join(DEFAULT_IMPLS), help=f"some of {','.join(SPECS)}")
    ap.add_argument("--e3nn", action="store_true", help="also time plain mace-torch (mace-e3nn-fp32; slow)")
    ap.add_argument("--structures", type=int, default=None, help="structures per batch (default 8; --tiny 2)")
    ap.add_argument("--atoms-per-batch", type=int, default=None, help="atoms in the batch (default 2048; --tiny 32)")
    ap.add_argument("--mixed", action="store_true", help="elements drawn from Cu Ni Pd Ag Au Al Fe instead of Cu")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 10; --tiny 3)")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed steps after the first (accuracy) pass, before timing (default 3; --tiny 1)")
    ap.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate")
    ap.add_argument("--w-energy", type=float, default=1.0, help="weight of the energy-per-atom MSE")
    ap.add_argument("--w-forces", type=float, default=10.0, help="weight of the force MSE")
    ap.add_argument("--noise-e", type=float, default=0.05, help="target energy noise, eV/atom")
    ap.add_argument("--noise-f", type=float, default=0.1, help="target force noise, eV/A")
    ap.add_argument("--force-scale", type=float, default=0.5,
                    help="set the readout scale so the reference's mean |F| is this (eV/A); 0: leave it")
    ap.add_argument("--no-cueq-ref", action="store_true",
                    help="skip the float64 mace-cueq model (cue gradients then only on the shared parameters)")
    ap.add_argument("--time-budget-s", type=float, default=480.0,
                    help="start no implementation after this many seconds (reported as skipped)")
    ap.add_argument("--tiny", action="store_true",
                    help="8 channels, max_ell 2, correlation 2; 2 x 16 atoms (CPU plumbing check)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_train: CUDA is not available (use --device cpu --tiny for a debug run)", file=sys.stderr)
        return 2
    wanted = [s for s in args.impls.split(",") if s]
    if args.e3nn and "mace-e3nn-fp32" not in wanted:
        wanted.append("mace-e3nn-fp32")
    bad = [s for s in wanted if s not in SPECS]
    if bad:
        ap.error(f"--impls: unknown {bad}; expected some of {tuple(SPECS)}")
    n_struct = args.structures or (2 if args.tiny else 8)
    n_atoms_req = args.atoms_per_batch or (32 if args.tiny else 2048)
    args.steps = args.steps or (3 if args.tiny else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)

    from equikernels.models import atoms_list_to_data, from_mace
    from equikernels.models.io import config_from_mace, mace_key_map

    structs = make_structures(n_struct, n_atoms_req, args.mixed)
    base = atoms_list_to_data(structs, R_MAX, Z, dtype=torch.float64)
    n_atoms = int(base["positions"].shape[0])
    n_edges = int(base["edge_index"].shape[1])
    per_graph = (base["ptr"][1:] - base["ptr"][:-1]).to(torch.float64)
    avg = n_edges / n_atoms
    system = {"structures": n_struct, "atoms": n_atoms, "edges": n_edges, "avg_num_neighbors": avg,
              "atoms_per_structure": [int(x) for x in per_graph.tolist()], "mixed": args.mixed,
              "elements": sorted({int(z) for a in structs for z in a.numbers})}
    print(f"batch: {n_struct} structures, {n_atoms} atoms, {n_edges} edges ({avg:.1f} neighbours/atom)", flush=True)
    report: Dict[str, object] = {
        "env": C.env_info(device), "args": vars(args), "system": system,
        "model": "tiny (8x0e+8x1o, max_ell 2, correlation 2, radial MLP [16, 16])" if args.tiny else
                 "MACE-MP-0 medium shape (128x0e+128x1o), random weights",
        "step": "zero_grad; forward(training=True, compute_force=True) [create_graph]; loss = w_E MSE(E/N) + "
                "w_F MSE(F); backward; Adam.step",
        "references": {}, "results": []}
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out_path.write_text(json.dumps(report, indent=1, default=str))

    # float64 mace-torch model -> equikernels float64 reference
    t0 = time.perf_counter()
    m64 = build_mace_model(torch.float64, args.tiny, avg)
    ek64_cpu = from_mace(m64)
    key_map = mace_key_map(m64, config_from_mace(m64))
    print(f"built the float64 model in {time.perf_counter() - t0:.1f} s", flush=True)
    ref_model = copy.deepcopy(ek64_cpu).to(device).train()
    d64 = cast_data(base, torch.float64, device)
    if args.force_scale > 0:
        f = ref_model(dict(d64), compute_force=True)["forces"].detach()
        factor = args.force_scale / float(f.norm(dim=1).mean())
        with torch.no_grad():
            m64.scale_shift.scale.mul_(factor)
            ek64_cpu.scale.mul_(factor)
            ref_model.scale.mul_(factor)
        report["force_scale_factor"] = factor
    # targets: the float64 reference + fixed noise
    out = ref_model(dict(d64), compute_force=True)
    gen = torch.Generator().manual_seed(1234)
    e64 = out["energy"].detach().double().cpu()
    f64 = out["forces"].detach().double().cpu()
    tgt64 = {"energy": e64 + args.noise_e * per_graph * torch.randn(e64.shape, generator=gen, dtype=torch.float64),
             "forces": f64 + args.noise_f * torch.randn(f64.shape, generator=gen, dtype=torch.float64),
             "n_atoms": per_graph}
    del out, d64
    t0 = time.perf_counter()
    ref = reference_pass("ek-fp64", ref_model, base, tgt64, device, args)
    report["references"]["ek-fp64"] = {
        "loss": ref["loss"], "loss_terms": ref["loss_terms"], "first_pass_s": time.perf_counter() - t0,
        "energy_per_atom_eV": float((ref["energy"] / per_graph).mean()),
        "mean_abs_force_eV_A": float(ref["forces"].norm(dim=1).mean())}
    r64 = report["references"]["ek-fp64"]
    print(f"reference ek-fp64: loss {ref['loss']:.5g}, E/atom {r64['energy_per_atom_eV']:.4f} eV, "
          f"mean |F| {r64['mean_abs_force_eV_A']:.3f} eV/A ({r64['first_pass_s']:.1f} s)", flush=True)
    del ref_model
    C.free_memory(device)

    m32_cache: Dict[str, object] = {}

    def m32_fn():
        if "m" not in m32_cache:
            m = build_mace_model(torch.float32, args.tiny, avg)
            m.load_state_dict(m64.state_dict())  # the same (scaled) weights, rounded to float32
            m32_cache["m"] = m
        return m32_cache["m"]

    cue_ref = None
    if any(SPECS[n][0] == "cueq" for n in wanted) and not args.no_cueq_ref:
        t0 = time.perf_counter()
        try:
            cm = to_cueq(m64, device).train()
            cue_ref = reference_pass("mace-cueq-fp64", cm, base, tgt64, device, args)
            check = force_energy_errors(cue_ref, ref, per_graph)
            report["references"]["mace-cueq-fp64"] = {"status": "ok", "loss": cue_ref["loss"],
                                                      "vs_ek_fp64": check,
                                                      "grad_common_vs_ek64": grad_errors(
                                                          cue_ref["grads"], to_mace_names("ek-fp64", ref["grads"],
                                                                                          key_map)),
                                                      "first_pass_s": time.perf_counter() - t0}
            print(f"reference mace-cueq-fp64 vs ek-fp64: dE {check['dE_max_meV_atom']:.2e} meV/atom, "
                  f"rel dF {check['dF_rel']:.2e}", flush=True)
            del cm
        except ImportError as exc:
            report["references"]["mace-cueq-fp64"] = {"status": "absent", "error": C.describe_exception(exc)}
        except Exception as exc:
            report["references"]["mace-cueq-fp64"] = {"status": "error", "error": C.describe_exception(exc)}
            cue_ref = None
        C.free_memory(device)
        if cue_ref is None:
            print(f"reference mace-cueq-fp64: {report['references']['mace-cueq-fp64']['status']} "
                  f"({report['references']['mace-cueq-fp64']['error']})", flush=True)
    save()

    for name in wanted:
        if args.time_budget_s and time.perf_counter() - t_start > args.time_budget_s:
            entry = {"impl": name, "family": SPECS[name][0], "status": "skipped",
                     "error": f"time budget of {args.time_budget_s:.0f} s spent"}
        else:
            t0 = time.perf_counter()
            entry = run_impl(name, ek64_cpu, m32_fn, base, tgt64, ref, cue_ref, key_map, device, args)
            entry["wall_s"] = time.perf_counter() - t0
        report["results"].append(entry)
        save()
        acc, g = entry.get("accuracy") or {}, entry.get("grad") or {}
        peak = entry.get("peak_gib")
        print(f"{name:<15} {entry['status']:<9} {C.fmt_ms(entry.get('ms_median')):>8} ms  "
              f"peak {'—' if peak is None else format(peak, '.2f')} GiB  "
              f"dE {C.fmt_err(acc.get('dE_mae_meV_atom'))} meV/atom  "
              f"rel dF {C.fmt_err(acc.get('dF_rel'))}  rel grad {C.fmt_err(g.get('rel'))} "
              f"(E term {C.fmt_err((entry.get('grad_energy_term') or {}).get('rel'))}, "
              f"F term {C.fmt_err((entry.get('grad_force_term') or {}).get('rel'))}; "
              f"d(sum E) {C.fmt_err((entry.get('grad_energy_sum') or {}).get('rel'))})"
              + (f"  [{entry.get('stage', '')}] {entry.get('error')}" if entry["status"] != "ok" else "")
              + f"  ({entry.get('wall_s', 0):.0f} s)", flush=True)
    report["wall_s"] = time.perf_counter() - t_start
    save()
    print(table(report))
    print(f"wrote {out_path}")
    return 0


def table(report: Dict[str, object]) -> str:
    s = report["system"]
    env = report["env"]
    rows = report["results"]
    base = next((r for r in rows if r["impl"] == BASELINE and r.get("status") == "ok"), None)
    lines = [f"\nMACE training step: {report['model']}; {s['structures']} structures, {s['atoms']} atoms, "
             f"{s['edges']} edges{' (mixed elements)' if s['mixed'] else ''}; {env.get('gpu')}; "
             f"reference: equikernels float64 (gradients: same-parameterisation float64 model); loss "
             f"{report['args']['w_energy']:g} MSE(E/N) + {report['args']['w_forces']:g} MSE(F), targets = float64 "
             f"+ noise ({report['args']['noise_e']:g} eV/atom, {report['args']['noise_f']:g} eV/A); Adam; median of "
             f"{report['args']['steps']} steps", "",
             "| impl | status | step ms (median) | p20-p80 | vs mace-cueq-fp32 | peak GiB | loss | "
             "dE MAE meV/atom | dF RMSE meV/A | rel dF | rel grad | rel grad E term / F term | rel d(ΣE)/dθ |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        acc, g = r.get("accuracy") or {}, r.get("grad") or {}
        ok = r.get("status") == "ok"
        ms = r.get("ms_median") if ok else None
        speed = f"{base['ms_median'] / ms:.2f}x" if (base and ms) else "—"
        status = r.get("status", "?") if ok else f"{r.get('status')}: {(r.get('error') or '')[:80]}"
        lines.append(
            f"| {r['impl']} | {status} | {C.fmt_ms(ms)} | "
            + (f"{C.fmt_ms(r.get('ms_p20'))}-{C.fmt_ms(r.get('ms_p80'))}" if ok else "—")
            + f" | {speed} | " + (f"{r['peak_gib']:.2f}" if ok and r.get("peak_gib") is not None else "—")
            + f" | {format(r['loss_first'], '.4g') if 'loss_first' in r else '—'} | "
            f"{C.fmt_err(acc.get('dE_mae_meV_atom'))} | {C.fmt_err(acc.get('dF_rmse_meV_A'))} | "
            f"{C.fmt_err(acc.get('dF_rel'))} | {C.fmt_err(g.get('rel'))} | "
            f"{C.fmt_err((r.get('grad_energy_term') or {}).get('rel'))} / "
            f"{C.fmt_err((r.get('grad_force_term') or {}).get('rel'))} | "
            f"{C.fmt_err((r.get('grad_energy_sum') or {}).get('rel'))} |")
    ok = {r["impl"]: r for r in rows if r.get("status") == "ok"}
    pairs = [(f"ek-{p}", f"mace-cueq-{p}") for p in ("fp32", "bf16", "fp16")]
    pairs += [("ek-bf16", "mace-cueq-fp32"), ("ek-fp16", "mace-cueq-fp32")]
    pairs += [(f"ek-{p}", "mace-oeq-fp32") for p in ("fp32", "bf16", "fp16")]
    if any(a in ok and b in ok for a, b in pairs):
        lines += ["", "speed-up (t(baseline) / t(ek)):"]
    for a, b in pairs:
        if a in ok and b in ok:
            lines.append(f"  {a} vs {b}: {ok[b]['ms_median'] / ok[a]['ms_median']:.2f}x")
    cref = report["references"].get("mace-cueq-fp64")
    if cref:
        if cref.get("status") == "ok":
            v = cref["vs_ek_fp64"]
            lines.append(f"\nmace-cueq-fp64 vs ek-fp64 (reference check): dE max {C.fmt_err(v['dE_max_meV_atom'])} "
                         f"meV/atom, rel dF {C.fmt_err(v['dF_rel'])}, rel grad (shared parameters) "
                         f"{C.fmt_err(cref['grad_common_vs_ek64'].get('rel'))}")
        else:
            lines.append(f"\nmace-cueq-fp64 reference: {cref.get('status')} ({cref.get('error')})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
