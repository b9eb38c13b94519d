"""e3nn 0.4.4 (pinned by mace-torch) calls ``torch.load`` on its bundled constants when first
imported; torch >= 2.6 (``weights_only=True`` by default) refuses them unless ``slice`` is an allowed
global. ``allow()`` registers it; ``BeforeE3nn`` does so just before e3nn's first import, so that
``import equikernels`` ahead of e3nn is enough without importing torch at that point."""
import sys


def allow() -> None:
    """Lets torch.load read e3nn 0.4.4's constants (idempotent)."""
    import torch  # noqa: PLC0415

    add = getattr(getattr(torch, "serialization", None), "add_safe_globals", None)
    if add is not None:
        add([slice])


class BeforeE3nn:
    """A ``sys.meta_path`` finder that calls ``allow()`` when e3nn is first looked for and finds nothing itself."""

    def find_spec(self, name, path=None, target=None):
        if name == "e3nn" and "e3nn" not in sys.modules:
            allow()
        return None


def install() -> None:
    """``allow()`` before e3nn's first import (nothing to do once e3nn is imported)."""
    if "e3nn" not in sys.modules and not any(isinstance(f, BeforeE3nn) for f in sys.meta_path):
        sys.meta_path.insert(0, BeforeE3nn())
