"""Launch a Triton kernel with less host work per call than ``fn[grid](...)``.

Triton 3.6's ``JITFunction.run`` binds the arguments, builds the specialisation key (as strings),
looks the compiled kernel up and reads several knobs on every launch: 10-30 us, most of the time
of a small tensor product (nequip-water). ``FastLaunch`` launches normally the first
time and keeps the ``CompiledKernel``; a later call whose specialisation is the same calls its
launcher directly.

The key covers everything Triton specialises on for our kernels' arguments (pointer, int and
constexpr parameters, in that order, no defaults): each pointer's dtype, each int's class (equal
to 1, which Triton turns into a constexpr; divisible by 16; 32- or 64-bit range), the constexpr
values, num_warps, num_stages, the current device and the two knobs Triton adds to the options
(runtime.debug, compilation.instrumentation_mode). Pointers that are not all 16-byte aligned take
the normal path (rare: offset views), so a kernel compiled with alignment hints never sees them.

``Pinned`` trims the per-call work further for a caller that fixes the dtypes and constexprs.

Normal path always: under the interpreter (``TRITON_INTERPRET=1``: the kernel is not a
JITFunction), with ``EQUIKERNELS_FAST_LAUNCH=0`` (default on for Triton 3.6 only) (read at import; ``set_enabled`` toggles), while
a launch hook is installed (profilers), and for a kernel with pre-run hooks.

A first launch (on the fast path: each new specialisation; otherwise the launcher's first call)
that is still building after ``BUILD_NOTICE_S`` seconds warns, so that a build of minutes does not
look like a hang.
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Dict, Sequence

import torch

from .. import settings
from ..dtypes import HALF

try:
    from triton import knobs as _knobs
    from triton.compiler import CompiledKernel as _Compiled
    from triton.runtime.jit import JITFunction as _JIT
    from triton import __version__ as _TRITON_VERSION
except ImportError:  # pragma: no cover - Triton missing or an older layout: always the normal path
    _knobs = _Compiled = _JIT = None
    _TRITON_VERSION = ""


def env_enabled() -> bool:
    # on by default for the Triton it was validated with (3.6, H200: bit-identical to the normal
    # path); other versions opt in with =1
    try:
        on = settings.get().fast_launch
    except settings.SettingsError:  # left to the first reader that needs settings, so `--help` still imports
        on = None
    return _TRITON_VERSION.startswith("3.6.") if on is None else on


ENABLED = env_enabled()
_RT = _knobs.runtime if _knobs is not None else None
_CT = _knobs.compilation if _knobs is not None else None
_device = _stream = None  # the functions Triton itself asks (bound on the first fast launch)


LISTENERS: list = []  # called with the new setting (ops.native's C++ launches follow this switch)


def set_enabled(on: bool) -> bool:
    """Turn the fast path on or off for this process; returns the previous setting."""
    global ENABLED
    old, ENABLED = ENABLED, bool(on)
    for f in LISTENERS:
        f(ENABLED)
    return old


def int_class(v) -> int:
    """What Triton's specialisation keeps of an int argument: 1 (compiled as a constexpr), multiple
    of 16, and the width (i32, i64, u64). -1: not a plain int (bool / float / other), no fast path."""
    if v.__class__ is not int:
        return -1
    if v == 1:
        return 1
    c = 2 if v % 16 == 0 else 0
    if not -0x80000000 <= v <= 0x7FFFFFFF:
        c |= 4 if -0x8000000000000000 <= v <= 0x7FFFFFFFFFFFFFFF else 8
    return c


def spec_key(tensors: Sequence, ints: Sequence, consts: tuple, num_warps: int, num_stages: int):
    """The specialisation key of a launch, or None where the fast path must not be used
    (a pointer not 16-byte aligned, an int argument that is not a plain int)."""
    dtypes = []
    ptrs = 0
    for t in tensors:
        dtypes.append(t.dtype)
        ptrs |= t.data_ptr()
    if ptrs & 15:
        return None
    classes = tuple([int_class(v) for v in ints])
    if -1 in classes:
        return None
    return (tuple(dtypes), classes, consts, num_warps, num_stages)


def register_cap(n_regs: int, num_warps: int):
    """``maxnreg`` for a kernel whose register count lies at most about 8 % above an
    occupancy step (programs of ``num_warps`` warps per SM, 64K registers and 64 warps per SM,
    per-thread allocation in steps of 8), else None. Converting bf16 costs registers: the mace-large
    backward needs 168 registers with float32 or float16 operands and 180 with bfloat16, which drops
    it from 3 to 2 programs per SM (H200: 0.742 ms bf16, 0.568 fp16); capped at 168, ptxas spills 8
    bytes (devtools/offline_regs.py). FastLaunch keeps a capped build only if it spills at most
    SPILL_LIMIT bytes."""
    threads = 32 * num_warps
    programs = 65536 // (-(-n_regs // 8) * 8 * threads)
    cap = 65536 // ((programs + 1) * threads) // 8 * 8
    ok = cap >= 64 and (programs + 1) * num_warps <= 64
    return cap if ok and 0 < n_regs - cap <= n_regs // 12 else None


SPILL_LIMIT = 16  # spilled 32-bit words per thread a capped build may have (a few local loads)
RESCUE_PTXAS = "--opt-level 1"
COLLAPSE_REGS, COLLAPSE_STACK = 40, 4096  # a collapsed build: at most this many registers, at least these stack bytes


def collapsed(compiled) -> bool:
    """Whether ptxas gave ``compiled`` (a launched CompiledKernel) the collapse it gives some very large
    kernels at its default -O3: a minimal register count and kilobytes of stack per thread (the float64
    backward of a 68-path product: 32 registers and 27 KB; built at -O1, 255 registers and 2.8 KB, and
    6.6x faster). EQUIKERNELS_PTXAS_RESCUE=0 keeps such builds."""
    if _Compiled is None or not isinstance(compiled, _Compiled) or not settings.get().ptxas_rescue:
        return False
    regs, words = getattr(compiled, "n_regs", None), getattr(compiled, "n_spills", None)
    return regs is not None and words is not None and regs <= COLLAPSE_REGS and 4 * words >= COLLAPSE_STACK


def rescue_options(compiled) -> dict:
    """Launch options rebuilding a collapsed build at ptxas -O1 (after any PTXAS_OPTIONS); {} otherwise."""
    if not collapsed(compiled):
        return {}
    given = _knobs.nvidia.ptxas_options if _knobs is not None else None
    return {"ptx_options": f"{given} {RESCUE_PTXAS}" if given else RESCUE_PTXAS}
BUILD_NOTICE_S = 20.0  # a first launch still building after this long is announced (high orders: minutes)


@contextlib.contextmanager
def build_notice(name: str):
    """Warn once if the body (a kernel's first launch, which builds it) runs past ``BUILD_NOTICE_S``.
    A timer thread warns on time: Triton releases the GIL while it compiles."""
    after = BUILD_NOTICE_S
    timer = threading.Timer(after, lambda: warnings.warn(
        f"equikernels: building the kernel {name} for this GPU has taken over {after:g} s; products of high "
        "orders can take minutes the first time, then the build is cached on disk (TRITON_CACHE_DIR)",
        stacklevel=1))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def cap_dtypes(fp32: bool):
    """Operand dtypes whose kernels get register_cap: half precision, and float32 where the kernel
    asks (``fp32``: the partial-sum backward, 182 registers in float32 with 4 bytes spilled at 168).
    EQUIKERNELS_REG_CAP=0 turns the cap off, =all caps float32 everywhere."""
    mode = settings.get().reg_cap
    if mode == "0":
        return ()
    return HALF + ((torch.float32,) if fp32 or mode == "all" else ())


def _hooked() -> bool:
    """A launch hook is installed (proton and other profilers): it needs Triton's own path.
    Triton 3.6 keeps hooks in a HookChain; an older-style plain function counts as a hook."""
    for h in (_RT.launch_enter_hook, _RT.launch_exit_hook):
        if h is not None and getattr(h, "calls", True):
            return True
    return False


class FastLaunch:
    """``launch(grid, tensors, ints, consts, num_warps, num_stages)`` runs
    ``fn[grid](*tensors, *ints, *consts, num_warps=..., num_stages=...)``."""

    __slots__ = ("fn", "fast", "hits", "cap_fp32", "cap", "launched", "opts")

    def __init__(self, fn, cap_fp32: bool = False, cap: bool = True):
        self.fn = fn
        self.cap_fp32 = cap_fp32
        self.cap = cap  # False: never the register-capped build (kernels not tuned for it)
        self.fast = _JIT is not None and isinstance(fn, _JIT)  # a compiled kernel (not the interpreter)
        self.hits: Dict[tuple, tuple] = {}  # key -> (launcher, CUfunction, packed metadata, CompiledKernel)
        self.launched = False
        self.opts: dict = {}  # compile options of later normal-path launches (a collapsed build's rescue)

    def __call__(self, grid, tensors: Sequence, ints: Sequence, consts: tuple, num_warps: int, num_stages: int):
        if not (ENABLED and self.fast) or _hooked():
            if self.launched or not self.fast:
                self.fn[grid](*tensors, *ints, *consts, num_warps=num_warps, num_stages=num_stages, **self.opts)
                return
            with build_notice(self._name()):
                compiled = self.fn[grid](*tensors, *ints, *consts, num_warps=num_warps, num_stages=num_stages)
            self.opts = rescue_options(compiled)
            self.launched = True
            return
        key = spec_key(tensors, ints, consts, num_warps, num_stages)
        if key is None:
            self.fn[grid](*tensors, *ints, *consts, num_warps=num_warps, num_stages=num_stages, **self.opts)
            return
        if _stream is None:
            _bind_driver()
        key = (_device(), _RT.debug, _CT.instrumentation_mode, key)
        hit = self.hits.get(key)
        if hit is not None:
            run, function, meta, _ = hit
            g1 = grid[1] if len(grid) > 1 else 1
            g2 = grid[2] if len(grid) > 2 else 1
            # the launcher takes every parameter (constexprs too, it skips them); no launch hooks
            run(grid[0], g1, g2, _stream(key[0]), function, meta, None, None, None, *tensors, *ints, *consts)
            return
        with build_notice(self._name()):
            self._first(key, grid, tensors, ints, consts, num_warps, num_stages)
        self.launched = True

    def _first(self, key, grid, tensors, ints, consts, num_warps, num_stages):
        """The normal launch (building the kernel), its CompiledKernel kept under ``key``."""
        compiled = self.fn[grid](*tensors, *ints, *consts, num_warps=num_warps, num_stages=num_stages)
        # async compiles (a future, not a kernel) and kernels with pre-run hooks are not kept
        if (isinstance(compiled, _Compiled) and not self.fn.pre_run_hooks
                and len(tensors) + len(ints) + len(consts) == len(self.fn.arg_names)):
            self.opts = rescue_options(compiled)
            if self.opts:  # the rest of the launches run the -O1 build (no register cap: it would be -O3 again)
                compiled = self.fn.warmup(*tensors, *ints, *consts, grid=grid, num_warps=num_warps,
                                          num_stages=num_stages, **self.opts)
                compiled.run  # noqa: B018 - loads the module now, not on the first timed launch
            capped = cap_dtypes(self.cap_fp32) if self.cap and not self.opts else ()
            cap = register_cap(compiled.n_regs, num_warps) if any(t.dtype in capped for t in tensors) else None
            if cap is not None:  # later launches use a build capped at the occupancy step below
                build = self.fn.warmup(*tensors, *ints, *consts, grid=grid, num_warps=num_warps,
                                       num_stages=num_stages, maxnreg=cap)
                build.run  # noqa: B018 - loads the module now (sets n_spills), not on the first timed launch
                if getattr(build, "n_spills", SPILL_LIMIT + 1) <= SPILL_LIMIT:
                    compiled = build
            self.hits[key] = (compiled.run, compiled.function, compiled.packed_metadata, compiled)

    def _name(self) -> str:
        return getattr(self.fn, "__name__", None) or type(self.fn).__name__


class Pinned:
    """A FastLaunch whose constexprs and launch shape are fixed, for a caller that launches one
    kernel with the same argument dtypes every time (it vouches for that; ops.tp's direct backward
    keys its recipes on the dtypes). Per call only the device, the int classes and the pointers'
    alignment are looked at (FastLaunch also rebuilds the dtype and constexpr parts of its key), and
    the launcher gets integer addresses: it skips its own per-tensor data_ptr call and pointer check.
    That check is what rejects CPU tensors, so tensors not on a GPU take the normal path here."""

    __slots__ = ("launcher", "consts", "num_warps", "num_stages", "hits")

    def __init__(self, launcher: FastLaunch, consts: tuple, num_warps: int, num_stages: int):
        self.launcher, self.consts, self.num_warps, self.num_stages = launcher, consts, num_warps, num_stages
        self.hits: Dict[tuple, tuple] = {}

    def __call__(self, grid0: int, tensors: Sequence, ints: Sequence):
        fl = self.launcher
        if ENABLED and fl.fast and not _hooked():
            ptrs, acc, gpu = [], 0, True
            for t in tensors:
                p = t.data_ptr()
                ptrs.append(p)
                acc |= p
                gpu = gpu and t.is_cuda
            if gpu and not acc & 15:
                if _stream is None:
                    _bind_driver()
                dev = _device()
                key = (dev, _RT.debug, _CT.instrumentation_mode, tuple([int_class(v) for v in ints]))
                hit = self.hits.get(key)
                if hit is not None:
                    run, function, meta, _ = hit
                    run(grid0, 1, 1, _stream(dev), function, meta, None, None, None, *ptrs, *ints, *self.consts)
                    return
                fl((grid0,), tensors, ints, self.consts, self.num_warps, self.num_stages)
                full = spec_key(tensors, ints, self.consts, self.num_warps, self.num_stages)
                hit = fl.hits.get((dev, _RT.debug, _CT.instrumentation_mode, full)) if full is not None else None
                if hit is not None and -1 not in key[3]:
                    self.hits[key] = hit
                return
        fl((grid0,), tensors, ints, self.consts, self.num_warps, self.num_stages)

    def compiled_for(self, ints: Sequence):
        """(CUfunction, packed metadata, CompiledKernel) this launcher ran on the current device with
        int arguments of the classes of ``ints``, or None (not launched so, or not on the fast path)."""
        if _device is None:
            return None
        hit = self.hits.get((_device(), _RT.debug, _CT.instrumentation_mode, tuple([int_class(v) for v in ints])))
        return None if hit is None or len(hit) < 4 else hit[1:]


def bound_device():
    """The current device as Triton's launches see it; None before the first fast launch."""
    return None if _device is None else _device()


def _bind_driver() -> None:
    """Bind the device / stream queries Triton's run uses (needs the active driver, i.e. CUDA)."""
    global _device, _stream
    from triton.runtime.driver import driver  # noqa: PLC0415
    _device, _stream = driver.active.get_current_device, driver.active.get_current_stream
