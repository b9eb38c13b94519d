"""The hyper-parameters of a MACE trained from scratch (``TrainConfig.new_model``): their defaults
and the check that names a bad one before any structure is read."""
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


def check_new_model(values: Any) -> None:
    """Raise ``ValueError`` naming the first entry of ``values`` that is unknown or of the wrong kind."""
    if not isinstance(values, dict):
        raise ValueError(f"new_model must be a mapping of hyper-parameters such as {{r_max: 5.0, hidden_irreps: "
                         f"'16x0e+16x1o'}}, got {values!r}")
    unknown = sorted(set(values) - set(DEFAULT_NEW_MODEL))
    if unknown:
        raise ValueError(f"unknown new_model option(s) {unknown}; known: {sorted(DEFAULT_NEW_MODEL)}")
    for name, value in values.items():
        if name == "r_max":
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
