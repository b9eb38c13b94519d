"""``equikernels eval``: a model's energies, forces and stresses for every frame of a structure file,
written to an extxyz file under mace-torch's ``MACE_*`` keys, and its errors where the frames carry
reference labels."""
from __future__ import annotations

import argparse
import os
import re
from typing import List

from . import label_keys
from .switch_words import switch_value


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
    a("structures", nargs="?", default=None,
      help="structure file: extxyz or any format ASE reads; every frame is evaluated, or those "
           "ASE's FILE@INDEX selects (FILE@-1, FILE@:10, FILE@::2); or given as --configs")
    a("--configs", default=None, metavar="STRUCTURES", help="the structure file, as mace_eval_configs names it")
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
    a("--compute-stress", "--compute_stress", action="store_true",
      help="accepted for mace_eval_configs' command lines: stresses of periodic frames are predicted by default")
    a("--compute-bec", "--compute_bec", action="store_true",
      help="mace_eval_configs' Born effective charges of MACELES models: refused, not supported here")
    a("--enable-cueq", "--enable_cueq", action="store_true",
      help="accepted for mace_eval_configs' command lines: equikernels' kernels always run")
    a("--return-node-energies", "--return_node_energies", action="store_true",
      help="also write each atom's energy (E0 included) as PREFIXnode_energies")
    a("--return-contributions", "--return_contributions", action="store_true",
      help="also write the energy's terms (E0, pair repulsion, one per interaction layer) as PREFIXBO_contributions; "
           "mace-torch's MACE models give them, its ScaleShiftMACE models do not")
    a("--return-descriptors", "--return_descriptors", action="store_true",
      help="also write the node features as PREFIXdescriptors (per atom, or per structure with "
           "--descriptor-aggregation-method)")
    a("--descriptor-num-layers", "--descriptor_num_layers", type=int, default=None, metavar="N",
      help="descriptors from the first N interaction layers (default -1: all)")
    a("--descriptor-aggregation-method", "--descriptor_aggregation_method", choices=("mean", "per_element_mean"),
      default=None, help="average the descriptors over a structure's atoms, or over those of each element "
                         "(default: one row per atom)")
    a("--descriptor-invariants-only", "--descriptor_invariants_only", type=_yes_no, default=None,
      metavar="{true,false}", help="descriptors from the invariant (0e) channels only (default true)")
    a("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    a("--dtype", "--default-dtype", "--default_dtype", choices=("float64", "float32"), default=None,
      help="model precision (default: the model's own)")
    label_keys.add_flags(p)
    a("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _yes_no(text: str) -> bool:
    value = switch_value(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


def _structures(args: argparse.Namespace) -> str:
    """The structures file, given as STRUCTURES or as mace_eval_configs' --configs."""
    if args.structures is None and args.configs is None:
        raise ValueError("no structures file: pass it as the first argument (or as --configs)")
    if args.structures is not None and args.configs is not None and args.structures != args.configs:
        raise ValueError(f"two structures files, {args.structures!r} and --configs {args.configs!r}: pass one")
    return args.structures if args.structures is not None else args.configs


DESCRIPTOR_FLAGS = (("descriptor_num_layers", "--descriptor-num-layers"),
                    ("descriptor_aggregation_method", "--descriptor-aggregation-method"),
                    ("descriptor_invariants_only", "--descriptor-invariants-only"))


def _descriptors(args: argparse.Namespace):
    """The descriptors asked for, or None; a descriptor option without --return-descriptors is refused."""
    from ..training.evaluate import Descriptors

    if not args.return_descriptors:
        given = [flag for name, flag in DESCRIPTOR_FLAGS if getattr(args, name) is not None]
        if given:
            raise ValueError(f"{given[0]} needs --return-descriptors")
        return None
    return Descriptors(num_layers=-1 if args.descriptor_num_layers is None else args.descriptor_num_layers,
                       invariants_only=True if args.descriptor_invariants_only is None
                       else args.descriptor_invariants_only)


def _aggregate(descriptors, symbols, method: str):
    """A structure's descriptors [N, D] as written: per atom, their mean, or their mean per element."""
    import numpy as np

    if method == "mean":
        return descriptors.mean(axis=0)
    symbols = np.asarray(symbols)
    return {str(e): descriptors[symbols == e].mean(axis=0).tolist() for e in np.unique(symbols)}


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
# every key eval may write under its prefix; a re-evaluated file's earlier values are removed first
WRITTEN = PREDICTED + ("node_energies", "BO_contributions", "descriptors", "dipole")
# mace_eval_configs' MACELES outputs, never written here: an earlier model's would pass for this one's
REMOVED = WRITTEN + ("BEC", "latent_charges")


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
                         f"replacing the labels in --out; choose another prefix such as {_other_prefix(prefix)}")


def _other_prefix(prefix: str) -> str:
    return "PRED_" if prefix == "MACE_" else "MACE_"


def _check_given_keys(given, configs, source: str) -> None:
    """A label key given on the command line that no frame holds is a wrong key (``fine-tune`` refuses
    it too): its errors would otherwise be left out without a word."""
    from ..training.data import UNUSED_STRESS

    for prop in ("energy", "forces", "stress", "virials"):
        attr = "stress" if prop == "virials" else prop  # virials are read into the stress
        # a stress label of a frame not periodic in all directions is found, then not compared
        found = [c for c in configs
                 if getattr(c, attr) is not None or (attr == "stress" and UNUSED_STRESS in c.label_keys)]
        if prop in given and configs and not found:
            raise ValueError(f"--{prop}-key {given[prop]!r}: no frame of {source} holds it (the first frame has "
                             f"{configs[0].available})")


def _check_out_name(out: str) -> None:
    """``--out`` is written as extended XYZ: a name ASE would read as another format is refused."""
    suffix = os.path.splitext(out)[1].lower()
    if suffix not in ("", ".xyz", ".extxyz"):
        raise ValueError(f"--out {out!r}: eval writes extended XYZ, which ASE would not read back from a "
                         f"{suffix} file; name it .xyz or .extxyz")


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
                             f"{_other_prefix(prefix)}")


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import warnings

    import ase.io
    from tqdm.auto import tqdm

    from ..calculators.loading import default_model_path, model_heads, resolve_device, resolve_dtype, \
        resolve_head, resolve_model
    from ..calculators.mace_args import class_name
    from ..calculators.model_kinds import model_outputs
    from ..training.config import DataKeys
    from ..training.data import DataError, configs_from_frames, frame_head, label_sources, read_frames, \
        split_selection
    from .._files import atomic_write, check_output_file, same_file
    from ..training.evaluate import metrics_lines, predict
    from . import option_names

    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be a positive integer, got {args.batch_size}")
    if args.compute_bec:  # mace_eval_configs' MACELES-only output; refused rather than left out of --out
        raise ValueError("--compute-bec: Born effective charges (mace-torch's MACELES models) are not supported "
                         "by equikernels eval")
    if args.compute_stress and args.no_stress:
        raise ValueError("--compute-stress and --no-stress contradict each other: pass one")
    descriptors = _descriptors(args)
    structures = _structures(args)
    try:
        device = resolve_device(args.device)
    except ValueError as exc:  # the flag, not the function's argument
        raise ValueError(option_names(str(exc), {"device": "--device"})) from None
    path, _ = split_selection(structures)
    out = args.out or default_out(path)
    if same_file(out, path):
        raise ValueError(f"--out {out!r} is the structures file itself; name another file")
    if args.model is not None and same_file(out, args.model):  # --overwrite would replace the model with predictions
        raise ValueError(f"--out {out!r} is the --model file itself; name another file")
    _check_out_name(out)
    check_output_file(out, "--out", "pred.xyz", overwrite=args.overwrite)  # before the (slow) evaluation
    keys = DataKeys(**label_keys.given(args))
    _check_prefix(args.prefix, keys)
    frames = read_frames(structures)
    configs = configs_from_frames(frames, keys, structures)
    _check_given_keys(label_keys.given(args), configs, structures)
    _check_calculator_keys(args.prefix, frames, structures)

    model = resolve_model(args.model, device)
    outputs = model_outputs(model, None)
    if not outputs.energy:
        raise ValueError(f"--model {args.model}: {class_name(model)} predicts dipoles only, no energies; evaluate it "
                         "with MACECalculator(model, model_type='DipoleMACE')")
    if args.return_node_energies and not outputs.per_atom_energies:
        raise ValueError(f"--return-node-energies: {class_name(model)}'s per-atom energies are not its energy's terms "
                         "(mace-torch's returns only the isolated-atom energies there)")
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
        if given is None:  # a head the frame names: say that --head overrides the frames' keys
            try:
                frame_head(configs[i], heads)
            except DataError:
                raise ValueError(f"{configs[i].source}: its {keys.head!r} key names head {str(head)!r}, which is not "
                                 f"one of the model's heads {heads}; pass --head NAME to evaluate every frame "
                                 "with one of them") from None

    atoms = sum(c.num_atoms for c in configs)
    name = args.model if args.model is not None else default_model_path()
    print(f"equikernels eval: {len(configs)} structure{'s' if len(configs) != 1 else ''} "
          f"({atoms} atom{'s' if atoms != 1 else ''}) from "
          f"{structures}, model {name} on {device} ({str(dtype).replace('torch.', '')})", flush=True)
    with tqdm(total=len(configs), unit="structure", disable=args.no_progress, leave=False) as bar:
        preds, metrics = predict(model, configs, dtype=dtype, device=device, batch_size=args.batch_size,
                                 stress=not args.no_stress, node_energies=args.return_node_energies,
                                 contributions=args.return_contributions, descriptors=descriptors,
                                 on_batch=bar.update)
    bad = _non_finite(preds)
    if bad:  # written as nan, as mace-torch writes them, but not silently
        warnings.warn(f"non-finite (NaN or inf) predictions for {len(bad)} structure(s), first "
                      f"{configs[bad[0]].source}: atoms too close together, or a model that does not describe them")

    for f, p in zip(frames, preds):
        for key in REMOVED:  # a re-evaluated output file's earlier values would pass for this model's
            f.info.pop(args.prefix + key, None)
            f.arrays.pop(args.prefix + key, None)
        f.info[args.prefix + "energy"] = p.energy
        f.arrays[args.prefix + "forces"] = p.forces
        if p.stress is not None:
            f.info[args.prefix + "stress"] = p.stress
        if p.node_energies is not None:
            f.arrays[args.prefix + "node_energies"] = p.node_energies
        if p.contributions is not None:
            f.info[args.prefix + "BO_contributions"] = p.contributions
        if p.dipole is not None:
            f.info[args.prefix + "dipole"] = p.dipole
        if p.descriptors is not None:
            if args.descriptor_aggregation_method is None:
                f.arrays[args.prefix + "descriptors"] = p.descriptors
            else:
                f.info[args.prefix + "descriptors"] = _aggregate(p.descriptors, f.get_chemical_symbols(),
                                                                 args.descriptor_aggregation_method)
    # renamed into place: a failed or interrupted write leaves the earlier file, never a truncated one
    atomic_write(out, lambda tmp: ase.io.write(tmp, frames, format="extxyz"))
    written = [args.prefix + "energy", args.prefix + "forces"]
    for key, field in (("stress", "stress"), ("node_energies", "node_energies"),
                       ("BO_contributions", "contributions"), ("descriptors", "descriptors"), ("dipole", "dipole")):
        if any(getattr(p, field) is not None for p in preds):
            written.append(args.prefix + key)
    print(f"  wrote {out} ({', '.join(written)})")
    unstressed = [c.source for c, p in zip(configs, preds) if p.stress is None]
    if args.compute_stress and unstressed:  # mace_eval_configs writes one for every frame: say where ours has none
        print(f"  no {args.prefix}stress for the {len(unstressed)} structure(s) not periodic in all three "
              f"directions, first {unstressed[0]}")
    if metrics:
        print(f"  against the labels: {label_sources(configs)}")
        print("\n".join("  " + line for line in metrics_lines([("model", metrics)])))
    else:
        print("  no reference labels in the file: nothing to compare")
    return 0
