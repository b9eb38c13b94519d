"""Generated Triton kernels for a batched tensor product plan: build, cache, launch."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl

from .cache import load_module
from .emit import Group, KernelMeta, Unsupported, generate

_DT = {torch.float32: tl.float32, torch.float64: tl.float64}
NEED_X, NEED_Y, NEED_W = 1, 2, 4


@dataclass(frozen=True)
class LaunchConfig:
    rows: int = 4          # rows per program
    num_warps: int = 4
    num_stages: int = 1


def default_config(kind: str, dtype: torch.dtype, device: torch.device) -> LaunchConfig:
    env = os.environ.get("EQUIKERNELS_ROWS")
    rows = int(env) if env else (4 if dtype == torch.float32 else 2)
    return LaunchConfig(rows=rows)


def _alloc(shape, like: torch.Tensor, zero: bool) -> torch.Tensor:
    """Output buffer. Elements the kernel does not write are zero-filled; with EQUIKERNELS_POISON=1
    the rest are NaN-filled so tests see any element a kernel forgets to write."""
    if zero:
        return torch.zeros(shape, dtype=like.dtype, device=like.device)
    if os.environ.get("EQUIKERNELS_POISON") == "1":
        return torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


class _Kernel:
    def __init__(self, name: str, groups, layout: str, row_operands, describe: str):
        body, self.meta = generate(name, groups, layout, row_operands)
        header = f"# {describe}\nimport triton\nimport triton.language as tl\n\n\n"
        digest = hashlib.sha256((header + body).encode()).hexdigest()[:12]
        self.module = load_module(f"{name}_{digest}", header + body)
        self.fn = getattr(self.module, name)
        self.source_path = self.module.__file__

    def launch(self, tensors: Dict[str, torch.Tensor], outputs: Dict[str, torch.Tensor], n: int,
               cfg: LaunchConfig, dtype: torch.dtype, programs: Optional[int] = None):
        nblk = triton.cdiv(n, cfg.rows)
        grid = (max(1, min(nblk, programs)) if programs else max(1, nblk),)
        args = [tensors[k] for k in self.meta.inputs] + [outputs[k] for k in self.meta.outputs]
        self.fn[grid](*args, n, nblk, ROWS=cfg.rows, DT=_DT[dtype], num_warps=cfg.num_warps,
                      num_stages=cfg.num_stages)
        return grid[0]


class TPKernels:
    """Forward and backward kernels of one Plan (problem + layout), built lazily per dtype/config."""

    def __init__(self, plan):
        self.plan = plan
        self.problem = plan.problem
        self._cache: Dict[tuple, _Kernel] = {}

    def _row_operands(self):
        rows = {"x", "y", "g"}
        if not self.problem.shared_weights:
            rows.add("w")
        return rows

    def kernel(self, kind: str, need: int = 0) -> _Kernel:
        key = (kind, need)
        if key not in self._cache:
            p = self.plan
            if kind == "fwd":
                groups = [Group(p.table, "out")]
            else:
                groups = [Group(p.grad_tables[n], "g" + n, reduce_rows=(n == "w" and self.problem.shared_weights))
                          for bit, n in ((NEED_X, "x"), (NEED_Y, "y"), (NEED_W, "w")) if need & bit]
            name = f"tp_{kind}{need or ''}_{self.problem.key()}_{p.layout}"
            self._cache[key] = _Kernel(name, groups, p.layout, self._row_operands(),
                                       f"{kind} of {self.problem.describe()} [{p.layout}]")
        return self._cache[key]

    def forward(self, x, y, w, cfg: Optional[LaunchConfig] = None):
        cfg = cfg or default_config("fwd", x.dtype, x.device)
        n = x.shape[0]
        k = self.kernel("fwd")
        out = _alloc((n, self.problem.dim_out), x, "out" in k.meta.zero_init)
        if n:
            k.launch({"x": x, "y": y, "w": w}, {"out": out}, n, cfg, x.dtype)
        return out

    def backward(self, x, y, w, g, need: int, cfg: Optional[LaunchConfig] = None):
        cfg = cfg or default_config("bwd", x.dtype, x.device)
        n = x.shape[0]
        k = self.kernel("bwd", need)
        shared = self.problem.shared_weights
        outs, res = {}, {}
        for bit, name, like in ((NEED_X, "x", x), (NEED_Y, "y", y), (NEED_W, "w", w)):
            if not need & bit:
                res[name] = like.new_empty(0)
                continue
            if name == "w" and shared:
                outs["gw"] = None  # partials, allocated once the grid is known
            else:
                outs["g" + name] = _alloc(like.shape, like, "g" + name in k.meta.zero_init)
        if n == 0:
            for name in ("x", "y", "w"):
                if "g" + name in outs:
                    t = outs["g" + name]
                    res[name] = t if t is not None else torch.zeros_like(w)
            return res["x"], res["y"], res["w"]
        programs = None
        if "gw" in outs and outs["gw"] is None:
            programs = min(triton.cdiv(n, cfg.rows), 4 * _num_sms(x.device))
            outs["gw"] = _alloc((programs, w.shape[0]), w, "gw" in k.meta.zero_init)
        k.launch({"x": x, "y": y, "w": w, "g": g}, outs, n, cfg, x.dtype, programs)
        for name in ("x", "y", "w"):
            if "g" + name in outs:
                t = outs["g" + name]
                if name == "w" and shared:
                    t = t.sum(0, dtype=torch.float64).to(w.dtype)  # deterministic, no precision loss
                res[name] = t
        return res["x"], res["y"], res["w"]
