"""Per-step work of ``EquikernelsMLIAP.compute_forces``: what depends only on LAMMPS's elements and
pair list is built once and reused while they are unchanged (and rebuilt when they change), the
layers update owned rows only, and bad indices are refused before the model runs."""
import numpy as np
import pytest
import torch

from emulator import decompose
from equikernels.default_model import default_model_path
from equikernels.lammps import EquikernelsMLIAP
from equikernels.models.element_linear import ElementGroups
from equikernels.models.io import load
from equikernels.ops.graph import ConvGraph
from test_lammps_mliap import check, crystal, reference, small_cell


@pytest.fixture(scope="module")
def model():
    return load(default_model_path(), dtype=torch.float64)


@pytest.fixture
def counted(monkeypatch):
    """Calls of ConvGraph.build (sorts the pair list) and ElementGroups.build (a host sync)."""
    calls = {"graph": 0, "groups": 0}
    graph_build, groups_build = ConvGraph.build, ElementGroups.build

    def graph(*args, **kwargs):
        calls["graph"] += 1
        return graph_build(*args, **kwargs)

    def groups(*args, **kwargs):
        calls["groups"] += 1
        return groups_build(*args, **kwargs)

    monkeypatch.setattr(ConvGraph, "build", staticmethod(graph))
    monkeypatch.setattr(ElementGroups, "build", staticmethod(groups))
    return calls


def _run(obj, em, atoms, model):
    for r in em.ranks:  # LAMMPS clears forces and virial before each step
        r.f[:] = 0
        r.virial[:] = 0
    check(em.run(obj, separate_objects=False), reference(model, atoms), atoms)


def test_unchanged_pair_list_reuses_the_graph(model, counted):
    obj = EquikernelsMLIAP(model)
    atoms = crystal()
    swapped = atoms.copy()
    swapped.symbols[[1, 2, 5]] = "Ni"
    for a in (atoms, swapped):
        reference(model, a)  # the calculator's calls are not counted
    counted.update(graph=0, groups=0)
    em = decompose(atoms, obj.element_types, float(model.r_max))
    _run(obj, em, atoms, model)
    first = dict(counted)
    assert first["graph"] == 1 and first["groups"] >= 1
    for _ in range(2):  # the same pair list: no sort, no element grouping
        _run(obj, em, atoms, model)
    assert counted == first

    # same shapes, other species: the elements are rebuilt, the graph is not
    em_swapped = decompose(swapped, obj.element_types, float(model.r_max))
    assert np.array_equal(em_swapped.ranks[0].pair_i, em.ranks[0].pair_i)
    _run(obj, em_swapped, swapped, model)
    assert counted["graph"] == first["graph"] and counted["groups"] > first["groups"]

    # the same pairs in another order (as a new neighbour list gives): a new graph, same results
    rank = em_swapped.ranks[0]
    order = np.random.default_rng(0).permutation(rank.npairs)
    rank.pair_i, rank.pair_j, rank.rij = rank.pair_i[order], rank.pair_j[order], rank.rij[order]
    _run(obj, em_swapped, swapped, model)
    assert counted["graph"] == first["graph"] + 1

    # the kept pair list handed by a coupling without exchange is still refused
    em_plain = decompose(swapped, obj.element_types, float(model.r_max), exchange=False)
    em_plain.ranks[0].pair_i, em_plain.ranks[0].pair_j = rank.pair_i, rank.pair_j
    with pytest.raises(RuntimeError, match="forward_exchange"):
        em_plain.run(obj, separate_objects=False)


def test_layers_update_owned_rows_only(model):
    """Ghost rows feed messages (linear_up) but receive none: the rest of each layer runs on the
    owned rows."""
    obj = EquikernelsMLIAP(model)
    atoms = small_cell()
    em = decompose(atoms, obj.element_types, float(model.r_max))
    rank = em.ranks[0]
    rows = {}
    hooks = []
    for k, block in enumerate(obj.model.interactions):
        for name in ("linear_up", "linear", "skip"):
            mod = getattr(block, name)
            hooks.append(mod.register_forward_hook(
                lambda m, args, out, key=(k, name): rows.__setitem__(key, args[0].shape[0])))
    try:
        _run(obj, em, atoms, model)
    finally:
        for h in hooks:
            h.remove()
    assert rank.ntotal > rank.nlocal
    for k in range(len(obj.model.interactions)):
        assert rows[(k, "linear_up")] == rank.ntotal
        assert rows[(k, "linear")] == rows[(k, "skip")] == rank.nlocal


def test_bad_indices_are_refused(model):
    obj = EquikernelsMLIAP(model)
    atoms = crystal()
    rank = decompose(atoms, obj.element_types, float(model.r_max)).ranks[0]
    elems = rank.elems.copy()
    rank.elems[3] = len(obj.element_types)
    with pytest.raises(ValueError, match=r"data.elems: element indices must lie in \[0, 7\)"):
        obj.compute_forces(rank)
    rank.elems = elems
    rank.pair_j = rank.pair_j.copy()
    rank.pair_j[5] = rank.ntotal
    with pytest.raises(ValueError, match="data.pair_i / data.pair_j"):
        obj.compute_forces(rank)



def _sync_count(fn) -> int:
    """Synchronising CUDA calls made by fn (torch's sync debug mode)."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("called a synchronizing CUDA operation" in str(w.message) for w in caught)  # not the mode's notice


@pytest.mark.gpu
def test_gpu_steady_step_syncs_twice_beyond_the_model(model):
    """On CUDA data, a step with an unchanged pair list synchronises with the host only to check
    the cached graph and to hand LAMMPS the energy, beyond what the model call itself does."""
    from equikernels.calculators import MACECalculator
    from equikernels.models.mace import trusted_inputs

    obj = EquikernelsMLIAP(model)
    atoms = crystal()
    rank = decompose(atoms, obj.element_types, float(model.r_max), device="cuda").ranks[0]
    rank.update_pair_forces_gpu = lambda fij: None  # the emulator's tally copies to the host
    calc = MACECalculator(model, device="cuda", default_dtype="float64", cuda_graph=False)
    data = calc.graph(atoms)

    def model_call():
        with trusted_inputs(node_feats=False):
            calc.model(data, compute_force=True, training=False)

    for _ in range(2):
        obj.compute_forces(rank)
        model_call()
    assert _sync_count(lambda: obj.compute_forces(rank)) <= _sync_count(model_call) + 2
