"""Timing and measurement helpers of the benchmark suite.

* warm-up calls, then ``n`` back-to-back calls, each bracketed by its own pair of CUDA events;
  ``n`` is chosen so the timed work takes about ``target_ms``, at least ``min_reps``. The
  **median** is the headline number; min, p20, p80, mean, stdev and every raw per-call time are
  kept. Host work the GPU cannot hide is included, as a user calling the op in a loop sees it.
* calls rotate over several independent input sets when one set is small, so that the L2 cache
  does not flatter small problems (the set count follows from the bytes one call touches).
* on CPU (debug runs) ``time.perf_counter`` replaces the CUDA events.
"""
from __future__ import annotations

import gc
import math
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .._compat import default_dtype  # noqa: F401  (re-exported for the benchmark scripts)

GIB = 1024 ** 3
H100_L2_BYTES = 50 * 1024 ** 2  # fallback when torch cannot tell the L2 size


# --- timing -------------------------------------------------------------------------------------
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stats(times_ms: List[float]) -> Dict[str, float]:
    s = sorted(times_ms)

    def pct(q: float) -> float:  # nearest-rank on the sorted sample, like numpy's "lower"
        return s[min(len(s) - 1, max(0, int(math.floor(q * (len(s) - 1)))))]

    return {
        "ms_median": statistics.median(s),
        "ms_min": s[0],
        "ms_max": s[-1],
        "ms_p20": pct(0.2),
        "ms_p80": pct(0.8),
        "ms_mean": statistics.fmean(s),
        "ms_stdev": statistics.stdev(s) if len(s) > 1 else 0.0,
        "n": len(s),
    }


def call_times(fn, n: int, cuda: bool, first: int = 0) -> List[float]:
    """ms of ``fn(first)``, ..., ``fn(first + n - 1)``, each between its own pair of CUDA events
    (back to back, one synchronisation at the end) or perf_counter calls on the CPU."""
    times: List[float] = []
    if cuda:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            starts[i].record()
            fn(first + i)
            ends[i].record()
        ends[-1].synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]
    for i in range(n):
        t0 = time.perf_counter()
        fn(first + i)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def time_calls(fn: Callable[[int], object], device: torch.device, *, n_sets: int = 1,
               target_ms: float = 250.0, min_reps: int = 5, max_reps: int = 2000,
               warmup: int = 3) -> Dict[str, object]:
    """Time ``fn(i)`` (i = call number; the callee uses input set ``i % n_sets``).

    Returns the statistics of the per-call times in ms plus the raw list (``times_ms``).
    """
    cuda = device.type == "cuda"
    for i in range(max(warmup, n_sets)):
        fn(i)
    synchronize(device)
    # estimate the per-call time from a short back-to-back burst
    k = max(3, n_sets)
    if cuda:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(k):
            fn(i)
        b.record()
        b.synchronize()
        est = a.elapsed_time(b) / k
    else:
        t0 = time.perf_counter()
        for i in range(k):
            fn(i)
        est = (time.perf_counter() - t0) * 1e3 / k
    n = int(min(max_reps, max(min_reps, math.ceil(target_ms / max(est, 1e-3)))))
    times = call_times(fn, n, cuda)
    out: Dict[str, object] = dict(_stats(times))
    out["n_sets"] = n_sets
    out["est_ms"] = est
    out["times_ms"] = [round(t, 6) for t in times]
    return out


def queued_gpu_times(fn: Callable[[int], object], device: torch.device, est_ms: float, *,
                     max_calls: int = 64, target_ms: float = 100.0) -> Dict[str, object]:
    """GPU time per call without the host in it: calls each between their own pair of CUDA events
    (as ``call_times``), issued while the GPU is held by ``torch.cuda._sleep`` long enough for the
    host to queue every one of them first. The per-call times of ``time_calls`` include host work the
    GPU cannot hide (what a user sees calling one op in a loop); where the host is slower than the
    kernels the two differ, and this one is the kernels' time.

    ``queued`` says whether the host really finished issuing before the sleep ended (else the
    figures include host gaps again and are not GPU time)."""
    if device.type != "cuda":
        return {}
    n = int(min(max_calls, max(5, math.ceil(target_ms / max(est_ms, 1e-3)))))
    sleep_ms = 2.0 * n * max(est_ms, 0.05) + 20.0
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    synchronize(device)
    s0.record()
    torch.cuda._sleep(int(sleep_ms * 2.0e6))  # cycles: ~sleep_ms at 2 GHz, longer at a lower clock
    s1.record()
    t0 = time.perf_counter()
    for i in range(n):
        starts[i].record()
        fn(i)
        ends[i].record()
    issue_ms = (time.perf_counter() - t0) * 1e3
    ends[-1].synchronize()
    times = sorted(a.elapsed_time(b) for a, b in zip(starts, ends))
    return {"gpu_ms_median": statistics.median(times), "gpu_ms_min": times[0], "gpu_n": n,
            "host_us_per_call": round(issue_ms / n * 1e3, 1), "gpu_queued": issue_ms < s0.elapsed_time(s1)}


def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0  # CPU debug runs: no rotation
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or H100_L2_BYTES)


def rotation_sets(bytes_per_call: int, device: torch.device, *, factor: float = 4.0,
                  max_sets: int = 8) -> int:
    """How many independent input sets so that one rotation touches >= factor x L2."""
    if bytes_per_call <= 0:
        return max_sets
    return int(min(max_sets, max(1, math.ceil(factor * l2_bytes(device) / bytes_per_call))))


# --- copy bandwidth -----------------------------------------------------------------------------
def copy_bandwidth(device: torch.device, nbytes: Optional[int] = None, reps: int = 30) -> Dict[str, float]:
    """Device-to-device copy ``dst.copy_(src)``; bandwidth counts read + write (2 x nbytes)."""
    if nbytes is None:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            nbytes = int(min(GIB, free // 8))
        else:
            nbytes = 8 * 1024 ** 2
    n = nbytes // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    res = time_calls(lambda i: dst.copy_(src), device, target_ms=200.0, min_reps=reps, warmup=5)
    del src, dst
    free_memory(device)
    med = res["ms_median"]
    return {
        "bytes_per_copy": n * 4,
        "ms_median": med,
        "ms_min": res["ms_min"],
        "n": res["n"],
        "gbps_median": 2 * n * 4 / (med * 1e-3) / 1e9,
        "gbps_best": 2 * n * 4 / (res["ms_min"] * 1e-3) / 1e9,
    }


def host_probe(device: torch.device, ops: int = 2000, batches: int = 5) -> Dict[str, float]:
    """Host speed: microseconds to issue one tiny in-place op on ``device`` (Python, dispatch and, on
    a GPU, the launch; the GPU keeps up, so this is host time). Median over ``batches`` batches."""
    t = torch.zeros(1, device=device)
    per = max(1, ops // batches)
    for _ in range(100):
        t.add_(1.0)
    synchronize(device)
    means = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(per):
            t.add_(1.0)
        means.append((time.perf_counter() - start) / per * 1e6)
        synchronize(device)
    return {"us_per_op": statistics.median(means), "us_per_op_min": min(means), "ops": per * batches}


# --- minimal traffic ----------------------------------------------------------------------------
def minimal_bytes(direction: str, rows: int, d1: int, d2: int, d3: int, nw: int, shared: bool,
                  itemsize: int) -> int:
    """Bytes that must move at least once (the minimal traffic of one call).

    fwd : read x, y, w; write out                       -> d1 + d2 + w + d3 words per row
    bwd : read x, y, w, g; write gx, gy, gw             -> 2(d1 + d2 + w) + d3
    dbwd: read x, y, w, g, Rx, Ry, Rw; write dx, dy, dw, dg -> 3(d1 + d2 + w) + 2 d3
    Shared weights (one weight vector for all rows) are counted once, not per row.
    """
    k = {"fwd": 1, "bwd": 2, "dbwd": 3}[direction]
    kd3 = {"fwd": 1, "bwd": 1, "dbwd": 2}[direction]
    per_row = k * (d1 + d2) + kd3 * d3 + (0 if shared else k * nw)
    once = k * nw if shared else 0
    return itemsize * (rows * per_row + once)


# --- layouts ------------------------------------------------------------------------------------
def ir_mul_index(irreps: Sequence[Tuple[int, int]]) -> torch.Tensor:
    """Index ``idx`` with ``t_ir_mul = t_mul_ir[..., idx]``; irreps as (mul, 2l+1) pairs.

    For every segment of ``mul`` copies of a ``d``-dimensional irrep, the e3nn ("mul_ir") block
    ``[mul, d]`` becomes the component-major ("ir_mul") block ``[d, mul]``.
    """
    idx = []
    off = 0
    for mul, d in irreps:
        block = torch.arange(mul * d).reshape(mul, d).t().reshape(-1)
        idx.append(block + off)
        off += mul * d
    return torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long)


class LayoutConverter:
    """mul_ir <-> ir_mul for one irreps (a permutation of the last dimension)."""

    def __init__(self, irreps: Sequence[Tuple[int, int]]):
        self.to_ir = ir_mul_index(irreps)
        self.to_mul = torch.argsort(self.to_ir)
        self._dev: Dict[torch.device, Tuple[torch.Tensor, torch.Tensor]] = {}

    def _idx(self, device):
        if device not in self._dev:
            self._dev[device] = (self.to_ir.to(device), self.to_mul.to(device))
        return self._dev[device]

    def to_ir_mul(self, t: torch.Tensor) -> torch.Tensor:
        return t.index_select(-1, self._idx(t.device)[0])

    def to_mul_ir(self, t: torch.Tensor) -> torch.Tensor:
        return t.index_select(-1, self._idx(t.device)[1])


# --- errors and memory --------------------------------------------------------------------------
def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a = a.detach().to(torch.float64).reshape(ref.shape)
    ref = ref.detach().to(torch.float64)
    den = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(a - ref).item()
    return num / den if den > 0 else num


def is_oom(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or "out of memory" in str(exc).lower()


def describe_exception(exc: BaseException, limit: int = 300) -> str:
    msg = " ".join(str(exc).split())
    if len(msg) > limit:
        msg = msg[:limit] + "..."
    return f"{type(exc).__name__}: {msg}"


def free_memory(device: torch.device) -> None:
    """Return freed device memory to the driver between cells (nothing to do on the CPU)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> Optional[float]:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / GIB




# --- formatting ---------------------------------------------------------------------------------
def fmt_ms(v: Optional[float]) -> str:
    if v is None:
        return "—"
    if v >= 100:
        return f"{v:.1f}"
    if v >= 10:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fmt_err(v: Optional[float]) -> str:
    return "—" if v is None else f"{v:.1e}"
