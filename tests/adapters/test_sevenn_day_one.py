"""accelerate() on SevenNet-0 as a SevenNet user meets it: one calculator reused across structures of
different sizes and periodicity (a molecule without PBC, a slab periodic in two directions, a lone atom
without neighbours), with per-atom energies and per-atom virials; sevenn's batched inference loop
(torch_geometric DataLoader, ``util.to_atom_graph_list``); and the accelerated model saved whole with
torch.save and loaded back. Every number equals the unmodified model's within float32 noise."""
import copy
import io

import numpy as np
import pytest
import torch

sevenn_calc = pytest.importorskip("sevenn.calculator")

import sevenn._keys as KEY  # noqa: E402
import sevenn.util as sevenn_util  # noqa: E402
from sevenn.atom_graph_data import AtomGraphData  # noqa: E402
from sevenn.train.dataload import unlabeled_atoms_to_graph  # noqa: E402

import equikernels as ek  # noqa: E402

pytestmark = pytest.mark.sevenn


def _structures():
    import ase.build  # noqa: PLC0415
    from ase import Atoms  # noqa: PLC0415

    water = ase.build.molecule("H2O")
    water.center(vacuum=3.0)
    water.rattle(0.02, seed=1)  # pbc False
    slab = ase.build.fcc111("Cu", (2, 2, 2), vacuum=4.0)
    slab.pbc = (True, True, False)
    slab.rattle(0.03, seed=3)
    lone = Atoms("Ar", positions=[[0.0, 0.0, 0.0]], cell=[10.0] * 3, pbc=True)
    return [water, slab, lone]


def _evaluate(calc, atoms):
    a = atoms.copy()
    a.calc = calc
    calc.reset()
    return [a.get_potential_energy(), a.get_forces(), a.get_stress(), a.get_potential_energies(),
            calc.results["stresses"]]


def _close(got, want):
    for g, w in zip(got, want):
        g, w = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
        assert np.abs(g - w).max() <= 2e-5 * max(1.0, np.abs(w).max()), (g, w)


def test_sevenn0_calculator_reused_batched_and_saved(single_thread):
    plain = sevenn_calc.SevenNetCalculator("7net-0", device="cpu", compute_atomic_virial=True)
    systems = _structures()
    want = [_evaluate(plain, atoms) for atoms in systems]
    fast_model = copy.deepcopy(plain.model)
    report = ek.accelerate(fast_model)
    assert len([t for _, t, _ in report.fused if t == "IrrepsConvolution"]) == 5, str(report)
    fast = sevenn_calc.SevenNetCalculator(fast_model, file_type="model_instance", device="cpu",
                                          compute_atomic_virial=True)
    for atoms, w in zip(systems, want):
        _close(_evaluate(fast, atoms), w)

    buf = io.BytesIO()
    torch.save(fast_model, buf)
    buf.seek(0)
    loaded = sevenn_calc.SevenNetCalculator(torch.load(buf, weights_only=False), file_type="model_instance",
                                            device="cpu", compute_atomic_virial=True)
    _close(_evaluate(loaded, systems[1]), want[1])

    from torch_geometric.loader import DataLoader  # noqa: PLC0415

    graphs = [AtomGraphData.from_numpy_dict(unlabeled_atoms_to_graph(a, fast_model.cutoff)) for a in systems]
    fast_model.set_is_batch_data(True)
    fast_model._modules["force_output"].use_atomic_virial = False
    outputs = []
    for batch in DataLoader(graphs, batch_size=2, shuffle=False):
        outputs.extend(sevenn_util.to_atom_graph_list(fast_model(batch).detach()))
    assert len(outputs) == len(systems)
    for out, w in zip(outputs, want):
        _close([out[KEY.PRED_TOTAL_ENERGY].item(), out[KEY.PRED_FORCE], out[KEY.ATOMIC_ENERGY].flatten()],
               [w[0], w[1], w[3]])


def test_readme_recipe_for_a_sum_of_calculators_runs_the_accelerated_model(single_thread):
    """README: accelerate the SevenNet member of an already evaluated sum (SevenNetD3Calculator's
    SumCalculator), then clear the member's and the sum's stored results: the next energy runs the
    accelerated model (LennardJones stands in for D3, which does not run on the CPU)."""
    from ase.build import bulk  # noqa: PLC0415
    from ase.calculators.lj import LennardJones  # noqa: PLC0415
    from ase.calculators.mixing import SumCalculator  # noqa: PLC0415

    calc = SumCalculator([sevenn_calc.SevenNetCalculator("7net-0", device="cpu"), LennardJones()])
    atoms = bulk("Si", "diamond", a=5.43)
    atoms.calc = calc
    before = atoms.get_potential_energy()
    model = calc.mixer.calcs[0].model
    ek.accelerate(model)
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    calc.mixer.calcs[0].reset()
    calc.results = {}
    assert abs(atoms.get_potential_energy() - before) <= 2e-5 * abs(before) and calls == [1]
