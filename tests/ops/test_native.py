"""The C++ autograd node of the eager backward (equikernels/ops/native.py, csrc/tp_node.cpp).

On CPU (EQUIKERNELS_NATIVE forced to 1) every double backward takes the node's Python fallback: this
checks the node's wiring (its inputs, saved tensors, which gradients are asked for, higher orders,
freed graphs). On a GPU (-m gpu) its own launches are checked bit for bit against the Python node."""
import shutil

import pytest
import torch

from equikernels.catalog import problem
from equikernels.ops import native, tensor_product
from equikernels.ops import tp as ops_tp

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the node")
NODE = "EquikernelsTPBackwardBackward"
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the interpreter, every call the fallback


@pytest.fixture
def mode(monkeypatch):
    if native.load() is None:  # g++ without torch's or Python's headers, say (the reason was warned)
        pytest.skip(f"the node does not build here: {native._failed}")

    def set_mode(m):
        monkeypatch.setattr(native, "MODE", m)
    set_mode("1")
    return set_mode


def _inputs(p, rows, device=DEV, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)  # noqa: E731
    return mk(rows, p.dim_in1), mk(rows, p.dim_in2), mk(rows, p.weight_numel)


def _second_order(p, x, y, w, wrt=(0, 1, 2), seed=1, backend="triton"):
    """Gradients of a force-style loss (a function of the first derivatives) for every input, and the
    name of the node that recorded the first derivatives."""
    ins = [t.detach().clone().requires_grad_(i in wrt) for i, t in enumerate((x, y, w))]
    out = tensor_product(p, *ins, layout="ir_mul", backend=backend)
    g = torch.Generator().manual_seed(seed)
    up = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out)
    want = [ins[i] for i in wrt]
    first = torch.autograd.grad(out, want, up, create_graph=True)
    name = first[0].grad_fn.name()
    loss = sum((f * torch.randn(f.shape, generator=g, dtype=torch.float64).to(f)).sum() for f in first)
    return torch.autograd.grad(loss, want, allow_unused=True), name


def test_node_matches_python_node(mode):
    """Same second-order gradients through the C++ node (its Python fallback here) as through the
    Python node, for every subset of inputs that need gradients."""
    p = problem("nequip-water")
    x, y, w = _inputs(p, 2)
    for wrt in ((0, 1, 2), (0,), (1, 2)):
        mode("1")
        got, name = _second_order(p, x, y, w, wrt)
        assert name == NODE and native._failed is None
        mode("0")
        want, other = _second_order(p, x, y, w, wrt)
        assert other != NODE
        for s, t in zip(got, want):
            assert (s is None) == (t is None)
            if s is not None:
                assert torch.equal(s, t), wrt


def _tiny():
    """A channel-wise product with per-row weights (the node's class), small enough for gradgradcheck
    under the interpreter."""
    from equikernels.problem import TPProblem
    return TPProblem.create("2x0e+1x1o", "1x0e+1x1o", "2x0e+1x0e+2x1o",
                            [(0, 0, 0, "uvu", True), (1, 1, 1, "uvu", True), (0, 1, 2, "uvu", True)],
                            shared_weights=False, internal_weights=False)


def test_node_gradgradcheck_and_third_order(mode):
    tiny = _tiny()
    x, y, w = (t.requires_grad_() for t in _inputs(tiny, 1))
    f = lambda x, y, w: tensor_product(tiny, x, y, w, layout="ir_mul", backend="triton")  # noqa: E731
    assert torch.autograd.gradgradcheck(f, (x, y, w))
    assert torch.autograd.grad(f(x, y, w).sum(), x, create_graph=True)[0].grad_fn.name() == NODE
    p = problem("nequip-water")
    x, y, w = (t.requires_grad_() for t in _inputs(p, 1))
    f = lambda x, y, w: tensor_product(p, x, y, w, layout="ir_mul", backend="triton")  # noqa: E731
    out = f(x, y, w)
    gx, = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    assert gx.grad_fn.name() == NODE
    h, = torch.autograd.grad(gx.pow(2).sum(), y, create_graph=True)  # recorded: the composed path
    third, = torch.autograd.grad(h.sum(), w)
    mode("0")
    out = f(x, y, w)
    gx, = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    h, = torch.autograd.grad(gx.pow(2).sum(), y, create_graph=True)
    assert torch.allclose(third, torch.autograd.grad(h.sum(), w)[0], rtol=1e-12, atol=0)


def test_node_frees_its_graph(mode):
    p = problem("nequip-water")
    x, y, w = (t.requires_grad_() for t in _inputs(p, 1))
    out = tensor_product(p, x, y, w, layout="ir_mul", backend="triton")
    gx, gw = torch.autograd.grad(out.sum(), (x, w), create_graph=True)
    loss = gx.sum() + gw.sum()
    torch.autograd.grad(loss, y)
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(loss, y)
    with torch.no_grad():  # nothing recorded without grad mode: plain tensors
        assert ops_tp.bwd(x, y, w, out, ops_tp.spec_of(p, "ir_mul"), "triton", 7)[0].grad_fn is None


def test_build_failure_warns_and_uses_python_node(mode, monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_ext", None)
    monkeypatch.setattr(native, "_failed", None)
    monkeypatch.setattr(native, "build_command", lambda src, out: ["false"])
    monkeypatch.setattr(native, "library_path", lambda: tmp_path / "x.so")
    p = problem("nequip-water")
    x, y, w = _inputs(p, 1)
    with pytest.warns(RuntimeWarning, match="native autograd node could not be built"):
        got, name = _second_order(p, x, y, w)
    assert name != NODE and native._failed is not None


def test_kernel_kinds():
    class Md:
        global_scratch_size = profile_scratch_size = 0
        launch_pdl = launch_cooperative_grid = False
        num_ctas = 1

    class Src:
        signature = {"x": "*fp32", "o": "*fp32", "N": "i32", "NBLK": "constexpr", "ROWS": "constexpr"}

    class Compiled:
        metadata, src = Md(), Src()

    class Fn:
        arg_names = ["x", "o", "N", "NBLK", "ROWS"]

    assert native.kernel_kinds(Fn(), Compiled()) == "ppicc"
    Src.signature["N"] = "i64"
    assert native.kernel_kinds(Fn(), Compiled()) == "ppl" + "cc"
    Src.signature["N"] = "fp32"
    assert native.kernel_kinds(Fn(), Compiled()) is None
    Src.signature["N"] = "i32"
    Md.global_scratch_size = 64
    assert native.kernel_kinds(Fn(), Compiled()) is None


# --- GPU: the node's own launches ----------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nequip-water", "nequip-lips", "mace-medium"])
def test_gpu_native_launch_bitwise(name, mode):
    """After a first call (the fallback hands the node its recipe) the C++ node launches the double
    backward itself, and its results equal the Python node's bit for bit, for row counts of every
    int class Triton specialises on (1, multiples of 16, others)."""
    mode("auto")
    p = problem(name)
    for rows in (1, 64, 1000, 1000):  # 1000 twice: the second call is native for sure
        x, y, w = _inputs(p, rows, "cuda", torch.float32, seed=rows)
        mode("auto")
        native.reset_counts()
        _second_order(p, x, y, w)
        got, name_ = _second_order(p, x, y, w)
        launched, fell_back = native.counts()
        assert name_ == NODE
        mode("0")
        want, _ = _second_order(p, x, y, w)
        for s, t in zip(got, want):
            assert torch.equal(s, t), (name, rows)
        assert launched >= 1, (name, rows, launched, fell_back)  # the second call at least


@pytest.mark.gpu
def test_gpu_native_gradgradcheck(mode):
    mode("auto")
    p = problem("nequip-water")
    x, y, w = (t.requires_grad_() for t in _inputs(p, 3, "cuda"))
    f = lambda x, y, w: tensor_product(p, x, y, w, layout="ir_mul", backend="triton")  # noqa: E731
    native.reset_counts()
    assert torch.autograd.gradgradcheck(f, (x, y, w))
    assert native.counts()[0] > 0
