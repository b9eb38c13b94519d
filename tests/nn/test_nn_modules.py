"""equikernels.nn modules against their e3nn counterparts (CPU reference backend).

fp64 references are built under ``torch.set_default_dtype(torch.float64)`` (e3nn computes its CG
tables in the default dtype at construction).
"""
import random

import pytest
import torch

import equikernels as ek
from equikernels._compat import o3
from equikernels.nn.spherical_harmonics import ir_mul_permutation

RTOL = {torch.float64: 1e-10, torch.float32: 1e-5}


@pytest.fixture
def dtype64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield torch.float64
    torch.set_default_dtype(old)


def assert_close(a, b, dtype=torch.float64, what=""):
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    err = (a - b).norm() / b.norm().clamp_min(1e-30)
    assert err <= RTOL[dtype], f"{what}: relative error {err:.3e} > {RTOL[dtype]:.0e}"


def pair(make, seed=0):
    """(e3nn module, equikernels module) built the same way from the same RNG state."""
    torch.manual_seed(seed)
    ref = make(o3)
    torch.manual_seed(seed)
    ours = make(ek)
    return ref, ours


def random_irreps(rng, n, lmax, maxmul=3):
    return o3.Irreps("+".join(f"{rng.randint(1, maxmul)}x{rng.randint(0, lmax)}{rng.choice('eo')}"
                              for _ in range(n)))


def weight_for(m, batch, dtype=None):
    if m.internal_weights or m.weight_numel == 0:
        return None
    shape = (m.weight_numel,) if m.shared_weights else (batch, m.weight_numel)
    return torch.randn(shape, dtype=dtype or torch.get_default_dtype(), requires_grad=True)


def check_tp_parity(ref, ours, batch=6, n_inputs=2, dtype=torch.float64):
    """Same instructions, state_dict, outputs and gradients (x, y, weight) as e3nn."""
    assert [tuple(i) for i in ours.instructions] == [tuple(i) for i in ref.instructions]
    assert ours.irreps_out == ref.irreps_out and ours.weight_numel == ref.weight_numel
    sd_ref, sd = ref.state_dict(), ours.state_dict()
    assert list(sd) == list(sd_ref)
    for k in sd_ref:
        assert torch.equal(sd[k], sd_ref[k]), k
    dims = [ref.irreps_in1.dim, ref.irreps_in2.dim][:n_inputs]
    xs = [torch.randn(batch, d, dtype=dtype, requires_grad=True) for d in dims]
    w = weight_for(ref, batch, dtype)
    extra = () if w is None else (w,)
    out_ref, out = ref(*xs, *extra), ours(*xs, *extra)
    assert_close(out, out_ref, dtype, "output")
    params = [t for t in (*xs, w, ref.weight if ref.internal_weights and ref.weight_numel else None)
              if t is not None]
    cot = torch.randn_like(out_ref)
    g_ref = torch.autograd.grad(out_ref, params, cot)
    params_ours = [ours.weight if p is ref.weight else p for p in params]
    g = torch.autograd.grad(out, params_ours, cot)
    for k, (a, b) in enumerate(zip(g, g_ref)):
        assert_close(a, b, dtype, f"gradient of input {k}")


# --- tensor products ----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fully_connected_random(dtype64, seed):
    rng = random.Random(seed)
    i1, i2 = random_irreps(rng, 3, 3), random_irreps(rng, 2, 2)
    reachable = sorted({ir for _, a in i1 for _, b in i2 for ir in a * b}, key=lambda ir: (ir.l, ir.p))
    io = o3.Irreps([(rng.randint(1, 3), ir) for ir in rng.sample(reachable, min(4, len(reachable)))])
    shared = seed != 1
    ref, ours = pair(lambda m: m.FullyConnectedTensorProduct(i1, i2, io, shared_weights=shared), seed)
    if ours.internal_weights:
        assert isinstance(ours.weight, torch.nn.Parameter) and torch.equal(ours.weight, ref.weight)
    check_tp_parity(ref, ours)


@pytest.mark.parametrize("mode", ["uvw", "uvu", "uvv", "uuw", "uuu", "uvuv"])
@pytest.mark.parametrize("norm", [("component", "element"), ("norm", "path"), ("none", "none")])
def test_generic_tensor_product_modes(dtype64, mode, norm):
    mul = {"uvw": (3, 2, 4), "uvu": (3, 2, 3), "uvv": (3, 2, 2), "uuw": (3, 3, 2), "uuu": (3, 3, 3),
           "uvuv": (3, 2, 6)}[mode]
    i1, i2 = f"{mul[0]}x0e+{mul[0]}x1o", f"{mul[1]}x1o+{mul[1]}x2e"
    io = f"{mul[2]}x1o+{mul[2]}x1e+{mul[2]}x0e+{mul[2]}x2e"
    unweighted_ok = mode not in ("uvw", "uuw")  # uvw needs weights; unweighted uuw needs mul_out == 1
    instr = [(0, 0, 0, mode, True, 1.0), (1, 0, 2, mode, True, 0.5), (1, 0, 1, mode, True),
             (1, 1, 0, mode, True), (0, 1, 3, mode, not unweighted_ok)]
    kw = dict(irrep_normalization=norm[0], path_normalization=norm[1], in1_var=[1.0, 2.0],
              out_var=[0.5, 1.0, 3.0, 2.0])
    ref, ours = pair(lambda m: m.TensorProduct(i1, i2, io, instr, **kw))
    check_tp_parity(ref, ours)
    # per-row external weights
    ref, ours = pair(lambda m: m.TensorProduct(i1, i2, io, instr, shared_weights=False, **kw))
    check_tp_parity(ref, ours)


def test_elementwise_and_full(dtype64):
    ref, ours = pair(lambda m: m.ElementwiseTensorProduct("3x0e+2x1o+1x2e", "2x0e+4x1o", ["0e", "1o", "2e"]))
    assert str(ours.irreps_in1) == str(ref.irreps_in1) and str(ours.irreps_in2) == str(ref.irreps_in2)
    check_tp_parity(ref, ours)
    ref, ours = pair(lambda m: m.ElementwiseTensorProduct("2x1o+1x2e", "2x1o+1x1o", ["1e", "0e", "1o"]))
    check_tp_parity(ref, ours)  # (1,1,1) and l=0 "uuu" paths: e3nn special-cases them in its codegen
    ref, ours = pair(lambda m: m.FullTensorProduct("2x0e+2x1o+1x2e", "0e+1o+2x1e", irrep_normalization="norm"))
    assert str(ours.irreps_out) == str(ref.irreps_out)  # sorted output
    check_tp_parity(ref, ours)
    ref, ours = pair(lambda m: m.FullTensorProduct("2x1o+1x2e", "1o", filter_ir_out=["1e", "2o"]))
    check_tp_parity(ref, ours)


@pytest.mark.skipif(not hasattr(o3, "TensorSquare"), reason="installed e3nn has no TensorSquare")
@pytest.mark.parametrize("kw", [{}, {"irrep_normalization": "norm"}, {"filter_ir_out": ["0e", "2e", "1e"]},
                                {"irreps_out": "3x0e+2x1o+2x2e+1x1e"},
                                {"irreps_out": "2x0e+2x2e", "irrep_normalization": "norm"},
                                {"irreps_out": "1x0e+1x1e", "irrep_normalization": "none"}])
def test_tensor_square(dtype64, kw):
    ref, ours = pair(lambda m: m.TensorSquare("3x0e+2x1o+3x2e", **kw))
    assert isinstance(ours, ek.TensorSquare) and str(ours.irreps_in) == str(ref.irreps_in)
    check_tp_parity(ref, ours, n_inputs=1)


def test_float32(dtype64):
    torch.set_default_dtype(torch.float32)
    ref, ours = pair(lambda m: m.FullyConnectedTensorProduct("4x0e+3x1o+2x2e", "0e+1o+2e", "5x0e+4x1o+3x2e"))
    check_tp_parity(ref, ours, dtype=torch.float32)


def test_channel_wise_matches_catalog_and_e3nn(dtype64):
    from equikernels.catalog import uvu_problem
    spec = uvu_problem("4x0e+3x1o", "0e+1o+2e", "4x0e+3x1o+2x2e")
    ours = ek.ChannelWiseTensorProduct("4x0e+3x1o", "0e+1o+2e", "4x0e+3x1o+2x2e")
    assert str(ours.irreps_out) == spec["irreps_out"] and not ours.shared_weights
    torch.manual_seed(0)
    ref = o3.TensorProduct(**spec)
    check_tp_parity(ref, ours)


def test_weight_list_and_views(dtype64):
    ref, ours = pair(lambda m: m.FullyConnectedTensorProduct("2x0e+2x1o", "0e+1o", "3x0e+2x1o", shared_weights=False))
    w = torch.randn(5, ref.weight_numel)
    ws = [v.clone() for v in ref.weight_views(w)]
    x, y = torch.randn(5, ref.irreps_in1.dim), torch.randn(5, ref.irreps_in2.dim)
    assert_close(ours(x, y, ws), ref(x, y, w), what="list weights")
    for a, b in zip(ours.weight_views(w), ref.weight_views(w)):
        assert torch.equal(a, b)


def test_right(dtype64):
    ref, ours = pair(lambda m: m.FullyConnectedTensorProduct("2x0e+2x1o", "0e+1o", "3x0e+2x1o", compile_right=True))
    y = torch.randn(4, ref.irreps_in2.dim)
    assert_close(ours.right(y), ref.right(y), what="right")
    with pytest.raises(ValueError, match=r"^y: expected last dimension 4 \(irreps_in2\), got shape \(4, 5\)$"):
        ours.right(torch.randn(4, 5))


def test_broadcasting_and_empty_batch(dtype64):
    ours = ek.FullyConnectedTensorProduct("2x0e+2x1o", "0e+1o", "3x0e+2x1o")
    ref = o3.FullyConnectedTensorProduct("2x0e+2x1o", "0e+1o", "3x0e+2x1o")
    ref.load_state_dict(ours.state_dict())
    x, y = torch.randn(3, 1, 8), torch.randn(1, 4, 4)
    assert_close(ours(x, y), ref(x, y), what="broadcast")
    x0 = torch.randn(0, 8, requires_grad=True)
    out = ours(x0, torch.randn(0, 4))
    assert out.shape == (0, ref.irreps_out.dim)
    out.sum().backward()
    assert x0.grad.shape == (0, 8)


def test_layout_ir_mul(dtype64):
    i1, i2, io = "3x0e+2x1o+2x2e", "2x0e+1x1o", "3x0e+2x1o+1x2e"
    torch.manual_seed(0)
    a = ek.FullyConnectedTensorProduct(i1, i2, io)
    torch.manual_seed(0)
    b = ek.FullyConnectedTensorProduct(i1, i2, io, layout="ir_mul")
    p1, p2, po = (ir_mul_permutation(i) for i in (i1, i2, io))
    assert p2 is None and p1 is not None  # "2x0e+1x1o": scalars only repeat, so the layouts agree
    p2 = slice(None)
    x, y = torch.randn(5, a.irreps_in1.dim), torch.randn(5, a.irreps_in2.dim)
    assert_close(b(x[:, p1], y[:, p2]), a(x, y)[:, po], what="ir_mul tensor product")
    with pytest.raises(ValueError, match="layout"):
        ek.TensorProduct(i1, i2, io, [], layout="mul_major")


def test_state_dict_round_trip(dtype64):
    io = "4x0e+3x1o+2x0o+2x2e"  # 0o is unreachable: zeros in output_mask
    mk = lambda m: m.FullyConnectedTensorProduct("3x0e+2x1o+1x2e", "0e+1o+2e", io)  # noqa: E731
    ref, ours = pair(mk, seed=3)
    assert torch.equal(ours.output_mask, ref.output_mask) and not ours.output_mask.all()
    torch.manual_seed(7)
    fresh = ek.FullyConnectedTensorProduct("3x0e+2x1o+1x2e", "0e+1o+2e", io)
    assert not torch.equal(fresh.weight, ref.weight)
    fresh.load_state_dict(ref.state_dict())  # e3nn checkpoint -> ours (strict)
    x, y = torch.randn(4, ref.irreps_in1.dim), torch.randn(4, ref.irreps_in2.dim)
    assert_close(fresh(x, y), ref(x, y), what="e3nn -> ours")
    torch.manual_seed(8)
    back = o3.FullyConnectedTensorProduct("3x0e+2x1o+1x2e", "0e+1o+2e", io)
    back.load_state_dict(fresh.state_dict())  # ours -> e3nn (strict)
    assert_close(back(x, y), ref(x, y), what="ours -> e3nn")


def test_tensor_product_bad_input(dtype64):
    tp = ek.FullyConnectedTensorProduct("2x0e+2x1o", "0e+1o", "3x0e+2x1o", shared_weights=False)
    x, y, w = torch.randn(5, 8), torch.randn(5, 4), torch.randn(5, tp.weight_numel)
    with pytest.raises(ValueError, match=r"x: expected last dimension 8"):
        tp(torch.randn(5, 7), y, w)
    with pytest.raises(ValueError, match=r"y: expected last dimension 4"):
        tp(x, torch.randn(5, 5), w)
    with pytest.raises(ValueError, match=r"x and y: batch dimensions"):
        tp(x, torch.randn(3, 4), w)
    with pytest.raises(ValueError, match=rf"weight: expected shape \(\.\.\., {tp.weight_numel}\)"):
        tp(x, y, torch.randn(5, tp.weight_numel - 1))
    with pytest.raises(ValueError, match=r"weight: required"):
        tp(x, y)
    with pytest.raises(TypeError, match=r"y: dtype torch.float32 does not match x"):
        tp(x, y.float(), w)
    with pytest.raises(ValueError, match=r"weight: expected 4 tensors \(one per weighted instruction\), got 1"):
        tp(x, y, [w])
    shared = ek.FullyConnectedTensorProduct("2x0e+2x1o", "0e+1o", "3x0e+2x1o", internal_weights=False)
    with pytest.raises(ValueError, match=rf"weight: expected shape \({tp.weight_numel},\) for shared weights"):
        shared(x, y, w)
    with pytest.raises(ValueError, match="irreps_in1 .* and irreps_in2 .* same number of irreps"):
        ek.ElementwiseTensorProduct("2x0e", "3x0e")
    with pytest.raises(ValueError, match="filter_ir_out"):
        ek.FullTensorProduct("1o", "1o", filter_ir_out=[3.5])


# --- Linear -------------------------------------------------------------------------------------
LINEAR_CASES = [
    (("3x0e+2x1o+1x2e+2x0e", "4x0e+3x1o+1x1e"), {}),
    (("3x0e+2x1o+1x2e+2x0e", "4x0e+3x1o+2x2e"), {"biases": True}),
    (("3x0e+2x1o+2x0e", "4x0e+3x1o+2x0o"), {"biases": [True, False, False], "path_normalization": "path"}),
    (("3x0e+2x1o+2x0e", "4x0e+3x1o"), {"instructions": [(0, 0), (1, 1)], "biases": True}),
    (("3x0e+2x1o", "4x0e+3x1o"), {"f_in": 2, "f_out": 3, "biases": True}),
    (("3x0e+2x1o", "4x0e+3x1o"), {"shared_weights": False}),
    (("3x0e+2x1o", "4x0e+3x1o"), {"internal_weights": False}),
    (("0x0e+2x1o", "4x0e+0x1o+1x1o+2x2e"), {}),
]


@pytest.mark.parametrize("args,kw", LINEAR_CASES)
def test_linear_parity(dtype64, args, kw):
    ref, ours = pair(lambda m: m.Linear(*args, **kw))
    assert list(ours.instructions) == list(ref.instructions)
    assert (ours.weight_numel, ours.bias_numel) == (ref.weight_numel, ref.bias_numel)
    sd_ref, sd = ref.state_dict(), ours.state_dict()
    assert list(sd) == list(sd_ref) and all(torch.equal(sd[k], sd_ref[k]) for k in sd_ref)
    with torch.no_grad():
        if ref.bias.numel():
            ref.bias.normal_()
            ours.bias.copy_(ref.bias)
    f = kw.get("f_in")
    x = torch.randn(5, *((f,) if f else ()), ref.irreps_in.dim, requires_grad=True)
    w = weight_for(ref, 5)
    extra = () if w is None else (w,)
    out_ref, out = ref(x, *extra), ours(x, *extra)
    assert_close(out, out_ref, what="linear output")
    params_ref = [t for t in (x, w) if t is not None] + [p for p in ref.parameters()]
    params = [t for t in (x, w) if t is not None] + [p for p in ours.parameters()]
    cot = torch.randn_like(out_ref)
    for a, b in zip(torch.autograd.grad(out, params, cot), torch.autograd.grad(out_ref, params_ref, cot)):
        assert_close(a, b, what="linear grad")


def test_linear_layout_and_errors(dtype64):
    torch.manual_seed(0)
    a = ek.Linear("3x0e+2x1o+2x2e", "2x0e+3x1o+1x2e", biases=True)
    torch.manual_seed(0)
    b = ek.Linear("3x0e+2x1o+2x2e", "2x0e+3x1o+1x2e", biases=True, layout="ir_mul")
    with torch.no_grad():
        a.bias.normal_()
        b.bias.copy_(a.bias)
    pi, po = ir_mul_permutation(a.irreps_in), ir_mul_permutation(a.irreps_out)
    x = torch.randn(4, a.irreps_in.dim)
    assert_close(b(x[:, pi]), a(x)[:, po], what="ir_mul linear")
    assert a(torch.randn(0, a.irreps_in.dim)).shape == (0, a.irreps_out.dim)
    with pytest.raises(ValueError, match=r"features: expected trailing shape \(19,\)"):
        a(torch.randn(4, 18))
    ext = ek.Linear("3x0e", "2x0e", internal_weights=False)
    with pytest.raises(ValueError, match=r"weight: expected shape \(6,\)"):
        ext(torch.randn(4, 3), torch.randn(7))
    with pytest.raises(ValueError, match="weight: required"):
        ext(torch.randn(4, 3))
    with pytest.raises(TypeError, match="weight: dtype torch.float32 does not match"):
        ext(torch.randn(4, 3), torch.randn(6, dtype=torch.float32))
    with pytest.raises(ValueError, match="biases: only scalar"):
        ek.Linear("1o", "1o", biases=[True])
    with pytest.raises(ValueError, match="f_in and f_out"):
        ek.Linear("1o", "1o", f_in=2)


@pytest.mark.parametrize("layout", ["mul_ir", "ir_mul"])
def test_frozen_linear_is_one_matrix_product_per_block(dtype64, layout):
    """Frozen weights (as in every calculator) give e3nn's numbers without a batched product per row."""
    ref, _ = pair(lambda m: m.Linear("3x0e+4x1o+2x2e", "2x0e+3x1o+5x2e"))
    torch.manual_seed(0)
    ours = ek.Linear("3x0e+4x1o+2x2e", "2x0e+3x1o+5x2e", layout=layout)
    with torch.no_grad():
        ours.weight.copy_(ref.weight)
    ours.requires_grad_(False)
    pi, po = ir_mul_permutation(ref.irreps_in), ir_mul_permutation(ref.irreps_out)
    x = torch.randn(7, ref.irreps_in.dim, requires_grad=True)
    out_ref = ref(x)
    cot = torch.randn_like(out_ref)
    (g_ref,) = torch.autograd.grad(out_ref, x, cot)
    xin = x.detach()[:, pi] if layout == "ir_mul" else x.detach()
    xin.requires_grad_(True)
    with torch.profiler.profile() as prof:
        out = ours(xin)
        (g,) = torch.autograd.grad(out, xin, cot[:, po] if layout == "ir_mul" else cot)
    if layout == "ir_mul":
        out, g = out[:, torch.argsort(po)], g[:, torch.argsort(pi)]
    assert_close(out, out_ref, what="frozen linear output")
    assert_close(g, g_ref, what="frozen linear input gradient")
    assert "aten::bmm" not in [e.name for e in prof.events()]


# --- spherical harmonics -----------------------------------------------------------------------
@pytest.mark.parametrize("args", [([0, 1, 2, 3], True, "integral"), ("0e+1o+2e", False, "component"),
                                  ("1o+2x2e+1x3o", True, "norm"), ([1, 1, 3], True, "integral"),
                                  ("0e+1e+2e", True, "component")])
def test_spherical_harmonics(dtype64, args):
    ref, ours = o3.SphericalHarmonics(*args), ek.SphericalHarmonics(*args)
    assert ours.irreps_out == ref.irreps_out and ours.irreps_in == ref.irreps_in
    assert list(ours.state_dict()) == list(ref.state_dict())
    v = torch.randn(7, 3, requires_grad=True)
    out_ref, out = ref(v), ours(v)
    assert_close(out, out_ref, what="sh")
    cot = torch.randn_like(out_ref)  # (not |Y|^2: it is constant on the sphere, its gradient is noise)
    assert_close(torch.autograd.grad(out, v, cot)[0], torch.autograd.grad(out_ref, v, cot)[0], what="sh grad")
    lay = ek.SphericalHarmonics(*args, layout="ir_mul")
    perm = ir_mul_permutation(ref.irreps_out)
    assert_close(lay(v), out_ref if perm is None else out_ref[:, perm], what="sh ir_mul")
    with pytest.raises(ValueError, match=r"x: expected last dimension 3"):
        ours(torch.randn(4, 2))


def test_ir_mul_permutation():
    assert ir_mul_permutation("0e+1o+2e") is None
    assert ir_mul_permutation("2x1o").tolist() == [0, 3, 1, 4, 2, 5]


def test_package_surface():
    assert ek.__version__ == "0.1.0"
    for name in ["TensorProduct", "FullyConnectedTensorProduct", "ElementwiseTensorProduct", "FullTensorProduct",
                 "Linear", "SphericalHarmonics", "from_e3nn", "accelerate", "TPProblem"]:
        assert hasattr(ek, name), name
    assert hasattr(ek, "TensorSquare") == hasattr(o3, "TensorSquare")
    assert "1 weights" in repr(ek.FullyConnectedTensorProduct("0e", "0e", "0e"))


def test_weight_view_for_instruction_after_an_unweighted_instruction(dtype64):
    ins = [(0, 0, 0, "uvw", True), (1, 1, 0, "uvu", False), (1, 0, 1, "uvu", True), (1, 1, 2, "uvv", True)]
    tp = ek.TensorProduct("2x0e+2x1o", "1x0e+2x1o", "2x0e+2x1o+2x1e", ins)
    views = list(tp.weight_views(yield_instruction=True))
    assert [i for i, _, _ in views] == [0, 2, 3]
    for i, _, view in views:  # each instruction's own weights, the unweighted one counted for nothing
        assert torch.equal(tp.weight_view_for_instruction(i), view)
    assert sum(v.numel() for _, _, v in views) == tp.weight_numel
