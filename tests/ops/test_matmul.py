"""equikernels.ops.matmul: the radial MLPs' products against float64 products on fresh inputs,
outputs poisoned, every tile shape the planner picks, derivatives of any order exact."""
import pytest
import torch

from equikernels.models.radial import RadialMLP
from equikernels.ops import matmul as MM


@pytest.fixture
def poisoned(monkeypatch):
    """Outputs of the op start as NaN: every element must be written."""
    empty = torch.empty
    monkeypatch.setattr(MM.torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))


# (rows, K, N): each config branch, ragged tiles in every dimension
SHAPES = [(203, 64, 40), (77, 24, 130), (130, 300, 48), (5, 16, 16), (150, 40, 300)]


def _act(x, act):
    return torch.nn.functional.silu(x) if act else x


@pytest.mark.parametrize("act", [None, "silu"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matches_the_float64_product(m, k, n, dtype, act, device, poisoned):
    x = (2 * torch.randn(m, k, dtype=dtype, device=device)).requires_grad_()
    w = torch.randn(k, n, dtype=dtype, device=device) / k ** 0.5
    g = torch.randn(m, n, dtype=dtype, device=device)
    assert MM.kernel_available(x, w, "triton")
    out = MM.matmul(x, w, "triton", act)
    (gx,) = torch.autograd.grad(out, x, g)  # with SiLU: its derivative applied by the kernel
    x64 = x.detach().double().requires_grad_()
    exact = _act(x64, act) @ w.double()
    (gexact,) = torch.autograd.grad(exact, x64, g.double())
    tol = 1e-12 if dtype == torch.float64 else 3e-6
    for ours, ref in ((out, exact), (gx, gexact)):
        torch.testing.assert_close(ours.double(), ref.detach(), rtol=0, atol=tol * ref.abs().max().item())


def test_strided_operands(device):
    x = torch.randn(48, 100, dtype=torch.float64, device=device)[:, ::2][:, :40]  # row stride 100, column stride 2
    w = torch.randn(64, 40, dtype=torch.float64, device=device).t()  # [40, 64], column-major
    torch.testing.assert_close(MM.matmul(x, w, "triton"), x @ w, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("act", [None, "silu"])
def test_each_order_is_exact_autograd(act, device):
    x = torch.randn(9, 20, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(20, 18, dtype=torch.float64, device=device, requires_grad=True)
    f = lambda a, b: MM.matmul(a, b, "triton", act)  # noqa: E731
    assert type(f(x, w).grad_fn).__name__ == "_MatMulBackward"
    g = torch.randn(9, 18, dtype=torch.float64, device=device)
    exact = torch.autograd.grad(_act(x, act) @ w, (x, w), g)
    for create_graph in (False, True):  # the kernels, then the recorded formulas
        ours = torch.autograd.grad(f(x, w), (x, w), g, create_graph=create_graph)
        for a, b in zip(ours, exact):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.autograd.gradcheck(f, (x, w), fast_mode=True)
    torch.autograd.gradgradcheck(f, (x, w), fast_mode=True)


def test_where_torch_runs(device):
    x, w = torch.randn(10, 32, device=device), torch.randn(32, 32, device=device)
    # automatic: float32 on CUDA only
    assert MM.kernel_available(x, w) == (device.type == "cuda") and not MM.kernel_available(x.double(), w.double())
    assert not MM.kernel_available(x, w.requires_grad_())  # automatic: constant weights only
    assert MM.kernel_available(x, w, "triton")
    w = w.detach()
    narrow = torch.randn(10, 8, device=device), torch.randn(8, 32, device=device)
    assert not MM.kernel_available(*narrow, "triton")  # K below tl.dot's 16
    assert not MM.kernel_available(x.half(), w.half(), "triton")
    assert not MM.kernel_available(x, w.double(), "triton")
    x, w = x.cpu(), w.cpu()  # automatic on the CPU: torch's product
    assert MM.matmul(x, w).grad_fn is None and torch.equal(MM.matmul(x, w), x @ w)
    assert torch.equal(MM.matmul(x, w, act="silu"), torch.nn.functional.silu(x) @ w)
    with pytest.raises(ValueError, match="act"):
        MM.matmul(x, w, act="relu")


def test_config_per_shape():
    assert MM.config(64, 128, torch.float32)[4] == "ieee" and MM.config(1280, 64, torch.float32)[4] == "tf32x3"
    assert MM.config(1280, 64, torch.float64)[4] == "ieee"
    # deep products of few rows: smaller row tiles (more programs)
    assert MM.config(1280, 64, torch.float32, rows=40_000)[0] == 64 and MM.config(1280, 64, torch.float32)[0] == 128
    assert MM.config(1280, 64, torch.float32, rows=400_000)[0] == 128
    assert MM.config(1280, 64, torch.float32, tf32=False)[4] == "ieee"  # no TF32 tensor cores
    # a narrow input feeding a wide output: row programs on tensor cores; else tiles
    assert MM.config(64, 1280, torch.float32)[4:] == ("tf32x3", True)
    assert not MM.config(64, 1280, torch.float32, tf32=False)[5] and not MM.config(256, 1280, torch.float32)[5]
    assert not MM.config(64, 1280, torch.float64)[5] and not MM.config(64, 128, torch.float32)[5]


def test_radial_mlp_runs_its_products_through_the_kernel(device):
    mlp = RadialMLP([8, 32, 32, 48], "silu").to(device=device, dtype=torch.float64)
    x = torch.randn(70, 8, dtype=torch.float64, device=device, requires_grad=True)
    ref = mlp(x)
    (gref,) = torch.autograd.grad(ref.square().sum(), x)
    mlp.backend = "triton"
    out = mlp(x)
    assert type(out.grad_fn).__name__ == "_MatMulBackward"
    (g,) = torch.autograd.grad(out.square().sum(), x)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, gref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("act", [None, "silu"])
def test_no_rows(act, device):
    # a structure without edges (a single atom): empty products and gradients
    x = torch.randn(0, 32, device=device, requires_grad=True)
    w = torch.randn(32, 48, device=device)
    out = MM.matmul(x, w, "triton", act)
    (gx,) = torch.autograd.grad(out, x, torch.ones_like(out))
    assert out.shape == (0, 48) and gx.shape == (0, 32)


@pytest.mark.parametrize("act", [None, "silu"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("m,k,n", [(203, 64, 40), (130, 300, 48), (150, 40, 300)])
def test_paired_rows(m, k, n, dtype, act, device, poisoned):
    """``paired``: the product written as rows m and M + m; the backward adds both rows' cotangents
    as it loads them (tiles and row programs, SiLU's derivative epilogue)."""
    x = (2 * torch.randn(m, k, dtype=dtype, device=device)).requires_grad_()
    w = torch.randn(k, n, dtype=dtype, device=device) / k ** 0.5
    g = torch.randn(2 * m, n, dtype=dtype, device=device)
    out = MM.matmul(x, w, "triton", act, paired=True)
    assert out.shape == (2 * m, n) and type(out.grad_fn).__name__ == "_MatMulBackward"
    (gx,) = torch.autograd.grad(out, x, g)
    x64 = x.detach().double().requires_grad_()
    y = _act(x64, act) @ w.double()
    exact = torch.cat((y, y))
    (gexact,) = torch.autograd.grad(exact, x64, g.double())
    tol = 1e-12 if dtype == torch.float64 else 3e-6
    for ours, ref in ((out, exact), (gx, gexact)):
        torch.testing.assert_close(ours.double(), ref.detach(), rtol=0, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("act", [None, "silu"])
def test_paired_rows_each_order_is_exact_autograd(act, device):
    x = torch.randn(9, 20, dtype=torch.float64, device=device, requires_grad=True)
    w = torch.randn(20, 18, dtype=torch.float64, device=device, requires_grad=True)
    f = lambda a, b: MM.matmul(a, b, "triton", act, paired=True)  # noqa: E731
    g = torch.randn(18, 18, dtype=torch.float64, device=device)
    y = _act(x, act) @ w
    exact = torch.autograd.grad(torch.cat((y, y)), (x, w), g)
    for create_graph in (False, True):
        ours = torch.autograd.grad(f(x, w), (x, w), g, create_graph=create_graph)
        for a, b in zip(ours, exact):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.autograd.gradcheck(f, (x, w), fast_mode=True)
    torch.autograd.gradgradcheck(f, (x, w), fast_mode=True)
    # torch's path (no kernel; float64 computes both halves) returns the same stacked product and derivatives
    torch.testing.assert_close(MM.matmul(x.detach(), w.detach(), act=act, paired=True), torch.cat((y, y)).detach())
    ref = lambda a, b: MM.matmul(a, b, "reference", act, paired=True)  # noqa: E731
    for a, b in zip(torch.autograd.grad(ref(x, w), (x, w), g), exact):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.autograd.gradgradcheck(ref, (x, w), fast_mode=True)


def test_radial_mlp_paired(device):
    mlp = RadialMLP([8, 32, 32, 48], "silu").to(device=device, dtype=torch.float64)
    x = torch.randn(70, 8, dtype=torch.float64, device=device, requires_grad=True)
    ref = mlp(x)
    (gref,) = torch.autograd.grad(torch.cat((ref, 2 * ref)).square().sum(), x)
    for backend in (None, "triton"):
        mlp.backend = backend
        out = mlp(x, paired=True)
        (g,) = torch.autograd.grad((out * torch.tensor([1.0] * 70 + [2.0] * 70, dtype=out.dtype,
                                                       device=device)[:, None]).square().sum(), x)
        torch.testing.assert_close(out, torch.cat((ref, ref)), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g, gref, rtol=1e-12, atol=1e-12)
