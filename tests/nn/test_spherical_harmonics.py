"""The product path of ``SphericalHarmonics`` (CUDA's) against e3nn, run on the CPU by adding it to
``PRODUCT_DEVICES``: values and derivatives to second order, autocast, pickling, fallbacks."""
import pickle

import pytest
import torch

import equikernels as ek
from equikernels._compat import o3
from equikernels.nn import spherical_harmonics as shm

CASES = [([0, 1, 2, 3], True, "component"), ([0, 1, 2, 3], True, "integral"), ("0e+1o+2e", False, "component"),
         ("1o+2x2e+1x3o", True, "norm"), ([1, 1, 3], True, "integral"), ([0, 1, 2, 3, 4], True, "component"),
         ([4, 2], False, "norm"), ("1o", True, "component")]


@pytest.fixture
def product_path(monkeypatch):
    monkeypatch.setattr(shm, "PRODUCT_DEVICES", shm.PRODUCT_DEVICES + ("cpu",))


def _rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _three_orders(module, v, cot, cot2):
    out = module(v)
    (g,) = torch.autograd.grad(out, v, cot, create_graph=True)
    (h,) = torch.autograd.grad(g, v, cot2)
    return out, g, h


@pytest.mark.parametrize("args", CASES)
def test_matches_e3nn_to_second_order(product_path, args):
    ref = o3.SphericalHarmonics(*args)
    ours = ek.SphericalHarmonics(*args)
    assert ours._poly is not None
    torch.manual_seed(1)
    v = torch.randn(40, 3, dtype=torch.float64, requires_grad=True)
    dim = ref.irreps_out.dim
    cot, cot2 = torch.randn(40, dim, dtype=torch.float64), torch.randn(40, 3, dtype=torch.float64)
    for what, a, b in zip(("values", "gradient", "second derivative"),
                          _three_orders(ours, v, cot, cot2), _three_orders(ref, v, cot, cot2)):
        assert _rel(a, b) <= 1e-12, f"{args} {what}: relative error {_rel(a, b):.2e}"


def test_takes_the_product_path(product_path):
    ours = ek.SphericalHarmonics([0, 1, 2, 3], True, "component")
    v = torch.randn(10, 3, dtype=torch.float64)
    with torch.profiler.profile() as prof:
        ours(v)
    names = [e.name for e in prof.events()]
    assert "aten::addmm" in names
    shm.PRODUCT_DEVICES = ("cuda",)  # restored by the fixture
    with torch.profiler.profile() as prof:
        ours(v)
    assert "aten::addmm" not in [e.name for e in prof.events()]


def test_gradcheck(product_path):
    ours = ek.SphericalHarmonics([0, 1, 2, 3], True, "component")
    v = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ours, (v,))
    assert torch.autograd.gradgradcheck(ours, (v,))


def test_float32_and_batch_shape(product_path):
    ref, ours = o3.SphericalHarmonics([0, 1, 2, 3], True, "component"), ek.SphericalHarmonics([0, 1, 2, 3], True,
                                                                                                  "component")
    v = torch.randn(2, 5, 3)
    out = ours(v)
    assert out.dtype == torch.float32 and out.shape == (2, 5, 16)
    assert _rel(out, ref(v)) <= 1e-6


def test_autocast_keeps_float32(product_path):
    ref, ours = o3.SphericalHarmonics([0, 1, 2, 3], True, "component"), ek.SphericalHarmonics([0, 1, 2, 3], True,
                                                                                                  "component")
    v = torch.randn(64, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ours(v)
    assert out.dtype == torch.float32
    assert _rel(out, ref(v)) <= 1e-6


def test_zero_vector_as_e3nn(product_path):
    for normalize in (True, False):
        ref = o3.SphericalHarmonics([0, 1, 2], normalize, "component")
        ours = ek.SphericalHarmonics([0, 1, 2], normalize, "component")
        v = torch.zeros(3, 3, dtype=torch.float64)
        assert _rel(ours(v), ref(v)) <= 1e-12


def test_pickled_and_older_pickles(product_path):
    ours = ek.SphericalHarmonics([0, 1, 2, 3], True, "component")
    v = torch.randn(8, 3, dtype=torch.float64)
    ours(v)
    assert ours._poly_on  # the per-device copies made
    again = pickle.loads(pickle.dumps(ours))
    assert again._poly_on == {}  # not saved: made again on first use
    assert torch.equal(again(v), ours(v))
    state = dict(ours.__dict__)
    del state["_poly"], state["_poly_on"]  # as pickled before the product path existed
    old = shm.SphericalHarmonics.__new__(shm.SphericalHarmonics)
    old.__setstate__(state)
    assert old._poly is not None and torch.equal(old(v), ours(v))


def test_beyond_the_product_path_uses_e3nn(product_path):
    ours = ek.SphericalHarmonics([5], True, "component")
    assert ours._poly is None
    v = torch.randn(4, 3, dtype=torch.float64)
    assert _rel(ours(v), o3.SphericalHarmonics([5], True, "component")(v)) <= 1e-12
    half = ek.SphericalHarmonics([1, 2], True, "component")
    out = half(torch.randn(4, 3).to(torch.bfloat16))
    assert out.dtype == torch.bfloat16


@pytest.mark.gpu
def test_float32_under_tf32_cuda():
    ref, ours = o3.SphericalHarmonics([0, 1, 2, 3], True, "component"), ek.SphericalHarmonics([0, 1, 2, 3], True,
                                                                                                  "component")
    v = torch.randn(4096, 3, device="cuda", requires_grad=True)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        out = ours(v)
        (g,) = torch.autograd.grad(out, v, torch.ones_like(out))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    ref = ref.to("cuda")
    out_ref = ref(v)
    (g_ref,) = torch.autograd.grad(out_ref, v, torch.ones_like(out_ref))
    assert _rel(out, out_ref) <= 1e-6 and _rel(g, g_ref) <= 1e-5


def test_traced_whole_by_torch_compile(product_path):
    ref = ek.SphericalHarmonics([0, 1, 2, 3], True, "component")
    fresh = ek.SphericalHarmonics([0, 1, 2, 3], True, "component")  # its coefficient copy made inside the trace
    v = torch.randn(20, 3, requires_grad=True)
    out = torch.compile(fresh, backend="aot_eager", fullgraph=True)(v)
    assert _rel(out, ref(v)) <= 1e-6
    (g,) = torch.autograd.grad(out.sum(), v)
    (g_ref,) = torch.autograd.grad(ref(v).sum(), v)
    assert _rel(g, g_ref) <= 1e-5
