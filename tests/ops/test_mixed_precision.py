"""Mixed precision: float16 / bfloat16 operands, float32 math, output dtype on request, autocast.

Every half-precision result is compared with the float64 reference evaluated on the *same rounded
inputs* (so the only admissible error is the final rounding of each result, plus float32
accumulation): relative error ||a - ref|| / ||ref|| at most TOL[dtype]. Outputs are NaN-poisoned
before the kernels run. On CPU the Triton kernels run in the interpreter, which cannot execute
bfloat16 code: interpreter tests use float16, bfloat16 runs on the reference path (and on the GPU).
"""
import os

import pytest
import torch

import equikernels
from equikernels import ConvGraph
from equikernels.catalog import problem as catalog_problem
from equikernels.catalog import standard_problems
from equikernels.ops import plan_of, spec_of, tensor_product, tensor_product_conv
from equikernels.ops.tp import tp_bwd, tp_dbwd, tp_fwd
from equikernels.problem import TPProblem

HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
TOL = {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _channelwise(shared=False) -> TPProblem:
    m = equikernels.ChannelWiseTensorProduct("3x0e+2x1o", "0e+1o+2e", "0e+1o+1e+2e", shared_weights=shared,
                                             internal_weights=False)
    return m.problem


def _fully_connected(shared=True) -> TPProblem:
    return equikernels.FullyConnectedTensorProduct("3x0e+2x1o", "0e+1o", "2x0e+3x1o", shared_weights=shared,
                                                   internal_weights=False).problem


def _inputs(p: TPProblem, rows: int, dtypes, device="cpu", seed=0):
    """x, y, w rounded to their dtypes, and the same values in float64."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(rows, p.dim_in1), (rows, p.dim_in2), (p.weight_numel,) if p.shared_weights else (rows, p.weight_numel)]
    low = [torch.randn(*s, generator=g, dtype=torch.float64).to(device=device, dtype=d) for s, d in zip(shapes, dtypes)]
    return low, [t.double() for t in low]


def check_all_orders(p: TPProblem, rows: int, dtypes, layout="mul_ir", backend="triton", device="cpu",
                     second_order=True, output_dtype=None):
    """Forward, the three gradients and (optionally) the four second-order results of the
    trilinear loss L = <gx, Rx> + <gy, Ry> + <gw, Rw> against the float64 reference."""
    low, ref_in = _inputs(p, rows, dtypes, device)
    out_dt = output_dtype or low[0].dtype
    low = [t.requires_grad_() for t in low]
    ref_in = [t.requires_grad_() for t in ref_in]
    out = tensor_product(p, *low, layout=layout, backend=backend, output_dtype=output_dtype)
    ref = tensor_product(p, *ref_in, layout=layout, backend="reference")
    assert out.dtype == out_dt
    assert not out.isnan().any(), "unwritten output elements"
    assert _rel(out, ref) <= TOL[out_dt], f"forward: {_rel(out, ref):.2e}"
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(ref.shape, generator=gen, dtype=torch.float64).to(device=device, dtype=out_dt)
    grads = torch.autograd.grad(out, low, g.requires_grad_(second_order), create_graph=second_order)
    grads_ref = torch.autograd.grad(ref, ref_in, g.double().requires_grad_(second_order), create_graph=second_order)
    for name, a, b, t in zip("xyw", grads, grads_ref, low):
        assert a.dtype == t.dtype, f"grad {name}: dtype {a.dtype}, operand {t.dtype}"
        assert not a.isnan().any(), f"grad {name}: unwritten elements"
        assert _rel(a, b) <= TOL[t.dtype], f"grad {name}: {_rel(a, b):.2e}"
    if not second_order:
        return
    R = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(device=device, dtype=t.dtype) for t in low]
    loss = sum((a * r).sum() for a, r in zip(grads, R))
    loss_ref = sum((a * r.double()).sum() for a, r in zip(grads_ref, R))
    seconds = torch.autograd.grad(loss, low + [g])
    seconds_ref = torch.autograd.grad(loss_ref, ref_in + [g])
    for name, a, b, t in zip(("dx", "dy", "dw", "dg"), seconds, seconds_ref, low + [g]):
        assert a.dtype == t.dtype, f"{name}: dtype {a.dtype}, operand {t.dtype}"
        assert _rel(a, b) <= TOL[t.dtype], f"{name}: {_rel(a, b):.2e}"


# --- CPU: reference path (float32 math for half inputs) -----------------------------------------
@pytest.mark.parametrize("dt", list(HALF))
@pytest.mark.parametrize("shared", [False, True])
def test_reference_half(dt, shared):
    p = _fully_connected(shared) if shared else _channelwise()
    check_all_orders(p, 6, [HALF[dt]] * 3, backend="reference")


# --- CPU: generated kernels in the interpreter (float16) ----------------------------------------
@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_kernels_fp16_per_row_weights(layout):
    check_all_orders(_channelwise(), 7, [torch.float16] * 3, layout=layout)


def test_kernels_fp16_shared_weights():
    check_all_orders(_fully_connected(shared=True), 9, [torch.float16] * 3)


def test_kernels_fp16_split_problem(monkeypatch, tmp_path):
    """A problem split over several kernels that add into one output: the shared buffer is float32."""
    monkeypatch.setenv("EQUIKERNELS_MAX_PATHS", "2")
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    p = _channelwise()
    plan_of.cache_clear()
    try:
        check_all_orders(p, 5, [torch.float16] * 3, second_order=False)
        assert len(plan_of(spec_of(p, "mul_ir")).kernels.kernel("bwd", 1).parts) > 1
    finally:
        plan_of.cache_clear()


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_long_channel_sums(backend):
    p = equikernels.FullyConnectedTensorProduct("256x0e", "0e", "4x0e", shared_weights=False,
                                                internal_weights=False).problem
    check_all_orders(p, 6, [torch.float16] * 3, backend=backend, second_order=False)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_math_is_float32(backend, device):
    """Products and partial sums (45000 + 45000) beyond float16's range whose total (450) is not:
    finite and exact only if the math is float32, whatever the order of operations."""
    p = TPProblem.create("4x0e", "0e", "1x0e", [(0, 0, 0, "uvw", True)], shared_weights=False,
                         internal_weights=False)  # coefficient 1/sqrt(4): terms x * y * w / 2
    x = torch.full((3, 4), 300.0, dtype=torch.float16, device=device)
    y = torch.full((3, 1), 300.0, dtype=torch.float16, device=device)
    w = torch.tensor([[1.0, 1.0, -1.0, -0.99]] * 3, dtype=torch.float16, device=device)
    out = tensor_product(p, x, y, w, backend=backend)
    ref = tensor_product(p, x.double(), y.double(), w.double(), backend="reference")
    assert torch.isfinite(out).all() and _rel(out, ref) <= TOL[torch.float16], out


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_shared_weight_partials_are_float32(backend):
    """Per-program partial sums of a shared weight's gradient overflow float16 (|partial| > 65504)
    while the total does not: the partials must be float32 (summed in float64, then rounded)."""
    p = TPProblem.create("1x0e", "1x0e", "1x0e", [(0, 0, 0, "uvw", True)], shared_weights=True,
                         internal_weights=False)
    rows = 64
    x = torch.full((rows, 1), 250.0, dtype=torch.float16)
    y = torch.full((rows, 1), 250.0, dtype=torch.float16)
    y[rows // 2:] = -249.0  # first half of the rows +62500 each, second half -62250 each
    w = torch.ones(1, dtype=torch.float16, requires_grad=True)
    out = tensor_product(p, x, y, w, backend=backend)
    (gw,) = torch.autograd.grad(out, w, torch.ones_like(out))
    ref_out = tensor_product(p, x.double(), y.double(), w.detach().double(), backend="reference")
    assert gw.dtype == torch.float16 and torch.isfinite(gw).all()
    assert _rel(gw, ref_out.sum().reshape(1)) <= 1e-3


# --- dtype rules ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_mixed_operand_dtypes(backend):
    """x float16 with float32 y and weights: each operand read in its own dtype, output in x's,
    every gradient in its operand's dtype."""
    check_all_orders(_channelwise(), 5, [torch.float16, torch.float32, torch.float32], backend=backend)


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_output_dtype_and_math_dtype(backend):
    p = _channelwise()
    check_all_orders(p, 5, [torch.float16] * 3, backend=backend, output_dtype=torch.float32, second_order=False)
    (x, y, w), (xr, yr, wr) = _inputs(p, 4, [torch.float16] * 3)
    out = tensor_product(p, x, y, w, backend=backend, math_dtype=torch.float64, output_dtype=torch.float64)
    assert out.dtype == torch.float64
    assert _rel(out, tensor_product(p, xr, yr, wr, backend="reference")) <= 1e-12


def test_bad_dtypes_are_named():
    p = _channelwise()
    (x, y, w), _ = _inputs(p, 3, [torch.float16] * 3)
    with pytest.raises(ValueError, match="math_dtype: expected torch.float32 or torch.float64"):
        tensor_product(p, x, y, w, math_dtype=torch.float16)
    with pytest.raises(ValueError, match="output_dtype: expected one of"):
        tensor_product(p, x, y, w, output_dtype=torch.int32)
    with pytest.raises(TypeError, match=r"y: dtype torch.float64 does not match x \(torch.float16\); float64"):
        tensor_product(p, x, y.double(), w)
    with pytest.raises(TypeError, match=r"weight: dtype torch.float64 does not match x"):
        tensor_product(p, x, y, w.double())
    with pytest.raises(TypeError, match="x: expected a float16, bfloat16, float32 or float64 tensor"):
        tensor_product(p, x.to(torch.float8_e4m3fn), y, w)
    with pytest.raises(ValueError, match="math_dtype"):
        equikernels.TensorProduct("0e", "0e", "0e", [(0, 0, 0, "uvw", True)], math_dtype=torch.bfloat16)


def test_fake_tensor_dtypes():
    """The fake (meta) implementations report the dtypes the real ones produce."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    p = _channelwise()
    spec = spec_of(p, "mul_ir")
    with FakeTensorMode():
        x = torch.empty(4, p.dim_in1, dtype=torch.bfloat16)
        y = torch.empty(4, p.dim_in2, dtype=torch.float32)
        w = torch.empty(4, p.weight_numel, dtype=torch.float16)
        assert tp_fwd(x, y, w, spec, "reference").dtype == torch.bfloat16
        assert tp_fwd(x, y, w, spec, "reference", None, torch.float32).dtype == torch.float32
        g = torch.empty(4, p.dim_out, dtype=torch.float32)
        assert [t.dtype for t in tp_bwd(x, y, w, g, spec, "reference", 7)] == [torch.bfloat16, torch.float32,
                                                                             torch.float16]
        res = tp_dbwd(x, y, w, g, x, y, w, spec, "reference", "abc", 15)
        assert [t.dtype for t in res] == [torch.bfloat16, torch.float32, torch.float16, torch.float32]


def test_custom_ops_opcheck_half():
    p = _channelwise()
    spec = spec_of(p, "mul_ir")
    (x, y, w), _ = _inputs(p, 3, [torch.float16, torch.float32, torch.float16])
    g = torch.randn(3, p.dim_out, dtype=torch.float32)
    torch.library.opcheck(tp_fwd, (x, y, w, spec, "reference", None, torch.float32),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(tp_bwd, (x, y, w, g, spec, "reference", 7, None),
                          test_utils=("test_schema", "test_faketensor"))


# --- autocast --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", list(HALF))
def test_autocast_cpu(dt):
    """Under autocast the output is in the autocast dtype, the operands are not cast, gradients are
    in the operands' dtypes; float64 is left alone; the custom op (compiled graphs) agrees."""
    p = _channelwise()
    (x, y, w), (xr, yr, wr) = _inputs(p, 5, [torch.float32] * 3)
    x.requires_grad_()
    ref = tensor_product(p, xr, yr, wr, backend="reference")
    with torch.autocast("cpu", dtype=HALF[dt]):
        out = tensor_product(p, x, y, w, backend="reference")
        op_out = tp_fwd(x, y, w, spec_of(p, "mul_ir"), "reference")
        out64 = tensor_product(p, xr, yr, wr, backend="reference")
        explicit = tensor_product(p, x, y, w, backend="reference", output_dtype=torch.float32)
    assert out.dtype == op_out.dtype == HALF[dt]
    assert out64.dtype == torch.float64 and explicit.dtype == torch.float32
    assert _rel(out, ref) <= TOL[HALF[dt]] and torch.equal(out, op_out)
    (gx,) = torch.autograd.grad(out, x, torch.ones_like(out))
    assert gx.dtype == torch.float32


def test_autocast_compiled():
    p = _channelwise()
    (x, y, w), (xr, yr, wr) = _inputs(p, 5, [torch.float32] * 3)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def f(a, b, c):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return tensor_product(p, a, b, c, backend="reference") * 2

    out = f(x, y, w)
    assert out.dtype == torch.bfloat16
    assert _rel(out, 2 * tensor_product(p, xr, yr, wr, backend="reference")) <= TOL[torch.bfloat16]


# --- convolution -------------------------------------------------------------------------------------
def check_conv(p: TPProblem, flow: str, dtypes, n=7, e=19, device="cpu", second_order=True, layout="mul_ir"):
    gen = torch.Generator().manual_seed(3)
    src = torch.randint(0, n, (e,), generator=gen).to(device)
    dst = torch.randint(0, n - 1, (e,), generator=gen).to(device)  # the last node receives nothing
    dst[: e // 3] = 0
    graph = ConvGraph.build(src, dst, n)
    mk = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    shapes = [(n, p.dim_in1), (e, p.dim_in2), (p.weight_numel,) if p.shared_weights else (e, p.weight_numel)]
    low = [mk(*s).to(device=device, dtype=d).requires_grad_() for s, d in zip(shapes, dtypes)]
    ref_in = [t.detach().double().requires_grad_() for t in low]
    backend = "reference" if flow == "unfused" else "triton"
    out = tensor_product_conv(p, *low, src, dst, n, graph=graph, backend=backend, dataflow=flow, layout=layout)
    ref = tensor_product_conv(p, *ref_in, src, dst, n, graph=graph, backend="reference", layout=layout)
    assert out.dtype == low[0].dtype and not out.isnan().any()
    assert _rel(out, ref) <= TOL[out.dtype], f"forward: {_rel(out, ref):.2e}"
    g = mk(*ref.shape).to(device=device, dtype=out.dtype).requires_grad_(second_order)
    g_ref = g.detach().double().requires_grad_(second_order)
    grads = torch.autograd.grad(out, low, g, create_graph=second_order)
    grads_ref = torch.autograd.grad(ref, ref_in, g_ref, create_graph=second_order)
    for name, a, b, t in zip("xyw", grads, grads_ref, low):
        assert a.dtype == t.dtype and not a.isnan().any(), f"grad {name}"
        assert _rel(a, b) <= TOL[t.dtype], f"grad {name}: {_rel(a, b):.2e}"
    if second_order:
        R = [mk(*t.shape).to(device=device, dtype=t.dtype) for t in low]
        seconds = torch.autograd.grad(sum((a * r).sum() for a, r in zip(grads, R)), low + [g])
        seconds_ref = torch.autograd.grad(sum((a * r.double()).sum() for a, r in zip(grads_ref, R)),
                                          ref_in + [g_ref])
        for name, a, b, t in zip(("dx", "dy", "dw", "dg"), seconds, seconds_ref, low + [g]):
            assert a.dtype == t.dtype, f"{name}: dtype {a.dtype}, operand {t.dtype}"
            assert _rel(a, b) <= TOL[t.dtype], f"{name}: {_rel(a, b):.2e}"


@pytest.mark.parametrize("flow", ["atomic", "deterministic", "unfused"])
def test_conv_fp16(flow):
    check_conv(_channelwise(), flow, [torch.float16] * 3)


def test_conv_mixed_and_shared():
    check_conv(_channelwise(), "deterministic", [torch.float16, torch.float32, torch.float16], second_order=False)
    check_conv(_channelwise(shared=True), "atomic", [torch.float16] * 3, second_order=False)


@pytest.mark.parametrize("dt", list(HALF))
def test_conv_reference_half(dt):
    check_conv(_channelwise(), "unfused", [HALF[dt]] * 3)


# --- modules -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", list(HALF))
def test_modules_half_features_float32_parameters(dt):
    d = HALF[dt]
    tp = equikernels.FullyConnectedTensorProduct("3x0e+2x1o", "0e+1o", "2x0e+3x1o", backend="reference")
    x, y = torch.randn(4, 9, dtype=d), torch.randn(4, 4, dtype=d)
    out = tp(x, y)
    assert out.dtype == d
    out.float().sum().backward()
    assert tp.weight.grad.dtype == torch.float32
    tp32 = equikernels.FullyConnectedTensorProduct("3x0e+2x1o", "0e+1o", "2x0e+3x1o", backend="reference",
                                                   output_dtype=torch.float32)
    tp32.load_state_dict(tp.state_dict())
    assert tp32(x, y).dtype == torch.float32
    assert _rel(tp32(x, y), tp(x.float(), y.float())) <= 1e-5  # float32 math either way
    lin = equikernels.Linear("3x0e+2x1o", "2x0e+1x1o")
    assert lin(x).dtype == d
    conv = equikernels.TensorProductConv("3x0e+2x1o", "0e+1o", "2x0e+3x1o",
                                         [(0, 0, 0, "uvw", True), (1, 1, 0, "uvw", True), (1, 0, 1, "uvw", True)],
                                         backend="reference", output_dtype=torch.float32)
    src, dst = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0])
    assert conv(x, y, src=src, dst=dst).dtype == torch.float32


# --- interpreter: every standard problem's kernels in fp16 (bf16 does not run there) --------------------
@pytest.mark.parametrize("name", list(standard_problems()))
def test_standard_problems_fp16_interpreter(name):
    """The generated forward and backward of every standard problem (and nequip-water's double backward)
    with fp16 operands under the Triton interpreter, against the float64 reference, outputs NaN-poisoned;
    3 rows. On a GPU, test_standard_problems_gpu_half compiles them (both half types, 1000 rows)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only (the GPU has test_standard_problems_gpu_half)")
    check_all_orders(catalog_problem(name), 3, [torch.float16] * 3, layout="mul_ir", device="cpu",
                     second_order=name == "nequip-water")


# --- GPU: every standard problem, both half types, and the convolution ---------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dt", list(HALF))
@pytest.mark.parametrize("name", list(standard_problems()))
def test_standard_problems_gpu_half(name, dt):
    layout = "ir_mul" if dt == "bf16" else "mul_ir"
    check_all_orders(catalog_problem(name), 1000, [HALF[dt]] * 3, layout=layout, device="cuda",
                     second_order=name == "nequip-water")


@pytest.mark.gpu
@pytest.mark.parametrize("dt", list(HALF))
def test_mixed_and_partials_gpu_half(dt):
    """50,000 rows of shared-weight gradient partials; half features with float32 edge features."""
    check_all_orders(catalog_problem("tetris-poly-1"), 50000, [HALF[dt]] * 3, device="cuda", second_order=False)
    check_all_orders(catalog_problem("mace-medium"), 500, [HALF[dt], torch.float32, HALF[dt]], layout="ir_mul",
                     device="cuda", second_order=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dt", list(HALF))
@pytest.mark.parametrize("flow", ["atomic", "deterministic"])
def test_conv_gpu_half(flow, dt):
    # the deterministic dataflow (the default) on the MACE problem; atomics on a cheaper-to-compile one
    name = "mace-medium" if flow == "deterministic" else "nequip-water"
    check_conv(catalog_problem(name), flow, [HALF[dt]] * 3, n=300, e=4000, device="cuda", layout="ir_mul",
               second_order=False)


@pytest.mark.gpu
def test_conv_gpu_bf16_double_backward():
    """Force training in bfloat16: the fused double backward of the deterministic convolution."""
    check_conv(catalog_problem("mace-medium"), "deterministic", [torch.bfloat16] * 3, n=300, e=4000, device="cuda",
               layout="ir_mul")


@pytest.mark.gpu
def test_autocast_gpu():
    p = catalog_problem("mace-medium")
    (x, y, w), (xr, yr, wr) = _inputs(p, 300, [torch.float32] * 3, device="cuda")
    ref = tensor_product(p, xr, yr, wr, layout="ir_mul", backend="reference")
    for d in HALF.values():
        with torch.autocast("cuda", dtype=d):
            out = tensor_product(p, x, y, w, layout="ir_mul")
        assert out.dtype == d and _rel(out, ref) <= TOL[d]


def test_linear_fast_path_half_features_fp32_weights():
    """Internal float32 weights with float16 features take the matmul fast path (weights rounded
    once, cached while frozen) and agree with the general path given the same weights."""
    lin = equikernels.Linear("4x0e+3x1o", "2x0e+5x1o", layout="ir_mul")
    x = torch.randn(6, lin.irreps_in.dim, dtype=torch.float16)
    fast = lin(x)
    general = lin(x, weight=lin.weight.detach())  # an explicit weight takes the general path
    ref = lin(x.float()).double()
    assert fast.dtype == torch.float16 and general.dtype == torch.float16
    assert _rel(fast.double(), ref) < 2e-3
    assert _rel(fast.double(), general.double()) < 2e-3
    with torch.no_grad():
        lin.weight.requires_grad_(False)
        again = lin(x)
        assert lin.__dict__["_scaled"][1].dtype == torch.float16  # the fast path's rounded copy
        lin.weight.mul_(2.0)  # an in-place update must not reuse the cached rounded copy
        doubled = lin(x)
    assert torch.equal(again, fast)
    assert _rel(doubled.double(), 2 * fast.double()) < 2e-3
