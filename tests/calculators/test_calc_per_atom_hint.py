"""Per-atom stresses asked of a calculator made without them: ASE's PropertyNotImplementedError (what
ASE's tools catch), saying which argument gives them."""
import pytest
from ase.build import bulk
from ase.calculators.calculator import PropertyNotImplementedError

from equikernels.calculators import MACECalculator


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def test_per_atom_stresses_without_the_argument_name_it(cu_model):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.calc = MACECalculator(cu_model, device="cpu")
    with pytest.raises(PropertyNotImplementedError, match=r"compute_atomic_stresses=True"):
        atoms.get_stresses()
    with pytest.raises(PropertyNotImplementedError, match=r"virials: .*compute_atomic_stresses=True"):
        atoms.calc.get_property("virials", atoms)
    with pytest.raises(PropertyNotImplementedError):  # as ASE's: its trajectory writer catches it
        atoms.calc.get_property("stresses", atoms, allow_calculation=False)
    atoms.calc = MACECalculator(cu_model, device="cpu", compute_atomic_stresses=True)
    assert atoms.get_stresses().shape == (len(atoms), 6)
