"""Padded fixed-shape evaluation (equikernels.models.graphed) and the calculator's CUDA-graph mode.

On CPU the padded evaluation runs eagerly (``capture=False``): padding atoms and edges, candidate
edges beyond the cutoff and bucket changes must change nothing. The GPU tests (marked gpu) replay
captured graphs against eager evaluation over MD steps, across a bucket change."""
import copy

import numpy as np
import pytest
import torch
from ase import units
from ase.build import bulk, molecule
from ase.md.verlet import VelocityVerlet

from equikernels.calculators import MACECalculator
from equikernels.calculators.md import initialise_velocities
from equikernels.models import GraphedModel, atoms_list_to_data, atoms_to_data
from equikernels.models.graphed import bucket

ELEMENTS = [1, 6, 8, 29]


@pytest.fixture(autouse=True)
def _one_thread(single_thread):
    yield


@pytest.fixture(scope="module")
def model():
    from random_models import small_random_model
    return small_random_model(ELEMENTS, seed=3, backend="equikernels").double().eval()


def crystal(seed=0):
    atoms = bulk("Cu", "fcc", a=3.61).repeat((2, 2, 2))
    atoms.numbers[::3] = 8
    atoms.rattle(0.1, seed=seed)
    return atoms


def _direct(model, data, stress):
    out = model(dict(data), compute_force=True, compute_stress=stress)
    return {k: out[k].detach() for k in ("energy", "node_energy", "forces") + (("stress",) if stress else ())}


def _close(a, b, tol=1e-10):
    a = {k: v.detach() for k, v in a.items()}
    for k in b:
        assert a[k].shape == b[k].shape, k
        scale = max(1.0, float(b[k].abs().max()))
        assert float((a[k] - b[k]).abs().max()) <= tol * scale, (k, float((a[k] - b[k]).abs().max()))


def test_bucket_sizes():
    assert bucket(1) == 64 and bucket(64) == 64 and bucket(65) == 72
    for n in (100, 1009, 40321):
        assert n <= bucket(n) <= n * 1.126


@pytest.mark.parametrize("stress", [False, True])
def test_padding_changes_nothing(model, stress):
    r_max = float(model.r_max)
    for atoms in (crystal(), molecule("CH3OH")):
        data = atoms_to_data(atoms, r_max, ELEMENTS, dtype=torch.float64)
        ref = _direct(model, data, stress)
        padded = GraphedModel(model, capture=False)(data, compute_stress=stress)
        _close(padded, ref)
    # several graphs in one batch (the padding graph comes last)
    data = atoms_list_to_data([crystal(1), crystal(2)], r_max, ELEMENTS, dtype=torch.float64)
    _close(GraphedModel(model, capture=False)(data, compute_stress=stress), _direct(model, data, stress))


def test_padding_check_can_fail(model):
    """Padding is really there, and the comparison would catch padding edges that reach real atoms."""
    data = atoms_to_data(crystal(), float(model.r_max), ELEMENTS, dtype=torch.float64)
    n, e = data["positions"].shape[0], data["edge_index"].shape[1]
    ref = _direct(model, data, False)
    g = GraphedModel(model, capture=False)
    _close(g(data), ref)
    assert g._shape[0] > n and g._shape[1] > e
    good = g._pad_edges

    def onto_atom_0(e, n):  # padding self-edges on real atom 0, inside the cutoff
        good(e, n)
        g._static["edge_index"][:, e:] = 0
        g._static["shifts"][e:, 0] = 0.5 * g.r_max

    g._pad_edges = onto_atom_0
    g._seen.clear()
    with pytest.raises(AssertionError):
        _close(g(data), ref)


def test_candidate_edges_beyond_cutoff_change_nothing(model):
    atoms = crystal()
    r_max = float(model.r_max)
    data = atoms_to_data(atoms, r_max, ELEMENTS, dtype=torch.float64)
    wide = atoms_to_data(atoms, r_max + 1.0, ELEMENTS, dtype=torch.float64)  # pairs up to r_max + 1
    assert wide["edge_index"].shape[1] > data["edge_index"].shape[1]
    g = GraphedModel(model, capture=False)
    _close(g(wide, compute_stress=True), _direct(model, data, True))
    # the model saw the edges within the cutoff plus headroom, not every candidate
    assert int(g._count) == data["edge_index"].shape[1]
    assert int(g._count) <= g._capacity < wide["edge_index"].shape[1]


def test_capacity_grows_when_more_edges_are_within(model):
    """More candidates within the cutoff than the capacity: it grows and the call is repeated."""
    atoms = crystal()
    r_max = float(model.r_max)
    wide = atoms_to_data(atoms, r_max + 1.0, ELEMENTS, dtype=torch.float64)
    ref = _direct(model, atoms_to_data(atoms, r_max, ELEMENTS, dtype=torch.float64), False)
    g = GraphedModel(model, capture=False)
    _close(g(wide), ref)
    count = int(g._count)
    g._capacity = count // 2  # as if the structure had gained edges since the capacity was set
    _close(g(wide), ref)
    assert g._capacity >= count
    # each growth doubles the spare fraction (a drifting count settles), up to MAX_HEADROOM
    from equikernels.models.graphed import MAX_HEADROOM
    spare = [g._capacity / count - 1]
    for _ in range(5):
        g._capacity = count // 2
        g(wide)
        spare.append(g._capacity / count - 1)
    h = g.edge_headroom
    for k, f in enumerate(spare):
        want = min(h * 2 ** (k + 1), MAX_HEADROOM)
        assert want <= f <= min(want + 32 / count, g._static["edge_index"].shape[1] / count - 1) + 1e-12, (k, f)


@pytest.mark.parametrize("stress", [False, True])
def test_host_results_equal_the_model_and_grow_the_capacity(model, stress):
    """``to_host``: the packed buffer unpacks to the model's results (padding rows dropped, several
    graphs, stress), as arrays of their own; a capacity found too small is grown there too."""
    r_max = float(model.r_max)
    data = atoms_list_to_data([crystal(1), crystal(2)], r_max + 1.0, ELEMENTS, dtype=torch.float64)
    ref = _direct(model, atoms_list_to_data([crystal(1), crystal(2)], r_max, ELEMENTS, dtype=torch.float64), stress)
    g = GraphedModel(model, capture=False)
    host = g.to_host(data, compute_stress=stress)
    assert set(host) == set(ref) and all(isinstance(v, np.ndarray) and v.base is None for v in host.values())
    _close({k: torch.from_numpy(v) for k, v in host.items()}, ref)
    count = int(g._count)
    g._capacity = count // 2
    host = g.to_host(data, compute_stress=stress)
    assert g._capacity >= count
    _close({k: torch.from_numpy(v) for k, v in host.items()}, ref)


def test_buckets_are_reused_and_changed(model):
    r_max = float(model.r_max)
    g = GraphedModel(model, capture=False)
    atoms = crystal()
    base = atoms_to_data(atoms, r_max, ELEMENTS, dtype=torch.float64)
    g(base)
    assert g.num_shapes == 1
    e = base["edge_index"].shape[1]
    # fewer edges (drop some pairs): same bucket, stale slots refilled with padding
    keep = torch.arange(e - 10)
    fewer = dict(base, edge_index=base["edge_index"][:, keep], shifts=base["shifts"][keep],
                 unit_shifts=base["unit_shifts"][keep])
    _close(g(fewer), _direct(model, fewer, False))
    assert g.num_shapes == 1
    _close(g(base), _direct(model, base, False))
    # a bigger system: new bucket
    big = atoms_to_data(atoms.repeat((2, 1, 1)), r_max, ELEMENTS, dtype=torch.float64)
    _close(g(big), _direct(model, big, False))
    assert g.num_shapes == 2
    # other elements, same sizes: the structure is reloaded
    other = atoms.copy()
    other.numbers[:] = 6
    od = atoms_to_data(other, r_max, ELEMENTS, dtype=torch.float64)
    _close(g(od), _direct(model, od, False))


@pytest.mark.parametrize("stress", [False, True])
def test_smaller_systems_in_the_same_bucket_leave_no_stale_atoms(model, stress):
    r_max = float(model.r_max)
    g = GraphedModel(model, capture=False)
    small = bulk("Cu", "fcc", a=3.61, cubic=True)  # 8 atoms, then 4, 2 and 8 again
    small.rattle(0.05, seed=4)
    two = bulk("Cu", "fcc", a=3.61).repeat((2, 1, 1))
    two.rattle(0.05, seed=5)
    kept, last = [], None
    for atoms in (crystal(), small, two, crystal(3)):
        data = atoms_to_data(atoms, r_max, ELEMENTS, dtype=torch.float64)
        shapes = g.num_shapes
        _close(g(data, compute_stress=stress), _direct(model, data, stress))
        kept.append(g.num_shapes == shapes and last is not None and len(atoms) < last)
        last = len(atoms)
    assert any(kept)  # a smaller system did reuse the buffers


def _md(calc, atoms, steps):
    atoms = atoms.copy()
    atoms.calc = calc
    initialise_velocities(atoms, 600.0, seed=1)
    dyn = VelocityVerlet(atoms, timestep=2.0 * units.fs)
    forces, energies = [], []
    for _ in range(steps):
        dyn.run(1)
        forces.append(atoms.get_forces().copy())
        energies.append(atoms.get_potential_energy())
    return np.array(energies), np.array(forces)


def test_calculator_padded_mode_matches_eager_over_md(model):
    atoms = crystal()
    eager = MACECalculator(copy.deepcopy(model), device="cpu", skin=0.1, cuda_graph=False)
    padded = MACECalculator(copy.deepcopy(model), device="cpu", skin=0.1, cuda_graph=False)
    padded._enable_graphs(capture=False)
    e0, f0 = _md(eager, atoms, 8)
    e1, f1 = _md(padded, atoms, 8)
    assert padded.neighbors.num_builds > 1  # rebuilds happened along the way
    np.testing.assert_allclose(e1, e0, rtol=0, atol=1e-9)
    np.testing.assert_allclose(f1, f0, rtol=0, atol=1e-9)
    a = atoms.copy()
    a.calc = padded
    s1 = a.get_stress()
    a.calc = eager
    np.testing.assert_allclose(s1, a.get_stress(), rtol=0, atol=1e-10)


def test_calculator_padded_mode_over_different_structures(model):
    """One calculator evaluating a list of structures in turn (a data set, several relaxations)."""
    padded = MACECalculator(copy.deepcopy(model), device="cpu", cuda_graph=False)
    padded._enable_graphs(capture=False)
    eager = MACECalculator(copy.deepcopy(model), device="cpu", cuda_graph=False)
    cubic = bulk("Cu", "fcc", a=3.61, cubic=True)
    frames = [crystal(), cubic, bulk("Cu", "fcc", a=3.6), crystal(5), molecule("CH3OH"), molecule("H2O")]
    for k, atoms in enumerate(frames):
        atoms.rattle(0.03, seed=k)
        got, ref = atoms.copy(), atoms.copy()
        got.calc, ref.calc = padded, eager
        assert got.get_potential_energy() == pytest.approx(ref.get_potential_energy(), abs=1e-9), k
        np.testing.assert_allclose(got.get_forces(), ref.get_forces(), rtol=0, atol=1e-9)
        if atoms.pbc.all():
            np.testing.assert_allclose(got.get_stress(), ref.get_stress(), rtol=0, atol=1e-10)


def test_cuda_graph_option(model, monkeypatch):
    with pytest.warns(RuntimeWarning, match="not CUDA"):
        calc = MACECalculator(copy.deepcopy(model), device="cpu", cuda_graph=True)
    assert calc.cuda_graph is False
    monkeypatch.setenv("EQUIKERNELS_CUDA_GRAPH", "bogus")
    with pytest.raises(ValueError, match="EQUIKERNELS_CUDA_GRAPH: expected one of"):
        MACECalculator(copy.deepcopy(model), device="cpu")


def test_auto_graphs_up_to_the_size_limit(model):
    """"auto": the padded graph evaluation up to CUDA_GRAPH_MAX_ATOMS atoms, eager above."""
    from equikernels.calculators import calculator as C
    calc = MACECalculator(copy.deepcopy(model), device="cpu", cuda_graph=False)
    calc.cuda_graph = "auto"  # as on CUDA, where "auto" is kept
    assert not calc._use_graphs(C.CUDA_GRAPH_MAX_ATOMS + 1) and calc._graphed is None
    assert C.CUDA_GRAPH_MAX_ATOMS >= 10192 and calc._use_graphs(C.CUDA_GRAPH_MAX_ATOMS)
    assert calc._graphed is not None


# --- GPU: captured graphs against eager evaluation -------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cuda_graph_md_matches_eager(model, dtype):
    """Replays over MD steps with neighbour-list rebuilds; a cell change (NPT-like) and a bigger
    system force re-captures; every step equals the eager calculator."""
    atoms = crystal()
    tol = 1e-9 if dtype == "float64" else 2e-4
    eager = MACECalculator(copy.deepcopy(model), device="cuda", skin=0.1, default_dtype=dtype, cuda_graph=False)
    graphed = MACECalculator(copy.deepcopy(model), device="cuda", skin=0.1, default_dtype=dtype, cuda_graph=True)
    e0, f0 = _md(eager, atoms, 12)
    e1, f1 = _md(graphed, atoms, 12)
    g = graphed._graphed
    assert g is not None and g.disabled_reason is None and g.num_captures >= 1
    np.testing.assert_allclose(e1, e0, rtol=0, atol=tol * max(1, np.abs(e0).max()))
    np.testing.assert_allclose(f1, f0, rtol=0, atol=tol * max(1, np.abs(f0).max()))
    # stress (another graph), then a bigger system (new bucket)
    a = atoms.copy()
    a.calc = graphed
    s1 = a.get_stress()
    a.calc = eager
    np.testing.assert_allclose(s1, a.get_stress(), rtol=0, atol=tol)
    big = atoms.repeat((2, 1, 1))
    captures = g.num_captures
    eb, fb = _md(eager, big, 3)
    gb, gfb = _md(graphed, big, 3)
    assert g.num_captures > captures and g.disabled_reason is None
    np.testing.assert_allclose(gb, eb, rtol=0, atol=tol * max(1, np.abs(eb).max()))
    np.testing.assert_allclose(gfb, fb, rtol=0, atol=tol * max(1, np.abs(fb).max()))


@pytest.mark.gpu
def test_graphed_model_replay_equals_eager(model):
    m = copy.deepcopy(model).to("cuda")
    r_max = float(m.r_max)
    g = GraphedModel(m)
    for seed in range(3):  # new positions each call, same shapes: replays of one graph
        data = atoms_to_data(crystal(seed), r_max, ELEMENTS, device="cuda", dtype=torch.float64)
        _close({k: v.cpu() for k, v in g(data, compute_stress=True).items()},
               {k: v.cpu() for k, v in _direct(m, data, True).items()})
    assert g.num_captures == 1 and g.disabled_reason is None


def test_edge_fluctuations_within_a_bucket_keep_the_shape():
    """MD: the atom count is fixed and the edge count moves inside its bucket; the padded shape
    (and so the captured graph) must be kept, however many padding atoms the edges need."""
    from equikernels.models.graphed import BUCKET_HEADROOM, PAD_DEGREE, GraphedModel, bucket
    g = GraphedModel.__new__(GraphedModel)
    n = 1008
    for e0, pairs in ((80000, False), (20000, False), (40000, True)):
        g.pairs = pairs  # a half list: a padding atom's candidates count twice
        eb = bucket(int(e0 * (1 + BUCKET_HEADROOM)) + 1)
        nb = bucket(n + 1 + -(-(eb - e0) // (PAD_DEGREE // (2 if pairs else 1))))
        g._shape = (nb, eb, "key")
        assert all(g._fits(n, e, ("key",)) for e in range(int(e0 * 0.9), eb + 1, 7))
        assert not g._fits(n, eb + 1, ("key",))  # more edges than the bucket holds


@pytest.mark.parametrize("stress", [False, True])
def test_half_list_with_pairs(model, stress):
    """``pairs=True``: a half candidate list (each pair once, with candidates beyond the cutoff)
    gives the full list's results; capacity and count are pairs."""
    from equikernels.calculators.neighbors import SkinNeighborList, pbc_tensor
    from equikernels.models.data import first_of_pairs
    r_max = float(model.r_max)
    for atoms in (crystal(), molecule("CH3OH")):
        data = atoms_to_data(atoms, r_max, ELEMENTS, dtype=torch.float64)
        ref = _direct(model, data, stress)
        keep = torch.nonzero(first_of_pairs(data["edge_index"], data["unit_shifts"])).squeeze(1)
        half = dict(data, edge_index=data["edge_index"][:, keep], shifts=data["shifts"][keep],
                    unit_shifts=data["unit_shifts"][keep])
        g = GraphedModel(model, capture=False, pairs=True)
        _close(g(half, compute_stress=stress), ref)
        assert int(g._count) == keep.numel() == data["edge_index"].shape[1] // 2
        # vesin's half list with a skin: candidates beyond the cutoff change nothing
        nl = SkinNeighborList(r_max, skin=1.0, paired=True)
        pos = data["positions"]
        cand = nl.candidates(pos, data["cell"], pbc_tensor(atoms.pbc, "cpu"))
        assert cand.sender.shape[0] > keep.numel() or len(atoms) < 8  # a molecule: every pair within
        cdata = dict(data, edge_index=cand.edge_index, shifts=cand.shifts, unit_shifts=cand.unit_shifts)
        _close(GraphedModel(model, capture=False, pairs=True)(cdata, compute_stress=stress), ref)
        # the same half list read as a full one misses every reverse edge
        wrong = GraphedModel(model, capture=False)(half, compute_stress=stress)
        assert float((wrong["forces"] - ref["forces"]).abs().max()) > 1e-6
