"""``equikernels convert IN OUT``: a mace-torch ``.model`` file (or one of ours) -> our format."""
from __future__ import annotations

import argparse
import importlib.util
import os
import warnings

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def register(subparsers) -> None:
    p = subparsers.add_parser("convert", help="convert between mace-torch .model files and equikernels' MACE format "
                                              "(--to mace for the reverse)",
                              description="Convert a mace-torch MACE/ScaleShiftMACE checkpoint (needs mace-torch) "
                                          "into equikernels' format (config JSON + weights), which loads without "
                                          "mace-torch. OUT is a file, or a directory to hold config.json and "
                                          "weights.pt.")
    p.add_argument("input", metavar="IN", help="mace-torch .model file (or an equikernels model file), or a "
                                               "foundation-model name (medium, small_off, ...)")
    p.add_argument("output", metavar="OUT", help="output file, or an existing directory")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="convert the weights to this dtype")
    p.add_argument("--to", choices=("equikernels", "mace"), default=None,
                   help="output format: equikernels' (default) or a mace-torch .model file (needs mace-torch)")
    p.add_argument("--head", default=None, metavar="NAME",
                   help="write only this head of a multi-head model, as a single-head model (mace-torch's "
                        "mace_select_head); the heads are listed when NAME is not one of them")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing OUT file (or the model files in an OUT directory)")
    p.set_defaults(func=_convert)


def _convert(args: argparse.Namespace) -> int:
    from ..models.foundations import foundation_checkpoint  # noqa: PLC0415
    from ..models.io import load, save  # noqa: PLC0415 (keeps `equikernels --help` light)

    format_implied, args.to = args.to is None, args.to or "equikernels"
    _check_output(args)  # before a download or the (slow) load
    if args.to == "mace" and importlib.util.find_spec("mace") is None:
        raise ImportError("--to mace: writing a mace-torch .model file needs mace-torch (pip install mace-torch)")
    args.input = foundation_checkpoint(args.input) or args.input  # "medium", "small_off", ...
    if not os.path.exists(args.input):
        names = ("expected a mace-torch .model file, an equikernels model or a foundation-model name mace-torch "
                 "knows, such as 'medium' or 'small_off'" if importlib.util.find_spec("mace") is not None else
                 "expected a mace-torch .model file or an equikernels model (foundation-model names such as "
                 "'medium' need mace-torch: pip install mace-torch)")
        raise FileNotFoundError(f"IN {args.input!r}: no such file or directory; {names}")
    model = load(args.input, device="cpu", dtype=DTYPES[args.dtype] if args.dtype else None)
    if args.head is not None:
        from ..models.select_head import select_head  # noqa: PLC0415

        model = select_head(model, args.head, argument="--head")
    if args.to == "mace":
        from ..training.mace_export import to_mace  # noqa: PLC0415
        from ..training.model_factory import save_mace_torch  # noqa: PLC0415

        mace_model = to_mace(model, args.input)
        try:
            save_mace_torch(mace_model, args.output)
        except (OSError, RuntimeError) as exc:  # torch.save reports a failed write as a RuntimeError
            text = str(exc).strip().splitlines()
            raise OSError(f"OUT {args.output!r}: cannot write the model there "
                          f"({text[0] if text else type(exc).__name__})") from exc
        print(f"converted {args.input} -> {args.output}: mace-torch {model.config['model']}")
        return 0
    save(model, args.output)
    if format_implied and args.output.lower().endswith(".model") and not os.path.isdir(args.output):
        # mace-torch's suffix on our format: whoever meant a mace-torch file learns it now, not when loading it
        warnings.warn(f"OUT {args.output!r}: written in equikernels' format, which mace-torch cannot read; "
                      "convert with --to mace for a mace-torch .model file", stacklevel=2)
    n = sum(p.numel() for p in model.parameters())
    print(f"converted {args.input} -> {args.output}: {type(model).__name__}, {len(model.interactions)} interactions, "
          f"{n} parameters, {model.atomic_energies.dtype}, heads {model.heads}")
    return 0


def _check_output(args: argparse.Namespace) -> None:
    """Refuse an OUT that cannot be written, or whose existing files would be replaced without --overwrite."""
    from ..models.io import CONFIG_FILE, WEIGHTS_FILE  # noqa: PLC0415

    out = args.output
    if not out:
        raise ValueError("OUT '': expected a file name or an existing directory")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        what = "is a file, not a folder" if os.path.exists(parent) else "does not exist; create it first"
        raise FileNotFoundError(f"OUT {out!r}: folder {parent} {what}")
    if out.endswith((os.sep, "/")) and not os.path.isdir(out):  # a folder was meant: none is created
        raise FileNotFoundError(f"OUT {out!r}: no such directory; create it first, or give a file name")
    if os.path.isdir(out):
        if args.to == "mace":
            raise IsADirectoryError(f"OUT {out!r}: is a directory; --to mace writes one .model file, give its name")
        existing = [n for n in (CONFIG_FILE, WEIGHTS_FILE) if os.path.exists(os.path.join(out, n))]
    else:
        existing = [out] if os.path.exists(out) else []
    _check_writable(out)
    if not existing or args.overwrite:
        return
    if os.path.exists(args.input) and not os.path.isdir(args.input) and os.path.samefile(args.input, out):
        raise FileExistsError(f"OUT {out!r}: is IN itself; give another name (or --overwrite to replace IN)")
    if existing == [out]:
        raise FileExistsError(f"OUT {out!r}: already exists; give another name, or --overwrite to replace it")
    raise FileExistsError(f"OUT {out!r}: already holds {' and '.join(existing)}; give another directory, or "
                          "--overwrite to replace them")


def _check_writable(out: str) -> None:
    """Refuse, naming OUT, a place that takes no new file (read-only, a system folder), before the model is read."""
    from .._files import temp_path  # noqa: PLC0415

    probe = temp_path(os.path.join(out, "probe") if os.path.isdir(out) else out)
    try:
        with open(probe, "xb"):  # "x": never truncates or removes what another writer holds there
            pass
    except OSError as exc:
        raise OSError(f"OUT {out!r}: cannot write the model there ({exc.strerror or type(exc).__name__})") from None
    os.remove(probe)
