"""Double backward of products mixing weighted and unweighted instructions.

An unweighted path does not depend on the weights, so the weight cotangent's term of the double
backward (T(x, y, c)) must leave it out; single-mode problems cannot show this (a product without
weighted paths has no weight operand). The oracle is autograd through the forward table evaluated
by plain einsums, which is exact to any order.
"""
import random
import warnings

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from equikernels import reference
from equikernels.ir import double_backward_tables, tp_table
from conv_checks import awkward_graph
from equikernels.ops import tensor_product, tensor_product_conv
from problems import problem_of, random_inputs, random_problem, rel_err

pytestmark = pytest.mark.usefixtures("single_thread")

LAYOUT = "ir_mul"
_PW = dict(internal_weights=False, shared_weights=False)
PROBLEMS = {
    # unweighted uuw and weighted uvw into different outputs
    "uuw+uvw": dict(irreps_in1="2x0e+2x1o", irreps_in2="2x1o", irreps_out="1x1o+2x1e",
                    instructions=[(0, 0, 0, "uuw", False), (1, 0, 1, "uvw", True)], **_PW),
    # ... and into the same output
    "uuw+uvw-shared-out": dict(irreps_in1="2x0e+2x1o", irreps_in2="2x1o", irreps_out="1x1o+2x1e",
                               instructions=[(0, 0, 0, "uuw", False), (0, 0, 0, "uvw", True),
                                             (1, 0, 1, "uvw", True)], **_PW),
    # unweighted uvu with a shared weight
    "uvu+uvw-shared-w": dict(irreps_in1="2x0e+2x1o", irreps_in2="1x1o", irreps_out="2x1o+2x1e",
                             instructions=[(0, 0, 0, "uvu", False), (1, 0, 1, "uvw", True)],
                             internal_weights=False, shared_weights=True),
    # unweighted uuw with the triangular u<vw
    "uuw+u<vw": dict(irreps_in1="3x1o", irreps_in2="3x1o", irreps_out="1x0e+2x1e",
                     instructions=[(0, 0, 0, "uuw", False), (0, 0, 1, "u<vw", True)], **_PW),
}
# interpreted Triton kernels are slow: two problems (the generator has no gradient kernel for the
# triangular mix, it falls back to the reference)
CASES = [(n, be) for n in PROBLEMS for be in ("reference", "cpu", "cpu-dense")] + [
    ("uuw+uvw-shared-out", "triton"), ("uvu+uvw-shared-w", "triton")]


def _dense(backend, monkeypatch) -> str:
    """The backend to pass: "cpu-dense" is the CPU backend kept to its own contractions (not e3nn)."""
    if backend == "cpu-dense":
        from equikernels.ops import cpu_e3nn

        monkeypatch.setattr(cpu_e3nn, "use_e3nn", lambda problem: False)
        return "cpu"
    return backend


def _inputs(p, rows=2, seed=0):
    return tuple(t.requires_grad_() for t in random_inputs(p, (rows,), seed=seed))


def _f(p, be):
    return lambda a, b, c: tensor_product(p, a, b, c, layout=LAYOUT, backend=be)


@pytest.mark.parametrize("name,backend", CASES)
def test_gradcheck_and_gradgradcheck(name, backend, monkeypatch):
    backend = _dense(backend, monkeypatch)
    p = problem_of(PROBLEMS[name])
    ts = _inputs(p)
    fast = backend == "triton"  # interpreted kernels: random projections, not full Jacobians
    with warnings.catch_warnings():
        # the triton cases must run generated kernels, not the reference fallback
        warnings.filterwarnings("error", message="equikernels: no generated")
        assert gradcheck(_f(p, backend), ts, fast_mode=fast)
        assert gradgradcheck(_f(p, backend), ts, fast_mode=fast)


def _oracle(p, x, y, w, g, cot, have):
    """(dx, dy, dw, dg) of S = sum over present cotangents of <grad, cotangent>, by autograd."""
    ts = [t.detach().clone().requires_grad_() for t in (x, y, w, g)]
    out = reference.evaluate(tp_table(p), dict(zip("xyw", ts[:3])), LAYOUT)
    grads = torch.autograd.grad(out, ts[:3], ts[3], create_graph=True)
    s = sum((gr * c).sum() for k, gr, c in zip("abc", grads, cot) if k in have)
    return [torch.zeros_like(t) if r is None else r
            for t, r in zip(ts, torch.autograd.grad(s, ts, allow_unused=True))]


def _double_backward(p, be, x, y, w, g, cot, have, create_graph):
    """The same four results through tensor_product's autograd: fused (create_graph=False) or
    composed from differentiable forward / backward products (create_graph=True)."""
    ts = [t.detach().clone().requires_grad_() for t in (x, y, w, g)]
    out = _f(p, be)(*ts[:3])
    grads = torch.autograd.grad(out, ts[:3], ts[3], create_graph=True)
    s = sum((gr * c).sum() for k, gr, c in zip("abc", grads, cot) if k in have)
    res = torch.autograd.grad(s, ts, allow_unused=True, create_graph=create_graph)
    return [torch.zeros_like(t) if r is None else r for t, r in zip(ts, res)]


def _check_against_oracle(p, backends, haves=("c", "ac", "bc", "abc", "ab"), modes=(False, True), seed=0):
    x, y, w = (t.detach() for t in _inputs(p, rows=3, seed=seed))
    gen = torch.Generator().manual_seed(seed + 1)
    g = torch.randn(3, p.dim_out, generator=gen, dtype=torch.float64)
    cot = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (x, y, w)]
    for have in haves:
        want = _oracle(p, x, y, w, g, cot, have)
        for be in backends:
            for composed in modes:
                got = _double_backward(p, be, x, y, w, g, cot, have, composed)
                for n, a, b in zip("xywg", got, want):
                    assert rel_err(a, b) < 1e-10, (p.describe(), be, have, composed, n, rel_err(a, b))


@pytest.mark.parametrize("name,backend", CASES)
def test_double_backward_matches_autograd(name, backend, monkeypatch):
    """Fused and composed double backward, every subset of cotangents holding c (and one without)."""
    backend = _dense(backend, monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # triangular gradients fall back to the reference under triton
        haves = ("c", "abc") if backend == "triton" else ("c", "ac", "bc", "abc", "ab")
        _check_against_oracle(problem_of(PROBLEMS[name]), (backend,), haves=haves)


def test_weight_cotangent_term_has_only_weighted_paths():
    """The tables themselves: T(x, y, c) keeps exactly the weighted paths, the other terms all."""
    table = tp_table(problem_of(PROBLEMS["uuw+uvw-shared-out"]))
    weighted = sum(q.weight is not None for q in table.paths)
    assert 0 < weighted < len(table.paths)
    assert len(double_backward_tables(table, "c", "g")["g"].paths) == weighted
    assert len(double_backward_tables(table, "abc", "g")["g"].paths) == 2 * len(table.paths) + weighted
    assert all(q.weight is not None and q.weight.operand == "c"
               for q in double_backward_tables(table, "c", "xy")["x"].paths)


MODES = ("uvw", "uvu", "uvv", "uuw", "uuu", "uvuv", "uvu<v", "u<vw")


def _mixed_problems(count, seed=1234):
    """Small random problems with both weighted and unweighted instructions (fixed seed)."""
    rng, found = random.Random(seed), []
    while len(found) < count:
        kw = random_problem(rng.randrange(10**6), modes=MODES, max_instructions=3)
        p = problem_of(kw)
        flags = {ins.has_weight for ins in p.instructions}
        if flags == {True, False} and p.dim_in1 * p.dim_in2 * p.dim_out <= 40_000:
            found.append(p)
    return found


def test_random_mixed_problems(monkeypatch):
    """Reference and CPU backends on a fixed sweep of random mixed problems, fused and composed."""
    problems = _mixed_problems(6)
    for k, p in enumerate(problems):
        _check_against_oracle(p, ("reference", "cpu"), haves=("c", "abc"), seed=k)
    _dense("cpu-dense", monkeypatch)
    for k, p in enumerate(problems):
        _check_against_oracle(p, ("cpu",), haves=("c", "abc"), seed=k)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_convolution_double_backward(backend):
    """The fused convolution composes the same identity (fused and composed paths)."""
    p = problem_of(PROBLEMS["uuw+uvw-shared-out"])
    src, dst = awkward_graph(4, 5, 1)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, p.dim_in1, generator=gen, dtype=torch.float64)
    y = torch.randn(5, p.dim_in2, generator=gen, dtype=torch.float64)
    w = torch.randn(5, p.weight_numel, generator=gen, dtype=torch.float64)
    g = torch.randn(4, p.dim_out, generator=gen, dtype=torch.float64)
    cot = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (x, y, w)]
    table = tp_table(p)

    def oracle(a, b, c):
        edges = reference.evaluate(table, {"x": a.index_select(0, src), "y": b, "w": c}, LAYOUT)
        return edges.new_zeros(4, p.dim_out).index_add(0, dst, edges)

    def conv(a, b, c):
        return tensor_product_conv(p, a, b, c, src, dst, 4, layout=LAYOUT, backend=backend)

    for composed in (False, True):
        res = []
        for f, cg in ((oracle, True), (conv, composed)):
            ts = [t.clone().requires_grad_() for t in (x, y, w, g)]
            grads = torch.autograd.grad(f(*ts[:3]), ts[:3], ts[3], create_graph=True)
            s = sum((gr * c).sum() for gr, c in zip(grads, cot))
            res.append(torch.autograd.grad(s, ts, allow_unused=True, create_graph=cg))
        for n, a, b in zip("xywg", *reversed(res)):
            assert rel_err(a, b) < 1e-10, (backend, composed, n, rel_err(a, b))
