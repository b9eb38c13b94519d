"""``equikernels settings``: every setting (``EQUIKERNELS_*`` variable) with the value in force, or with
``--markdown`` the table of docs/configuration.md. A bad value is reported as the library would
report it at first use."""
from __future__ import annotations

import difflib
import sys
from typing import List

from .. import settings


def register(sub) -> None:
    p = sub.add_parser("settings", help="list the EQUIKERNELS_* settings and the values in force",
                       description=__doc__.replace("``", "'"))
    p.add_argument("--markdown", action="store_true", help="print the documentation's table of every setting")
    p.set_defaults(func=run)


def text() -> str:
    """One line per setting: variable, value in force, and where it comes from."""
    current = settings.get()  # raises SettingsError (one line) for a bad value
    width = max(len(settings.env_name(f)) for f in settings.FIELDS)
    lines = []
    for f in settings.FIELDS:
        name = settings.env_name(f)
        source = "environment" if settings.in_environment(f) else "default"
        lines.append(f"{name:<{width}}  {getattr(current, f.name)!r}  ({source})")
    return "\n".join(lines)


def unknown_variables(close_only: bool = False) -> List[str]:
    """One line per ``EQUIKERNELS_*`` environment variable that is no setting (a misspelt name is ignored
    by the library), with the closest setting's name where one is close; ``close_only``: only those."""
    known = [settings.env_name(f) for f in settings.FIELDS]
    lines = []
    for name in sorted(settings.environ_items((settings.PREFIX,))):
        if name in known:
            continue
        close = difflib.get_close_matches(name.upper(), known, n=1, cutoff=0.85)  # EQUIKERNELS_autotune too
        if close_only and not close:
            continue
        hint = f"; did you mean {close[0]}?" if close else ""
        lines.append(f"{name} is set but is no equikernels setting: ignored{hint}")
    return lines


def warn_unknown(command: str) -> None:
    """Warns on stderr about each ``EQUIKERNELS_*`` variable that is no setting but close to one's name,
    for a command whose output depends on the settings (a misspelt variable would go unnoticed; other
    tools' variables of the prefix are left to ``equikernels settings``)."""
    for line in unknown_variables(close_only=True):
        print(f"equikernels {command}: warning: {line}", file=sys.stderr)


def run(args) -> int:
    if args.markdown:
        print(settings.table(), end="")
        return 0
    print(text())
    for line in unknown_variables():
        print(f"equikernels settings: warning: {line}", file=sys.stderr)
    return 0
