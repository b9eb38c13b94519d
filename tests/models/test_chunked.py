"""Edge-chunked interactions (equikernels.models.chunked): a small MACE with a tiny chunk size (7
edges: dozens of chunks, nodes with more incoming edges than a chunk holds, nodes with none)
against the unchunked model: energy, forces and stress in fp64 to 1e-12, a force-loss parameter
gradient through ``create_graph=True`` (checkpointed chunks differentiated twice), energy without
gradients, mixed precision, one case on the Triton interpreter; the auto rule leaves small systems
alone; the setting and its environment variable reject bad values."""
import numpy as np
import pytest
import torch
from ase import Atoms

from equikernels.models import atoms_list_to_data
from equikernels.models import blocks as model_blocks
from equikernels.models import chunked
from equikernels.models.builder import mace_config, random_model
from equikernels.models import chunked
from equikernels.models.blocks import set_edge_chunk
from equikernels.models.chunked import (CHUNK_FRACTION, EDGE_CHUNK_ENV, MEMORY_MARGIN, STEP_BYTES_PER_WEIGHT_BYTE, chunk_plan,
                                        resolve_edge_chunk)
from mace_models import R_MAX, ZS
from mace_models import layout_model as _model
from mace_models import mixed_atoms as _atoms
CHUNK = 7

MODELS = {
    "residual": dict(),
    "density-zbl": dict(interaction="RealAgnosticDensityResidualInteractionBlock",
                        interaction_first="RealAgnosticDensityInteractionBlock", pair_repulsion=True,
                        distance_transform="Agnesi"),
    "plain-mul_ir": dict(model="MACE", layout="mul_ir"),
}


@pytest.fixture(autouse=True)
def _env(monkeypatch, single_thread):
    monkeypatch.delenv(EDGE_CHUNK_ENV, raising=False)
    monkeypatch.delenv("EQUIKERNELS_BACKEND", raising=False)


def _data(dtype=torch.float64, device="cpu"):
    return atoms_list_to_data(_atoms(), R_MAX, ZS, dtype=dtype, device=device)


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


@pytest.fixture
def count_chunked(monkeypatch):
    """Counts the chunked convolutions run and their chunks."""
    calls = {"convs": 0, "chunks": 0}
    conv, plan = chunked.chunked_edge_conv, chunked.chunk_plan

    def counting_conv(*a, **k):
        calls["convs"] += 1
        return conv(*a, **k)

    def counting_plan(*a, **k):
        p = plan(*a, **k)
        calls["chunks"] += len(p)
        return p

    monkeypatch.setattr(model_blocks, "chunked_edge_conv", counting_conv)
    monkeypatch.setattr(chunked, "chunk_plan", counting_plan)
    return calls


def test_chunk_plan():
    assert chunk_plan([0, 0, 10, 12, 12, 20, 30, 30, 30], 7) == [(0, 2, 0, 10), (2, 4, 10, 12), (4, 5, 12, 20),
                                                                 (5, 8, 20, 30)]
    assert chunk_plan([0, 3, 6, 9], 7) == [(0, 2, 0, 6), (2, 3, 6, 9)]
    assert chunk_plan([0, 0, 0], 7) == [(0, 2, 0, 0)]  # no edges: one chunk
    assert chunk_plan([0], 7) == []
    rng = np.random.default_rng(0)
    for _ in range(50):
        deg = rng.integers(0, 12, size=int(rng.integers(1, 40))) * (rng.random(1) < 0.8)
        ptr = [0] + np.cumsum(deg).tolist()
        c = int(rng.integers(1, 15))
        plan = chunk_plan(ptr, c)
        assert plan[0][0] == 0 and plan[-1][1] == len(deg)
        for (n0, n1, e0, e1), nxt in zip(plan, plan[1:] + [None]):
            assert n0 < n1 and (e0, e1) == (ptr[n0], ptr[n1])
            assert nxt is None or nxt[0] == n1
            assert e1 > e0 or len(plan) == 1  # no chunk without edges
            assert e1 - e0 <= c or np.count_nonzero(deg[n0:n1]) == 1  # over the limit: one node with edges
    with pytest.raises(ValueError, match="chunk_edges"):
        chunk_plan([0, 1], 0)


@pytest.mark.parametrize("name", list(MODELS))
def test_chunked_equals_unchunked_fp64(name, count_chunked, device):
    model = _model(device=device, **MODELS[name])
    # edge forces: a second backward through the retained graph (the chunks are recomputed again)
    ref = model(_data(device=device), compute_stress=True, compute_edge_forces=True)
    assert count_chunked["convs"] == 0
    set_edge_chunk(model, CHUNK)
    out = model(_data(device=device), compute_stress=True, compute_edge_forces=True)
    assert count_chunked["convs"] == 2 and count_chunked["chunks"] > 40
    for key in ("energy", "node_energy", "forces", "stress", "edge_forces"):
        assert _rel(out[key], ref[key]) < 1e-12, key
    assert ref["forces"].abs().max() > 1e-3  # (not bitwise: a matmul's rounding depends on its row count)


def test_force_loss_gradient_create_graph(count_chunked, device):
    """Force training: the forces are built with create_graph=True (through the checkpointed
    chunks) and a loss on them is differentiated again to every parameter."""
    model = _model(device=device, **MODELS["density-zbl"])
    params = [p for p in model.parameters() if p.requires_grad]

    def grads():
        out = model(_data(device=device), training=True, compute_stress=True)
        loss = (out["energy"] ** 2).sum() + (out["forces"] ** 2).sum() + (out["stress"] ** 2).sum()
        return torch.autograd.grad(loss, params, allow_unused=True)

    ref = grads()
    set_edge_chunk(model, CHUNK)
    got = grads()
    assert count_chunked["convs"] == 2
    radial = {id(p) for blk in model.interactions for p in blk.radial_mlp.parameters()}
    for p, a, b in zip(params, got, ref):
        assert (a is None) == (b is None)
        if b is not None and b.abs().max() > 0:
            assert _rel(a, b) < 1e-10
    # the radial MLP weights get their gradient only through the chunks
    assert all(b is not None and b.abs().max() > 0 for p, b in zip(params, ref) if id(p) in radial)


@pytest.mark.parametrize("name", ["residual", "density-zbl"])
def test_chunked_equals_unchunked_fp32(name, count_chunked, device):
    """fp32: the energy to 1e-6; forces and stress differ only by the order in which the gradient of
    h sums its chunks, an error no larger than fp32's own (against the fp64 model: 2-5e-6 here)."""
    model = _model(device=device, **MODELS[name])
    exact = model(_data(device=device), compute_stress=True)
    model.set_precision("fp32")
    ref = model(_data(torch.float32, device), compute_stress=True)
    set_edge_chunk(model, CHUNK)
    out = model(_data(torch.float32, device), compute_stress=True)
    assert count_chunked["convs"] == 2
    assert _rel(out["energy"], ref["energy"]) < 1e-6
    for key in ("forces", "stress"):
        # two float32 evaluations summing in different orders: within twice the float32 error
        assert _rel(out[key], ref[key]) < max(1e-6, 2 * _rel(ref[key], exact[key])), key


def test_no_grad_energy(count_chunked):
    model = _model()
    with torch.no_grad():
        ref = model(_data(), compute_force=False)["energy"]
        set_edge_chunk(model, CHUNK)
        got = model(_data(), compute_force=False)["energy"]
    assert count_chunked["convs"] == 2
    assert torch.equal(got, ref)


def test_mixed_precision(count_chunked):
    model = _model(dtype=torch.float32).set_precision("bf16-mixed")
    ref = model(_data(torch.float32))
    set_edge_chunk(model, CHUNK)
    out = model(_data(torch.float32))
    assert count_chunked["convs"] == 2
    assert _rel(out["energy"], ref["energy"]) < 1e-6
    assert _rel(out["forces"], ref["forces"]) < 1e-2  # bf16 gradient of h summed per chunk


def test_triton_interpreter(monkeypatch):
    """The fused (Triton, interpreted) convolution on the local graphs of the chunks: one small
    interaction of a molecule, first derivatives (the whole model would take minutes interpreted)."""
    monkeypatch.setenv("EQUIKERNELS_BACKEND", "triton")
    import ase.build

    from equikernels.ops.conv import ConvGraph, tensor_product_conv

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the interpreter (conftest)
    block = _model(dtype=torch.float32, max_ell=1, hidden_irreps="2x0e+2x1o", device=dev).interactions[0]
    data = atoms_list_to_data([ase.build.molecule("CH3CH2OH")], R_MAX, ZS, dtype=torch.float32, device=dev)
    src, dst = data["edge_index"]
    n, e, p = data["positions"].shape[0], src.shape[0], block.problem
    graph = ConvGraph.build(src, dst, n)
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(n, p.dim_in1, generator=g), torch.randn(e, p.dim_in2, generator=g),
              torch.randn(e, block.radial_mlp.hs[0], generator=g), torch.rand(e, 1, generator=g)]
    inputs = [t.to(dev).requires_grad_() for t in inputs]
    wrt = inputs + list(block.radial_mlp.parameters())

    def run(chunk):
        h, ea, ef, cut = inputs
        if chunk:
            out = chunked.chunked_edge_conv(p, block.radial_mlp, h, ea, ef, cut, graph, chunk, block.layout)
        else:
            out = tensor_product_conv(p, h, ea, block.radial_mlp(ef) * cut, src, dst, n, graph=graph,
                                      layout=block.layout)
        return [out] + list(torch.autograd.grad((out * out).sum(), wrt))

    assert len(chunk_plan(graph.ptr_dst.tolist(), 20)) >= 3
    for a, b in zip(run(20), run(0)):
        assert _rel(a, b) < 1e-6


def test_saves_less(count_chunked):
    """Bytes saved for the backward during the forward: the chunks keep only their inputs."""
    model = _model(radial_MLP=[32, 32])

    def saved_bytes():
        seen = {}

        def pack(t):
            seen[(t.untyped_storage().data_ptr(), t.dtype)] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(_data(), compute_force=False)["energy"].sum()
        return sum(seen.values())

    full = saved_bytes()
    set_edge_chunk(model, CHUNK)
    assert saved_bytes() < 0.75 * full
    assert count_chunked["convs"] == 2


def test_auto_rule(count_chunked, monkeypatch):
    model = _model()
    model(_data())
    assert count_chunked["convs"] == 0  # the default ("auto") leaves small systems unchunked
    gib = 1 << 30
    monkeypatch.setattr(chunked, "available_bytes", lambda device, needed=None: 70 * gib)
    # MACE-MP-0-medium shape (weight_numel 512 and 1280), 795k edges: unchunked in fp32 and fp64
    # when the memory is there, whatever the dtype
    for nw in (512, 1280):
        for itemsize in (4, 8):
            assert resolve_edge_chunk(None, 795_010, nw, itemsize, "cuda") == 0
    # ~8.6M edges in fp32 do not fit: chunks take CHUNK_FRACTION of the available memory
    step = 1280 * 4 * STEP_BYTES_PER_WEIGHT_BYTE
    assert resolve_edge_chunk("auto", 8_600_000, 1280, 4, "cuda") == int(CHUNK_FRACTION * 70 * gib) // step
    # the boundary is the margin of the available memory, the same for every dtype
    fits = int(MEMORY_MARGIN * 70 * gib) // step
    assert resolve_edge_chunk(None, fits, 1280, 4, "cuda") == 0
    assert resolve_edge_chunk(None, fits + 1, 1280, 4, "cuda") > 0
    assert resolve_edge_chunk(None, fits // 2, 1280, 8, "cuda") == 0
    assert resolve_edge_chunk(None, fits // 2 + 1, 1280, 8, "cuda") > 0
    # less memory left: the same layer is chunked
    monkeypatch.setattr(chunked, "available_bytes", lambda device, needed=None: 2 * gib)
    assert resolve_edge_chunk(None, 795_010, 1280, 4, "cuda") > 0
    # an explicit setting wins over the memory rule
    assert resolve_edge_chunk(0, 10 ** 9, 1280, 4) == 0
    assert resolve_edge_chunk(100, 100, 1280, 4) == 0  # one chunk: unchunked
    assert resolve_edge_chunk(100, 101, 1280, 4) == 100


def test_available_bytes_on_host():
    assert chunked.available_bytes("cpu") > 0


def test_available_bytes_asks_the_allocator_only_when_needed(monkeypatch):
    gib = 1 << 30
    monkeypatch.setattr(chunked, "_FREE_SEEN", {})
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * gib, 80 * gib))

    def stats(device=None):
        calls.append(device)
        return {"reserved_bytes.all.current": 5 * gib, "allocated_bytes.all.current": 1 * gib}
    calls = []
    monkeypatch.setattr(torch.cuda, "memory_stats", stats)
    assert chunked.available_bytes("cuda", needed=6 * gib) == 8 * gib  # the driver's free memory covers it
    assert calls == []
    assert chunked.available_bytes("cuda", needed=10 * gib) == 12 * gib  # plus the allocator's unused blocks
    assert chunked.available_bytes("cuda") == 12 * gib
    assert len(calls) == 2


def test_a_recent_free_memory_reading_is_reused_only_with_room(monkeypatch):
    gib = 1 << 30
    free, queries, now = [40 * gib], [], [100.0]
    monkeypatch.setattr(chunked, "_FREE_SEEN", {})
    monkeypatch.setattr(chunked.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: queries.append(1) or (free[0], 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {})
    assert chunked.available_bytes("cuda", needed=10 * gib) == 40 * gib and len(queries) == 1
    free[0] = 5 * gib  # another process took memory: a reading within the time and the room still stands
    assert chunked.available_bytes("cuda", needed=10 * gib) == 40 * gib and len(queries) == 1
    assert chunked.available_bytes("cuda", needed=25 * gib) == 5 * gib and len(queries) == 2  # no room: asked
    free[0] = 40 * gib
    assert chunked.available_bytes("cuda", needed=1 * gib) == 5 * gib and len(queries) == 2
    now[0] += chunked.FREE_TTL_S  # too old: asked again
    assert chunked.available_bytes("cuda", needed=1 * gib) == 40 * gib and len(queries) == 3
    assert chunked.available_bytes("cuda") == 40 * gib and len(queries) == 4  # no need given: always asked


def test_never_while_compiling(monkeypatch):
    """torch.compile / CUDA-graph capture: always the unchunked path (chunking syncs with the host)."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert resolve_edge_chunk(7, 10 ** 6, 1280, 4) == 0
    assert resolve_edge_chunk("auto", 10 ** 9, 1280, 4) == 0


def test_environment_setting(monkeypatch, count_chunked):
    model = _model()
    monkeypatch.setenv(EDGE_CHUNK_ENV, "0")
    model(_data())
    assert count_chunked["convs"] == 0
    monkeypatch.setenv(EDGE_CHUNK_ENV, str(CHUNK))
    model(_data())
    assert count_chunked["convs"] == 2
    set_edge_chunk(model, 0)  # the model's setting wins over the environment
    model(_data())
    assert count_chunked["convs"] == 2
    set_edge_chunk(model, None)
    monkeypatch.setenv(EDGE_CHUNK_ENV, "auto")
    model(_data())
    assert count_chunked["convs"] == 2


@pytest.mark.parametrize("bad", ["seven", "-1", "1.5", "1e6", "auto,7"])
def test_bad_setting(monkeypatch, bad):
    model = _model()
    monkeypatch.setenv(EDGE_CHUNK_ENV, bad)
    with pytest.raises(ValueError, match=f"{EDGE_CHUNK_ENV}: expected 'auto' or a non-negative integer"):
        model(_data())
    monkeypatch.delenv(EDGE_CHUNK_ENV)
    for value in (bad, -3, 2.0, True):
        with pytest.raises(ValueError, match="edge_chunk: expected 'auto' or a non-negative integer"):
            set_edge_chunk(model, value)
