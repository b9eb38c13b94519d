"""The hyper-parameters of a MACE trained from scratch (``TrainConfig.new_model``): their defaults,
the check that names a bad one before any structure is read, and mace-torch's ``num_channels`` /
``max_L`` shorthand for ``hidden_irreps``."""
from __future__ import annotations

from typing import Any, Dict

# a small MACE; each entry can be overridden in new_model
DEFAULT_NEW_MODEL: Dict[str, Any] = dict(
    r_max=5.0, num_bessel=8, num_polynomial_cutoff=5, max_ell=2, num_interactions=2,
    hidden_irreps="16x0e+16x1o", MLP_irreps="16x0e", correlation=3, radial_MLP=[32, 32],
    interaction="RealAgnosticResidualInteractionBlock",
    interaction_first="RealAgnosticResidualInteractionBlock",
    builder="auto",  # "mace": mace-torch's constructor (then converted); "equikernels": ours
)
BUILDERS = ("auto", "mace", "equikernels")
_COUNTS = {"num_bessel": 1, "num_polynomial_cutoff": 1, "max_ell": 0, "num_interactions": 1, "correlation": 1}
_TEXTS = ("hidden_irreps", "MLP_irreps", "interaction", "interaction_first")
# mace-torch's shorthand: hidden_irreps = num_channels x (0e + 1o + ... up to max_L), both given together
SHORTHAND = {"num_channels": 1, "max_L": 0}


def check_new_model(values: Any) -> None:
    """Raise ``ValueError`` naming the first entry of ``values`` that is unknown or of the wrong kind."""
    if not isinstance(values, dict):
        raise ValueError(f"new_model must be a mapping of hyper-parameters such as {{r_max: 5.0, hidden_irreps: "
                         f"'16x0e+16x1o'}}, got {values!r}")
    known = set(DEFAULT_NEW_MODEL) | set(SHORTHAND)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown new_model option(s) {unknown}; known: {sorted(known)}")
    given = [n for n in SHORTHAND if n in values]
    if given and len(given) < len(SHORTHAND):
        missing = [n for n in SHORTHAND if n not in values][0]
        raise ValueError(f"new_model: {given[0]} given without {missing}: give both (hidden_irreps is then "
                         f"num_channels x (0e + 1o + ... up to max_L)) or hidden_irreps alone")
    if given and "hidden_irreps" in values:
        raise ValueError("new_model: hidden_irreps and num_channels / max_L both given: give one or the other")
    for name, value in values.items():
        if name in SHORTHAND:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= SHORTHAND[name]
            kind = f"an integer >= {SHORTHAND[name]}"
        elif name == "r_max":
            ok = _number(value) and value > 0
            kind = "a number > 0 (Angstrom)"
        elif name in _COUNTS:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= _COUNTS[name]
            kind = f"an integer >= {_COUNTS[name]}"
        elif name in _TEXTS:
            ok, kind = isinstance(value, str) and bool(value.strip()), "a string"
        elif name == "radial_MLP":
            ok = isinstance(value, (list, tuple)) and bool(value) and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
            kind = "a list of layer widths such as [64, 64, 64]"
        else:
            ok, kind = value in BUILDERS, f"one of {BUILDERS}"
        if not ok:
            raise ValueError(f"new_model: {name} must be {kind}, got {value!r}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def resolve_new_model(values: Any) -> Dict[str, Any]:
    """``values`` checked and completed with the defaults, ``num_channels`` / ``max_L`` turned into
    ``hidden_irreps`` (as mace-torch does: 128 and 1 give '128x0e+128x1o')."""
    check_new_model(values)
    hp = {**DEFAULT_NEW_MODEL, **values}
    if "num_channels" in hp:
        c, top = hp.pop("num_channels"), hp.pop("max_L")
        hp["hidden_irreps"] = "+".join(f"{c}x{l}{'e' if l % 2 == 0 else 'o'}" for l in range(top + 1))
    return hp
