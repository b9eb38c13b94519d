"""The ``equikernels`` command. Each sub-command lives with the code it drives and registers itself
through a ``register(subparsers)`` function; a sub-package that is missing or fails to import only
removes its sub-command."""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import List, Optional

# sub-command modules, in the order `equikernels --help` lists them
COMMAND_MODULES = (
    "equikernels.calculators.commands",   # md
    "equikernels.training.commands",      # fine-tune
    "equikernels.models.commands",        # convert
    "equikernels.tune.commands",          # tune
    "equikernels.bench_commands",         # bench
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="equikernels", description="Fast e3nn-compatible equivariant kernels and MACE.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):  # the sub-package itself is absent
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
