"""ASE calculator and molecular dynamics for MACE models (equikernels' or mace-torch's)."""
from .calculator import MACECalculator
from .neighbors import DEFAULT_SKIN, SkinNeighborList

__all__ = ["MACECalculator", "SkinNeighborList", "DEFAULT_SKIN"]
