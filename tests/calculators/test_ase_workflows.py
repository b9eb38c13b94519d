"""The calculator in the ways ASE workflows pass it around: pickled for multiprocessing and copied
with ``copy.deepcopy`` (one calculator per NEB image), after it has evaluated a structure."""
import copy
import pickle

import numpy as np
import pytest
from ase.build import bulk

from equikernels.calculators import MACECalculator


class _Uncopyable:
    """Stands in for a captured ``torch.cuda.CUDAGraph``, which can be neither pickled nor copied."""

    def __reduce__(self):
        raise TypeError("cannot pickle 'torch._C._CUDAGraph' object")


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def crystal():
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.rattle(0.05, seed=1)
    return atoms


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_calculator_with_graphs_pickles_and_copies(cu_model, how):
    calc = MACECalculator(cu_model, device="cpu", default_dtype="float64")
    calc._enable_graphs(capture=False)  # the padded evaluation CUDA runs as a graph replay
    atoms = crystal()
    atoms.calc = calc
    energy, forces = atoms.get_potential_energy(), atoms.get_forces()
    calc._graphed._graph = _Uncopyable()
    other = pickle.loads(pickle.dumps(calc)) if how == "pickle" else copy.deepcopy(calc)
    assert other._graphed is None and calc._graphed is not None
    image = crystal()
    image.calc = other
    assert image.get_potential_energy() == pytest.approx(energy, abs=1e-10)
    np.testing.assert_allclose(image.get_forces(), forces, atol=1e-10)
    image.positions[0] += 0.1
    image.calc = other
    assert image.get_potential_energy() != pytest.approx(energy, abs=1e-6)

