"""The fast launch path (equikernels/codegen/launch.py): its specialisation key against Triton's
own, the cache logic with a stand-in kernel, the fallbacks, and TP results through it (the
interpreter on CPU: normal path; a real GPU with -m gpu: fast path against the normal one)."""
import os
import time
import warnings

import pytest
import torch

from equikernels import settings
from equikernels.catalog import problem as catalog_problem
from equikernels.codegen import launch
from equikernels.ops import tp as ops_tp
from equikernels.ops.tp import plan_of, spec_of

triton = pytest.importorskip("triton")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@pytest.fixture(autouse=True)
def _python_node(monkeypatch):
    """These tests count the Python direct paths' calls: the C++ node (tests/ops/test_native.py) off."""
    from equikernels.ops import native
    monkeypatch.setattr(native, "MODE", "0")


def _triton_spec(arg):
    """Triton's specialisation of one non-constexpr argument (what JITFunction.run keys on)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend
    return native_specialize_impl(CUDABackend, arg, False, True, True)


def test_int_class_matches_triton():
    values = [0, 1, 2, 15, 16, 17, 32, 48, 50_000, 12_500, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, 2**62,
              2**63, 2**64 - 16, -1, -16, -17, -2**31, -2**31 - 16]
    for a in values:
        for b in values:
            if launch.int_class(a) == launch.int_class(b):
                assert _triton_spec(a) == _triton_spec(b), (a, b)
    assert launch.int_class(1) != launch.int_class(17)  # 1 is compiled in as a constexpr
    assert launch.int_class(16) != launch.int_class(17)
    assert launch.int_class(2**31 + 16) != launch.int_class(16)
    for v in (True, False, 1.0, None):
        assert launch.int_class(v) == -1


def test_spec_key_alignment_dtypes_ints():
    buf = torch.zeros(256)
    a, b = buf[:64], buf[64:128]  # 256-byte offsets: aligned
    key = launch.spec_key([a, b], [50_000, 12_500], (4, "DT", "ieee"), 4, 1)
    assert key is not None
    assert launch.spec_key([a, buf[1:65]], [50_000, 12_500], (4, "DT", "ieee"), 4, 1) is None  # 4-byte offset
    assert launch.spec_key([a, buf[4:68]], [50_000, 12_500], (4, "DT", "ieee"), 4, 1) is not None  # 16 bytes
    variants = [
        launch.spec_key([a, b.double()], [50_000, 12_500], (4, "DT", "ieee"), 4, 1),
        launch.spec_key([a, b], [50_001, 12_500], (4, "DT", "ieee"), 4, 1),
        launch.spec_key([a, b], [1, 12_500], (4, "DT", "ieee"), 4, 1),
        launch.spec_key([a, b], [50_000, 12_500], (8, "DT", "ieee"), 4, 1),
        launch.spec_key([a, b], [50_000, 12_500], (4, "DT", "tf32"), 4, 1),
        launch.spec_key([a, b], [50_000, 12_500], (4, "DT", "ieee"), 2, 1),
        launch.spec_key([a, b], [50_000, 12_500], (4, "DT", "ieee"), 4, 2),
    ]
    assert all(v is not None and v != key for v in variants)
    assert len(set(variants)) == len(variants)
    # same specialisation, other values: same key (the cache is hit)
    assert launch.spec_key([buf[128:192], b], [50_032, 12_508], (4, "DT", "ieee"), 4, 1) == key
    assert launch.spec_key([a, b], [True, 12_500], (4, "DT", "ieee"), 4, 1) is None


def test_spec_key_implies_triton_spec():
    buf = torch.zeros(512)
    tensors = [buf[i:i + 64] for i in (0, 4, 8, 64)] + [buf.double()[:64], buf.half()[:64], buf.half()[8:72]]
    ints = [1, 16, 17, 2**31]
    cases = [([t, u], [n]) for t in tensors for u in tensors for n in ints]
    keyed = [(launch.spec_key(ts, ns, (), 4, 1), [_triton_spec(v) for v in ts + ns]) for ts, ns in cases]
    for k1, s1 in keyed:
        if k1 is None:
            assert any(s[1] == "" for s in s1[:2])  # only misaligned pointers leave the fast path
        for k2, s2 in keyed:
            if k1 is not None and k1 == k2:
                assert s1 == s2


class _Compiled:
    def __init__(self, n_regs=96, n_spills=0):
        self.calls = []
        self.run = lambda *a: self.calls.append(a)
        self.function, self.packed_metadata, self.n_regs, self.n_spills = 1234, (4, 1, 0), n_regs, n_spills


class _Jit:
    """Stands in for a JITFunction: fn[grid](*args, **kw) records the call, returns a 'kernel'."""
    arg_names = ["x_ptr", "out_ptr", "N", "NBLK", "ROWS", "DT", "PREC"]

    def __init__(self, n_regs=96, n_spills=0):
        self.normal, self.compiled, self.pre_run_hooks, self.warmed = [], [], [], []
        self.n_regs, self.n_spills = n_regs, n_spills
        self.capped_spills = 0  # bytes the capped build spills

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.normal.append((grid, args, kw))
            self.compiled.append(_Compiled(255, 700) if "ptx_options" in kw else _Compiled(self.n_regs, self.n_spills))
            return self.compiled[-1]
        return run

    def warmup(self, *args, grid, **kw):  # compiles, launches nothing
        self.warmed.append((grid, args, kw))
        if "ptx_options" in kw:  # the -O1 build of a collapsed kernel
            return _Compiled(255, 700)
        return _Compiled(kw.get("maxnreg", self.n_regs), self.capped_spills if "maxnreg" in kw else 0)


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(launch, "ENABLED", True)
    monkeypatch.setattr(launch, "_Compiled", _Compiled)
    monkeypatch.setattr(launch, "_device", lambda: 0)
    monkeypatch.setattr(launch, "_stream", lambda dev: 77)
    jit = _Jit()
    fl = launch.FastLaunch(jit)
    fl.fast = True  # a stand-in, not a real JITFunction
    return jit, fl


def test_fast_launch_caches_per_specialisation(fake):
    jit, fl = fake
    buf = torch.zeros(1024)
    x, out = buf[:256], buf[512:768]
    fl((5,), [x, out], [20, 5], (4, "DT", "ieee"), 4, 1)
    assert len(jit.normal) == 1 and jit.normal[0][2] == {"num_warps": 4, "num_stages": 1}
    assert jit.normal[0][1] == (x, out, 20, 5, 4, "DT", "ieee")
    fl((6,), [x, out], [23, 6], (4, "DT", "ieee"), 4, 1)  # same specialisation: direct launch
    assert len(jit.normal) == 1
    (call,) = jit.compiled[0].calls
    assert call == (6, 1, 1, 77, 1234, (4, 1, 0), None, None, None, x, out, 23, 6, 4, "DT", "ieee")
    fl((2,), [x, out], [16, 2], (4, "DT", "ieee"), 4, 1)  # N divisible by 16: another kernel
    fl((1,), [x, out], [1, 1], (4, "DT", "ieee"), 4, 1)  # N == 1: another kernel
    fl((6,), [x, buf[1:257]], [23, 6], (4, "DT", "ieee"), 4, 1)  # misaligned: normal path, not kept
    fl((6,), [x, buf[1:257]], [23, 6], (4, "DT", "ieee"), 4, 1)
    assert len(jit.normal) == 5
    assert len(fl.hits) == 3
    fl((6,), [x, out], [23, 6], (4, "DT", "ieee"), 4, 1)
    assert len(jit.normal) == 5 and len(jit.compiled[0].calls) == 2


def test_register_cap():
    """maxnreg only just above an occupancy step (4 warps: 4 programs per SM up to 128 registers, 3 up
    to 168, 2 up to 256)."""
    assert launch.register_cap(180, 4) == 168 and launch.register_cap(176, 4) == 168
    assert launch.register_cap(130, 4) == 128
    for regs in (168, 128, 96, 200, 255, 64):
        assert launch.register_cap(regs, 4) is None, regs


@pytest.mark.parametrize("dtype,regs,capped,fp32,spills", [
    (torch.bfloat16, 180, True, False, 8), (torch.float16, 176, True, False, 0), (torch.bfloat16, 200, False, False, 0),
    (torch.float32, 180, False, False, 0), (torch.float32, 180, True, True, 4), (torch.bfloat16, 180, False, False, 20)])
def test_fast_launch_half_register_cap(fake, dtype, regs, capped, fp32, spills):
    """A half-precision launch (float32 too where the kernel asks: ``fp32``) whose build sits just
    above an occupancy step: the first launch runs as compiled, later ones use a build capped at the
    step (compiled by warmup, nothing launched), unless that build spills more than SPILL_LIMIT."""
    jit, fl = fake
    jit.n_regs, jit.capped_spills, fl.cap_fp32 = regs, spills, fp32
    x, out = torch.zeros(256, dtype=dtype), torch.zeros(256)
    args = ((5,), [x, out], [20, 5], (4, "DT", "ieee"), 4, 1)
    fl(*args)
    fl(*args)
    assert len(jit.normal) == 1
    if capped:  # the second launch ran the capped build
        assert len(jit.warmed) == 1 and jit.warmed[0][2]["maxnreg"] == 168
        assert jit.warmed[0][1] == (x, out, 20, 5, 4, "DT", "ieee") and not jit.compiled[0].calls
    else:  # not in the window, float32 not asked for, or the capped build spilled too much
        assert len(jit.warmed) == (spills > launch.SPILL_LIMIT) and len(jit.compiled[0].calls) == 1


def test_collapse_signature():
    """ptxas's collapse (a minimal register count, kilobytes of stack) and nothing else is rebuilt."""
    c = lambda regs, words: launch.collapsed(_Real(regs, words))  # noqa: E731
    assert c(32, 27000 // 4) and c(40, 1024)
    assert not c(255, 700) and not c(41, 27000 // 4) and not c(32, 1023) and not c(168, 3088 // 4)
    assert not launch.collapsed(None) and not launch.collapsed(object())
    with settings.override(ptxas_rescue=False):
        assert not c(32, 27000 // 4)


class _Real(launch._Compiled or object):
    """A CompiledKernel's register and spill counts, nothing else."""

    module = None  # what CompiledKernel.__del__ reads (Triton 3.8)

    def __init__(self, regs, words):
        self.n_regs, self.n_spills = regs, words


@pytest.mark.parametrize("regs,words,rescued", [(32, 6750, True), (255, 700, False), (32, 100, False)])
def test_fast_launch_rebuilds_a_collapsed_build(fake, regs, words, rescued):
    """A first build with ptxas's collapse runs once; later launches run its -O1 build (compiled by
    warmup with ptx_options, nothing launched twice), and no register cap is tried on it."""
    jit, fl = fake
    jit.n_regs, jit.n_spills = regs, words
    x, out = torch.zeros(256, dtype=torch.float64), torch.zeros(256, dtype=torch.float64)
    args = ((5,), [x, out], [20, 5], (4, "DT", "ieee"), 4, 1)
    fl(*args)
    fl(*args)
    assert len(jit.normal) == 1
    if rescued:
        assert [w[2] for w in jit.warmed] == [{"num_warps": 4, "num_stages": 1, "ptx_options": "--opt-level 1"}]
        assert not jit.compiled[0].calls and fl.opts == {"ptx_options": "--opt-level 1"}
    else:
        assert not jit.warmed and len(jit.compiled[0].calls) == 1 and fl.opts == {}


def test_normal_path_rebuilds_a_collapsed_build(fake, monkeypatch):
    """Without the fast path the launches after a collapsed first build ask for the -O1 build, after any
    PTXAS_OPTIONS given."""
    jit, fl = fake
    jit.n_regs, jit.n_spills = 32, 6750
    monkeypatch.setattr(launch, "ENABLED", False)
    x = torch.zeros(64, dtype=torch.float64)
    args = ((4,), [x, x], [20, 5], (4, "DT", "ieee"), 4, 1)
    fl(*args)
    monkeypatch.setattr(launch._knobs.nvidia, "ptxas_options", "-v")
    fl2 = launch.FastLaunch(jit)
    fl2.fast = True
    fl2(*args)
    fl(*args)
    fl2(*args)
    assert [kw.get("ptx_options") for _, _, kw in jit.normal] == [None, None, "--opt-level 1", "-v --opt-level 1"]


def test_fast_launch_fallbacks(fake, monkeypatch):
    jit, fl = fake
    x = torch.zeros(64)
    args = ((4,), [x, x], [20, 5], (4, "DT", "ieee"), 4, 1)
    fl(*args)
    fl(*args)
    assert len(jit.normal) == 1
    old = launch.set_enabled(False)
    try:
        fl(*args)
    finally:
        launch.set_enabled(old)
    assert len(jit.normal) == 2
    hook = lambda *a: None  # noqa: E731
    launch._RT.launch_enter_hook.add(hook)
    try:
        fl(*args)
    finally:
        launch._RT.launch_enter_hook.remove(hook)
    assert len(jit.normal) == 3
    fl(*args)
    assert len(jit.normal) == 3
    jit.pre_run_hooks.append(hook)  # a kernel with pre-run hooks is never launched directly
    fl2 = launch.FastLaunch(jit)
    fl2.fast = True
    fl2(*args)
    fl2(*args)
    assert len(jit.normal) == 5 and not fl2.hits


def test_env_switch(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_FAST_LAUNCH", "0")
    assert launch.env_enabled() is False
    monkeypatch.setenv("EQUIKERNELS_FAST_LAUNCH", "1")
    assert launch.env_enabled() is True
    monkeypatch.delenv("EQUIKERNELS_FAST_LAUNCH")
    assert launch.env_enabled() is launch._TRITON_VERSION.startswith("3.6.")  # validated version only


def _small_problem():
    return catalog_problem("nequip-water") if not INTERPRET else _tiny()


def _tiny():
    from equikernels.problem import TPProblem
    return TPProblem.create("2x0e+2x1o", "1x0e+1x1o", "2x0e+2x1o+2x1e",
                            [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True), (1, 0, 1, "uvu", True),
                             (1, 1, 0, "uvu", True), (1, 1, 2, "uvu", True)],
                            shared_weights=False, internal_weights=False)


def _operands(p, rows, device, seed=0):
    """x, y, w, g and the cotangents a, b, c."""
    gen = torch.Generator().manual_seed(seed)
    mk = lambda *s: torch.randn(*s, generator=gen).to(device)  # noqa: E731
    x, y, w, g = mk(rows, p.dim_in1), mk(rows, p.dim_in2), mk(rows, p.weight_numel), mk(rows, p.dim_out)
    return x, y, w, g, mk(*x.shape), mk(*y.shape), mk(*w.shape)


def _all_directions(p, x, y, w, g, a, b, c, backend):
    """fwd, bwd for every need, dbwd for several cotangent sets (some outputs with no term)."""
    spec = spec_of(p, "ir_mul")
    e = x.new_empty(0)
    res = [ops_tp._fwd_impl(x, y, w, spec, backend)]
    for need in (7, 1, 2, 4, 3, 6):
        res += [t for t in ops_tp._bwd_impl(x, y, w, g, spec, backend, need) if t.numel()]
    for have, args in (("abc", (a, b, c)), ("a", (a, e, e)), ("", (e, e, e))):
        res += list(ops_tp._dbwd_impl(x, y, w, g, *args, spec, backend, have, 15))
    return res


def _check_directions(p, device):
    ops = _operands(p, 37, device)
    ref = _all_directions(p, *(t.double() for t in ops), "reference")
    out = _all_directions(p, *ops, "triton")
    assert len(out) == len(ref)
    for i, (a, b) in enumerate(zip(out, ref)):
        assert a.shape == b.shape and a.dtype == torch.float32, i
        assert float((a.double() - b).norm()) <= 1e-5 * max(1.0, float(b.norm())), i
    return out


@pytest.mark.skipif(not INTERPRET, reason="checks the interpreter fallback")
def test_interpreter_takes_normal_path():
    p = _tiny()
    _check_directions(p, "cpu")
    kernels = plan_of(spec_of(p, "ir_mul")).kernels
    ks = [k for k in kernels._kernels.values() if k is not None]
    assert ks
    for k in ks:
        for part in getattr(k, "parts", [k]):
            assert part.launcher.fast is False and not part.launcher.hits


@pytest.mark.gpu
def test_gpu_fast_equals_normal():
    p = _small_problem()
    old = launch.set_enabled(False)
    try:
        normal = _check_directions(p, "cuda")
    finally:
        launch.set_enabled(old)
    launch.set_enabled(True)
    try:
        _check_directions(p, "cuda")  # first calls: normal launches, kept
        fast = _check_directions(p, "cuda")
        kernels = plan_of(spec_of(p, "ir_mul")).kernels
        assert any(k.launcher.hits for k in kernels._kernels.values() if k is not None)
        # misaligned operands (views 1 element in): the normal path, same numbers
        x, y, w = _operands(p, 37, "cuda")[:3]
        xs = torch.empty(x.numel() + 1, device="cuda")[1:].view_as(x).copy_(x)
        spec = spec_of(p, "ir_mul")
        torch.testing.assert_close(ops_tp._fwd_impl(xs, y, w, spec, "triton"), ops_tp._fwd_impl(x, y, w, spec, "triton"))
    finally:
        launch.set_enabled(old)
    for a, b in zip(fast, normal):
        assert torch.equal(a, b)


# --- ops.tp's direct eager backward (_bwd_direct): the resolved launch of TPKernels.backward -------
def _odd():
    """Widths 3 / 4 / 9 (odd row sizes: unaligned row offsets inside the buffers)."""
    from equikernels.problem import TPProblem
    return TPProblem.create("3x0e", "1x0e+1x1o", "3x0e+3x1o", [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True)],
                            shared_weights=False, internal_weights=False)


@pytest.fixture
def nan_alloc(monkeypatch):
    """The direct path's buffers start as NaN, so an element no kernel writes shows."""
    monkeypatch.setattr(ops_tp, "_empty_like", lambda t: torch.full_like(t, float("nan")))
    monkeypatch.setattr(ops_tp, "FAST_BWD", True)


def _grads(p, x, y, w, g, req, direct: bool):
    """Gradients of tensor_product through autograd (bench_tp's bwd), direct path on or off."""
    from equikernels.ops import tensor_product
    old = ops_tp.FAST_BWD
    ops_tp.FAST_BWD = direct
    try:
        leaves = [t.detach().clone().requires_grad_(r) for t, r in zip((x, y, w), req)]
        out = tensor_product(p, *leaves, layout="ir_mul", backend="triton")
        return torch.autograd.grad(out, [t for t in leaves if t.requires_grad], g)
    finally:
        ops_tp.FAST_BWD = old


def _dev():
    return "cpu" if INTERPRET else "cuda"


@pytest.mark.parametrize("rows", [37, 1])
def test_direct_backward_matches_full_path(nan_alloc, rows):
    p = _odd() if INTERPRET else _small_problem()
    x, y, w, g = _operands(p, rows, _dev())[:4]
    spec = spec_of(p, "ir_mul")
    ref = ops_tp._bwd_impl(*(t.double() for t in (x, y, w, g)), spec, "reference", 7)
    ops_tp._BWD_DIRECT.clear()
    for req in ((True, True, True), (True, False, False), (False, True, False), (False, False, True),
                (True, True, False), (True, False, True), (False, True, True)):
        full = _grads(p, x, y, w, g, req, direct=False)
        for _ in range(2):  # the first launch of a specialisation and a later one (launch.Pinned's hit)
            got = _grads(p, x, y, w, g, req, direct=True)
            assert len(got) == len(full) == sum(req)
            for a, b in zip(got, full):
                assert a.shape == b.shape and a.dtype == b.dtype and a.is_contiguous()
                assert torch.equal(a, b), req  # same kernel and arguments: bit-identical
            want = [r for r, q in zip(ref, req) if q]
            for a, b in zip(got, want):
                assert float((a.double() - b).norm()) <= 1e-5 * max(1.0, float(b.norm()))
    plans = [d for d in ops_tp._BWD_DIRECT.values() if d is not None]
    assert len(plans) == 7  # the direct path ran for every need (it is not silently skipped)


def test_direct_backward_leaf_grads_and_fallbacks(nan_alloc, monkeypatch):
    from equikernels.ops import tensor_product
    p = _odd() if INTERPRET else _small_problem()
    x, y, w, g = _operands(p, 36, _dev())[:4]
    full = _grads(p, x, y, w, g, (True, True, True), direct=False)
    leaves = [t.detach().clone().requires_grad_() for t in (x, y, w)]
    for _ in range(2):  # .backward(): leaf .grad set, then accumulated into
        tensor_product(p, *leaves, layout="ir_mul", backend="triton").backward(g)
    for t, f in zip(leaves, full):
        assert torch.equal(t.grad, 2 * f)
    # mixed operand dtypes: each gradient in its operand's dtype
    wb = w.to(torch.bfloat16)
    got = _grads(p, x, y, wb, g, (True, True, True), direct=True)
    want = _grads(p, x, y, wb, g, (True, True, True), direct=False)
    assert [t.dtype for t in got] == [torch.float32, torch.float32, torch.bfloat16]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # autotuning / poisoning / zero rows / create_graph / shared weights: the full path
    calls = []
    monkeypatch.setattr(ops_tp, "_empty_like", lambda t: calls.append(t) or torch.empty_like(t))
    for var in ("EQUIKERNELS_POISON", "EQUIKERNELS_AUTOTUNE"):
        monkeypatch.setenv(var, "1")
        got = _grads(p, x, y, w, g, (True, True, True), direct=True)
        monkeypatch.delenv(var)
        assert all(torch.equal(a, b) for a, b in zip(got, full))
    x0, y0, w0, g0 = (t[:0] for t in (x, y, w, g))
    assert [t.shape for t in _grads(p, x0, y0, w0, g0, (True, True, True), direct=True)] == \
        [x0.shape, y0.shape, w0.shape]
    leaves = [t.detach().clone().requires_grad_() for t in (x, y, w)]
    out = tensor_product(p, *leaves, layout="ir_mul", backend="triton")
    hi = torch.autograd.grad(out, leaves, g, create_graph=True)
    assert all(torch.equal(a, b) for a, b in zip(hi, full))
    ps = _tiny_shared()
    xs, ys = x[:, :ps.dim_in1].contiguous(), y
    ws = torch.randn(ps.weight_numel, device=x.device)
    gs = torch.randn(x.shape[0], ps.dim_out, device=x.device)
    got = _grads(ps, xs, ys, ws, gs, (True, True, True), direct=True)
    assert all(torch.equal(a, b) for a, b in zip(got, _grads(ps, xs, ys, ws, gs, (True, True, True), direct=False)))
    assert not calls
    _grads(p, x, y, w, g, (True, True, True), direct=True)
    assert calls  # and the direct path is back


def _tiny_shared():
    from equikernels.problem import TPProblem
    return TPProblem.create("3x0e", "1x0e+1x1o", "3x0e+3x1o", [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True)],
                            shared_weights=True, internal_weights=False)


class _Launcher:
    """Stands in for a FastLaunch whose kernel is already compiled (hits filled on first call)."""

    def __init__(self, jit):
        self.fast, self.hits, self.jit, self.calls = True, {}, jit, []

    def __call__(self, grid, tensors, ints, consts, num_warps, num_stages):
        self.calls.append(grid)
        compiled = _Compiled()
        key = launch.spec_key(tensors, ints, consts, num_warps, num_stages)
        self.hits[(launch._device(), launch._RT.debug, launch._CT.instrumentation_mode, key)] = \
            (compiled.run, compiled.function, compiled.packed_metadata, compiled)
        self.compiled = compiled


class _Cuda:
    """A tensor stand-in on a 'GPU' (launch.Pinned reads data_ptr and is_cuda only, spec_key dtype)."""

    def __init__(self, ptr, cuda=True):
        self.ptr, self.is_cuda, self.dtype = ptr, cuda, torch.float32

    def data_ptr(self):
        return self.ptr


def test_pinned_launch(fake):
    fl = _Launcher(None)
    pin = launch.Pinned(fl, (4, "DT", "ieee"), 4, 1)
    a, b = _Cuda(4096), _Cuda(8192)
    pin(5, [a, b], (20, 5))  # first: the normal path, its hit kept
    assert fl.calls == [(5,)] and len(pin.hits) == 1
    pin(6, [b, a], (23, 6))  # same classes: direct, with addresses
    assert fl.calls == [(5,)]
    assert fl.compiled.calls == [(6, 1, 1, 77, 1234, (4, 1, 0), None, None, None, 8192, 4096, 23, 6, 4, "DT", "ieee")]
    pin(1, [a, b], (16, 1))  # other int classes: the normal path again
    pin(6, [a, _Cuda(8200)], (23, 6))  # misaligned
    pin(6, [a, _Cuda(8192, cuda=False)], (23, 6))  # not on a GPU: the normal path (the launcher checks)
    assert fl.calls == [(5,), (1,), (6,), (6,)]
    old = launch.set_enabled(False)
    try:
        pin(6, [a, b], (23, 6))
    finally:
        launch.set_enabled(old)
    assert len(fl.calls) == 5


# --- ops.tp's direct eager double backward (_dbwd_direct): TPKernels.double_backward resolved -------
def _dgrads(p, ops, R, req, greq, use, wrt, direct: bool):
    """bench_tp's double backward through autograd, direct path on or off: first-order gradients of
    tensor_product with create_graph (``req``: which of x, y, w require grad, ``greq``: g too),
    L = sum over ``use`` (indexes into x, y, w) of <g_i, R_i>, then grad(L, the inputs in ``wrt``
    (indexes into x, y, w, g))."""
    old = ops_tp.FAST_BWD
    ops_tp.FAST_BWD = direct
    try:
        return _bench_dgrads(p, ops, R, req, greq, use, wrt, "triton")[1]
    finally:
        ops_tp.FAST_BWD = old


def _bench_dgrads(p, ops, R, req, greq, use, wrt, backend):
    """(the inputs in ``wrt``, their second-order gradients) as _dgrads describes, on ``backend``."""
    from equikernels.ops import tensor_product
    leaves = [t.detach().clone().requires_grad_(r) for t, r in zip(ops[:3], req)]
    gg = ops[3].detach().clone().requires_grad_(greq)
    out = tensor_product(p, *leaves, layout="ir_mul", backend=backend)
    first = torch.autograd.grad(out, [t for t in leaves if t.requires_grad], gg, create_graph=True)
    by = dict(zip([i for i, r in enumerate(req) if r], first))
    loss = sum((by[i] * R[i]).sum() for i in use)
    inputs = [t for i, t in enumerate(leaves + [gg]) if i in wrt]
    return inputs, torch.autograd.grad(loss, inputs, allow_unused=True)


def _dbwd_cases(full: bool):
    """(req, greq, use, wrt): every set of first-order gradients and g requiring grad (the need of
    the double backward), every nonempty set of them in L (the cotangents autograd hands over),
    gradients to every input that requires grad and to the first one alone."""
    subsets = ((0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2))
    for s in subsets:
        req = tuple(i in s for i in range(3))
        for greq in (True, False):
            for use in subsets:
                if not set(use) <= set(s) or not (full or use in ((s[-1],), s)):
                    continue
                wrt = s + ((3,) if greq else ())
                yield req, greq, use, wrt
                if full and len(wrt) > 1:
                    yield req, greq, use, wrt[:1]


@pytest.fixture
def count_dbwd(monkeypatch):
    """Results of _dbwd_direct: None (full path) or the tuple it returned."""
    seen = []
    inner = ops_tp._dbwd_direct

    def spy(*args):
        r = inner(*args)
        seen.append(r is not None)
        return r
    monkeypatch.setattr(ops_tp, "_dbwd_direct", spy)
    return seen


def _check_dbwd(p, ops, R, cases, count, ref=None, repeat: int = 2):
    """Direct == full path bit for bit (``repeat`` times: on a GPU the Pinned's first launch and a
    later one), the direct path taken every time; optionally both against the float64 reference."""
    ops_tp._DBWD_DIRECT.clear()
    n = 0
    for req, greq, use, wrt in cases:
        full = _dgrads(p, ops, R, req, greq, use, wrt, direct=False)
        for _ in range(repeat):
            del count[:]
            got = _dgrads(p, ops, R, req, greq, use, wrt, direct=True)
            assert count == [True], (req, greq, use, wrt)  # one double backward, the direct one
            assert len(got) == len(full) == len(wrt)
            for a, b in zip(got, full):
                assert (a is None) == (b is None)
                if a is not None:
                    assert a.shape == b.shape and a.dtype == b.dtype
                    assert torch.equal(a, b), (req, greq, use, wrt)
        if ref is not None:
            want = ref(req, greq, use, wrt)
            for a, b in zip(got, want):
                assert float((a.double() - b).norm()) <= 1e-5 * max(1.0, float(b.norm())), (req, greq, use, wrt)
        n += 1
    assert n and all(d is not None for d in ops_tp._DBWD_DIRECT.values())


def _reference_dgrads(p, ops, R):
    """The same double backward on the float64 reference backend (the direct path never runs)."""
    ops64 = [t.double() for t in ops]
    R64 = [t.double() for t in R]

    def ref(req, greq, use, wrt):
        inputs, res = _bench_dgrads(p, ops64, R64, req, greq, use, wrt, "reference")
        return [torch.zeros_like(t) if r is None else r for t, r in zip(inputs, res)]
    return ref


@pytest.mark.skipif(not INTERPRET, reason="CPU: the interpreter")
def test_direct_double_backward_interpreter(nan_alloc, count_dbwd):
    """Under the interpreter the direct path runs too (launch.Pinned's normal path): bit-identical to
    the full path and as close to the float64 reference, for a few needs and cotangent sets."""
    p = _odd()
    x, y, w, g, a, b, c = _operands(p, 13, "cpu")
    cases = [((True, True, True), True, (0, 1, 2), (0, 1, 2, 3)),  # need 15, have abc
             ((True, False, False), True, (0,), (0, 3)),            # need 9, have a
             ((False, True, True), False, (2,), (1, 2)),            # need 6 (gy not in L: b zeros)
             ((False, False, True), True, (2,), (2, 3))]            # need 12, have c: dw no term (zeros)
    _check_dbwd(p, (x, y, w, g), (a, b, c), cases, count_dbwd, _reference_dgrads(p, (x, y, w, g), (a, b, c)),
                repeat=1)
    keys = {k[1:3] for k in ops_tp._DBWD_DIRECT}
    assert {("abc", 15), ("a", 9), ("c", 12)} <= keys


def test_direct_double_backward_raw(nan_alloc, monkeypatch):
    """_dbwd_direct against _dbwd_impl directly: every need, missing cotangents (placeholders, zeros
    for results without a term), mixed dtypes; None for zero rows, 3-d operands, poison/autotune."""
    monkeypatch.setenv("EQUIKERNELS_DBWD_ONE", "0")  # two kernels (dg; dx, dy, dw): the launch counts below
    p = _odd() if INTERPRET else _small_problem()
    x, y, w, g, a, b, c = _operands(p, 5, _dev())
    spec = spec_of(p, "ir_mul")
    ops_tp._DBWD_DIRECT.clear()
    e = x.new_empty(0)
    for have, need, wb in (("abc", 15, w), ("", 15, w), ("a", 15, w), ("b", 5, w), ("ac", 8, w),
                           ("abc", 7, w.bfloat16())):
        cot = [t if k in have else None for k, t in zip("abc", (a, b, c.to(wb.dtype)))]
        got = ops_tp._dbwd_direct(x, y, wb, g, *cot, spec, have, need, None)
        want = ops_tp._dbwd_impl(x, y, wb, g, *(t if t is not None else e for t in cot), spec, "triton", have, need)
        assert got is not None and len(got) == 4
        for i, (s, t) in enumerate(zip(got, want)):
            assert s.shape == t.shape and s.dtype == t.dtype and torch.equal(s, t), (have, need, i)
    plans = {k[1:3]: d for k, d in ops_tp._DBWD_DIRECT.items()}
    assert not plans[("", 15)].launches and plans[("", 15)].res == (-1, -1, -1, -1)  # no terms: zeros
    assert len(plans[("a", 15)].launches) == 2 and plans[("a", 15)].res[0] == -1  # dx: no term with a
    assert plans[("b", 5)].res[1::2] == (-2, -2)
    assert ops_tp._dbwd_direct(x[:0], y[:0], w[:0], g[:0], a[:0], b[:0], c[:0], spec, "abc", 15, None) is None
    assert ops_tp._dbwd_direct(x[None], y[None], w[None], g[None], a[None], b[None], c[None], spec, "abc", 15,
                               None) is None
    for var in ("EQUIKERNELS_POISON", "EQUIKERNELS_AUTOTUNE"):
        monkeypatch.setenv(var, "1")
        assert ops_tp._dbwd_direct(x, y, w, g, a, b, c, spec, "abc", 15, None) is None
        monkeypatch.delenv(var)
    assert ops_tp._dbwd_direct(x, y, w, g, a, b, c, spec, "abc", 15, None) is not None
    ops_tp._DBWD_DIRECT.clear()  # recipes made with EQUIKERNELS_DBWD_ONE=0: not for later tests


def test_direct_double_backward_plan_fallbacks():
    """No recipe for shared weights and uvw products (per-row: uvw_rows; shared)."""
    from equikernels.problem import TPProblem
    uvw_rows = TPProblem.create("2x0e+2x1o", "1x0e+1x1o", "2x0e+2x1o", [(0, 0, 0, "uvw", True), (1, 1, 0, "uvw", True)],
                                shared_weights=False, internal_weights=False)
    uvw_shared = TPProblem.create("2x0e+2x1o", "1x0e+1x1o", "2x0e+2x1o", [(0, 0, 0, "uvw", True)],
                                  shared_weights=True, internal_weights=False)
    for p in (_tiny_shared(), uvw_rows, uvw_shared):
        x, y, w, g, a, b, c = _operands(p, 4, "cpu")
        if p.shared_weights:
            w, c = w[0], c[0]
        assert ops_tp._dbwd_direct_plan(spec_of(p, "ir_mul"), "abc", 15, x, y, w, g, a, b, c, None) is None


def test_direct_double_backward_kernel_set(nan_alloc, monkeypatch):
    """A channel-wise product whose double backward is split over several kernels (a _KernelSet, as
    nequip-lips' split by first-input segment; here forced by EQUIKERNELS_MAX_PATHS=1 when first built):
    the recipe launches every part, zero-fills the outputs parts add into, and equals the full path bit
    for bit; half-precision outputs added into (a float32 buffer in the full path) get no recipe. A
    problem of its own, so the split kernels stay with it."""
    from equikernels.codegen import tp as ct
    from equikernels.problem import TPProblem
    p = TPProblem.create("2x0o+2x1o", "1x0e+1x1o", "2x0o+2x1o+2x1e",
                         [(0, 0, 0, "uvu", True), (0, 1, 2, "uvu", True), (1, 0, 1, "uvu", True),
                          (1, 1, 2, "uvu", True)], shared_weights=False, internal_weights=False)
    monkeypatch.setenv("EQUIKERNELS_MAX_PATHS", "1")
    spec = spec_of(p, "ir_mul")
    x, y, w, g, a, b, c = _operands(p, 7, _dev())
    ops_tp._DBWD_DIRECT.clear()
    try:
        for need in (15, 7, 2):
            k = plan_of(spec).kernels.kernel("dbwd", need, "abc")
            assert isinstance(k, ct._KernelSet) and len(k.parts) > 1 and k.meta.zero_init
            got = ops_tp._dbwd_direct(x, y, w, g, a, b, c, spec, "abc", need, None)
            want = ops_tp._dbwd_impl(x, y, w, g, a, b, c, spec, "triton", "abc", need)
            assert got is not None
            for i, (s, t) in enumerate(zip(got, want)):
                assert s.shape == t.shape and s.dtype == t.dtype and torch.equal(s, t), (need, i)
            d = ops_tp._DBWD_DIRECT[next(key for key in ops_tp._DBWD_DIRECT if key[2] == need)]
            assert len(d.launches) == len(k.parts)
            assert any(z for _, _, _, allocs in d.launches for _, z in allocs)  # an output parts add into
        h = y.half()
        assert ops_tp._dbwd_direct_plan(spec, "abc", 15, x, h, w, g, a, b.half(), c, None) is None
    finally:
        ops_tp._DBWD_DIRECT.clear()  # recipes made under EQUIKERNELS_MAX_PATHS=1: not for later tests


@pytest.mark.skipif(not INTERPRET, reason="CPU: the interpreter")
def test_direct_double_backward_shared_full_path(count_dbwd):
    """Shared weights through autograd: _dbwd_direct declines, the result equals the direct-off run."""
    p = _tiny_shared()
    x, y, w, g, a, b, c = _operands(p, 6, "cpu")
    w, c = w[0].clone(), c[0].clone()
    case = ((True, True, True), True, (0, 1, 2), (0, 1, 2, 3))
    full = _dgrads(p, (x, y, w, g), (a, b, c), *case, direct=False)
    got = _dgrads(p, (x, y, w, g), (a, b, c), *case, direct=True)
    assert count_dbwd == [False]
    assert all(torch.equal(s, t) for s, t in zip(got, full))


def test_dbwd_impl_generates_only_launched_parts():
    """_dbwd_impl asks TPKernels.dbwd_parts which kernels double_backward launches: per-row uvw
    (uvw_rows: dx/dy/dg and dw) generates no (need & 8, need & 7) kernels it never uses."""
    from equikernels.problem import TPProblem
    p = TPProblem.create("2x0e+2x1o", "1x0e+1x1o", "2x0e+2x1o", [(0, 0, 0, "uvw", True), (1, 1, 0, "uvw", True)],
                         shared_weights=False, internal_weights=False)
    kernels = plan_of(spec_of(p, "ir_mul")).kernels
    assert kernels.planner.uvw_rows()
    parts = kernels.dbwd_parts(15)
    assert parts != (8, 7)
    x, y, w, g, a, b, c = _operands(p, 3, _dev())  # the triton backend: CUDA tensors on a GPU machine
    ops_tp._dbwd_impl(x, y, w, g, a, b, c, spec_of(p, "ir_mul"), "triton", "abc", 15)
    made = {k[1] for k in kernels.built_steps() if k[0] == "dbwd"}
    assert made == {q for q in parts if q}, (made, parts)


@pytest.mark.skipif(not INTERPRET, reason="CPU: the interpreter")
def test_direct_double_backward_one_kernel(nan_alloc, monkeypatch):
    """EQUIKERNELS_DBWD_ONE=1 (TPKernels.dbwd_parts: one kernel for all four): the plan launches the
    same single kernel, bit-identical to the full path."""
    p = _odd()
    kernels = plan_of(spec_of(p, "ir_mul")).kernels
    monkeypatch.setenv("EQUIKERNELS_DBWD_ONE", "1")
    assert kernels.dbwd_parts(15) == (15,)
    ops_tp._DBWD_DIRECT.clear()
    try:
        x, y, w, g, a, b, c = _operands(p, 9, "cpu")
        spec = spec_of(p, "ir_mul")
        got = ops_tp._dbwd_direct(x, y, w, g, a, b, c, spec, "abc", 15, None)
        want = ops_tp._dbwd_impl(x, y, w, g, a, b, c, spec, "triton", "abc", 15)
        (d,) = ops_tp._DBWD_DIRECT.values()
        assert len(d.launches) == 1
        assert all(torch.equal(s, t) for s, t in zip(got, want))
    finally:
        ops_tp._DBWD_DIRECT.clear()  # the recipe is made under the switch: drop it


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nequip-water", "mace-medium"])
def test_gpu_direct_double_backward_matches_full_path(nan_alloc, count_dbwd, name):
    """The bench's double backward (nequip-water, mace-medium), every need and every cotangent set
    autograd hands over: the direct path runs and is bit-identical to TPKernels.double_backward."""
    p = catalog_problem(name)
    x, y, w, g, a, b, c = _operands(p, 1001, "cuda")
    _check_dbwd(p, (x, y, w, g), (a, b, c), list(_dbwd_cases(full=True)), count_dbwd,
                _reference_dgrads(p, (x, y, w, g), (a, b, c)))


@pytest.mark.gpu
def test_gpu_direct_double_backward_kernel_set(nan_alloc, count_dbwd):
    """nequip-lips (30 paths: the double backward split by first-input segment, a _KernelSet adding
    into a zero-filled dy): the direct path runs and is bit-identical to TPKernels.double_backward, for
    the bench's case and one with x's cotangent alone (few cases: every (need, have) compiles five
    kernels)."""
    from equikernels.codegen import tp as ct
    p = catalog_problem("nequip-lips")
    x, y, w, g, a, b, c = _operands(p, 1001, "cuda")
    assert isinstance(plan_of(spec_of(p, "ir_mul")).kernels.kernel("dbwd", 15, "abc"), ct._KernelSet)
    cases = [((True, True, True), True, (0, 1, 2), (0, 1, 2, 3)), ((True, False, False), True, (0,), (0, 3))]
    _check_dbwd(p, (x, y, w, g), (a, b, c), cases, count_dbwd, _reference_dgrads(p, (x, y, w, g), (a, b, c)))
    # mixed dtypes (bfloat16 weights): each result in its operand's dtype, still identical
    wb, cb = w.bfloat16(), c.bfloat16()
    case = ((True, True, True), True, (0, 1, 2), (0, 1, 2, 3))
    full = _dgrads(p, (x, y, wb, g), (a, b, cb), *case, direct=False)
    del count_dbwd[:]
    got = _dgrads(p, (x, y, wb, g), (a, b, cb), *case, direct=True)
    assert count_dbwd == [True]
    assert [t.dtype for t in got] == [torch.float32, torch.float32, torch.bfloat16, torch.float32]
    assert all(torch.equal(s, t) for s, t in zip(got, full))


@pytest.mark.gpu
def test_gpu_half_register_cap_same_numbers(monkeypatch, tmp_path):
    """mace-large's bf16 backward with 4 rows x 4 warps, per-path channel sums, no prefetch and no L2
    prefetch needs 180 registers (168 with fp32 / fp16 operands): the first launch runs that build,
    later ones a build capped at 168 (launch.register_cap). Same numbers."""
    for k, v in (("PARTIAL_SUM", "0"), ("PREFETCH", "0"), ("L2_PREFETCH", "off"), ("ROWS_BWD", "4"), ("WARPS_BWD", "4"),
                 ("CACHE_DIR", str(tmp_path))):
        monkeypatch.setenv("EQUIKERNELS_" + k, v)
    plan_of.cache_clear()
    ops_tp._BWD_DIRECT.clear()
    p = catalog_problem("mace-large")
    x, y, w, g = (t.bfloat16() for t in _operands(p, 1000, "cuda")[:4])
    spec = spec_of(p, "ir_mul")
    plan_of(spec).kernels.kernel("bwd", 7).launcher.hits.clear()  # kept from an earlier test: start over
    caps = []

    def spy(n_regs, num_warps):
        caps.append(real(n_regs, num_warps))
        return caps[-1]
    real, old = launch.register_cap, launch.set_enabled(True)
    launch.register_cap = spy
    try:
        first = ops_tp._bwd_impl(x, y, w, g, spec, "triton", 7)
        second = ops_tp._bwd_impl(x, y, w, g, spec, "triton", 7)
    finally:
        launch.register_cap = real
        launch.set_enabled(old)
    assert caps == [168]  # the second call ran the capped build
    ref = ops_tp._bwd_impl(*(t.double() for t in (x, y, w, g)), spec, "reference", 7)
    plan_of.cache_clear()
    ops_tp._BWD_DIRECT.clear()
    for a, b, r in zip(first, second, ref):
        assert torch.equal(a, b)
        assert ((a.double() - r).norm() / r.norm()).item() < 1e-2


class _SlowJit(_Jit):
    """A stand-in whose launches take ``delay`` seconds (a build)."""

    def __init__(self, delay):
        super().__init__()
        self.delay = delay

    def __getitem__(self, grid):
        run = super().__getitem__(grid)

        def slow(*args, **kw):
            time.sleep(self.delay)
            return run(*args, **kw)
        return slow


def _notices(fl, args, calls):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(calls):
            fl(*args)
        time.sleep(0.1)  # a timer that was not cancelled has fired by now
    return [str(w.message) for w in seen if "building the kernel" in str(w.message)]


@pytest.mark.parametrize("enabled", (True, False))
def test_a_slow_first_build_is_announced_once(fake, monkeypatch, enabled):
    """A first launch still building after BUILD_NOTICE_S warns, naming the kernel; a quick first
    launch and later launches do not (fast path and normal path alike)."""
    monkeypatch.setattr(launch, "BUILD_NOTICE_S", 0.05)
    monkeypatch.setattr(launch, "ENABLED", enabled)
    args = ((4,), [torch.zeros(64), torch.zeros(64)], [20, 5], (4, "DT", "ieee"), 4, 1)
    slow = launch.FastLaunch(_SlowJit(0.3))
    slow.fast = True
    (msg,) = _notices(slow, args, 3)
    assert "_SlowJit" in msg and "taken over 0.05 s" in msg
    assert len(slow.fn.normal) == (1 if enabled else 3)
    quick = launch.FastLaunch(_SlowJit(0.0))
    quick.fast = True
    assert _notices(quick, args, 2) == []
