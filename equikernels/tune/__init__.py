"""Autotuner: choose launch configurations (and the convolution dataflow) by timing real launches,
and remember the choice.

``choose(key_parts, candidates, measure, default)`` returns the cached choice for the key (no
timing on a hit); on a miss it times every candidate with ``measure`` (CUDA events, warm-up,
median), stores the fastest next to the default's time and returns it. Tuning is opt-in
(``EQUIKERNELS_AUTOTUNE=1``, or ahead of time with ``equikernels tune``): its first use compiles
and times every candidate (0.6-42 s per kernel set on an H200), and over the standard problems it
gained 4-9 % on three cells, the heuristic matching it elsewhere. Otherwise (or with
``EQUIKERNELS_AUTOTUNE=0``) the heuristic default is used without timing. A candidate that
fails (compile error, out of resources) is skipped; if all fail the default is used. Tuning changes
only how results are computed, never which: every candidate computes the same thing.

On a GPU the candidates other than the default are first run once each in parallel threads, so
their Triton compiles overlap (EQUIKERNELS_TUNE_THREADS caps the threads; 1 disables), then timed
in EQUIKERNELS_TUNE_ROUNDS (default 3) interleaved rounds, each round in a rotated order, so that
clock ramp-up and cache state do not favour whoever runs first or last. A candidate replaces the
default only when it is faster in every round and its median over the rounds beats the default's
by more than EQUIKERNELS_TUNE_MARGIN (default 0.03, relative) and by more than
EQUIKERNELS_TUNE_MIN_GAIN_MS (default 0.02 ms, absolute): a tie within timing noise keeps the
heuristic. (One pass in a fixed order, default first, picked two configurations that were
slower than the default when measured again.)
EQUIKERNELS_TUNE_MAX_CANDIDATES caps how many candidates are tried (the default always is).
"""
from __future__ import annotations

import json
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Optional, Sequence, Union

import torch

from .. import settings
from .cache import TuneCache

_CACHE: Optional[TuneCache] = None


def enabled() -> bool:
    return settings.get().autotune


def active(device: torch.device) -> bool:
    """Whether to tune now: enabled, on a GPU, and not while compiling or capturing a CUDA graph
    (checked in that order: the cheap test first, this runs on every launch)."""
    return (enabled() and device.type == "cuda" and not torch.compiler.is_compiling()
            and not torch.cuda.is_current_stream_capturing())


_CACHE_FOR: Optional[tuple] = None
_DEVICE_KEYS: Dict[tuple, str] = {}


def cache() -> TuneCache:
    """The process's cache object; rebuilt when the settings that locate the file change (this
    runs on every tuned launch, so it compares strings rather than building paths)."""
    global _CACHE, _CACHE_FOR
    s = settings.get()
    env = (s.tune_file, s.cache_dir, s.xdg_cache_home)
    if _CACHE is None or env != _CACHE_FOR:
        _CACHE, _CACHE_FOR = TuneCache(), env
    return _CACHE


def bucket(n: int) -> int:
    """Row / edge count bucket: the next power of two (tunings are shared within a bucket)."""
    return 1 << max(0, int(n) - 1).bit_length()


def device_key(device: torch.device) -> str:
    """GPU name and versions (memoized per device: this runs on every tuned launch)."""
    idx = device.index if device.index is not None or device.type != "cuda" else torch.cuda.current_device()
    k = (device.type, idx)
    if k not in _DEVICE_KEYS:
        import triton  # noqa: PLC0415

        from .._version import __version__  # noqa: PLC0415
        name = torch.cuda.get_device_name(idx) if device.type == "cuda" else "cpu"
        _DEVICE_KEYS[k] = f"{name}|torch {torch.__version__}|triton {triton.__version__}|equikernels {__version__}"
    return _DEVICE_KEYS[k]


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


def _threads(n: int) -> int:
    """Threads for the parallel compile pass: only with CUDA in use (the Triton interpreter is not
    thread-safe), capped by EQUIKERNELS_TUNE_THREADS and the CPU count."""
    s = settings.get()
    if s.tune_threads is not None:
        return max(1, min(n, s.tune_threads))
    if s.triton_interpret or not torch.cuda.is_initialized():
        return 1
    return max(1, min(n, os.cpu_count() or 1))


def _precompile(cands: Sequence[dict], measure: Callable[[dict], float], failed: Dict[int, str]) -> None:
    """Run ``measure`` once per candidate in parallel threads (results discarded): the first launch
    of each compiles it, and Triton releases the GIL for part of a compile (ptxas is a subprocess).
    Threads use the caller's device and stream."""
    cuda = torch.cuda.is_initialized()
    dev = torch.cuda.current_device() if cuda else None
    stream = torch.cuda.current_stream() if cuda else None
    grad = torch.is_grad_enabled()

    def one(i: int) -> None:
        try:
            if cuda:
                torch.cuda.set_device(dev)
                with torch.cuda.stream(stream), torch.set_grad_enabled(grad):
                    measure(cands[i])
            else:
                with torch.set_grad_enabled(grad):
                    measure(cands[i])
        except Exception as exc:  # noqa: BLE001 (reported and skipped below)
            failed[i] = f"{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(max_workers=_threads(len(cands)), thread_name_prefix="ek-tune") as pool:
        list(pool.map(one, range(len(cands))))


def _margin() -> float:
    return settings.get().tune_margin


def _min_gain_ms() -> float:
    """Smallest absolute gain (ms) that replaces the default (EQUIKERNELS_TUNE_MIN_GAIN_MS, default
    0.02). Per-call timings of sub-0.2 ms calls carry tens of microseconds of host jitter: a 15 us
    win in tuning turned into a 9 us loss when measured again (H200, tetris-poly-1 forward)."""
    return settings.get().tune_min_gain_ms


def _rounds() -> int:
    """Timing rounds per candidate (EQUIKERNELS_TUNE_ROUNDS, >= 1; the first also warms up)."""
    return settings.get().tune_rounds


def choose(key: str, candidates: Union[Sequence[dict], Callable[[], Sequence[dict]]],
           measure: Callable[[dict], float], default: dict) -> dict:
    """The tuned configuration for ``key`` (see the module docstring). ``candidates`` may be a
    callable; it is evaluated on a cache miss and once per process for a hit, whose configuration
    must be the default or one of the candidates (else it is tuned again and replaced)."""
    if not enabled():
        return default
    store = cache()
    hit = store.get(key)
    if hit is not None and key in store.checked:
        return hit["config"]
    cands = candidates() if callable(candidates) else candidates
    if hit is not None:
        if _same_config(hit["config"], default) or any(_same_config(hit["config"], c) for c in cands):
            store.checked.add(key)
            return hit["config"]
        warnings.warn(f"equikernels autotune: ignoring the cached configuration {hit['config']} for {key}: "
                      f"it is not one of the candidates (tuning again)", RuntimeWarning)
    best = _tune(key, cands, measure, default)
    store.checked.add(key)  # chosen from the candidates just now
    return best


def _same_config(cached: dict, candidate: dict) -> bool:
    """``cached`` (read back from JSON) is ``candidate``: compared as JSON (tuples become lists)."""
    try:
        return json.dumps(cached, sort_keys=True) == json.dumps(candidate, sort_keys=True)
    except (TypeError, ValueError):
        return False


def _tune(key: str, candidates: Sequence[dict], measure: Callable[[dict], float], default: dict) -> dict:
    others = [c for c in candidates if c != default]
    cap = settings.get().tune_max_candidates
    if cap is not None:
        others = others[:cap - 1]
    cands = [default] + others
    t0 = time.perf_counter()
    times: Dict[int, float] = {}
    failed: Dict[int, str] = {}

    def timed(i: int) -> None:
        try:
            times[i] = measure(cands[i])
        except Exception as exc:  # a candidate that does not compile or run is skipped
            failed[i] = f"{type(exc).__name__}: {exc}"

    timed(0)  # the default first, alone: it also builds what all candidates share
    compile_s = 0.0
    if len(cands) > 2 and _threads(len(cands) - 1) > 1:
        t1 = time.perf_counter()
        rest: Dict[int, str] = {}
        _precompile(cands[1:], measure, rest)
        failed.update({i + 1: m for i, m in rest.items()})
        compile_s = time.perf_counter() - t1
    for i in range(1, len(cands)):
        if i not in failed:
            timed(i)
    rounds = {i: [t] for i, t in times.items()}  # round 0 doubles as the warm-up of each candidate
    for r in range(1, _rounds()):
        live = sorted(rounds)
        for i in live[r % len(live):] + live[:r % len(live)]:  # rotated order
            try:
                rounds[i].append(measure(cands[i]))
            except Exception as exc:  # noqa: BLE001 (flaky candidate: drop it)
                failed[i] = f"{type(exc).__name__}: {exc}"
                rounds.pop(i)
    for i, msg in sorted(failed.items()):
        warnings.warn(f"equikernels autotune: candidate {cands[i]} failed for {key}: {msg}")
    if not rounds:
        return default
    times = {i: sorted(ts[1:] or ts)[len(ts[1:] or ts) // 2] for i, ts in rounds.items()}
    best = min(times, key=times.get)
    if 0 in times and best != 0:
        every = all(b < d for b, d in zip(rounds[best][1:] or rounds[best], rounds[0][1:] or rounds[0]))
        if not every or times[best] > min(times[0] * (1 - _margin()), times[0] - _min_gain_ms()):
            best = 0  # not faster than the default in every round and beyond the margin
    entry = {"config": cands[best], "ms": times[best], "default_ms": times.get(0), "candidates": len(cands),
             "rounds": {str(i): ts for i, ts in rounds.items()},
             "tuning_s": time.perf_counter() - t0, "parallel_compile_s": compile_s,
             "tried": [{"config": c, "ms": times.get(i), "error": failed.get(i)} for i, c in enumerate(cands)]}
    try:
        cache().put(key, entry)
    except OSError as exc:  # a read-only cache directory must not stop the run
        warnings.warn(f"equikernels autotune: could not write {cache().path}: {exc}")
    return cands[best]


__all__ = ["TuneCache", "active", "bucket", "cache", "choose", "device_key", "enabled", "time_ms"]
