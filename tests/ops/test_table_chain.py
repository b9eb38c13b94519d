"""The gradient-table chain (ops.table_chain) on a small symmetric contraction (degree 3 in x):
derivatives of every order through gradient tables, and a method implementation that cannot be
built or fails on its first launch falls back to the reference with one warning."""
import pytest
import torch

from equikernels.models.builder import coupled_u_matrices
from equikernels.models.symmetric_contraction import contraction_table
from equikernels.ops.table_chain import TableOp


@pytest.fixture(scope="module")
def table():
    us = coupled_u_matrices("1x0e+1x1o", "1x0e+1x1o", 3)
    return contraction_table(1, [0, 1], [0, 1], us)[0]


def _inputs(table, rows=2):
    gen = torch.Generator().manual_seed(0)
    return {n: torch.randn(rows, table.operand(n).dim, generator=gen, dtype=torch.float64, requires_grad=True)
            for n in ("x", "w")}


def test_third_order_through_gradient_tables(table):
    """<d/dx |d/dx |C|^2|^2, v> differentiated once more (gradient tables three levels deep) against
    a central difference of it."""
    op = TableOp(table, "ir_mul", backend="reference")
    t = _inputs(table)
    x, w = t["x"], t["w"].detach()
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def second(x):
        (gx,) = torch.autograd.grad(op({"x": x, "w": w}).pow(2).sum(), x, create_graph=True)
        (hx,) = torch.autograd.grad(gx.pow(2).sum(), x, create_graph=True)
        return (hx * v).sum()

    (third,) = torch.autograd.grad(second(x), x)
    eps = 1e-6
    fd = (second((x + eps * v).detach().requires_grad_()) - second((x - eps * v).detach().requires_grad_())) / (2 * eps)
    assert abs(float((third * v).sum() - fd)) < 1e-6 * max(1.0, abs(float(fd)))
    assert op.grad("x").grad("x").grad("x").level == 3


class _FailsOnLaunch:
    compiled = False

    def __init__(self, table, layout, math, name):
        self.calls = 0

    def __call__(self, named, rows, out_dtype):
        raise RuntimeError("compile error")


def _unbuildable(table, layout, math, name):
    raise ValueError("cannot express")


@pytest.mark.parametrize("build,match", [(_unbuildable, "no generated kernel"), (_FailsOnLaunch, "a level-0 kernel failed to compile")])
def test_method_that_fails_falls_back_to_the_reference(table, build, match):
    t = {k: v.detach() for k, v in _inputs(table).items()}
    want = TableOp(table, "ir_mul", backend="reference").evaluate(t)
    op = TableOp(table, "ir_mul", backend="triton", build=build, label="toy table")
    with pytest.warns(RuntimeWarning, match=f"toy table: {match}"):
        got = op.evaluate(t)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert op._kernels[torch.float64] is None  # decided once: later calls take the reference silently


def test_out_of_memory_is_not_swallowed(table):
    class _Oom(_FailsOnLaunch):
        def __call__(self, named, rows, out_dtype):
            raise RuntimeError("CUDA out of memory")

    op = TableOp(table, "ir_mul", backend="triton", build=_Oom)
    with pytest.raises(RuntimeError, match="out of memory"):
        op.evaluate({k: v.detach() for k, v in _inputs(table).items()})


def test_bad_dtypes_name_the_operation(table):
    t = {k: v.detach() for k, v in _inputs(table).items()}
    op = TableOp(table, "ir_mul", backend="reference", label="toy table")
    with pytest.raises(TypeError, match="toy table: float64 operands do not mix"):
        op.evaluate({"x": t["x"], "w": t["w"].half()})
    with pytest.raises(TypeError, match="toy table: operands must be"):
        op.evaluate({"x": t["x"].int(), "w": t["w"]})


def test_compiled_forces_and_their_training_gradient(table):
    """Traced (torch.compile, fullgraph, aot_autograd): the table runs as the custom op
    equikernels::table and its x-gradient (forces) as the gradient table's op inside the graph; the
    training gradient of |gx|^2 then differentiates those ops again. Both equal the eager chain's."""
    op = TableOp(table, "ir_mul", backend="reference")
    t = _inputs(table, rows=3)

    def energy_forces(x, w):
        energy = op({"x": x, "w": w}).pow(2).sum()
        (gx,) = torch.autograd.grad(energy, x, create_graph=True)
        return energy, gx

    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes)
        return torch._dynamo.backends.common.aot_autograd(fw_compiler=lambda g, _: g)(gm, example_inputs)

    torch._dynamo.reset()
    results = []
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled = torch.compile(energy_forces, fullgraph=True, backend=backend)
        for f in (compiled, energy_forces):
            x, w = (t[n].detach().clone().requires_grad_() for n in ("x", "w"))
            energy, gx = f(x, w)
            results.append([energy, gx, *torch.autograd.grad(gx.pow(2).sum(), [x, w])])
    assert any("equikernels.table" in s for s in seen), seen
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "torch.save"])
def test_module_holding_built_kernels_pickles_and_copies(how, tmp_path):
    import copy
    import pickle

    from equikernels.models.symmetric_contraction import SymmetricContraction

    torch.manual_seed(0)
    us = [[u.double() for u in per] for per in coupled_u_matrices("2x0e+2x1o", "2x0e+2x1o", 2)]
    sc = SymmetricContraction(2, [0, 1], [0, 1], [2, 2], 2, us, "ir_mul", backend="triton").double()
    x, el = torch.randn(3, 8, dtype=torch.float64), torch.tensor([0, 1, 0])
    out = sc(x, el)  # builds the generated kernels the op keeps
    if how == "torch.save":
        torch.save(sc, tmp_path / "sc.pt")
        other = torch.load(tmp_path / "sc.pt", weights_only=False)
    else:
        other = pickle.loads(pickle.dumps(sc)) if how == "pickle" else copy.deepcopy(sc)
    assert other.op.key != sc.op.key  # registered under its own name
    torch.testing.assert_close(other(x, el), out, rtol=0, atol=0)
