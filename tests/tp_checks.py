"""Shared checks of generated tensor-product kernels against the reference backend (float64)."""
import torch

from equikernels.ops import tensor_product
from equikernels.problem import TPProblem


def _inputs(p: TPProblem, rows: int, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)  # noqa: E731
    x, y = mk(rows, p.dim_in1), mk(rows, p.dim_in2)
    w = mk(p.weight_numel) if p.shared_weights else mk(rows, p.weight_numel)
    return x, y, w


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def check_against_reference(p: TPProblem, rows: int, dtype, layout: str, device: str = "cpu"):
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    x, y, w = _inputs(p, rows, dtype, device)
    # reference in float64 from the same (rounded) inputs
    xr, yr, wr = (t.double().requires_grad_() for t in (x, y, w))
    x, y, w = (t.requires_grad_() for t in (x, y, w))
    out = tensor_product(p, x, y, w, layout=layout, backend="triton")
    ref = tensor_product(p, xr, yr, wr, layout=layout, backend="reference")
    assert not out.isnan().any(), "kernel left output elements unwritten"
    assert _rel(out, ref) <= tol, f"forward: {_rel(out, ref):.2e}"
    g = torch.randn_like(ref)
    inputs = [t for t in (x, y, w) if t.numel()]
    refs = [t for t in (xr, yr, wr) if t.numel()]
    grads = torch.autograd.grad(out, inputs, g.to(dtype))
    grads_ref = torch.autograd.grad(ref, refs, g)
    for name, a, b in zip("xyw", grads, grads_ref):
        assert not a.isnan().any(), f"grad {name}: unwritten elements"
        assert _rel(a, b) <= tol, f"grad {name}: {_rel(a, b):.2e}"


def _double_backward(fn, x, y, w):
    out = fn(x, y, w)
    g = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    ins = [t for t in (x, y, w) if t.numel()]
    grads = torch.autograd.grad((out * g).sum(), ins, create_graph=True)
    loss = sum((gr * gr).sum() + gr.sin().sum() for gr in grads)
    return torch.autograd.grad(loss, ins)
