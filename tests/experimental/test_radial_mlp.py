"""Fused radial MLP (experimental/mlp.py, experimental/codegen_mlp.py): the Triton kernels (interpreter on CPU) against
the plain torch chain -- forward, input and weight gradients, fp32 and fp64, outputs NaN-poisoned
first -- derivatives to third order, errors, fallbacks, and a MACE model with the fused MLP on/off."""
import pytest
import torch

pytest.importorskip("triton")

from equikernels.experimental.codegen_mlp import MLPConfig, kernels_for  # noqa: E402
from equikernels.models.radial import RadialMLP  # noqa: E402
from equikernels import experimental  # noqa: E402
from equikernels.experimental import mlp as mlp_ops  # noqa: E402
from equikernels.experimental.mlp import DEFAULT_PRECISION, mlp_chain, radial_mlp, resolve_precision  # noqa: E402

SCALE = 1.6791767923989418  # e3nn normalize2mom(silu)
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
ROWS = 37
WIDTHS = {"small": [10, 16, 16, 40], "mace-like": [8, 64, 64, 64, 96]}


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")
    experimental.enable()
    yield
    experimental.disable()


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts launches of the fused forward / backward (so a test knows the kernels really ran)."""
    calls = {"fwd": 0, "bwd": 0}
    fwd, bwd = mlp_ops._fwd_impl, mlp_ops._bwd_impl

    def count_fwd(*a):
        calls["fwd"] += 1
        return fwd(*a)

    def count_bwd(*a):
        calls["bwd"] += 1
        return bwd(*a)

    monkeypatch.setattr(mlp_ops, "_fwd_impl", count_fwd)
    monkeypatch.setattr(mlp_ops, "_bwd_impl", count_bwd)
    return calls


def _operands(widths, dtype, rows=ROWS, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, widths[0], generator=g, dtype=dtype).requires_grad_()
    ws = [(torch.randn(a, b, generator=g, dtype=dtype) / a ** 0.5).requires_grad_() for a, b in zip(widths, widths[1:])]
    return x, ws


def _rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("shape", list(WIDTHS))
def test_forward_and_gradients_match_torch_chain(shape, dtype, kernel_calls):
    x, ws = _operands(WIDTHS[shape], dtype)
    out = radial_mlp(x, ws, SCALE, backend="triton", precision="ieee")
    ref = mlp_chain(x, ws, SCALE)
    assert out.shape == ref.shape and not out.isnan().any()
    assert _rel(out, ref) <= TOL[dtype]
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, [x] + ws, g)
    want = torch.autograd.grad(ref, [x] + ws, g)
    for name, a, b in zip(["x"] + [f"W{i}" for i in range(len(ws))], got, want):
        assert not a.isnan().any(), name
        assert _rel(a, b) <= TOL[dtype], name
    # input gradient alone (the force path: frozen weights) and weight gradients alone
    wd = [w.detach() for w in ws]
    (gx,) = torch.autograd.grad(radial_mlp(x, wd, SCALE, backend="triton", precision="ieee"), x, g)
    assert _rel(gx, want[0]) <= TOL[dtype]
    gw = torch.autograd.grad(radial_mlp(x.detach(), ws, SCALE, backend="triton", precision="ieee"), ws, g)
    assert all(_rel(a, b) <= TOL[dtype] for a, b in zip(gw, want[1:]))
    assert kernel_calls == {"fwd": 3, "bwd": 3}


@pytest.mark.parametrize("cfg", [MLPConfig(16, 16, 1, 1), MLPConfig(32, 32, 2, 1)], ids=["16x16", "32x32"])
@pytest.mark.parametrize("widths", [[10, 16, 16, 40], [5, 24, 33], [7, 1], [3, 130]], ids=str)
def test_kernels_multiple_programs_and_partial_tiles(widths, cfg):
    """Several programs (37 rows), a partial last row block and column tile, padded widths, a
    single layer; every combination of the backward's outputs."""
    x, ws = _operands(widths, torch.float64)
    x, ws = x.detach(), [w.detach() for w in ws]
    k = kernels_for(tuple(widths))
    ref = mlp_chain(x, ws, SCALE)
    out = k.forward(x, ws, SCALE, "ieee", cfg)
    assert _rel(out, ref) <= 1e-12
    g = torch.randn_like(ref)
    want_x, want_w = mlp_ops._torch_grads(x, ws, g, SCALE, True, [True] * len(ws))
    for need_x, need_w in ((True, False), (False, True), (True, True)):
        gx, acts, deltas = k.backward(x, ws, g, SCALE, "ieee", need_x, need_w, cfg)
        assert (gx is not None) == need_x and len(acts) == len(deltas) == (len(ws) - 1 if need_w else 0)
        if need_x:
            assert _rel(gx, want_x) <= 1e-12
        if need_w:
            gws = [a.T @ d for a, d in zip([x] + acts, deltas + [g])]
            assert all(_rel(a, b) <= 1e-12 for a, b in zip(gws, want_w))


def test_gradcheck_and_gradgradcheck_fp64():
    # fast mode (random projections): the slow mode's hundreds of interpreted launches take a minute;
    # every gradient is compared element by element with the torch chain's above
    x, ws = _operands([5, 16, 12], torch.float64, rows=6)

    def f(x, *ws):
        return radial_mlp(x, list(ws), SCALE, backend="triton")

    assert torch.autograd.gradcheck(f, (x, *ws), fast_mode=True)
    assert torch.autograd.gradgradcheck(f, (x, *ws), fast_mode=True)


def test_third_order_matches_torch_chain(kernel_calls):
    x, ws = _operands([4, 16, 16, 6], torch.float64, rows=5)
    res = []
    for fn in (lambda x: radial_mlp(x, ws, SCALE, backend="triton"), lambda x: mlp_chain(x, ws, SCALE)):
        (g1,) = torch.autograd.grad(fn(x).pow(2).sum(), x, create_graph=True)
        (g2,) = torch.autograd.grad(g1.pow(2).sum(), x, create_graph=True)
        g3 = torch.autograd.grad(g2.sum(), [x] + ws)
        res.append((g1, g2) + g3)
    for a, b in zip(*res):
        assert _rel(a, b) <= 1e-12
    assert kernel_calls["fwd"] == 1


def test_precisions_and_default(monkeypatch, kernel_calls):
    x, ws = _operands([10, 16, 40], torch.float32)
    ref = mlp_chain(x, ws, SCALE)
    for p in ("ieee", "tf32x3", "tf32"):
        monkeypatch.setenv("EQUIKERNELS_MLP_PRECISION", p)
        assert resolve_precision(None, torch.float32) == p
        assert resolve_precision(None, torch.float64) == "ieee"
        # (the interpreter computes every precision in full fp32)
        assert _rel(radial_mlp(x, ws, SCALE, backend="triton"), ref) <= 1e-5
    monkeypatch.delenv("EQUIKERNELS_MLP_PRECISION")
    assert resolve_precision(None, torch.float32) == DEFAULT_PRECISION
    monkeypatch.setenv("EQUIKERNELS_MLP_PRECISION", "fp16")
    with pytest.raises(ValueError, match="EQUIKERNELS_MLP_PRECISION"):
        radial_mlp(x, ws, SCALE, backend="triton")
    with pytest.raises(ValueError, match="precision"):
        radial_mlp(x, ws, SCALE, precision="tf64")


def test_fallbacks_run_the_torch_chain(kernel_calls):
    for dtype in (torch.float16, torch.bfloat16):
        x, ws = _operands([10, 16, 40], dtype)
        assert torch.equal(radial_mlp(x, ws, SCALE, backend="triton"), mlp_chain(x, ws, SCALE))
    x, ws = _operands([10, 16, 40], torch.float32)
    assert torch.equal(radial_mlp(x, ws, SCALE, backend="reference"), mlp_chain(x, ws, SCALE))
    assert torch.equal(radial_mlp(x, ws, SCALE), mlp_chain(x, ws, SCALE))  # CPU: automatic = reference
    x, ws = _operands([10, 160, 40], torch.float32, rows=3)  # hidden width beyond the kernels' registers
    assert torch.equal(radial_mlp(x, ws, SCALE, backend="triton"), mlp_chain(x, ws, SCALE))
    assert kernel_calls == {"fwd": 0, "bwd": 0}


def test_zero_rows():
    x, ws = _operands([10, 16, 40], torch.float32, rows=0)
    out = radial_mlp(x, ws, SCALE, backend="triton")
    assert out.shape == (0, 40)
    gx, gw = torch.autograd.grad(out.sum(), [x, ws[0]])
    assert gx.shape == x.shape and torch.equal(gw, torch.zeros_like(gw))


def test_bad_input():
    x, ws = _operands([10, 16, 40], torch.float32, rows=4)
    cases = [
        ((x[0], ws), ValueError, "x: expected a 2-D"),
        ((x[None], ws), ValueError, "x: expected a 2-D"),
        ((x.detach().numpy(), ws), TypeError, "x: expected a torch.Tensor"),
        ((x.long(), ws), TypeError, "x: expected a floating-point"),
        ((x, []), ValueError, "weights: expected a non-empty list"),
        ((x, ws[0]), ValueError, "weights: expected a non-empty list"),
        ((x, [ws[0], ws[1][None]]), ValueError, r"weights\[1\]: expected a 2-D"),
        ((x, [ws[1], ws[0]]), ValueError, r"weights\[0\]: expected 10 rows \(the width of x\)"),
        ((x, [ws[0], ws[0]]), ValueError, r"weights\[1\]: expected 16 rows \(the width of weights\[0\]\)"),
        ((x, [ws[0], ws[1].double()]), TypeError, r"weights\[1\]: dtype torch.float64 does not match x"),
        ((x, [ws[0], "w"]), TypeError, r"weights\[1\]: expected a torch.Tensor"),
    ]
    for args, exc, msg in cases:
        for backend in ("triton", "reference"):
            with pytest.raises(exc, match=msg):
                radial_mlp(*args, SCALE, backend=backend)
    with pytest.raises(TypeError, match="act_scale"):
        radial_mlp(x, ws, "1.0", backend="triton")
    with pytest.raises(ValueError, match="backend"):
        radial_mlp(x, ws, SCALE, backend="cuda")


def test_radial_mlp_module_state_dict_and_half_path(kernel_calls):
    m = RadialMLP([10, 16, 16, 40])
    assert list(m.state_dict()) == ["layers.0.weight", "layers.1.weight", "layers.2.weight"]
    x = torch.randn(ROWS, 10)
    ref = m(x)
    m.backend = "triton"
    out = m(x)
    assert kernel_calls["fwd"] == 1 and _rel(out, ref) <= 1e-5
    m.requires_grad_(False)  # frozen weights: the scaled weights are cached and reused
    assert torch.equal(m(x), out) and m._scaled() is m._scaled()
    half = m(x.to(torch.bfloat16))  # mixed precision keeps its torch path (bf16 matmuls)
    assert half.dtype == torch.bfloat16 and kernel_calls["fwd"] == 2 and _rel(half.float(), ref) < 2e-2


def test_mace_model_fused_mlp_on_and_off(kernel_calls):
    """A small equikernels MACE (density and residual interactions: RadialMLPs with hidden layers
    and a single-layer one) gives the same energies and forces with the fused MLP forced on."""
    from mace_models import _batch, _crystal, _model, _molecule

    model = _model(interaction_first="RealAgnosticDensityInteractionBlock")
    data = _batch([_crystal(), _molecule()])
    res = {}
    for backend in ("reference", "triton"):
        for m in model.modules():
            if isinstance(m, RadialMLP):
                m.backend = backend
        res[backend] = model(dict(data))
    assert kernel_calls["fwd"] == 3 and kernel_calls["bwd"] == 3
    for key in ("energy", "node_energy", "forces"):
        a, b = res["triton"][key], res["reference"][key]
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10 * float(b.detach().abs().max())), key


def test_torch_compile_uses_the_custom_ops(kernel_calls):
    """Traced (fullgraph) through the custom ops' fake implementations and autograd; the fused
    forward and backward run inside the compiled graph."""
    x, ws = _operands([10, 16, 40], torch.float32)
    w0 = ws[0].detach()

    def fn(x, w0, w1):
        return radial_mlp(x, [w0, w1], SCALE, backend="triton").sin().sum()

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(x, w0, ws[1]), [x, ws[1]])
    want = torch.autograd.grad(mlp_chain(x, [w0, ws[1]], SCALE).sin().sum(), [x, ws[1]])
    assert kernel_calls == {"fwd": 1, "bwd": 1}
    assert all(_rel(a, b) <= 1e-5 for a, b in zip(got, want))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_cuda_precisions_against_float64(dtype):
    """Compiled kernels (automatic backend on CUDA): every dot precision against a float64 chain."""
    widths = [10, 64, 64, 64, 1280]
    x, ws = _operands(widths, torch.float64, rows=3001)
    ref = mlp_chain(x, ws, SCALE)
    g = torch.randn_like(ref)
    want = torch.autograd.grad(ref, [x] + ws, g)
    tol = {"ieee": 1e-5, "tf32x3": 1e-5, "tf32": 5e-3} if dtype == torch.float32 else {"ieee": 1e-10}
    for prec, t in tol.items():
        xc = x.detach().to("cuda", dtype).requires_grad_()
        wc = [w.detach().to("cuda", dtype).requires_grad_() for w in ws]
        out = radial_mlp(xc, wc, SCALE, precision=prec)
        got = (out,) + torch.autograd.grad(out, [xc] + wc, g.to("cuda", dtype))
        for a, b in zip(got, (ref,) + want):
            assert _rel(a.cpu().double(), b) <= t, prec
