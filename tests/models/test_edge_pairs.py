"""Reverse-pair edge order (``models.edge_pairs``): ordering full neighbour lists, the model's use of it
(the radial MLP on half the edges, the same energies, forces and stress), the check of a false
declaration, the padded evaluation's paired layout and the calculator's neighbour lists."""
import copy

import numpy as np
import pytest
import torch
from ase.build import bulk, molecule

from equikernels.calculators import MACECalculator
from equikernels.calculators.neighbors import SkinNeighborList, pbc_tensor
from equikernels.models import GraphedModel, atoms_to_data
from equikernels.models.edge_pairs import DECLARED, KEY, is_paired, reverse_pair_order
from equikernels.models.mace import trusted_inputs

ELEMENTS = [1, 6, 8, 29]


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def model():
    from random_models import small_random_model
    return small_random_model(ELEMENTS, seed=5, backend="equikernels").double().eval()


def crystal():
    atoms = bulk("Cu", "fcc", a=3.61).repeat((2, 2, 2))
    atoms.numbers[::3] = 8
    atoms.rattle(0.1, seed=0)
    return atoms


STRUCTURES = {"crystal": crystal, "one-atom cell": lambda: bulk("Cu", "fcc", a=3.61),
              "molecule": lambda: molecule("CH3OH")}


def _data(model, atoms):
    return atoms_to_data(atoms, float(model.r_max), ELEMENTS, dtype=torch.float64)


def _paired(data):
    ei, s = data["edge_index"], data["unit_shifts"]
    order = reverse_pair_order(ei[0], ei[1], s, data["positions"].shape[0])
    assert order is not None
    assert torch.equal(order.sort().values, torch.arange(ei.shape[1]))
    out = dict(data, edge_index=ei[:, order], shifts=data["shifts"][order], unit_shifts=s[order])
    out[KEY] = DECLARED
    return out


def _direct(model, data, stress=True):
    out = model(dict(data), compute_force=True, compute_stress=stress)
    return {k: out[k].detach() for k in ("energy", "node_energy", "forces") + (("stress",) if stress else ())}


def _close(a, b, tol=1e-10):
    for k in b:
        scale = max(1.0, float(b[k].abs().max()))
        d = float((a[k].detach() - b[k]).abs().max())
        assert d <= tol * scale, (k, d)


@pytest.mark.parametrize("name", list(STRUCTURES))
def test_full_lists_are_ordered_in_pairs(model, name):
    data = _paired(_data(model, STRUCTURES[name]()))
    ei = data["edge_index"]
    assert is_paired(ei[0], ei[1], data["shifts"])


def test_lists_without_every_reverse_are_left_alone(model):
    data = _data(model, crystal())
    ei, s = data["edge_index"], data["unit_shifts"]
    n = data["positions"].shape[0]
    assert reverse_pair_order(ei[0, 1:], ei[1, 1:], s[1:], n) is None  # odd count
    keep = torch.ones(ei.shape[1], dtype=torch.bool)
    first = ei[:, 0]
    keep[0] = False
    # drop the first edge and one unrelated edge: an even count, two pairs broken
    other = int(torch.nonzero((ei[0] != first[1]) | (ei[1] != first[0]))[1])
    keep[other] = False
    assert reverse_pair_order(ei[0][keep], ei[1][keep], s[keep], n) is None


@pytest.mark.parametrize("name", list(STRUCTURES))
def test_same_energies_forces_and_stress(model, name):
    data = _data(model, STRUCTURES[name]())
    stress = name != "molecule"
    _close(_direct(model, _paired(data), stress), _direct(model, data, stress))


def test_radial_mlp_runs_on_half_the_edges(model):
    data = _data(model, crystal())
    rows = []
    hooks = [m.radial_mlp.register_forward_hook(lambda mod, args, out: rows.append(args[0].shape[0]))
             for m in model.interactions]
    try:
        model(dict(data), compute_force=True)
        plain, rows[:] = list(rows), []
        model(dict(_paired(data)), compute_force=True)
    finally:
        for h in hooks:
            h.remove()
    e = data["edge_index"].shape[1]
    assert plain == [e] * len(model.interactions)
    assert rows == [e // 2] * len(model.interactions)


def test_a_false_declaration_is_refused(model):
    data = dict(_data(model, crystal()))
    data[KEY] = DECLARED
    with pytest.raises(ValueError, match="paired_edges"):
        model(dict(data), compute_force=True)
    with trusted_inputs():  # trusted callers (the calculator, graph capture) are not checked
        model(dict(data), compute_force=True)


@pytest.mark.parametrize("stress", [False, True])
def test_padded_evaluation_keeps_the_pairs(model, stress):
    data = _data(model, crystal())
    g = GraphedModel(model, capture=False)
    _close(g(_paired(data), compute_stress=stress), _direct(model, data, stress))
    s = g._static
    assert s[KEY] and s["edge_index"].shape[1] > data["edge_index"].shape[1]
    assert is_paired(s["edge_index"][0], s["edge_index"][1], s["shifts"])
    # fewer edges in the same bucket (one pair dropped): the freed slots are padding pairs again
    p = _paired(data)
    h = p["edge_index"].shape[1] // 2
    keep = torch.cat([torch.arange(1, h), torch.arange(h + 1, 2 * h)])
    fewer = dict(p, edge_index=p["edge_index"][:, keep], shifts=p["shifts"][keep], unit_shifts=p["unit_shifts"][keep])
    unpaired = {k: v for k, v in fewer.items() if k != KEY}
    _close(g(fewer, compute_stress=stress), _direct(model, unpaired, stress))
    assert g.num_shapes == 1 and is_paired(s["edge_index"][0], s["edge_index"][1], s["shifts"])


def test_neighbour_lists_are_paired_after_moves(model):
    atoms = crystal()
    nl = SkinNeighborList(float(model.r_max), skin=0.5)
    cell = torch.as_tensor(atoms.cell.array, dtype=torch.float64)
    pbc = pbc_tensor(atoms.pbc, "cpu")
    rng = np.random.default_rng(0)
    for step in range(4):
        pos = torch.as_tensor(atoms.positions + 0.1 * step * rng.standard_normal(atoms.positions.shape))
        for edges in (nl.update(pos, cell, pbc), nl.candidates(pos, cell, pbc)):
            assert edges.paired and is_paired(edges.sender, edges.receiver, edges.shifts)
    assert nl.num_builds > 1


def test_calculator_matches_the_unpaired_model(model):
    atoms = crystal()
    calc = MACECalculator(copy.deepcopy(model), device="cpu", cuda_graph=False)
    ref = _direct(model, _data(model, atoms))
    atoms.calc = calc
    np.testing.assert_allclose(atoms.get_forces(), ref["forces"].numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(atoms.get_potential_energy(), float(ref["energy"][0]), rtol=1e-12)
    assert calc.neighbors._paired
