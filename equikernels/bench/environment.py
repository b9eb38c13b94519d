"""What a benchmark run ran on: GPU kind, library versions, settings. ``gpu_kind`` names the GPU model
(``nvidia-h100-80gb-hbm3``); stored baselines are compared only within one kind."""
from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import importlib.util
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

import torch

from .. import settings
from .._version import __version__
from .timing import GIB, describe_exception, l2_bytes


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def gpu_kind(device: torch.device) -> str:
    """The GPU model as a file-name-safe slug (``cpu`` without a GPU)."""
    if device.type != "cuda":
        return "cpu"
    return slug(torch.cuda.get_device_name(device))


def _dist_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except Exception:
        return None


def module_version(name: str) -> Optional[str]:
    """Version of an installed module (None when absent), without importing it when the distribution
    metadata knows the version."""
    v = _dist_version(name.replace("_", "-")) or _dist_version(name)
    if v is not None:
        return v
    if name in sys.modules:
        return getattr(sys.modules[name], "__version__", "?")
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        spec = None
    return None if spec is None else "present (version unknown)"


def source_fingerprint() -> Dict[str, Optional[str]]:
    """equikernels' version and a hash of its installed source, so two runs of different code differ."""
    pkg = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for p in sorted(pkg.rglob("*.py")):
        h.update(str(p.relative_to(pkg)).encode())
        h.update(p.read_bytes())
    out: Dict[str, Optional[str]] = {"version": __version__, "source_sha256": h.hexdigest()[:16], "git_commit": None}
    try:
        r = subprocess.run(["git", "-C", str(pkg), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                           text=True, timeout=10)
        out["git_commit"] = r.stdout.strip() or None
    except Exception:
        pass
    return out


def env_info(device: torch.device) -> Dict[str, object]:
    info: Dict[str, object] = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": module_version("triton"),
        "e3nn": module_version("e3nn"),
        "mace_torch": module_version("mace") and (_dist_version("mace-torch") or module_version("mace")),
        "cuequivariance_torch": module_version("cuequivariance_torch"),
        "openequivariance": module_version("openequivariance"),
        "equikernels": source_fingerprint(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "env_vars": settings.environ_items(("EQUIKERNELS_", "TRITON_", "CUDA_VISIBLE")),
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update({"gpu": torch.cuda.get_device_name(device), "gpu_sms": p.multi_processor_count,
                     "gpu_mem_gib": round(p.total_memory / GIB, 2), "gpu_l2_bytes": l2_bytes(device),
                     "gpu_capability": f"{p.major}.{p.minor}", "driver": _driver()})
    else:
        info["gpu"] = "cpu"
    return info


def _driver() -> Optional[str]:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip().splitlines()[0]
    except Exception as exc:
        return describe_exception(exc, 80)
