"""``equikernels export-lammps MODEL OUT``: the ML-IAP unified object LAMMPS loads with
``pair_style mliap unified OUT 0``."""
from __future__ import annotations

import argparse

DTYPES = ("float64", "float32")
# export_mliap's parameter -> this command's argument, for its error messages
CLI_NAMES = {"path": "OUT", "model": "MODEL", "head": "--head", "dtype": "--dtype"}


def register(subparsers) -> None:
    p = subparsers.add_parser("export-lammps", help="write a model for LAMMPS (pair_style mliap unified)",
                              description="Write the LAMMPS ML-IAP unified model of an equikernels or mace-torch "
                                          "MACE model (mace-torch files need mace-torch here, not where LAMMPS "
                                          "runs). OUT ending in .pt/.pth is read by LAMMPS with torch.load, any "
                                          "other name with pickle.load. See docs/lammps.md.")
    p.add_argument("model", metavar="MODEL", help="equikernels model file/directory or mace-torch .model file")
    p.add_argument("output", metavar="OUT", help="output file, e.g. model-mliap.pt; an existing file is refused "
                                                 "unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT file")
    p.add_argument("--dtype", choices=DTYPES, default=None, help="precision to run in (default: the model's)")
    p.add_argument("--head", default=None, help="head of a multi-head model (default: the only or 'Default' head)")
    p.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from .._files import check_output_file, same_file  # noqa: PLC0415
    from ..lammps.export import export_mliap, is_torch_file  # noqa: PLC0415 (keeps `equikernels --help` light)

    if not same_file(args.model, args.output):  # export_mliap names a MODEL given as OUT
        check_output_file(args.output, "OUT", "model-mliap.pt", overwrite=args.overwrite)
    try:
        obj = export_mliap(args.model, args.output, dtype=args.dtype, head=args.head)
    except (ValueError, OSError) as exc:  # the library names its parameters; say the command's names
        text = str(exc)
        for param, name in CLI_NAMES.items():
            if text.startswith(param + ": "):
                raise type(exc)(f"{name}: {text[len(param) + 2:]}") from exc
        raise
    elements = " ".join(obj.element_types)
    layers = f"{obj.num_layers} interaction layer" + ("" if obj.num_layers == 1 else "s")
    print(f"wrote {args.output}: {type(obj.model).__name__}, {layers}, {obj.dtype_name}, "
          f"head {obj.head!r}, cutoff {2 * obj.rcutfac:g} A\n"
          f"LAMMPS input:\n  pair_style mliap unified {args.output} 0\n"
          f"  pair_coeff * * <one of {elements} per atom type>")
    if is_torch_file(args.output):
        print("LAMMPS reads .pt files with torch.load: with torch >= 2.6 set TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 "
              "for it, or export to a .pkl name (read with pickle.load)")
    return 0
