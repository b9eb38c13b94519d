"""The grouped CPU product (``ops.cpu_grouped``) against the path-table reference in float64: forward,
gradients and second-order gradients, both layouts, shared and per-row weights, output segments
written by several paths, non-contiguous weight blocks, fully connected paths with shared weights
(alone and beside channel-wise ones); which problems it takes."""
import pytest
import torch

from conv_checks import channelwise
from equikernels.catalog import problem as catalog_problem
from equikernels.ops import cpu_grouped, tensor_product
from equikernels.problem import TPProblem
from problems import ek_forward_backward, random_inputs, rel_err, second_order


DEFAULT_MIN_MUL = cpu_grouped.ASSEMBLE_MIN_MUL


@pytest.fixture(autouse=True, params=["assembled", "concatenated"])
def ir_mul_output(request, monkeypatch):
    """Outputs both ways in either layout, whatever the channel counts (the test problems have few)."""
    monkeypatch.setattr(cpu_grouped, "ASSEMBLE_MIN_MUL", 1 if request.param == "assembled" else 10 ** 9)
    return request.param


@pytest.fixture
def grouped_taken(monkeypatch):
    """Counts the calls of the grouped path."""
    calls = []
    real = cpu_grouped.forward
    monkeypatch.setattr(cpu_grouped, "forward", lambda *a: calls.append(1) or real(*a))
    return calls


# in1, in2, out filter: shared output segments (nequip-like), scalars only, vectors, l up to 3
PROBLEMS = [("3x0e+2x1o", "0e+1o+2e", "0e+1o+1e+2e"), ("4x0e", "0e+1o", "0e+1o"),
            ("2x0o+2x0e+2x1o+2x1e", "0e+1o", "0e+0o+1o+1e"), ("3x1o+3x2e", "0e+1o+2e+3o", "0e+1o+2e+3o")]


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("irreps", PROBLEMS)
def test_matches_reference(irreps, shared, layout, grouped_taken):
    p = TPProblem.create(**channelwise(*irreps, shared=shared))
    x, y, w = random_inputs(p, (6,), seed=len(irreps[0]))
    g = torch.randn(6, p.dim_out, dtype=torch.float64)
    got = ek_forward_backward(p, x, y, w, g, layout=layout, backend="cpu")
    assert grouped_taken
    ref = ek_forward_backward(p, x, y, w, g, layout=layout, backend="reference")
    for a, b in zip(got, ref):
        assert rel_err(a, b) < 1e-12, irreps


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
@pytest.mark.parametrize("shared_out", [False, True])
def test_weight_blocks_out_of_segment_order(shared_out, layout, grouped_taken):
    """Instructions of one first-input segment that are not adjacent (their weight columns are
    gathered), and output segments that two or three paths write (summed)."""
    out = "2x0e+2x1o+2x2e" if shared_out else "2x0e+2x1o+2x1o+2x0e"
    ins = ([(0, 0, 0, "uvu", True), (1, 0, 1, "uvu", True), (0, 1, 1, "uvu", True), (1, 1, 0, "uvu", True),
            (1, 1, 2, "uvu", True), (0, 2, 2, "uvu", True), (1, 2, 1, "uvu", True)] if shared_out else
           [(0, 0, 0, "uvu", True), (1, 0, 1, "uvu", True), (0, 1, 2, "uvu", True), (1, 1, 3, "uvu", True)])
    p = TPProblem.create("2x0e+2x1o", "0e+1o+2e" if shared_out else "0e+1o", out, ins, shared_weights=False)
    assert any(g.w_first is None for g in cpu_grouped.grouped_plan(p, "mul_ir").groups)
    x, y, w = random_inputs(p, (4,), seed=3)
    g = torch.randn(4, p.dim_out, dtype=torch.float64)
    for a, b in zip(ek_forward_backward(p, x, y, w, g, layout=layout, backend="cpu"),
                    ek_forward_backward(p, x, y, w, g, layout=layout, backend="reference")):
        assert rel_err(a, b) < 1e-12
    assert grouped_taken
    got, ref = (second_order(lambda a, b, c: tensor_product(p, a, b, c, layout=layout, backend=be), x, y, w)
                for be in ("cpu", "reference"))
    for a, b in zip(got, ref):
        assert rel_err(a, b) < 1e-12


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_second_order_and_gradgradcheck(layout, grouped_taken):
    p = TPProblem.create(**channelwise("2x0e+2x1o", "0e+1o", "0e+1o+1e"))
    x, y, w = random_inputs(p, (3,), seed=5)
    got, ref = (second_order(lambda a, b, c: tensor_product(p, a, b, c, layout=layout, backend=be), x, y, w)
                for be in ("cpu", "reference"))
    for a, b in zip(got, ref):
        assert rel_err(a, b) < 1e-12
    ts = [t.clone().requires_grad_() for t in (x, y, w)]
    f = lambda a, b, c: tensor_product(p, a, b, c, layout=layout, backend="cpu")  # noqa: E731
    assert torch.autograd.gradcheck(f, ts) and torch.autograd.gradgradcheck(f, ts)
    assert grouped_taken


def test_which_problems_and_calls():
    for name in ("mace-large", "mace-mp-medium-L2", "nequip-lips", "nequip-water"):
        assert cpu_grouped.eligible(catalog_problem(name)), name
    assert cpu_grouped.eligible(catalog_problem("tetris-poly-1"))  # fully connected, shared weights
    assert not cpu_grouped.eligible(catalog_problem("diffdock-L2"))  # fully connected, per-row weights
    # two-channel second input, an unweighted path: not channel-wise products of this shape
    assert not cpu_grouped.eligible(TPProblem.create(**channelwise(i2="2x0e+2x1o")))
    assert not cpu_grouped.eligible(TPProblem.create("2x0e", "0e", "2x0e", [(0, 0, 0, "uvu", False)]))
    p = catalog_problem("nequip-water")
    x, y, w = random_inputs(p, (2,), seed=0)
    assert cpu_grouped.applicable(p, x, y, w, None, None)
    assert not cpu_grouped.applicable(p, x.float(), y, w, None, None)  # mixed dtypes
    assert not cpu_grouped.applicable(p, x, y, w, torch.float32, None)
    assert not cpu_grouped.applicable(p, x[:0], y[:0], w[:0], None, None)


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
@pytest.mark.parametrize("mixed", [False, True])
def test_fully_connected_shared_weights(mixed, layout, grouped_taken):
    """uvw paths with shared weights (tetris-like: one-channel inputs, wide outputs), with uvu paths
    beside them in one first-input segment, to second order."""
    ins = [(0, 0, 0, "uvw", True), (1, 1, 0, "uvw", True), (0, 1, 1, "uvw", True), (1, 0, 1, "uvw", True)]
    if mixed:
        ins += [(0, 1, 2, "uvu", True), (1, 1, 3, "uvu", True)]
    p = TPProblem.create("2x0e+2x1o", "0e+1o", "3x0e+4x1o" + ("+2x1o+2x0e" if mixed else ""), ins,
                         shared_weights=True)
    assert cpu_grouped.eligible(p) and not all(g.channelwise for g in cpu_grouped.grouped_plan(p, layout).groups)
    x, y, w = random_inputs(p, (4,), seed=7)
    got, ref = (second_order(lambda a, b, c: tensor_product(p, a, b, c, layout=layout, backend=be), x, y, w)
                for be in ("cpu", "reference"))
    for a, b in zip(got, ref):
        assert rel_err(a, b) < 1e-12
    assert grouped_taken


def test_assembled_from_the_default_channel_count(monkeypatch):
    monkeypatch.setattr(cpu_grouped, "ASSEMBLE_MIN_MUL", DEFAULT_MIN_MUL)
    taken = []
    real = cpu_grouped.GroupedPlan._assembled
    monkeypatch.setattr(cpu_grouped.GroupedPlan, "_assembled", lambda *a: taken.append(1) or real(*a))
    for name, layout, want in (("mace-medium", "ir_mul", True), ("nequip-water", "ir_mul", False),
                               ("mace-medium", "mul_ir", True), ("mace-large", "mul_ir", True),
                               ("nequip-lips", "mul_ir", False)):
        p = catalog_problem(name)
        x, y, w = random_inputs(p, (3,), seed=0)
        taken.clear()
        got = tensor_product(p, x, y, w, layout=layout, backend="cpu")
        ref = tensor_product(p, x, y, w, layout=layout, backend="reference")
        assert rel_err(got, ref) < 1e-12
        assert bool(taken) == want, (name, layout)


def test_torch_func_grad_through_the_ir_mul_product():
    """torch.func works on the grouped product as on plain autograd (the assembly is left out)."""
    p = catalog_problem("mace-medium")
    x, y, w = random_inputs(p, (3,), seed=1)
    g = torch.randn(3, p.dim_out, dtype=torch.float64)

    def f(a):
        return (tensor_product(p, a, y, w, layout="ir_mul", backend="cpu") * g).sum()
    xr = x.detach().clone().requires_grad_()
    (want,) = torch.autograd.grad(f(xr), xr)
    torch.testing.assert_close(torch.func.grad(f)(x), want, rtol=1e-12, atol=1e-12)
