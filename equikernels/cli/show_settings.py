"""``equikernels settings``: every setting (``EQUIKERNELS_*`` variable) with the value in force, or with
``--markdown`` the table of docs/configuration.md. A bad value is reported as the library would
report it at first use."""
from __future__ import annotations

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


def run(args) -> int:
    print(settings.table(), end="") if args.markdown else print(text())
    return 0
