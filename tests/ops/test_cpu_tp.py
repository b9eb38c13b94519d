"""The dense CPU tensor product (per-instruction contractions, ``ops.cpu_tp``) against the
path-table reference and e3nn in float64: every connection mode, both layouts, shared and per-row
weights, forward, backward and double backward, gradcheck / gradgradcheck on tiny problems."""
import pytest
import torch

from equikernels.ops import resolve_backend, tensor_product
from equikernels.ops.tp import plan_of, spec_of, tp_bwd
from problems import (e3nn_forward_backward, e3nn_tp, ek_forward_backward, ir_mul_to_mul_ir, mul_ir_to_ir_mul,
                      problem_of, random_inputs, random_problem, rel_err, supported_modes)

MODES = ("uvw", "uvu", "uvv", "uuw", "uuu", "uvuv", "uvu<v", "u<vw")


@pytest.fixture(autouse=True)
def dense_only(monkeypatch):
    """These tests are about the dense contractions: the e3nn-backed CPU path is kept out."""
    from equikernels.ops import cpu_e3nn

    monkeypatch.setattr(cpu_e3nn, "use_e3nn", lambda problem: False)


@pytest.fixture(autouse=True)
def poisoned_results(monkeypatch):
    """Every result tensor starts as NaN: a part no contraction writes must be zeroed explicitly."""
    from equikernels.ops import cpu_tp

    monkeypatch.setattr(cpu_tp, "_new", lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype,
                                                                                 device=device))


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_parts_no_path_reaches_are_zero(layout, shared):
    """An input block and an output block no instruction touches, and paths adding into one output."""
    from equikernels.problem import TPProblem

    p = TPProblem.create("2x1o+3x0e+2x0o", "1x1e+1x0e", "2x2e+2x1o+3x0e",
                         [(0, 0, 1, "uvu", True), (0, 1, 1, "uvw", True)], shared_weights=shared)
    x, y, w = random_inputs(p, (3,), seed=2)
    g = torch.randn(3, p.dim_out, dtype=torch.float64)
    got = ek_forward_backward(p, x, y, w, g, layout=layout, backend="cpu")
    ref = ek_forward_backward(p, x, y, w, g, layout=layout, backend="reference")
    for a, b in zip(got, ref):
        assert not a.isnan().any()
        assert rel_err(a, b) < 1e-12


def test_cpu_is_the_default_on_cpu():
    assert resolve_backend(None, torch.device("cpu")) == "cpu"


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
@pytest.mark.parametrize("seed", range(8))
def test_matches_reference(seed, layout):
    mode = MODES[seed % len(MODES)]
    kw = random_problem(seed, modes=MODES, force_mode=mode, shared=bool(seed % 2))
    p = problem_of(kw)
    x, y, w = random_inputs(p, (5,), seed=seed)
    g = torch.randn(5, p.dim_out, dtype=torch.float64)
    got = ek_forward_backward(p, x, y, w, g, layout=layout, backend="cpu")
    ref = ek_forward_backward(p, x, y, w, g, layout=layout, backend="reference")
    for a, b in zip(got, ref):
        assert rel_err(a, b) < 1e-12, (mode, kw)


@pytest.mark.parametrize("seed", range(3))
def test_matches_e3nn(seed):
    mode = supported_modes()[seed % len(supported_modes())]
    kw = random_problem(100 + seed, force_mode=mode)
    p = problem_of(kw)
    x, y, w = random_inputs(p, (4,), seed=seed)
    g = torch.randn(4, p.dim_out, dtype=torch.float64)
    ref = e3nn_forward_backward(e3nn_tp(kw), x, y, w, g)
    for layout in ("mul_ir", "ir_mul"):
        conv = (lambda t, irreps: t) if layout == "mul_ir" else mul_ir_to_ir_mul
        back = (lambda t, irreps: t) if layout == "mul_ir" else ir_mul_to_mul_ir
        i1, i2, io = kw["irreps_in1"], kw["irreps_in2"], kw["irreps_out"]
        got = ek_forward_backward(p, conv(x, i1), conv(y, i2), w, conv(g, io), layout=layout, backend="cpu")
        assert rel_err(back(got[0], io), ref[0]) < 1e-12
        assert rel_err(back(got[1], i1), ref[1]) < 1e-12
        assert rel_err(back(got[2], i2), ref[2]) < 1e-12
        assert rel_err(got[3], ref[3]) < 1e-12


TINY = {  # one instruction per mode
    "uvw": ("2x1o", "2x1e", "2x0o", "uvw"), "uvu": ("2x1o", "2x1e", "2x0o", "uvu"),
    "uvv": ("2x1o", "2x1e", "2x0o", "uvv"), "uuw": ("2x1o", "2x1e", "3x0o", "uuw"),
    "uuu": ("2x1o", "2x1e", "2x0o", "uuu"), "uvuv": ("2x1o", "2x1e", "4x0o", "uvuv"),
    "uvu<v": ("3x1o", "3x1e", "3x0o", "uvu<v"), "u<vw": ("3x1o", "3x1e", "2x0o", "u<vw"),
}


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_gradcheck_and_gradgradcheck(mode, shared):
    from equikernels.problem import TPProblem

    i1, i2, io, m = TINY[mode]
    p = TPProblem.create(i1, i2, io, [(0, 0, 0, m, True)], shared_weights=shared)
    x, y, w = (t.requires_grad_() for t in random_inputs(p, (2,), seed=1))
    f = lambda a, b, c: tensor_product(p, a, b, c, layout="ir_mul", backend="cpu")  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, y, w))
    assert torch.autograd.gradgradcheck(f, (x, y, w))


@pytest.mark.parametrize("seed", range(4))
def test_fused_double_backward_matches_reference(seed):
    """The non-recording double backward (the force-training step) against the reference tables."""
    kw = random_problem(200 + seed, modes=MODES, force_mode=MODES[seed * 2 % len(MODES)], shared=bool(seed % 2))
    p = problem_of(kw)
    x, y, w = random_inputs(p, (3,), seed=seed)
    g = torch.randn(3, p.dim_out, dtype=torch.float64)
    res = {}
    for be in ("cpu", "reference"):
        ts = [t.clone().requires_grad_() for t in (x, y, w, g)]
        gx, gy, gw = tp_bwd(*ts, spec_of(p, "mul_ir"), be, 7)
        torch.manual_seed(seed)
        cot = [torch.randn_like(t) for t in (gx, gy, gw)]
        res[be] = torch.autograd.grad((gx * cot[0]).sum() + (gy * cot[1]).sum() + (gw * cot[2]).sum(), ts,
                                      allow_unused=True, materialize_grads=True)
    for a, b in zip(res["cpu"], res["reference"]):
        assert rel_err(a, b) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_close_to_float64(dtype):
    kw = random_problem(3, force_mode="uvu")
    p = problem_of(kw)
    x, y, w = random_inputs(p, (6,), seed=0)
    ref = tensor_product(p, x, y, w, backend="cpu")
    got = tensor_product(p, x.to(dtype), y.to(dtype), w.to(dtype), backend="cpu")
    assert got.dtype == dtype
    assert rel_err(got, ref) < {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]


def test_constants_are_cached_per_dtype():
    p = problem_of(random_problem(5, force_mode="uvw"))
    from equikernels.ops.cpu_tp import cpu_plan

    plan = cpu_plan(p, "mul_ir")
    a = plan.consts(torch.float32, torch.device("cpu"))
    assert plan.consts(torch.float32, torch.device("cpu")) is a
    assert plan_of(spec_of(p, "mul_ir")).problem == p


@pytest.mark.parametrize("layout", ["ir_mul", "mul_ir"])
def test_symmetric_contraction_matches_table(layout):
    """The monomial-basis contraction against the path table (reference), values and derivatives
    to second order (forces, force-trained weights)."""
    from equikernels.models.builder import coupled_u_matrices
    from equikernels.models.symmetric_contraction import SymmetricContraction

    us = coupled_u_matrices("2x0e+2x1o+2x2e", "2x0e+2x1o", 3)
    sc = SymmetricContraction(2, [0, 1, 2], [0, 1], [3, 3], 2, [[u.double() for u in per] for per in us],
                              layout).double()
    x = torch.randn(4, 2 * 9, dtype=torch.float64, requires_grad=True)
    el = torch.tensor([0, 1, 1, 0])
    params = [w for per in sc.weights for w in per]
    res = {}
    for be in ("cpu", "reference"):
        sc.backend = be
        o = sc(x, el)
        g = torch.autograd.grad((o * torch.sin(o)).sum(), [x] + params, create_graph=True)
        res[be] = [o, *g, *torch.autograd.grad(sum((t ** 2).sum() for t in g), [x] + params)]
    for a, b in zip(res["cpu"], res["reference"]):
        assert rel_err(a, b) < 1e-12


def test_symmetric_contraction_default_is_monomial_on_cpu(monkeypatch):
    from equikernels.models import cpu_contraction
    from equikernels.models.builder import coupled_u_matrices
    from equikernels.models.symmetric_contraction import SymmetricContraction

    us = coupled_u_matrices("2x0e+2x1o", "2x0e", 2)
    sc = SymmetricContraction(2, [0, 1], [0], [2], 1, us, "ir_mul")
    calls = []
    real = cpu_contraction.MonomialContraction.__call__
    monkeypatch.setattr(cpu_contraction.MonomialContraction, "__call__",
                        lambda self, *a: calls.append(1) or real(self, *a))
    sc(torch.randn(3, 8), torch.zeros(3, dtype=torch.long))
    assert calls


def test_per_row_weights_contract_through_batched_matmuls(monkeypatch):
    """Fully connected with a weight per row (DiffDock's shape): the rows' matrix products run as
    bmm over rows, with the reference's numbers in both layouts."""
    from equikernels.ops import cpu_tp
    from equikernels.problem import TPProblem

    used = []
    real = torch.bmm
    monkeypatch.setattr(cpu_tp.torch, "bmm", lambda a, b: used.append((a.shape, b.shape)) or real(a, b))
    p = TPProblem.create("4x1o+3x0e", "1x0e+1x1o", "4x1o+3x0e", [(0, 0, 0, "uvw", True), (0, 1, 1, "uvw", True),
                                                                 (1, 1, 0, "uvw", True)], shared_weights=False)
    x, y, w = random_inputs(p, (6,), seed=4)
    g = torch.randn(6, p.dim_out, dtype=torch.float64)
    for layout in ("mul_ir", "ir_mul"):
        got = ek_forward_backward(p, x, y, w, g, layout=layout, backend="cpu")
        ref = ek_forward_backward(p, x, y, w, g, layout=layout, backend="reference")
        for a, b in zip(got, ref):
            assert rel_err(a, b) < 1e-12
    assert used and all(a[0] == 6 and b[0] == 6 for a, b in used)
