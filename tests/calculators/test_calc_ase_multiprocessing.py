"""A calculator handed to ``multiprocessing`` (a Pool's arguments go through its ``ForkingPickler``,
which moves CPU tensors into shared memory) keeps working in the sending process."""
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
from ase.build import bulk

from equikernels.calculators import MACECalculator


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


def test_sending_a_calculator_to_workers_leaves_its_element_table_and_e0_intact():
    calc = MACECalculator(device="cpu", default_dtype="float64")  # the bundled model: several elements
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.rattle(0.05, seed=0)
    atoms.calc = calc
    node_energy = calc.get_property("node_energy", atoms).copy()
    lookup, e0 = calc.elements._lookup_np.copy(), calc._e0.copy()
    for _ in range(3):
        ForkingPickler.dumps(calc)  # what Pool.map does with the calculator in its arguments
        # fill the memory the tensors' previous storage gave back
        filler = [torch.full((len(lookup),), -7, dtype=torch.int64) for _ in range(64)]
        filler += [torch.full((len(e0),), 1e300, dtype=torch.float64) for _ in range(64)]
        np.testing.assert_array_equal(calc.elements._lookup_np, lookup)
        np.testing.assert_array_equal(calc._e0, e0)
        del filler
    alloy = atoms.copy()
    alloy.numbers[::2] = 28
    alloy.calc = calc
    fresh = MACECalculator(device="cpu", default_dtype="float64")
    np.testing.assert_allclose(calc.get_property("node_energy", alloy), fresh.get_property("node_energy", alloy),
                               rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="does not know: Si"):
        calc.get_potential_energy(bulk("Si", "diamond", a=5.43))
    assert np.isfinite(node_energy).all()


def _threads_in_worker(calc):
    return calc.num_threads, torch.get_num_threads()


def test_a_calculator_unpickled_in_a_spawned_worker_sets_its_thread_count():
    import multiprocessing

    calc = MACECalculator(device="cpu", num_threads=1)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        # a spawned worker starts with torch's own count (the cores), the calculator's applies there too
        assert pool.apply(_threads_in_worker, (calc,)) == (1, 1)
