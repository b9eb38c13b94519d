"""equikernels.ops.cpu_assemble: output segments as weighted sums of path-result slices, both layouts, every order."""
import pytest
import torch

from equikernels.ops.cpu_assemble import assemble

# two results: r0 [z, 1+3+3, 4] with weights w0 [., 3, 4]; r1 [z, 3, 4] unweighted
# out: seg A (1 comp, 4 ch) <- r0 k0; seg B (3 comps) <- r0 k1..3 + r0 k4..6 + r1; seg C (5 comps): no source
SEGMENTS = ((0, 4, 1, ((0, 0, 1, 0, 0),)),
            (4, 4, 3, ((0, 1, 3, 0, 1), (0, 4, 3, 0, 2), (1, 0, 3, -1, 0))),
            (16, 4, 5, ()))
DIM = 36


def _explicit(r0, r1, w0, layout):
    z = r0.shape[0]
    a = r0[:, 0:1] * w0[:, 0:1]
    b = r0[:, 1:4] * w0[:, 1:2] + r0[:, 4:7] * w0[:, 2:3] + r1
    if layout == "mul_ir":  # [z, do, mul] -> rows of [mul, do]
        a, b = a.transpose(1, 2), b.transpose(1, 2)
    return torch.cat([a.reshape(z, -1), b.reshape(z, -1), r0.new_zeros(z, 20)], 1)


def _inputs(shared):
    z = 5
    r0 = torch.randn(z, 7, 4, dtype=torch.float64, requires_grad=True)
    r1 = torch.randn(z, 3, 4, dtype=torch.float64, requires_grad=True)
    w0 = torch.randn(1 if shared else z, 3, 4, dtype=torch.float64, requires_grad=True)
    return r0, r1, w0


@pytest.mark.parametrize("layout", ["ir_mul", "mul_ir"])
@pytest.mark.parametrize("shared", [False, True])
def test_values_and_first_derivatives(shared, layout):
    r0, r1, w0 = _inputs(shared)
    out = assemble(SEGMENTS, DIM, [r0, r1], [w0], layout)
    ref = _explicit(r0, r1, w0, layout)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-15)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (r0, r1, w0), g), torch.autograd.grad(ref, (r0, r1, w0), g)):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("layout", ["ir_mul", "mul_ir"])
@pytest.mark.parametrize("shared", [False, True])
def test_every_order(shared, layout):
    inputs = _inputs(shared)

    def fn(r0, r1, w0):
        return assemble(SEGMENTS, DIM, [r0, r1], [w0], layout)
    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)
