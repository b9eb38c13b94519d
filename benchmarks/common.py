"""Shared helpers of the benchmark scripts. Timing, bandwidth, byte counts, layouts, errors and the
environment record come from ``equikernels.bench`` (the harness ``equikernels bench`` uses; see
docs/performance.md); this module adds what a script run records beyond it (host, git state,
cuEquivariance's packages, nvidia-smi) and the file names the scripts write.
"""
from __future__ import annotations

import datetime as _dt
import platform
import socket
import subprocess
from pathlib import Path
from typing import Dict

import torch

from equikernels import settings
from equikernels.bench import environment
from equikernels.bench.environment import slug  # noqa: F401  (re-exported for the scripts)
from equikernels.bench.timing import *  # noqa: F401,F403  (the harness, re-exported)
from equikernels.bench.timing import _stats, describe_exception, fmt_err, fmt_ms, l2_bytes  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parent.parent


def _git_dirty() -> object:
    """Whether the checkout's package sources differ from its commit (None when git cannot tell)."""
    try:
        r = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "equikernels"],
                           capture_output=True, text=True, timeout=10)
        return bool(r.stdout.strip()) if r.returncode == 0 else None
    except Exception:
        return None


def _nvidia_smi() -> Dict[str, str]:
    q = "name,driver_version,clocks.max.sm,power.limit,memory.total"
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        first = r.stdout.strip().splitlines()[0]
        return dict(zip(q.split(","), [s.strip() for s in first.split(",")]))
    except Exception as exc:
        return {"error": describe_exception(exc, 120)}


def env_info(device: torch.device) -> Dict[str, object]:
    """``equikernels.bench.environment.env_info`` plus the host, the git state, cuEquivariance's
    packages, TF32 and (on a GPU) nvidia-smi's clocks and limits."""
    info = environment.env_info(device)
    info["host"] = socket.gethostname()
    info["equikernels"]["git_dirty"] = _git_dirty()
    info["cuequivariance"] = environment.module_version("cuequivariance")
    info["cuequivariance_ops_torch"] = (environment._dist_version("cuequivariance-ops-torch-cu13")
                                        or environment._dist_version("cuequivariance-ops-torch-cu12")
                                        or environment.module_version("cuequivariance_ops_torch"))
    info["matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
    info["env_vars"] = settings.environ_items(("EQUIKERNELS_", "TRITON_", "CUEQUIVARIANCE", "OEQ", "CUDA_VISIBLE"))
    if device.type == "cuda":
        info["nvidia_smi"] = _nvidia_smi()
    else:
        info["cpu"] = platform.processor() or platform.machine()
        info["cpu_threads"] = torch.get_num_threads()
    return info


def stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
