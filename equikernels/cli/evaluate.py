"""``equikernels eval``: a model's energies, forces and stresses for every frame of a structure file,
written to an extxyz file under mace-torch's ``MACE_*`` keys, and its errors where the frames carry
reference labels."""
from __future__ import annotations

import argparse
import os
import re
from typing import List

from . import label_keys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="predict energies, forces and stresses for a structure file (and the errors against its labels)",
        description="Evaluate a MACE model on every frame of a structure file (extxyz or anything ASE reads). "
                    "Writes an extxyz file with the frames as read plus the predictions under PREFIX"
                    "energy (eV), PREFIXforces (eV/Å) and, for frames periodic in all three directions, "
                    "PREFIXstress (3x3, eV/Å³, ASE's sign convention); the default prefix MACE_ gives the keys "
                    "mace-torch's evaluation script writes. Frames with reference labels (the REF_* keys, or "
                    "the calculator results ASE writes) are compared: RMSE and MAE per property.")
    a = p.add_argument
    a("structures", help="structure file: extxyz or any format ASE reads; every frame is evaluated, or those "
                         "ASE's FILE@INDEX selects (FILE@-1, FILE@:10, FILE@::2)")
    a("--model", default=None,
      help="model file or directory (ours, as `equikernels convert` writes, or a mace-torch .model), "
           "or a foundation-model name (medium, small_off, ...; needs mace-torch); "
           "default: the bundled default model")
    # the second names are mace-torch's mace_eval_configs', so that its command lines carry over
    a("--out", "--output", default=None, help="output extxyz file (default: <structures file name>_eval.xyz here); "
                                               "an existing file is refused unless --overwrite")
    a("--overwrite", action="store_true", help="replace an existing --out file")
    a("--prefix", "--info-prefix", "--info_prefix", default="MACE_",
      help="prefix of the prediction keys (default MACE_)")
    a("--batch-size", "--batch_size", type=int, default=8, help="structures per model call (default 8)")
    a("--head", default=None, help="head of a multi-head model for every frame (default: a frame's own "
                                   "head key, else the model's only or 'default' head)")
    a("--no-stress", action="store_true", help="do not predict stresses")
    a("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    a("--dtype", "--default-dtype", "--default_dtype", choices=("float64", "float32"), default=None,
      help="model precision (default: the model's own)")
    label_keys.add_flags(p)
    a("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def default_out(structures: str) -> str:
    stem = os.path.splitext(os.path.basename(structures.rstrip(os.sep)))[0] or "structures"
    return f"{stem}_eval.xyz"


def _non_finite(preds) -> List[int]:
    """Indices of the predictions holding NaN or inf."""
    import numpy as np

    return [i for i, p in enumerate(preds)
            if not (np.all(np.isfinite(p.energy)) and np.all(np.isfinite(p.forces))
                    and (p.stress is None or np.all(np.isfinite(p.stress))))]


PREDICTED = ("energy", "forces", "stress")


def _check_prefix(prefix: str, keys) -> None:
    """Raise, naming ``--prefix``, when its keys would not read back from extxyz or would replace the
    labels the predictions are compared with."""
    if not re.fullmatch(r"[\w.+-]*", prefix):  # extxyz reads keys with spaces, quotes, ':' or '=' back wrongly
        raise ValueError(f"--prefix {prefix!r}: expected letters, digits and _ . + - only (a key prefix such as "
                         "MACE_)")
    labels = {keys.energy, keys.forces, keys.stress}
    clash = [prefix + p for p in PREDICTED if prefix + p in labels]
    if clash:
        raise ValueError(f"--prefix {prefix!r} writes the predictions under the label key(s) {', '.join(clash)}, "
                         "replacing the labels in --out; choose another prefix such as MACE_")


def _check_calculator_keys(prefix: str, frames, source: str) -> None:
    """An empty prefix writes ``energy``/``forces``/``stress``, the keys of ASE's calculator results."""
    if prefix:
        return
    for i, f in enumerate(frames):
        results = getattr(f.calc, "results", None) or {}
        taken = [p for p in PREDICTED if p in results]
        if taken:
            raise ValueError(f"--prefix '' writes the predictions under {', '.join(taken)}, which frame {i} of "
                             f"{source} already holds as its calculator results (labels); choose a prefix such as "
                             "MACE_")


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import warnings

    import ase.io
    from tqdm.auto import tqdm

    from ..calculators.loading import default_model_path, model_heads, resolve_device, resolve_dtype, \
        resolve_head, resolve_model
    from ..training.config import DataKeys
    from ..training.data import configs_from_frames, label_sources, read_frames, split_selection
    from .._files import atomic_write, check_output_file, same_file
    from ..training.evaluate import metrics_lines, predict
    from . import option_names

    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be a positive integer, got {args.batch_size}")
    try:
        device = resolve_device(args.device)
    except ValueError as exc:  # the flag, not the function's argument
        raise ValueError(option_names(str(exc), {"device": "--device"})) from None
    path, _ = split_selection(args.structures)
    out = args.out or default_out(path)
    if same_file(out, path):
        raise ValueError(f"--out {out!r} is the structures file itself; name another file")
    if args.model is not None and same_file(out, args.model):  # --overwrite would replace the model with predictions
        raise ValueError(f"--out {out!r} is the --model file itself; name another file")
    check_output_file(out, "--out", "pred.xyz", overwrite=args.overwrite)  # before the (slow) evaluation
    keys = DataKeys(**label_keys.given(args))
    _check_prefix(args.prefix, keys)
    frames = read_frames(args.structures)
    configs = configs_from_frames(frames, keys, args.structures)
    _check_calculator_keys(args.prefix, frames, args.structures)

    model = resolve_model(args.model, device)
    dtype = resolve_dtype(args.dtype, model)
    model = model.to(device=device, dtype=dtype)
    heads = model_heads(model)
    try:
        given = heads[resolve_head(args.head, heads)] if args.head is not None else None
    except ValueError as exc:
        raise ValueError(option_names(str(exc), {"head": "--head"})) from None
    for i, f in enumerate(frames):
        head = given if given is not None else f.info.get(keys.head)
        if head is None:
            try:
                head = heads[resolve_head(None, heads)]
            except ValueError:
                raise ValueError(f"{configs[i].source}: no {keys.head!r} key, and the model has several heads "
                                 f"{heads}, none called 'default': pass --head") from None
        configs[i] = dataclasses.replace(configs[i], head=str(head))

    atoms = sum(c.num_atoms for c in configs)
    name = args.model if args.model is not None else default_model_path()
    print(f"equikernels eval: {len(configs)} structure{'s' if len(configs) != 1 else ''} "
          f"({atoms} atom{'s' if atoms != 1 else ''}) from "
          f"{args.structures}, model {name} on {device} ({str(dtype).replace('torch.', '')})", flush=True)
    with tqdm(total=len(configs), unit="structure", disable=args.no_progress, leave=False) as bar:
        preds, metrics = predict(model, configs, dtype=dtype, device=device, batch_size=args.batch_size,
                                 stress=not args.no_stress, on_batch=bar.update)
    bad = _non_finite(preds)
    if bad:  # written as nan, as mace-torch writes them, but not silently
        warnings.warn(f"non-finite (NaN or inf) predictions for {len(bad)} structure(s), first "
                      f"{configs[bad[0]].source}: atoms too close together, or a model that does not describe them")

    for f, p in zip(frames, preds):
        f.info[args.prefix + "energy"] = p.energy
        f.arrays[args.prefix + "forces"] = p.forces
        if p.stress is not None:
            f.info[args.prefix + "stress"] = p.stress
        else:  # a re-evaluated output file's earlier stress would pass for this model's
            f.info.pop(args.prefix + "stress", None)
    # renamed into place: a failed or interrupted write leaves the earlier file, never a truncated one
    atomic_write(out, lambda tmp: ase.io.write(tmp, frames, format="extxyz"))
    written = [args.prefix + "energy", args.prefix + "forces"]
    if any(p.stress is not None for p in preds):
        written.append(args.prefix + "stress")
    print(f"  wrote {out} ({', '.join(written)})")
    if metrics:
        print(f"  against the labels: {label_sources(configs)}")
        print("\n".join("  " + line for line in metrics_lines([("model", metrics)])))
    else:
        print("  no reference labels in the file: nothing to compare")
    return 0
