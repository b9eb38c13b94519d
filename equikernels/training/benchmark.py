"""Training throughput (structures per second, energy + force loss, AdamW step included) of a
MACE-MP-shaped model with equikernels' MACE and with mace-torch (e3nn, and cuEquivariance when
installed), same weights, same batches.

    python -m equikernels.training.benchmark --size medium --batch 8 --steps 20 --out bench.json

Needs mace-torch (it builds the model and is the baseline). Data: EMT-labelled, rattled fcc
supercells of Cu/Ni/Al/Pd (``--cells`` repeats of the 4-atom cubic cell)."""
from __future__ import annotations

import argparse
import copy
import json
import time
from typing import Dict, List

import numpy as np
import torch

from . import model_factory as mf
from .config import DataKeys, TrainConfig
from .data import build_dataset, collate, config_from_atoms
from .trainer import backward_step

# MACE-MP-0 shapes: 89 elements, 2 interactions, correlation 3, max_ell 3, r_max 6
SIZES = {"small": "128x0e", "medium": "128x0e+128x1o", "large": "128x0e+128x1o+128x2e"}


def mp_hparams(size: str) -> Dict:
    return dict(hidden_irreps=SIZES[size], MLP_irreps="16x0e", max_ell=3, correlation=3,
                num_interactions=2, r_max=6.0, num_bessel=10, num_polynomial_cutoff=5,
                radial_MLP=[64, 64, 64], builder="mace")


def structures(n: int, cells: int, seed: int = 0) -> List:
    from ase.build import bulk
    from ase.calculators.emt import EMT

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        host = rng.choice(["Cu", "Ni", "Al", "Pd"])
        atoms = bulk(host, "fcc", cubic=True) * (cells, cells, cells)
        atoms.positions += rng.normal(scale=0.1, size=atoms.positions.shape)
        atoms.calc = EMT()
        atoms.info["REF_energy"] = atoms.get_potential_energy()
        atoms.arrays["REF_forces"] = atoms.get_forces()
        atoms.calc = None
        out.append(atoms)
    return out


def _variants(base, names: List[str]):
    for name in names:
        if name == "mace-e3nn":
            yield name, copy.deepcopy(base)
        elif name == "equikernels":
            yield name, mf.convert(copy.deepcopy(base), "equikernels")
        elif name == "mace-cueq":
            try:
                from mace.cli.convert_e3nn_cueq import run as to_cueq
            except ImportError as exc:
                print(f"mace-cueq: skipped ({exc})")
                continue
            old = torch.get_default_dtype()
            try:  # mace's converter changes the default dtype
                model = to_cueq(copy.deepcopy(base), device=str(next(base.parameters()).device))
            except Exception as exc:  # cuEquivariance missing or unsupported here
                print(f"mace-cueq: skipped ({type(exc).__name__}: {exc})")
                continue
            finally:
                torch.set_default_dtype(old)
            yield name, model
        else:
            raise ValueError(f"unknown backend {name!r}; choose from equikernels, mace-e3nn, mace-cueq")


def throughput(model, batches, cfg, steps: int, warmup: int, device) -> Dict:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    losses = []

    def step(b):
        opt.zero_grad(set_to_none=True)
        loss, _ = backward_step(model, b, cfg)
        opt.step()
        losses.append(loss)

    for k in range(warmup):
        step(batches[k % len(batches)])
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for k in range(steps):
        step(batches[k % len(batches)])
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    n_struct = sum(int(b["ptr"].numel() - 1) for b in (batches[k % len(batches)] for k in range(steps)))
    return {"structures_per_s": n_struct / dt, "ms_per_step": 1000 * dt / steps, "first_loss": losses[0],
            "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else None}


def main(argv=None) -> Dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", choices=sorted(SIZES), default="medium")
    p.add_argument("--batch", type=int, default=8, help="structures per step")
    p.add_argument("--cells", type=int, default=2, help="supercell repeats (atoms = 4 * cells^3)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--backends", default="equikernels,mace-e3nn,mace-cueq")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None, help="JSON file for the results")
    args = p.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)

    torch.manual_seed(0)
    frames = structures(2 * args.batch, args.cells)
    configs = [config_from_atoms(a, DataKeys(), f"bench, frame {i}") for i, a in enumerate(frames)]
    z_table = list(range(1, 90))  # MACE-MP's element count shapes the element-indexed weights
    hp = mp_hparams(args.size)
    ds = build_dataset(configs, z_table, hp["r_max"], ["Default"])
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        base = mf.build_new_model(hp, z_table, np.zeros(len(z_table)), 40.0, 1.0, 0.0, backend="mace").to(device)
    finally:
        torch.set_default_dtype(old)
    batches = [collate(ds.graphs[k:k + args.batch], dtype, device) for k in range(0, len(ds.graphs), args.batch)]
    cfg = TrainConfig(energy_weight=1.0, forces_weight=10.0, stress_weight=0.0)
    n_atoms = len(frames[0])
    n_edges = float(np.mean([g.edge_index.shape[1] for g in ds.graphs]))
    results = {"size": args.size, "dtype": args.dtype, "batch": args.batch, "atoms_per_structure": n_atoms,
               "edges_per_structure": n_edges, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "backends": {}}
    for name, model in _variants(base, [b.strip() for b in args.backends.split(",") if b.strip()]):
        model = model.to(device=device, dtype=dtype).train()
        try:
            results["backends"][name] = throughput(model, batches, cfg, args.steps, args.warmup, device)
        except Exception as exc:
            results["backends"][name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        print(name, json.dumps(results["backends"][name]))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    return results


if __name__ == "__main__":
    main()
