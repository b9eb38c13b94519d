"""equikernels.models.pairing: a MACE model pairs a full edge list itself (the radial MLPs once per
pair) and gives the full list's results; lists it cannot pair, per-edge outputs and declared lists
are left as they are."""
import pytest
import torch
from ase.build import bulk, molecule

from equikernels import settings
from equikernels.models import atoms_list_to_data
from equikernels.models import data as D
from equikernels.models.data import PAIRED_KEY
from equikernels.models.radial import RadialMLP

ELEMENTS = [1, 6, 8, 29]
pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def model():
    """A model of its own per test (its pairing state starts empty)."""
    from random_models import small_random_model
    return small_random_model(ELEMENTS, seed=5, backend="equikernels").double().eval()


def _data(model):
    crystal = bulk("Cu", "fcc", a=3.61).repeat((2, 2, 2))
    crystal.numbers[::3] = 8
    crystal.rattle(0.1, seed=1)
    return atoms_list_to_data([crystal, molecule("CH3OH")], float(model.r_max), ELEMENTS, dtype=torch.float64)


def _run(model, data, **kw):
    out = model(dict(data), compute_force=True, compute_stress=True, **kw)
    return {k: v.detach() for k, v in out.items() if isinstance(v, torch.Tensor) and k != "node_feats"}


@pytest.fixture
def mlp_rows(monkeypatch):
    rows = []
    forward = RadialMLP.forward

    def counted(self, x, *args, **kwargs):
        rows.append(x.shape[0])
        return forward(self, x, *args, **kwargs)
    monkeypatch.setattr(RadialMLP, "forward", counted)
    return rows


@pytest.fixture
def pair_calls(monkeypatch):
    import equikernels.models.pairing as P
    calls = []

    def counted(data):
        calls.append(data["edge_index"].shape[1])
        return D.pair_edges(data)
    monkeypatch.setattr(P, "pair_edges", counted)
    return calls


def test_full_list_is_paired_with_the_same_results(model, mlp_rows, pair_calls):
    data = _data(model)
    e = data["edge_index"].shape[1]
    with settings.override(pair_edges="0"):
        ref = _run(model, data)
    assert set(mlp_rows) == {e}
    mlp_rows.clear()
    with settings.override(pair_edges="1"):
        out = _run(model, data)
        again = _run(model, data)
    assert set(mlp_rows) == {e // 2}  # the radial MLPs ran once per pair
    assert pair_calls == [e]  # the second call reused the first call's pairing
    for res in (out, again):
        for k in ("energy", "node_energy", "forces", "stress", "virials"):
            torch.testing.assert_close(res[k], ref[k], rtol=1e-10, atol=1e-10)
    # a modified edge list is paired again
    data["shifts"].add_(0.0)
    with settings.override(pair_edges="1"):
        _run(model, data)
    assert pair_calls == [e, e]


def test_what_is_left_unpaired(model, mlp_rows, pair_calls):
    data = _data(model)
    e = data["edge_index"].shape[1]
    with settings.override(pair_edges="1"):
        ref = _run(model, dict(data, **{PAIRED_KEY: False}))  # declared: left alone
        assert set(mlp_rows) == {e} and pair_calls == []
        out = _run(model, data, compute_edge_forces=True)  # per-edge rows in the caller's order
        assert set(mlp_rows) == {e} and pair_calls == []
        torch.testing.assert_close(out["forces"], ref["forces"], rtol=1e-10, atol=1e-10)
    with settings.override(pair_edges="auto"):  # auto: CUDA and large lists only
        _run(model, data)
    with settings.override(pair_edges="0"):
        _run(model, data)
    assert set(mlp_rows) == {e} and pair_calls == []


def test_a_list_without_every_reverse_stays_unpaired(model, mlp_rows, pair_calls):
    data = _data(model)
    keep = torch.arange(1, data["edge_index"].shape[1])  # edge 0's reverse has no partner now
    cut = dict(data, edge_index=data["edge_index"][:, keep], shifts=data["shifts"][keep],
               unit_shifts=data["unit_shifts"][keep])
    with settings.override(pair_edges="0"):
        ref = _run(model, cut)
    with settings.override(pair_edges="1"):
        out = _run(model, cut)
        _run(model, data)  # no further attempt, even for a full list
    assert pair_calls == [keep.numel()]
    assert model.__dict__["_pairing"].refused
    assert set(mlp_rows) == {keep.numel(), keep.numel() + 1}
    for k in ("energy", "forces", "stress"):
        torch.testing.assert_close(out[k], ref[k], rtol=1e-12, atol=1e-12)


def test_auto_rule():
    from equikernels.models.pairing import AUTO_MIN_EDGES, auto_pairs
    assert auto_pairs(AUTO_MIN_EDGES, "cuda", training=False)
    assert not auto_pairs(AUTO_MIN_EDGES - 1, "cuda", training=False)  # host-bound sizes
    assert not auto_pairs(AUTO_MIN_EDGES, "cuda", training=True)  # new batches every step: no gain
    assert not auto_pairs(10 * AUTO_MIN_EDGES, "cpu", training=False)
