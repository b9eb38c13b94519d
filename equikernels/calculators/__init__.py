"""ASE calculator and molecular dynamics for MACE models (equikernels' or mace-torch's).

    from equikernels.calculators import MACECalculator
    atoms.calc = MACECalculator()                      # the bundled default model, CUDA if available
    atoms.calc = MACECalculator("my.model", default_dtype="float32", device="cuda")
    results = atoms.calc.batch_evaluate(list_of_atoms)  # many structures per model call
    atoms.calc = mace_mp("medium")                     # mace-torch's foundation-model names (mace_off,
                                                       # mace_omol, mace_anicc too)

``equikernels md`` (``equikernels.cli.md``) runs MD from the command line; ``md.run_md`` from Python.
"""
from .calculator import MACECalculator
from .foundations import mace_anicc, mace_mp, mace_off, mace_omol
from .neighbors import DEFAULT_SKIN, SkinNeighborList

__all__ = ["MACECalculator", "SkinNeighborList", "DEFAULT_SKIN", "mace_mp", "mace_off", "mace_omol", "mace_anicc"]
