"""How many torch threads the calculator and ``equikernels md`` use on a CPU.

An MD step of a small MACE model is thousands of small operations, and extra intra-op threads
mostly add synchronisation, badly so when other processes share the cores. Measured on a 2-core
machine shared with other jobs (the bundled model, energy + forces, median of 5 calls, one process
per cell, rounds interleaved): at 108 Cu atoms a second thread gained nothing (float64 0.113 vs
0.113 s and 0.175 vs 0.202 s; float32 0.063 vs 0.062 s) and, when the cores were busier, cost up
to 10x; at 500 atoms it won one float64 round (1.16 vs 1.56 s) and lost or tied the others.
Hence ``DEFAULT_MAX_THREADS = 1``; for large systems on an idle many-core machine pass a count
(``--threads``, ``num_threads=``) or set ``OMP_NUM_THREADS``, which always win.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from .. import settings

DEFAULT_MAX_THREADS = 1


def physical_cores() -> int:
    """Cores this process may run on (affinity-aware where the OS tells)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """The thread count used when none is given: ``min(cores, DEFAULT_MAX_THREADS)``."""
    return max(1, min(physical_cores(), DEFAULT_MAX_THREADS))


def resolve_threads(num_threads: Optional[int]) -> Optional[int]:
    """The count to set: ``num_threads`` (validated), else the default, else None when the user
    already chose through ``OMP_NUM_THREADS``."""
    if num_threads is not None:
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f"num_threads must be a positive integer or None, got {num_threads!r}")
        return num_threads
    if settings.get().omp_num_threads:
        return None
    return default_threads()


def apply_threads(device: torch.device, num_threads: Optional[int]) -> int:
    """Set torch's intra-op threads for a CPU ``device`` (see ``resolve_threads``); returns the
    count in force. Other devices: nothing is changed."""
    if device.type == "cpu":
        n = resolve_threads(num_threads)
        if n is not None and n != torch.get_num_threads():
            torch.set_num_threads(n)
    elif num_threads is not None:
        resolve_threads(num_threads)  # still refuse a bad value
    return torch.get_num_threads()
