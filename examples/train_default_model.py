"""Train the bundled default model of equikernels (the default of `equikernels md` and
`equikernels fine-tune`) from scratch, reproducibly, on CPU in at most about 20 minutes (2520
optimiser steps: 4-6 min on 2 quiet cores, 16 min on 2 cores shared with other jobs).

Data: ASE's EMT potential on Cu, Ni, Al, Ag, Au, Pd, Pt: pure and alloyed fcc cells, strained
and rattled, strongly rattled ("hot") cells and rattled (111)/(100) surface slabs, labelled with
energy, forces and stress (emt_data.py next to this script, fixed seeds). Model: a small
ScaleShiftMACE (16x0e+16x1o, max_ell 2, correlation 3, 2 interactions, r_max 5 Å), trained with
equikernels.training (AdamW, cosine schedule, EMA, energy/forces/stress loss).

    python examples/train_default_model.py                 # train and install into the package
    python examples/train_default_model.py --no-install --epochs 1 --n-train 40 --n-valid 10 \\
        --n-test 10 --data /tmp/emt --out /tmp/run   # a quick look

Writes examples/data/emt_{train,valid,test}.xyz (kept if present), the run under --out, and,
unless --no-install, equikernels/default_model/mace_emt_small.pt + metrics.json. A data file
kept from earlier must hold the --n-* structures asked for: other sizes go to another --data.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time

import ase.io
import torch

from emt_data import write_emt_dataset  # the sibling module: this folder is sys.path[0] when run as a script
from equikernels.training import DataKeys, Trainer, TrainConfig, read_configs
from equikernels.training import model_factory as mf
from equikernels.training.data import build_dataset

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
SEEDS = {"train": 1001, "valid": 1002, "test": 1003}
SMALL_MACE = dict(hidden_irreps="16x0e+16x1o", MLP_irreps="16x0e", max_ell=2, correlation=3,
                  num_interactions=2, r_max=5.0, num_bessel=8, num_polynomial_cutoff=5,
                  radial_MLP=[32, 32])


def dataset(directory: str, split: str, n: int, regenerate: bool) -> str:
    """The ``split`` file in ``directory``, written when absent or ``regenerate``; a kept file
    must hold ``n`` structures (ValueError otherwise), so that --n-* is never silently ignored."""
    path = os.path.join(directory, f"emt_{split}.xyz")
    if regenerate or not os.path.isfile(path):
        os.makedirs(directory, exist_ok=True)
        write_emt_dataset(path, n, seed=SEEDS[split])
        return path
    kept = sum(1 for _ in ase.io.iread(path, index=":", format="extxyz"))
    if kept != n:
        raise ValueError(f"{path} holds {kept} structures, --n-{split} asks for {n}: pass --data DIR "
                         f"for a data set of this size (or --regenerate to rewrite this file)")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-train", type=int, default=500)
    p.add_argument("--n-valid", type=int, default=60)
    p.add_argument("--n-test", type=int, default=60)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--energy-weight", type=float, default=10.0)
    p.add_argument("--forces-weight", type=float, default=10.0)
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch")
    p.add_argument("--device", default="cpu", help="torch device to train on (cpu, cuda)")
    p.add_argument("--out", default=os.path.join(HERE, "default_model_run"))
    p.add_argument("--data", default=DATA, help="where the extxyz files are (re)generated")
    p.add_argument("--regenerate", action="store_true", help="rebuild the data files even if present")
    p.add_argument("--no-install", action="store_true", help="do not copy the model into the package")
    args = p.parse_args()
    for split in SEEDS:
        if getattr(args, f"n_{split}") < 1:
            p.error(f"--n-{split} must be a positive integer, got {getattr(args, f'n_{split}')}")
    torch.set_num_threads(args.threads)

    t0 = time.time()
    try:
        files = {s: dataset(args.data, s, getattr(args, f"n_{s}"), args.regenerate) for s in SEEDS}
    except ValueError as exc:
        p.error(str(exc))
    t_data = time.time() - t0
    # mace-torch's implementation is the faster one on CPU (ours runs its PyTorch reference
    # there); the result is saved in equikernels' format either way
    backend = "mace" if mf._have_mace() else "equikernels"
    cfg = TrainConfig(
        train_file=files["train"], valid_file=files["valid"], new_model=SMALL_MACE, e0s="average",
        model_backend=backend, dtype="float64", epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
        lr_schedule="cosine", warmup_steps=20, min_lr_ratio=0.02, ema_decay=0.99, clip_grad_norm=10.0,
        energy_weight=args.energy_weight, forces_weight=args.forces_weight, stress_weight=10.0, weight_decay=5e-7,
        seed=7, out_dir=args.out, checkpoint_every=100, device=args.device, amsgrad=False)
    trainer = Trainer(cfg)
    t1 = time.time()
    summary = trainer.fit(overwrite=True)  # --out is this script's own folder: a rerun trains afresh
    t_train = time.time() - t1

    # a held-out test set, never used for model selection
    final = mf.load_model(summary["model_path"], "equikernels") if mf.ours() else trainer.model
    test_set = build_dataset(read_configs(files["test"], DataKeys()), mf.atomic_numbers(final),
                             mf.r_max(final), mf.heads(final))
    live, trainer.model, trainer.dtype = trainer.model, final.to(trainer.device, torch.float64), torch.float64
    summary["test"] = trainer.evaluate(test_set)
    trainer.model = live
    print("test (meV/atom, meV/Å, meV/Å³)  "
          + "  ".join(f"{k} {1000 * v:.2f}" for k, v in summary["test"].items() if k != "loss"))

    record = {
        "description": "small ScaleShiftMACE trained on EMT data (Cu Ni Al Ag Au Pd Pt) by "
                       "examples/train_default_model.py; errors in eV/atom, eV/Å, eV/Å^3",
        "model": SMALL_MACE, "trained_with_backend": backend,
        "saved_format": "equikernels" if mf.ours() else "mace-torch",
        "num_parameters": sum(p.numel() for p in final.parameters()),
        "data": {s: {"file": os.path.relpath(f, os.path.dirname(HERE)), "structures": len(read_configs(f, DataKeys())),
                     "seed": SEEDS[s]} for s, f in files.items()},
        "training": {k: v for k, v in cfg.to_dict().items() if k not in ("train_file", "valid_file", "out_dir")},
        "metrics": {s: summary[s] for s in ("train", "valid", "test")},
        "steps": summary["step"], "best_step": summary["best_step"],
        "seconds": {"data": round(t_data, 1), "train": round(t_train, 1)},
        "command": "python examples/train_default_model.py " + " ".join(sys.argv[1:]),
        "host": {"torch": torch.__version__, "device": args.device, "threads": args.threads,
                 "machine": platform.machine(), "processor": platform.processor(),
                 "gpu": torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else None},
    }
    with open(os.path.join(args.out, "default_model_metrics.json"), "w") as fh:
        json.dump(record, fh, indent=1)
    print(f"trained in {t_train / 60:.1f} min ({summary['step']} steps); data {t_data:.0f} s")

    if not args.no_install:
        from equikernels import default_model

        target_dir = os.path.dirname(default_model.__file__)
        shutil.copyfile(summary["model_path"], os.path.join(target_dir, default_model.MODEL_FILE))
        with open(os.path.join(target_dir, "metrics.json"), "w") as fh:
            json.dump(record, fh, indent=1)
        print(f"installed {os.path.join(target_dir, default_model.MODEL_FILE)}")


if __name__ == "__main__":
    main()
