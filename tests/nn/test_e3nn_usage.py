"""The e3nn-compatible modules as e3nn users drive them: torch.func transforms (vmap, grad, jacrev,
jvp, model ensembles) give e3nn's values on every backend, float64."""
import copy
import io

import pytest
import torch
from e3nn import o3
from torch.func import functional_call, grad, jacrev, jvp, stack_module_state, vmap

import equikernels
from equikernels import nn as enn
from equikernels._compat import default_dtype

F64 = dict(dtype=torch.float64)


def _pair(backend):
    torch.manual_seed(0)
    with default_dtype(torch.float64):  # e3nn's constants are exact only when built in float64
        ref = o3.FullyConnectedTensorProduct("3x0e+2x1o", "0e+1o", "2x0e+3x1o")
    ours = enn.FullyConnectedTensorProduct("3x0e+2x1o", "0e+1o", "2x0e+3x1o", backend=backend).double()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_tensor_product_under_torch_func(backend):
    ref, ours = _pair(backend)
    x, y = torch.randn(4, 9, **F64), torch.randn(4, 4, **F64)
    torch.testing.assert_close(vmap(ours)(x, y), vmap(ref)(x, y), rtol=1e-12, atol=1e-12)
    for a, b in zip(jacrev(ours, argnums=(0, 1))(x[0], y[0]), jacrev(ref, argnums=(0, 1))(x[0], y[0])):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad(lambda t: ours(t, y).pow(2).sum())(x), grad(lambda t: ref(t, y).pow(2).sum())(x),
                               rtol=1e-12, atol=1e-12)
    tangent = torch.ones_like(x)
    torch.testing.assert_close(jvp(lambda t: ours(t, y), (x,), (tangent,))[1],
                               jvp(lambda t: ref(t, y), (x,), (tangent,))[1], rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not hasattr(o3, "TensorSquare"), reason="this e3nn has no TensorSquare")
def test_tensor_square_under_torch_func():
    torch.manual_seed(0)
    with default_dtype(torch.float64):
        ref = o3.TensorSquare("2x0e+2x1o")
    ours = enn.from_e3nn(copy.deepcopy(ref))
    x = torch.randn(3, 8, **F64)
    torch.testing.assert_close(vmap(ours)(x), vmap(ref)(x), rtol=1e-12, atol=1e-12)


def test_ensemble_under_torch_func():
    # a model ensemble: the weights stacked and vmapped
    torch.manual_seed(0)
    with default_dtype(torch.float64):
        refs = [o3.FullyConnectedTensorProduct("2x0e+1o", "0e+1o", "2x0e+1o") for _ in range(3)]
    ours = [enn.from_e3nn(copy.deepcopy(m)) for m in refs]
    x, y = torch.randn(4, 5, **F64), torch.randn(4, 4, **F64)

    def ensemble(mods):
        params, bufs = stack_module_state(mods)
        base = copy.deepcopy(mods[0]).to("meta")
        return vmap(lambda p, b: functional_call(base, (p, b), (x, y)))(params, bufs)

    torch.testing.assert_close(ensemble(ours), ensemble(refs), rtol=1e-12, atol=1e-12)


def test_transformed_tensor_product_keeps_dtype_rules():
    _, ours = _pair("reference")
    ours.float()
    x, y = torch.randn(4, 9), torch.randn(4, 4)
    assert vmap(ours)(x, y).dtype == torch.float32
    with pytest.raises(TypeError, match="float64"):
        vmap(ours)(x.double(), y.double())
    assert equikernels.TensorProduct is enn.TensorProduct


def test_scripted_float64_product_is_exact_under_a_float32_default():
    # built under the usual float32 default dtype, then made float64: the TorchScript form uses the
    # exact coefficients, as the eager path does
    torch.manual_seed(0)
    tp = enn.FullyConnectedTensorProduct("2x0e+2x1o+1x2e", "0e+1o+2e", "2x0e+2x1o+2x2e").double()
    x, y = torch.randn(5, 13, **F64), torch.randn(5, 9, **F64)
    torch.testing.assert_close(torch.jit.script(tp)(x, y), tp(x, y), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("frozen", [False, True])
def test_linear_under_torch_jit_trace(frozen):
    # a traced Linear reads its weight (caches of an earlier call do not enter the trace as constants)
    torch.manual_seed(0)
    lin = enn.Linear("2x0e+1o", "2x0e+1o").double().requires_grad_(not frozen)
    x = torch.randn(4, 5, **F64)
    lin(x)
    traced = torch.jit.trace(lin, (x,))  # (its check runs the module twice more and compares the graphs)
    new = enn.Linear("2x0e+1o", "2x0e+1o").double().state_dict()
    traced.load_state_dict(new)
    lin.load_state_dict(new)
    torch.testing.assert_close(traced(x), lin(x), rtol=1e-12, atol=1e-12)


def test_spherical_harmonics_product_path_under_torch_jit_trace(monkeypatch):
    from equikernels.nn import spherical_harmonics as shm
    monkeypatch.setattr(shm, "PRODUCT_DEVICES", shm.PRODUCT_DEVICES + ("cpu",))  # the CUDA path, here
    sh = enn.SphericalHarmonics([0, 1, 2], True)
    v = torch.randn(6, 3, **F64)
    traced = torch.jit.trace(sh, (v,))  # its check compares two more traces
    torch.testing.assert_close(traced(v), o3.SphericalHarmonics([0, 1, 2], True)(v), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_tensor_product_under_torch_jit_trace(backend):
    ref, ours = _pair(backend)
    x, y = torch.randn(4, 9, **F64), torch.randn(4, 4, **F64)
    traced = torch.jit.trace(ours, (x, y))  # (its check traces twice more and compares the graphs)
    buf = io.BytesIO()
    torch.jit.save(traced, buf)
    buf.seek(0)
    x2, y2 = torch.randn(6, 9, **F64), torch.randn(6, 4, **F64)
    torch.testing.assert_close(torch.jit.load(buf)(x2, y2), ref(x2, y2), rtol=1e-12, atol=1e-12)
