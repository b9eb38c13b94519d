"""An e3nn Linear converted by accelerate / from_e3nn takes the same one-matmul-per-block path as a
Linear built directly (not the general per-call einsum), with e3nn's numbers."""
import torch

import equikernels as ek
from equikernels._compat import o3


def test_converted_linear_takes_the_matmul_path(single_thread):
    torch.manual_seed(0)
    lin = o3.Linear("5x0e+3x1o", "4x0e+2x1o")
    model = torch.nn.Sequential(lin)
    ek.accelerate(model)
    new = model[0]
    assert new._fast_plan() is not None
    x = torch.randn(6, lin.irreps_in.dim, dtype=torch.float64)
    with torch.no_grad():
        ref = lin.double()(x)
    new.double()
    calls = []
    fast = type(new)._fast
    type(new)._fast = lambda self, *a: calls.append(1) or fast(self, *a)
    try:
        out = new(x)
    finally:
        type(new)._fast = fast
    assert calls and torch.allclose(out, ref, rtol=1e-12, atol=1e-12)


def test_linear_does_not_keep_its_input_alive(single_thread):
    """With trainable weights, a Linear over scalar and l > 0 blocks saves copies of its blocks for the
    weight gradient, not views that keep the whole input tensor alive until the backward."""
    import weakref  # noqa: PLC0415

    torch.manual_seed(0)
    lin = ek.Linear("4x0e+3x1o+2x2e", "5x0e+2x1o+2x2e")
    x = torch.randn(6, lin.irreps_in.dim)
    freed = []
    weakref.finalize(x.untyped_storage(), freed.append, True)
    out = lin(x)
    del x
    assert freed, "the input is still referenced by the autograd graph"
    out.sum().backward()
    assert lin.weight.grad is not None
