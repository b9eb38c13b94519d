"""Shared helpers of the benchmark scripts. Timing, bandwidth, byte counts, layouts and errors come
from ``equikernels.bench.timing`` (the harness ``equikernels bench`` uses; see docs/performance.md);
this module adds the environment record and the formatting the scripts print.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import re
import socket
import subprocess
from pathlib import Path
from typing import Dict, Optional

import torch

from equikernels.bench.timing import *  # noqa: F401,F403  (the harness, re-exported)
from equikernels.bench.timing import _stats, describe_exception, fmt_err, fmt_ms, l2_bytes  # noqa: F401
from equikernels.bench.environment import _dist_version, module_version as _module_version  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parent.parent


# --- environment --------------------------------------------------------------------------------
def equikernels_fingerprint() -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {"version": _dist_version("equikernels")}
    try:
        r = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"],
                           capture_output=True, text=True, timeout=10)
        out["git_commit"] = r.stdout.strip() or None
        r = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "equikernels"],
                           capture_output=True, text=True, timeout=10)
        out["git_dirty"] = bool(r.stdout.strip()) if r.returncode == 0 else None
    except Exception:
        out["git_commit"] = None
    h = hashlib.sha256()
    pkg = REPO_ROOT / "equikernels"
    for p in sorted(pkg.rglob("*.py")):
        h.update(str(p.relative_to(pkg)).encode())
        h.update(p.read_bytes())
    out["source_sha256"] = h.hexdigest()[:16]
    return out


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
    info: Dict[str, object] = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": _module_version("triton"),
        "e3nn": _module_version("e3nn"),
        "cuequivariance": _module_version("cuequivariance"),
        "cuequivariance_torch": _module_version("cuequivariance_torch"),
        "cuequivariance_ops_torch": (_dist_version("cuequivariance-ops-torch-cu13")
                                     or _dist_version("cuequivariance-ops-torch-cu12")
                                     or _module_version("cuequivariance_ops_torch")),
        "openequivariance": _module_version("openequivariance"),
        "equikernels": equikernels_fingerprint(),
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "env_vars": {k: v for k, v in os.environ.items()
                     if k.startswith(("EQUIKERNELS_", "TRITON_", "CUEQUIVARIANCE", "OEQ", "CUDA_VISIBLE"))},
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update({
            "gpu": torch.cuda.get_device_name(device),
            "gpu_sms": p.multi_processor_count,
            "gpu_mem_gib": round(p.total_memory / GIB, 2),
            "gpu_l2_bytes": l2_bytes(device),
            "gpu_capability": f"{p.major}.{p.minor}",
            "nvidia_smi": _nvidia_smi(),
        })
    else:
        info["gpu"] = "cpu"
        info["cpu"] = platform.processor() or platform.machine()
        info["cpu_threads"] = torch.get_num_threads()
    return info


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")


