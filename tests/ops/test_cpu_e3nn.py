"""The e3nn-backed CPU tensor product (``ops.cpu_e3nn``) against the path-table reference in
float64 (forward, gradients, double backward; both layouts, shared and per-row weights), and the
static rule choosing it over the dense contractions of ``ops.cpu_tp``."""
import pytest
import torch

from equikernels.catalog import problem as catalog_problem
from equikernels.ops import cpu_e3nn, cpu_grouped, cpu_tp, tensor_product
from equikernels.problem import TPProblem
from problems import BASE_MODES, ek_forward_backward, problem_of, random_inputs, random_problem, rel_err


@pytest.fixture
def e3nn_taken(monkeypatch):
    """Forces the e3nn path wherever e3nn can express the problem; counts its calls."""
    calls = []
    real = cpu_e3nn.forward
    monkeypatch.setattr(cpu_e3nn, "use_e3nn", cpu_e3nn.expressible)
    monkeypatch.setattr(cpu_grouped, "applicable", lambda *a: False)
    monkeypatch.setattr(cpu_e3nn, "forward", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
@pytest.mark.parametrize("seed", range(6))
def test_matches_reference(seed, layout, e3nn_taken):
    mode = BASE_MODES[seed % len(BASE_MODES)]
    kw = random_problem(300 + seed, modes=BASE_MODES, force_mode=mode, shared=bool(seed % 2))
    p = problem_of(kw)
    x, y, w = random_inputs(p, (5,), seed=seed)
    g = torch.randn(5, p.dim_out, dtype=torch.float64)
    got = ek_forward_backward(p, x, y, w, g, layout=layout, backend="cpu")
    assert e3nn_taken
    ref = ek_forward_backward(p, x, y, w, g, layout=layout, backend="reference")
    for a, b in zip(got, ref):
        assert rel_err(a, b) < 1e-12, (mode, kw)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("mode", ["uvw", "uvu", "uuw", "uvuv"])
def test_double_backward_matches_reference(mode, shared, e3nn_taken):
    out = {"uvw": "3x0o+2x1e", "uvu": "2x0o+1x1e", "uuw": "3x0o+2x1e", "uvuv": "4x0o+2x1e"}[mode]
    second = [] if mode == "uuw" else [(1, 0, 1, mode, True)]  # uuw needs equal multiplicities
    p = TPProblem.create("2x1o+1x0e", "2x1e", out, [(0, 0, 0, mode, True)] + second, shared_weights=shared)
    x, y, w = random_inputs(p, (3,), seed=2)
    res = {}
    for be in ("cpu", "reference"):
        ts = [t.clone().requires_grad_() for t in (x, y, w)]
        out = tensor_product(p, *ts, layout="ir_mul", backend=be)
        gr = torch.autograd.grad((out * torch.sin(out)).sum(), ts, create_graph=True)
        res[be] = [out, *gr, *torch.autograd.grad(sum((t ** 2).sum() for t in gr), ts)]
    assert e3nn_taken
    for a, b in zip(res["cpu"], res["reference"]):
        assert rel_err(a, b) < 1e-12


def test_gradgradcheck(e3nn_taken):
    p = TPProblem.create("2x1o", "2x1e", "2x0o+2x1o", [(0, 0, 0, "uvu", True), (0, 0, 1, "uvw", True)],
                         shared_weights=False)
    x, y, w = (t.requires_grad_() for t in random_inputs(p, (2,), seed=1))
    f = lambda a, b, c: tensor_product(p, a, b, c, layout="ir_mul", backend="cpu")  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, y, w))
    assert torch.autograd.gradgradcheck(f, (x, y, w))
    assert e3nn_taken


def test_auto_on_cpu_runs_grouped_where_it_applies_and_e3nn_otherwise(monkeypatch):
    """Products with a one-channel second input take the grouped path, a shared-weight fully connected
    one with a two-channel second input e3nn's module."""
    calls = []
    for mod in (cpu_grouped, cpu_e3nn):
        real = mod.forward
        monkeypatch.setattr(mod, "forward", lambda *a, m=mod, f=real: calls.append(m) or f(*a))
    monkeypatch.setattr(cpu_tp, "forward", lambda *a: pytest.fail("dense path taken"))
    wide = TPProblem.create("2x0e+2x1o", "2x0e+2x1o", "3x0e+2x1o",
                            [(0, 0, 0, "uvw", True), (1, 1, 0, "uvw", True), (0, 1, 1, "uvw", True)])
    for p, path in ((catalog_problem("nequip-water"), cpu_grouped), (catalog_problem("tetris-poly-1"), cpu_grouped),
                    (wide, cpu_e3nn)):
        x, y, w = random_inputs(p, (3,), dtype=torch.float32)
        calls.clear()
        out = tensor_product(p, x.float(), y.float(), w.float())
        assert calls == [path] and out.dtype == torch.float32
        assert rel_err(out, tensor_product(p, x, y, w, backend="reference")) < 1e-5


def test_rule():
    assert cpu_e3nn.use_e3nn(catalog_problem("mace-medium"))
    assert cpu_e3nn.use_e3nn(catalog_problem("tetris-poly-1"))  # uvw, shared weights
    assert not cpu_e3nn.use_e3nn(catalog_problem("diffdock-L2"))  # uvw, per-row weights: dense
    tri = TPProblem.create("3x1o", "3x1e", "3x0o", [(0, 0, 0, "uvu<v", True)], shared_weights=False)
    assert not cpu_e3nn.expressible(tri)
    empty = TPProblem.create("0x1o", "3x1e", "3x0o", [(0, 0, 0, "uvw", True)])
    assert not cpu_e3nn.expressible(empty)


def test_mixed_precision_stays_dense(monkeypatch):
    """e3nn has no math_dtype / mixed operands: such calls keep the dense path."""
    p = catalog_problem("nequip-water")
    monkeypatch.setattr(cpu_e3nn, "forward", lambda *a: pytest.fail("e3nn path taken"))
    x, y, w = random_inputs(p, (3,))
    ref = tensor_product(p, x, y, w, backend="reference")
    got = tensor_product(p, x.float(), y.float(), w.float(), backend="cpu", math_dtype=torch.float64)
    assert rel_err(got, ref) < 1e-6
    got = tensor_product(p, x.float(), y.half(), w.float(), backend="cpu")
    assert rel_err(got, ref) < 2e-3


def test_builds_e3nn_class_even_when_swapped(monkeypatch):
    """Code that swaps e3nn.o3.TensorProduct for ours (as e3nn-compatibility users do) must not make
    the CPU path build our class instead of e3nn's."""
    import equikernels
    from equikernels._compat import o3
    from equikernels.ops import cpu_e3nn
    monkeypatch.setattr(o3, "TensorProduct", equikernels.TensorProduct)
    cpu_e3nn.e3nn_plan.cache_clear()
    p = catalog_problem("nequip-water")
    plan = cpu_e3nn.e3nn_plan(p, torch.float64)
    cpu_e3nn.e3nn_plan.cache_clear()
    assert type(plan.module).__module__.startswith("e3nn.")
