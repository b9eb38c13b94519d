"""Autotuner: choose launch configurations (and the convolution dataflow) by timing real launches,
and remember the choice (DESIGN §5).

``choose(key_parts, candidates, measure, default)`` returns the cached choice for the key (no
timing on a hit); on a miss it times every candidate with ``measure`` (CUDA events, warm-up,
median), stores the fastest next to the default's time and returns it. Tuning is opt-in for now
(``EQUIKERNELS_AUTOTUNE=1``, or ahead of time with ``equikernels tune``): its first use compiles
every candidate, and its benefit has not yet been measured on a GPU. Otherwise (or with
``EQUIKERNELS_AUTOTUNE=0``) the heuristic default is used without timing. A candidate that
fails (compile error, out of resources) is skipped; if all fail the default is used. Tuning changes
only how results are computed, never which: every candidate computes the same thing.
"""
from __future__ import annotations

import os
import time
import warnings
from typing import Callable, Dict, Optional, Sequence

import torch

from .cache import TuneCache

_CACHE: Optional[TuneCache] = None


def enabled() -> bool:
    return os.environ.get("EQUIKERNELS_AUTOTUNE", "0") == "1"


def active(device: torch.device) -> bool:
    """Whether to tune now: enabled, on a GPU, and not while compiling or capturing a CUDA graph
    (checked in that order: the cheap test first, this runs on every launch)."""
    return (enabled() and device.type == "cuda" and not torch.compiler.is_compiling()
            and not torch.cuda.is_current_stream_capturing())


def cache() -> TuneCache:
    global _CACHE
    if _CACHE is None or _CACHE.path != TuneCache().path:
        _CACHE = TuneCache()
    return _CACHE


def bucket(n: int) -> int:
    """Row / edge count bucket: the next power of two (tunings are shared within a bucket)."""
    return 1 << max(0, int(n) - 1).bit_length()


def device_key(device: torch.device) -> str:
    import triton  # noqa: PLC0415

    from .. import __version__  # noqa: PLC0415
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return f"{name}|torch {torch.__version__}|triton {triton.__version__}|equikernels {__version__}"


def time_ms(fn: Callable[[], object], device: torch.device, reps: int = 10, warmup: int = 2) -> float:
    """Median time of ``fn`` in ms: CUDA events on a GPU, perf_counter elsewhere."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def choose(key: str, candidates: Sequence[dict], measure: Callable[[dict], float], default: dict) -> dict:
    """The tuned configuration for ``key`` (see the module docstring)."""
    if not enabled():
        return default
    hit = cache().get(key)
    if hit is not None:
        return hit["config"]
    cands = list(candidates)
    if default not in cands:
        cands.insert(0, default)
    t0 = time.perf_counter()
    times: Dict[int, float] = {}
    for i, c in enumerate(cands):
        try:
            times[i] = measure(c)
        except Exception as exc:  # a candidate that does not compile or run is skipped
            warnings.warn(f"equikernels autotune: candidate {c} failed for {key}: {type(exc).__name__}: {exc}")
    if not times:
        return default
    best = min(times, key=times.get)
    entry = {"config": cands[best], "ms": times[best], "default_ms": times.get(cands.index(default)),
             "candidates": len(cands), "tuning_s": time.perf_counter() - t0}
    try:
        cache().put(key, entry)
    except OSError as exc:  # a read-only cache directory must not stop the run
        warnings.warn(f"equikernels autotune: could not write {cache().path}: {exc}")
    return cands[best]


__all__ = ["TuneCache", "active", "bucket", "cache", "choose", "device_key", "enabled", "time_ms"]
