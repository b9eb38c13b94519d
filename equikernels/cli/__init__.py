"""The ``equikernels`` command line: one module per sub-command, each with ``register(subparsers)``.

Errors a user can cause (bad files, arguments, devices) end in one line on stderr and exit status 2,
any other failure in one line and status 1; ``--debug`` (or ``EQUIKERNELS_DEBUG=1``) shows the
traceback instead.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
import warnings
from typing import Dict, List, Optional

from .. import settings

# sub-command modules, in the order `equikernels --help` lists them
COMMAND_MODULES = (
    "equikernels.cli.md",           # md
    "equikernels.cli.evaluate",     # eval
    "equikernels.cli.fine_tune",    # fine-tune
    "equikernels.cli.convert",      # convert
    "equikernels.cli.tune",         # tune
    "equikernels.cli.export_lammps",  # export-lammps
    "equikernels.cli.bench",        # bench
    "equikernels.cli.plan",         # plan
    "equikernels.cli.show_settings",  # settings
)

# exceptions that describe bad input rather than a bug; their message is the whole story
USER_ERRORS = (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, KeyError,
               TypeError, RuntimeError, OSError, ImportError)


def build_parser() -> argparse.ArgumentParser:
    from .._version import __version__

    parser = argparse.ArgumentParser(prog="equikernels",
                                     description="Fast e3nn-compatible equivariant kernels, MACE, MD and fine-tuning.")
    parser.add_argument("--version", action="version", version=f"equikernels {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for command in sub.choices.values():  # --debug after the command too; absent, the top level's stands
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show full tracebacks on errors")
    return parser


def _debug_requested(args: Optional[argparse.Namespace]) -> bool:
    if getattr(args, "debug", False):
        return True
    try:
        return settings.get().debug
    except settings.SettingsError:  # only a command that reads no setting gets here with a malformed one
        return False


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    text = str(message).strip().splitlines()
    return f"{_origin(filename)}: warning: {text[0] if text else category.__name__}\n"


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _origin(filename: str) -> str:
    """Who a warning comes from: equikernels for a file of this package, the package for a file under
    site-packages, else "python" (the standard library, a script), so another's warning is not taken
    for ours."""
    path = os.path.abspath(str(filename))
    if path.startswith(_PACKAGE + os.sep):
        return "equikernels"
    parts = os.path.normpath(path).split(os.sep)
    for marker in ("site-packages", "dist-packages"):
        if marker in parts[:-1]:
            return parts[parts.index(marker) + 1].split(".")[0]
    return "python"


# argparse takes "-1e9" for an option (its negative-number test knows no exponents)
_NEGATIVE = re.compile(r"-(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _joined_negatives(argv: List[str]) -> List[str]:
    """``--opt -1e9`` written as ``--opt=-1e9``, so that a negative number in exponent form is a value."""
    out: List[str] = []
    for tok in argv:
        if out and _NEGATIVE.fullmatch(tok) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


def option_names(message: str, options: Dict[str, str]) -> str:
    """``message`` of an error raised below the command line with the Python argument names of
    ``options`` (``{"device": "--device"}``) given as the options that set them: the name it starts
    with (``device must be ...``) and any it asks for (``pass head=``)."""
    names = "|".join(re.escape(n) for n in sorted(options, key=len, reverse=True))
    message = re.sub(rf"^({names})(?![\w.=])", lambda m: options[m.group(1)], message)
    return re.sub(rf"(?<=pass )({names})=(?![\w.=])", lambda m: options[m.group(1)], message)


def _interrupted(who: str, exc: BaseException) -> int:
    """One line for Ctrl-C (or the signal the interrupt carries) and its exit status, 128 + the signal."""
    signum = getattr(exc, "signum", signal.SIGINT)
    print(f"{who}: interrupted ({signal.Signals(signum).name})", file=sys.stderr)
    return 128 + int(signum)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:  # without the commands' imports (torch): seconds saved
        from .._version import __version__
        print(f"equikernels {__version__}")
        return 0
    try:
        args = _parse(argv)
    except KeyboardInterrupt as exc:  # before the command runs: importing the commands, parsing
        try:
            debug = settings.get().debug
        except settings.SettingsError:
            debug = False
        if debug or "--debug" in argv:
            raise
        return _interrupted("equikernels", exc)
    return args if isinstance(args, int) else _dispatch(args)


def _parse(argv: List[str]):
    """The parsed arguments of a command to run, or the exit status when there is none to run."""
    try:
        settings.get()  # a malformed EQUIKERNELS_* variable: one line, before anything reads it
    except settings.SettingsError as exc:
        if "--debug" in argv:
            raise
        # help, the version and the settings' documentation table read no setting
        if not ({"-h", "--help", "--version"} & set(argv) or argv[:1] == ["settings"] and "--markdown" in argv):
            print(f"equikernels: error: {exc} (run with --debug for the traceback)", file=sys.stderr)
            return 2
    parser = build_parser()
    args, extra = parser.parse_known_args(_joined_negatives(argv))
    if extra:
        _unrecognized(parser, args, extra)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args


def _unrecognized(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: List[str]) -> None:
    """Exit with the usage of the command the unknown arguments were given to, naming the nearest
    option of that command (argparse would show the top level's usage and suggest nothing)."""
    import difflib

    command = getattr(args, "command", None)
    sub = _subparser(parser, command) if command else None
    target = sub or parser
    options = [o for action in target._actions for o in action.option_strings if o.startswith("--")]
    message = f"unrecognized arguments: {' '.join(extra)}"
    first = next((e.split("=", 1)[0] for e in extra if e.startswith("--")), None)
    near = difflib.get_close_matches(first, options, n=1, cutoff=0.7) if first else []
    if near:
        message += f" (did you mean {near[0]}?)"
    loose = [e for e in extra if not e.startswith("-")]
    given = getattr(args, "structures", None) or getattr(args, "structure", None)
    if loose and "--model" in options and isinstance(given, str) and given.lower().endswith(_MODEL_SUFFIXES):
        message += f" (the model is given with --model: equikernels {command} --model {given} {loose[0]})"
    target.error(message)


_MODEL_SUFFIXES = (".model", ".pt", ".pth")


def _subparser(parser: argparse.ArgumentParser, command: str) -> Optional[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(command)
    return None


def _dispatch(args: argparse.Namespace) -> int:
    debug = _debug_requested(args)
    saved = warnings.formatwarning
    if not debug:  # warnings as one line each, like the errors below
        warnings.formatwarning = _one_line_warning
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:
        if debug:
            raise
        return _interrupted(f"equikernels {args.command}", exc)
    except BrokenPipeError:  # the reader stopped early (``| head``): end quietly, as SIGPIPE would
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        except (OSError, ValueError, AttributeError):  # stdout without a descriptor (captured)
            pass
        return 128 + int(signal.SIGPIPE)
    except USER_ERRORS as exc:
        if _debug_requested(args):
            raise
        msg = str(exc) or type(exc).__name__
        if isinstance(exc, KeyError):
            msg = f"missing key {exc}"
        first = msg.strip().splitlines()[0] if msg.strip() else type(exc).__name__
        print(f"equikernels {args.command}: error: {first} (run with --debug for the traceback)", file=sys.stderr)
        return 2
    except Exception as exc:  # a failure that is no input error: still one line, status 1
        if _debug_requested(args):
            raise
        text = str(exc).strip().splitlines()
        detail = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
        print(f"equikernels {args.command}: internal error: {detail} (run with --debug for the traceback)",
              file=sys.stderr)
        return 1
    finally:
        warnings.formatwarning = saved


if __name__ == "__main__":
    sys.exit(main())
