"""Input dtypes, shapes and strides of the e3nn-compatible modules as an e3nn user passes them: equal to
e3nn 0.6 where e3nn computes (float64), a one-line error naming the argument where e3nn or we refuse,
never a silent wrong result (eager on the CPU and kernel backends, and the TorchScript forms)."""
import copy

import pytest
import torch

import equikernels.nn as enn
from equikernels._compat import o3

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

D = torch.float64
INS = [(0, 0, 0, "uvu", True), (1, 0, 1, "uvu", True), (0, 1, 1, "uvu", True), (1, 1, 2, "uvu", True),
       (1, 1, 0, "uvu", True)]
ARGS = ("2x0e+2x1o", "0e+1o", "2x0e+2x1o+2x1e", INS)


def _external(backend=None):
    """(e3nn's, ours) channel-wise product with per-row external weights, float64."""
    torch.set_default_dtype(D)
    ref = o3.TensorProduct(*ARGS, shared_weights=False, internal_weights=False)
    ours = enn.TensorProduct(*ARGS, shared_weights=False, internal_weights=False, backend=backend)
    return ref, ours


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_external_weights_broadcast_strided_and_empty_match_e3nn(backend):
    ref, ours = _external(backend)
    nw = ref.weight_numel
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=D)  # noqa: E731
    cases = [
        (r(3, 1, 8), r(1, 4, 4), r(3, 4, nw)),  # leading dims broadcast as e3nn's
        (r(8, 6).t(), r(12, 5)[::2, 1:], r(nw, 6).t()),  # transposed and sliced views
        (r(1, 8).expand(5, 8), r(5, 4), r(5, nw)),  # a stride-0 row
        (r(0, 8), r(0, 4), r(0, nw)),  # no rows
    ]
    for x, y, w in cases:
        grads = []
        for m in (ref, ours):
            xs, ys, ws = (t.detach().clone().requires_grad_() for t in (x, y, w))
            out = m(xs, ys, ws)
            grads.append((out,) + torch.autograd.grad(out.pow(2).sum(), (xs, ys, ws)))
        for a, b in zip(grads[1], grads[0]):
            assert a.shape == b.shape and a.dtype == b.dtype
            assert a.numel() == 0 or _rel(a, b) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_module_gives_e3nn_dtype_and_values(dtype):
    torch.manual_seed(0)
    ref = o3.FullyConnectedTensorProduct("3x0e+2x1o", "0e+1o", "2x0e+3x1o")
    ours = enn.FullyConnectedTensorProduct("3x0e+2x1o", "0e+1o", "2x0e+3x1o")
    ours.load_state_dict(ref.state_dict(), strict=False)
    x, y = torch.randn(6, 9), torch.randn(6, 4)
    a = ours.to(dtype)(x.to(dtype), y.to(dtype))
    b = copy.deepcopy(ref).to(dtype)(x.to(dtype), y.to(dtype))
    assert a.dtype == b.dtype == dtype
    assert _rel(a.double(), ref(x, y).double()) < 3e-2


@pytest.mark.parametrize("bad", [torch.int64, torch.complex128])
def test_non_float_external_weight_is_named_with_float64_inputs(bad):
    _, ours = _external("cpu")
    x, y = torch.randn(5, 8, dtype=D), torch.randn(5, 4, dtype=D)
    w = torch.ones(5, ours.weight_numel, dtype=bad)
    with pytest.raises(TypeError, match=rf"^weight: expected a floating-point tensor, got {bad}$"):
        ours(x, y, w)


@pytest.mark.filterwarnings("ignore:Complex modules:UserWarning")
def test_complex_module_with_float64_inputs_names_the_weight():
    ours = enn.FullyConnectedTensorProduct("3x0e+2x1o", "0e+1o", "2x0e+3x1o").to(torch.complex128)
    with pytest.raises(TypeError, match=r"^weight: expected a floating-point tensor, got torch.complex128$"):
        ours(torch.randn(5, 9, dtype=D), torch.randn(5, 4, dtype=D))


def test_scripted_product_refuses_integer_inputs():
    # weightless: the Wigner-3j blocks would be cast to int64 (1/sqrt(3) -> 0), a silent wrong result
    ref = o3.ElementwiseTensorProduct("3x0e+2x1o", "3x0e+2x1o")
    scripted = torch.jit.script(enn.ElementwiseTensorProduct("3x0e+2x1o", "3x0e+2x1o"))
    x = torch.randn(5, 9)
    assert _rel(scripted(x, x), ref(x, x)) < 1e-6
    for t in ((x * 3).long(), x > 0):
        with pytest.raises(torch.jit.Error, match=r"x: expected a floating-point tensor, got an integer or bool"):
            scripted(t, t)


def test_scripted_product_names_a_mismatched_dtype():
    scripted = torch.jit.script(enn.FullyConnectedTensorProduct("3x0e+2x1o", "0e+1o", "2x0e+3x1o"))
    x, y = torch.randn(5, 9), torch.randn(5, 4)
    with pytest.raises(torch.jit.Error, match=r"y: dtype does not match x's"):
        scripted(x, y.double())
    with pytest.raises(torch.jit.Error, match=r"weight: dtype does not match x's"):
        scripted(x.double(), y.double())  # float32 weights, as e3nn's scripted module refuses too


def test_scripted_linear_refuses_integer_features():
    torch.manual_seed(0)
    ref = o3.Linear("3x0e+2x1o", "2x0e+3x1o", biases=True)
    ours = enn.Linear("3x0e+2x1o", "2x0e+3x1o", biases=True)
    ours.load_state_dict(ref.state_dict())
    scripted = torch.jit.script(ours)
    x = torch.randn(5, 9)
    assert _rel(scripted(x), ref(x)) < 1e-6
    with pytest.raises(torch.jit.Error, match=r"features: expected a floating-point tensor, got an integer or bool"):
        scripted((x * 3).long())  # the weights would be truncated to integers
