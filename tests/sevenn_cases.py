"""Structures and their energy, forces and stress through an ASE calculator, for the tests of ``accelerate``
on SevenNet models (needs ase, imported lazily)."""
from typing import Optional


def structures(water_vacuum: float = 3.5, water_rattle: Optional[float] = 0.02) -> list:
    """A rattled Si diamond cell with one C atom, and a water molecule centred with ``water_vacuum`` Å
    around it in a periodic box, rattled by ``water_rattle`` Å (None: not rattled)."""
    import ase.build  # noqa: PLC0415

    crystal = ase.build.bulk("Si", "diamond", a=5.43, cubic=True)
    crystal.numbers[3] = 6
    crystal.rattle(0.05, seed=0)
    water = ase.build.molecule("H2O")
    water.center(vacuum=water_vacuum)
    water.pbc = True
    if water_rattle is not None:
        water.rattle(water_rattle, seed=1)
    return [crystal, water]


def evaluate(calc, atoms):
    """(energy, forces, stress) of a copy of ``atoms`` through ``calc``, computed afresh."""
    a = atoms.copy()
    a.calc = calc
    calc.reset()
    return a.get_potential_energy(), a.get_forces(), a.get_stress()
