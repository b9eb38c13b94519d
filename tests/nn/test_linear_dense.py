"""``Linear`` through one matrix product with its weights spread into a dense [dim_in, dim_out] matrix
(``nn.linear.DENSE_*``; CUDA by default, forced onto the CPU here): e3nn's numbers in both layouts,
trainable and frozen, derivatives to second order, the cache of frozen weights, the size cap, and
what is left to the per-block path."""
import copy
import io

import pytest
import torch

from equikernels.nn import linear as L
from linear_checks import linear_pair, run_both

CASES = [("3x0e+2x1o+1x2e+2x0e", "4x0e+3x1o+2x2e"), ("8x0e+4x1o+3x2e+2x1o", "5x0e+6x1o+2x2e"),
         ("2x0e+2x1e+3x3o", "3x0e+1x1e+2x3o")]


@pytest.fixture
def dense(monkeypatch):
    """The dense path on the CPU, and the number of dense weights built."""
    monkeypatch.setattr(L, "DENSE_DEVICES", ("cpu",))
    built = []
    real = L.Linear._dense_weight
    monkeypatch.setattr(L.Linear, "_dense_weight", lambda self, *a: built.append(1) or real(self, *a))
    return built


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
@pytest.mark.parametrize("irreps", CASES)
def test_matches_e3nn(dense, irreps, layout, frozen):
    ref, ours = linear_pair(*irreps, layout)
    if frozen:
        ours.requires_grad_(False)
    x = torch.randn(6, ref.irreps_in.dim, dtype=torch.float64, requires_grad=True)
    out, out_ref = run_both(ref, ours, layout, x)
    assert dense
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    cot = torch.randn_like(out_ref)
    ins = [x] if frozen else [x, ours.weight]
    got = torch.autograd.grad(out, ins, cot)
    want = torch.autograd.grad(out_ref, [x] if frozen else [x, ref.weight], cot)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_second_order(dense, layout):
    _, ours = linear_pair("3x0e+2x1o+1x2e", "2x0e+2x1o+1x2e", layout)
    x = torch.randn(3, ours.irreps_in.dim, dtype=torch.float64, requires_grad=True)
    w = ours.weight.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x_, w_: _with_weight(ours, x_, w_), (x, w))
    assert torch.autograd.gradgradcheck(lambda x_, w_: _with_weight(ours, x_, w_), (x, w))
    assert dense


def _with_weight(lin, x, w):
    """The module's forward with ``w`` as its weight (a function of w for gradcheck)."""
    saved = lin.weight
    del lin.weight
    lin.weight = w
    try:
        return lin(x)
    finally:
        lin.weight = saved


def test_frozen_weight_cached_and_followed(dense):
    ref, ours = linear_pair("3x0e+2x1o", "2x0e+3x1o", "mul_ir")
    ours.requires_grad_(False)
    x = torch.randn(4, ref.irreps_in.dim, dtype=torch.float64)
    first = ours(x)
    ours(x)
    cached = ours.__dict__["_dense_w"][1]
    assert torch.equal(ours(x), first) and ours.__dict__["_dense_w"][1] is cached  # reused, not rebuilt
    with torch.no_grad():
        ours.weight.mul_(2.0)  # in place: the cached matrix must not be reused
        ref.weight.mul_(2.0)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-12, atol=1e-12)


def test_trainable_weights_under_no_grad_are_not_kept(dense):
    """Evaluation under no_grad between optimiser steps: every call sees the current weights."""
    ref, ours = linear_pair("3x0e+2x1o", "2x0e+3x1o", "ir_mul")
    x = torch.randn(4, ref.irreps_in.dim, dtype=torch.float64)
    for step in range(3):
        with torch.no_grad():
            got, want = run_both(ref, ours, "ir_mul", x)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
            ours.weight.add_(0.5)
            ref.weight.add_(0.5)
    assert "_dense_w" not in ours.__dict__


def test_size_cap_and_repeated_instructions(dense, monkeypatch):
    _, ours = linear_pair("3x0e+2x1o", "2x0e+3x1o", "mul_ir")
    monkeypatch.setattr(L, "DENSE_MAX_MACS", 4 * ours.irreps_in.dim * ours.irreps_out.dim)
    ours(torch.randn(4, ours.irreps_in.dim, dtype=torch.float64))
    assert len(dense) == 1
    ours(torch.randn(5, ours.irreps_in.dim, dtype=torch.float64))  # above the cap: per block
    assert len(dense) == 1
    # the same (input, output) pair twice: two weights per position, left to the per-block path
    ref, twice = linear_pair("3x0e+2x1o", "2x0e+3x1o", "mul_ir", instructions=[(0, 0), (0, 0), (1, 1)])
    x = torch.randn(4, ref.irreps_in.dim, dtype=torch.float64)
    torch.testing.assert_close(twice(x), ref(x), rtol=1e-12, atol=1e-12)
    assert len(dense) == 1 and twice.__dict__["_dense_idx"] is None


def test_caches_are_not_saved(dense):
    _, ours = linear_pair("3x0e+2x1o+1x2e", "2x0e+3x1o", "ir_mul")
    x = torch.randn(4, ours.irreps_in.dim, dtype=torch.float64)
    ours(x)  # trained: the gather places
    ours.requires_grad_(False)
    want = ours(x)  # frozen: the kept matrix
    assert all(k in ours.__dict__ for k in L._DENSE_CACHES)
    buf = io.BytesIO()
    torch.save(ours, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert not any(k in loaded.__dict__ for k in L._DENSE_CACHES)
    torch.testing.assert_close(loaded(x), want, rtol=0, atol=0)
    torch.testing.assert_close(copy.deepcopy(ours)(x), want, rtol=0, atol=0)
