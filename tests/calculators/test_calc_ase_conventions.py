"""The calculator follows ASE's conventions where ASE's tools rely on them: stress of a structure
without a 3-D cell is ASE's PropertyNotImplementedError (what ASE's own calculators raise and its
tools catch), and a cell that is not finite is refused by name rather than giving wrong numbers."""
import numpy as np
import pytest
from ase import Atoms
from ase.calculators.calculator import PropertyNotImplementedError

from equikernels.calculators import MACECalculator


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def dimer(**kwargs):
    return Atoms("Cu2", positions=[[0.0, 0.0, 0.0], [1.3, 1.1, 1.2]], **kwargs)


@pytest.mark.parametrize("cell,pbc", [(None, False), ([[3.0, 0, 0], [0, 3.0, 0], [0, 0, 0]], [True, True, False])],
                         ids=["molecule", "slab-without-c"])
def test_stress_without_a_cell_is_property_not_implemented(cu_model, cell, pbc):
    atoms = dimer(cell=cell, pbc=pbc)
    atoms.calc = MACECalculator(cu_model, device="cpu", compute_atomic_stresses=True)
    energy = atoms.get_potential_energy()
    for get in (atoms.get_stress, atoms.get_stresses):
        with pytest.raises(PropertyNotImplementedError, match="cell without volume"):
            get()
    with pytest.raises(ValueError, match="stress was requested"):  # still a ValueError too
        atoms.get_stress()
    assert atoms.get_potential_energy() == energy and atoms.calc.get_property("virials", atoms).shape == (2, 3, 3)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_cell_is_refused_also_without_periodicity(cu_model, bad):
    calc = MACECalculator(cu_model, device="cpu")
    atoms = dimer(cell=[[bad, 0, 0], [0, 5.0, 0], [0, 0, 5.0]], pbc=False)
    with pytest.raises(ValueError, match="cell is not finite"):
        calc.get_potential_energy(atoms)
    with pytest.raises(ValueError, match=r"atoms_list\[0\]: its cell is not finite"):
        calc.batch_evaluate([atoms])
    atoms.cell = np.zeros((3, 3))  # the same molecule without a cell: evaluated
    assert np.isfinite(calc.get_potential_energy(atoms))
