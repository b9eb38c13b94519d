"""The fast launch path (equikernels/codegen/launch.py): its specialisation key against Triton's
own, the cache logic with a stand-in kernel, the fallbacks, and TP results through it (the
interpreter on CPU: normal path; a real GPU with -m gpu: fast path against the normal one)."""
import os

import pytest
import torch

from equikernels.catalog import problem as catalog_problem
from equikernels.codegen import launch
from equikernels.ops import tp as ops_tp
from equikernels.ops.tp import plan_of, spec_of

triton = pytest.importorskip("triton")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


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
    def __init__(self):
        self.calls = []
        self.run = lambda *a: self.calls.append(a)
        self.function, self.packed_metadata = 1234, (4, 1, 0)


class _Jit:
    """Stands in for a JITFunction: fn[grid](*args, **kw) records the call, returns a 'kernel'."""
    arg_names = ["x_ptr", "out_ptr", "N", "NBLK", "ROWS", "DT", "PREC"]

    def __init__(self):
        self.normal, self.compiled, self.pre_run_hooks = [], [], []

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.normal.append((grid, args, kw))
            self.compiled.append(_Compiled())
            return self.compiled[-1]
        return run


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
    ks = [k for k in kernels._cache.values() if k is not None]
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
        assert any(k.launcher.hits for k in kernels._cache.values() if k is not None)
        # misaligned operands (views 1 element in): the normal path, same numbers
        x, y, w = _operands(p, 37, "cuda")[:3]
        xs = torch.empty(x.numel() + 1, device="cuda")[1:].view_as(x).copy_(x)
        spec = spec_of(p, "ir_mul")
        torch.testing.assert_close(ops_tp._fwd_impl(xs, y, w, spec, "triton"), ops_tp._fwd_impl(x, y, w, spec, "triton"))
    finally:
        launch.set_enabled(old)
    for a, b in zip(fast, normal):
        assert torch.equal(a, b)
