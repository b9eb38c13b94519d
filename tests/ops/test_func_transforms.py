"""The ops under torch.func transforms (vmap, grad, jacrev, jvp, functional ensembles) and torch.jit.trace
give the untransformed calls' values and gradients on every backend, float64."""
import copy
import io

import pytest
import torch
from torch.autograd.functional import jacobian
from torch.func import functional_call, grad, jacrev, jvp, stack_module_state, vmap

from equikernels import nn as enn
from equikernels.ops import conv as conv_ops
from equikernels.ops.conv import tensor_product_conv
from equikernels.ops.silu import silu
from equikernels.ops.tp import tensor_product

F64 = dict(dtype=torch.float64)
TOL = dict(rtol=1e-12, atol=1e-12)
BACKENDS = ["cpu", "reference", "triton"]
SRC, DST = torch.tensor([0, 1, 2, 3, 4, 0, 2]), torch.tensor([1, 2, 3, 4, 0, 4, 4])


def _module(cls=enn.TensorProduct, backend=None, **kw):
    fc = enn.FullyConnectedTensorProduct("3x0e+2x1o", "0e+1o", "2x0e+3x1o")
    ins = [(i.i_in1, i.i_in2, i.i_out, i.connection_mode, i.has_weight) for i in fc.instructions]
    return cls("3x0e+2x1o", "0e+1o", "2x0e+3x1o", ins, backend=backend, **kw).double()


def _operands(rows=(5, 7)):
    torch.manual_seed(0)
    p = _module(shared_weights=False, internal_weights=False).problem
    n, e = rows
    return p, torch.randn(n, 9, **F64), torch.randn(e, 4, **F64), torch.randn(e, p.weight_numel, **F64)


def _close(a, b):
    for s, t in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        torch.testing.assert_close(s, t, **TOL)


def _check(f, args, eager_f=None):
    """vmap over a leading batch, grad, jacrev and jvp of ``f`` against eager autograd (the Jacobian of
    ``eager_f``, default f: the Triton interpreter is slow for one backward per output entry)."""
    batched = tuple(torch.stack([a, 2 * a]) for a in args)
    _close(vmap(f)(*batched), torch.stack([f(*a) for a in zip(*batched)]))
    leaves = [a.clone().requires_grad_() for a in args]
    _close(grad(lambda *a: f(*a).pow(2).sum(), argnums=(0, 1, 2))(*args),
           torch.autograd.grad(f(*leaves).pow(2).sum(), leaves))
    eager_jac = jacobian(eager_f or f, args)
    _close(jacrev(f, argnums=(0, 1, 2))(*args), eager_jac)
    tangents = tuple(torch.randn_like(a) for a in args)
    expected = sum(torch.tensordot(j, t, dims=t.dim()) for j, t in zip(eager_jac, tangents))
    _close(jvp(f, args, tangents)[1], expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_product_op_under_torch_func(backend):
    p, x, y, w = _operands((4, 4))
    _check(lambda x, y, w: tensor_product(p, x, y, w, backend=backend), (x, y, w),
           lambda x, y, w: tensor_product(p, x, y, w, backend="reference"))
    # operands captured from outside the transform are plain tensors: the transform is still active
    out = vmap(lambda a: a * tensor_product(p, x, y, w, backend=backend))(torch.ones(2, **F64))
    _close(out, tensor_product(p, x, y, w, backend=backend).expand(2, -1, -1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_convolution_op_under_torch_func(backend):
    p, x, y, w = _operands()
    _check(lambda x, y, w: tensor_product_conv(p, x, y, w, SRC, DST, backend=backend), (x, y, w),
           lambda x, y, w: tensor_product_conv(p, x, y, w, SRC, DST, backend="reference"))


def test_chunked_cpu_convolution_under_vmap(monkeypatch):
    p, x, y, w = _operands()
    monkeypatch.setattr(conv_ops, "CPU_CHUNK_BYTES", 64)  # a few edges per chunk (added in place)
    f = lambda y: tensor_product_conv(p, x, y, w, SRC, DST, backend="cpu")  # noqa: E731
    _close(vmap(f)(torch.stack([y, 2 * y])), torch.stack([f(y), f(2 * y)]))


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_convolution_module_ensemble_and_grad(backend):
    torch.manual_seed(0)
    mods = [_module(enn.TensorProductConv, backend) for _ in range(3)]
    _, x, y, _ = _operands()
    params, bufs = stack_module_state(mods)
    base = copy.deepcopy(mods[0]).to("meta")
    out = vmap(lambda p, b: functional_call(base, (p, b), (x, y), {"src": SRC, "dst": DST}))(params, bufs)
    _close(out, torch.stack([m(x, y, src=SRC, dst=DST) for m in mods]))
    m = mods[0]
    g = grad(lambda p: functional_call(m, p, (x, y), {"src": SRC, "dst": DST}).pow(2).sum())(
        {k: v.detach() for k, v in m.named_parameters()})
    _close(g["weight"], torch.autograd.grad(m(x, y, src=SRC, dst=DST).pow(2).sum(), m.weight)[0])


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_backward_of_a_recorded_product_under_vmap(backend):
    # vmap over autograd.grad of a graph recorded eagerly: rows of a Jacobian, first and second order
    p, x, y, w = _operands((4, 4))
    x.requires_grad_()
    w.requires_grad_()
    out = tensor_product(p, x, y, w, backend=backend)
    gx = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)[0]
    for t, v in ((out, torch.randn(3, *out.shape, **F64)), (gx, torch.randn(3, *gx.shape, **F64))):
        got = vmap(lambda v: torch.autograd.grad(t, (x, w), v, retain_graph=True))(v)
        rows = [torch.autograd.grad(t, (x, w), r, retain_graph=True) for r in v]
        _close(got, tuple(torch.stack(c) for c in zip(*rows)))


def test_symmetric_contraction_table_under_torch_func():
    from equikernels.models.builder import coupled_u_matrices
    from equikernels.models.symmetric_contraction import SymmetricContraction
    torch.manual_seed(0)
    us = [[u.double() for u in per] for per in coupled_u_matrices("2x0e+2x1o", "2x0e+2x1o", 2)]
    sc = SymmetricContraction(2, [0, 1], [0, 1], [2, 2], 2, us, "ir_mul", backend="reference").double()
    x, el = torch.randn(3, 8, **F64), torch.tensor([0, 1, 0])
    _close(vmap(lambda t: sc(t, el))(torch.stack([x, 2 * x])), torch.stack([sc(x, el), sc(2 * x, el)]))
    leaf = x.clone().requires_grad_()
    _close(grad(lambda t: sc(t, el).pow(2).sum())(x), torch.autograd.grad(sc(leaf, el).pow(2).sum(), leaf)[0])


def test_silu_under_torch_jit_trace_and_transforms():
    class Act(torch.nn.Module):
        def forward(self, z):
            return silu(2 * z)

    z = torch.randn(6, **F64, requires_grad=True)
    traced = torch.jit.trace(Act(), (z,))  # (its check traces twice more and compares the graphs)
    buf = io.BytesIO()
    torch.jit.save(traced, buf)
    buf.seek(0)
    loaded = torch.jit.load(buf)
    _close(loaded(z), torch.nn.functional.silu(2 * z))
    _close(torch.autograd.grad(loaded(z).sum(), z)[0], torch.autograd.grad(silu(2 * z).sum(), z)[0])
    # a captured tensor that requires grad, inside a transform
    _close(vmap(lambda a: a * silu(z))(torch.ones(2, **F64)), torch.nn.functional.silu(z).expand(2, -1))


def test_symmetric_contraction_weights_under_torch_func_on_the_cpu():
    from equikernels.models.builder import coupled_u_matrices
    from equikernels.models.symmetric_contraction import SymmetricContraction
    torch.manual_seed(0)
    us = [[u.double() for u in per] for per in coupled_u_matrices("2x0e+2x1o", "2x0e+2x1o", 2)]
    sc = SymmetricContraction(2, [0, 1], [0, 1], [2, 2], 2, us, "ir_mul", backend="cpu").double()
    x, el = torch.randn(3, 8, **F64), torch.tensor([0, 1, 0])
    params = {k: v.detach() for k, v in sc.named_parameters()}
    got = grad(lambda p: functional_call(sc, p, (x, el)).pow(2).sum())(params)
    expected = torch.autograd.grad(sc(x, el).pow(2).sum(), list(sc.parameters()))
    _close(tuple(got[k] for k, _ in sc.named_parameters()), tuple(expected))


def test_triton_matmul_with_captured_operands_under_vmap():
    from equikernels.ops.matmul import matmul
    x, w = torch.randn(5, 16, **F64), torch.randn(16, 16, **F64)
    _close(vmap(lambda a: a * matmul(x, w, backend="triton"))(torch.ones(2, **F64)), (x @ w).expand(2, -1, -1))
