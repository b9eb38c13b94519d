"""The launcher of the batched tensor product: builds the kernels a plan names, runs plans.

Decisions (kernel split, generator choices, launch shapes) are the planner's (planner.py); this
module compiles and launches what a ``DirectionPlan`` says, and turns plans into pinned recipes
(recipe.py) for the eager paths that skip per-call work.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Dict, Optional

import torch
import triton

from .. import settings
from .cache import load_module
from ..dtypes import acc_dtype, math_dtype_of
from .emit import KernelMeta, generate
from .launch import FastLaunch
from .plan_types import KernelChoice, KernelStep, LaunchConfig
from .planner import NEED_W, NEED_X, NEED_Y, Planner, channelwise_rows, weights_dominate
from .planner import default_config  # noqa: F401 (public: the heuristic launch shape)
from . import recipe as _recipe
from .recipe import KERNEL_DT, constexprs  # noqa: F401 (KERNEL_DT: public for equikernels.experimental)


def _poison() -> bool:
    return settings.get().poison


def _alloc(shape, like: torch.Tensor, zero: bool, dtype: Optional[torch.dtype] = None,
           poison: Optional[bool] = None) -> torch.Tensor:
    """Output buffer (dtype of ``like`` unless given). Elements the kernel does not write are
    zero-filled; with EQUIKERNELS_POISON=1 (``poison``: the caller read it already) the rest are
    NaN-filled so tests see any element a kernel forgets to write."""
    dtype = dtype or like.dtype
    if zero:
        return torch.zeros(shape, dtype=dtype, device=like.device)
    if _poison() if poison is None else poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (4 off CUDA), for partial-sum program counts."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


class Kernel:
    """One generated Triton kernel over ``groups`` (its source, metadata and launch). ``choice``: a
    plan_types.KernelChoice, or the set of row operands for the default choices."""

    def __init__(self, name: str, groups, layout: str, choice, describe: str, built=None, acc_outputs=None):
        if not isinstance(choice, KernelChoice):
            choice = KernelChoice(row_operands=frozenset(choice))
        # ``built``: (source, KernelMeta) made already (the planner's), else emit.generate
        body, self.meta = built or generate(name, groups, layout, choice)
        header = f"# {describe}\nimport triton\nimport triton.language as tl\n\n\n"
        digest = hashlib.sha256((header + body).encode()).hexdigest()[:12]
        self.module = load_module(f"{name}_{digest}", header + body)
        self.fn = getattr(self.module, name)
        # cap_fp32: float32 builds just above an occupancy step are capped too (launch.register_cap)
        self.launcher = FastLaunch(self.fn, choice.cap_fp32)
        self.source_path = self.module.__file__
        self.acc_outputs = (frozenset(g.out_ptr for g in groups if g.accumulate and not g.reduce_rows)
                            if acc_outputs is None else acc_outputs)

    @classmethod
    def of_member(cls, m, choice: KernelChoice) -> "Kernel":
        """The kernel of a plan step's member (plan_types.Member)."""
        meta = KernelMeta(m.name, m.inputs, m.outputs, m.zero_init, m.reduce_rows, m.min_rows)
        return cls(m.name, (), "", choice, m.describe, built=(m.body, meta), acc_outputs=m.acc_outputs)

    def launch(self, tensors: Dict[str, torch.Tensor], outputs: Dict[str, torch.Tensor], n: int,
               cfg: LaunchConfig, dtype: torch.dtype, programs: Optional[int] = None):
        nblk = (n + cfg.rows - 1) // cfg.rows
        grid = (max(1, min(nblk, programs)) if programs else max(1, nblk),)
        args = [tensors[k] for k in self.meta.inputs] + [outputs[k] for k in self.meta.outputs]
        # kernel parameters: pointers, N, NBLK, then the constexprs ROWS, DT, PREC (emit.generate)
        self.launcher(grid, args, (n, nblk), constexprs(cfg, dtype), cfg.num_warps, cfg.num_stages)


class _KernelSet:
    """A plan step split over several kernels launched in sequence on one stream. Outputs that two
    parts write are zero-filled first and added into, so the result equals the single kernel's."""

    def __init__(self, parts, step: KernelStep):
        self.parts = parts
        self.meta = KernelMeta(step.name, step.inputs, step.outputs, step.zero_filled, step.row_partials,
                               step.min_rows)
        self.acc_outputs = step.acc_outputs

    def launch(self, tensors, outputs, n, cfg, dtype, programs=None):
        for k in self.parts:
            k.launch(tensors, outputs, n, cfg, dtype, programs)


class TPKernels:
    """The launcher of one (problem, layout): runs the planner's plans, builds their kernels lazily.
    ``plan``: an object with ``problem``, ``layout``, ``table`` and ``grad_tables``. ``tuner``: the
    autotuner these launches consult (``equikernels.tune``'s functions: enabled, active, bucket,
    cache, device_key, choose, time_ms), or None for the heuristic launch shapes."""

    def __init__(self, plan, tuner=None):
        self.plan = plan
        self.problem = plan.problem
        self.tuner = tuner
        self.planner = Planner(plan)
        # (step key, member names) -> kernel (set): one step key has other members per math dtype
        self._kernels: Dict[tuple, Kernel] = {}
        self._cache: Dict[tuple, Optional[Kernel]] = {}  # kernel(): (direction, need, have) -> kernel (set) or None
        self._tuned_cfgs: Dict[tuple, LaunchConfig] = {}  # autotuner choices already looked up

    def _step_kernel(self, step: KernelStep):
        # by source too: one name is built differently per math dtype (e.g. its loads ahead)
        key = (step.key, tuple((m.name, m.body) for m in step.members))
        k = self._kernels.get(key)
        if k is None:
            ks = [Kernel.of_member(m, step.choice) for m in step.members]
            k = self._kernels[key] = ks[0] if len(ks) == 1 else _KernelSet(ks, step)
        return k

    def built_steps(self) -> set:
        """(direction, need, have) of every step whose kernel(s) were built."""
        return {k[0] for k in self._kernels}

    def kernel(self, kind: str, need: int = 0, have: str = ""):
        """The compiled kernel (a _KernelSet where split) of (kind, need bits, have), None where
        nothing is computed; raises emit.Unsupported where the generator cannot express it."""
        key = (kind, need, have)
        if key in self._cache:
            return self._cache[key]
        b = self.planner.built(kind, need, have)
        if b is None:
            self._cache[key] = None
            return None
        step = KernelStep(key, b.name, need, b.choice, LaunchConfig(), b.inputs, b.outputs, b.zero, b.reduce_rows,
                          b.acc, b.min_rows, b.members)
        return self._step_kernel(step)

    def launchers(self, step: KernelStep) -> list:
        """The launch.FastLaunch of each kernel of ``step``, in launch order."""
        k = self._step_kernel(step)
        return [q.launcher for q in getattr(k, "parts", (k,))]

    # --- pinned recipes (recipe.py) -----------------------------------------------------------------
    def direct_recipes(self) -> bool:
        """Channel-wise products with per-row weights (MACE / NequIP, the host-bound ones) get pinned
        recipes: shared weights are reduced over rows, uvw products may split the weight gradient off
        or take uvw_rows' kernels."""
        return channelwise_rows(self.problem) and not weights_dominate(self.problem)

    def recipe(self, kind: str, need: int, have: str, math: torch.dtype, dtypes=()):
        """The pinned recipe (recipe.BwdRecipe / DbwdRecipe) of the heuristic plan of ``kind`` ("bwd"
        or "dbwd"), or None where the plan has no recipe form or is not generated (the full path
        runs). ``dtypes``: of x, y, w, g (dbwd: its output buffers are allocated alike)."""
        if not self.direct_recipes():
            return None
        from .emit import Unsupported  # noqa: PLC0415
        try:
            plan = self.planner.plan(kind, need, have, math)
        except Unsupported:
            return None
        if kind == "bwd":
            return _recipe.bwd_recipe(plan, self.launchers)
        return _recipe.dbwd_recipe(plan, dtypes, self.launchers)

    # --- autotuning ---------------------------------------------------------------------------------
    def _cfg(self, kind: str, dtype) -> LaunchConfig:
        return self.planner.default_launch(kind, dtype)

    def _tuned(self, kind: str, tag: str, x: torch.Tensor, math: torch.dtype, run) -> LaunchConfig:
        """The autotuner's launch shape for this direction and row-count bucket, or
        the heuristic default off the GPU, while compiling or capturing a CUDA graph, or with
        EQUIKERNELS_AUTOTUNE=0. ``run(cfg)`` launches the direction with ``cfg``."""
        default = self.planner.default_launch(kind, math)
        tune = self.tuner
        if tune is None or not (tune.enabled() and tune.active(x.device)):  # x.device builds an object: test the env first
            return default
        # a hit costs a dict lookup: the key string (problem hash, device name) is built once
        memo = (tag, x.dtype, math, x.device, tune.bucket(x.shape[0]), tune.cache().path)
        cfg = self._tuned_cfgs.get(memo)
        if cfg is None:
            mtag = "" if math == x.dtype else f"|math={math}"
            key = (f"{tune.device_key(x.device)}|tp|{self.problem.key()}|{self.plan.layout}|{x.dtype}{mtag}|{tag}|"
                   f"{tune.bucket(x.shape[0])}")
            best = tune.choose(key, lambda: [dataclasses.asdict(c) for c in self.planner.candidates(kind, math)],
                               lambda c: tune.time_ms(lambda: run(LaunchConfig(**c)), x.device),
                               dataclasses.asdict(default))
            cfg = self._tuned_cfgs[memo] = LaunchConfig(**best)
        return cfg

    # Dtypes: operands may be float16 / bfloat16 / float32 (mixed) or float64; every kernel computes
    # in ``math`` (dtypes.math_dtype_of: float32 unless float64 is involved), the forward writes ``out_dtype``
    # (default x's), every gradient is written in the dtype of the operand it is the gradient of.
    def forward(self, x, y, w, cfg: Optional[LaunchConfig] = None, out_dtype: Optional[torch.dtype] = None,
                math: Optional[torch.dtype] = None):
        math = math_dtype_of((x, y, w), math)
        ins = {"x": x, "y": y, "w": w}
        outs = {"out": ((x.shape[0], self.problem.dim_out), out_dtype or x.dtype)}
        if cfg is None:
            cfg = self._tuned("fwd", "fwd", x, math, lambda c: self.forward(x, y, w, c, out_dtype, math))
        step = self.planner.plan("fwd", 0, "", math, cfg).steps[0]
        return self._run(step, ins, outs, math)["out"]

    def backward(self, x, y, w, g, need: int, cfg: Optional[LaunchConfig] = None, math: Optional[torch.dtype] = None):
        math = math_dtype_of((x, y, w, g), math)
        if cfg is None:
            cfg = self._tuned("bwd", f"bwd{need}", x, math, lambda c: self.backward(x, y, w, g, need, c, math))
        outs = {"g" + n: (t.shape, t.dtype) for bit, n, t in ((NEED_X, "x", x), (NEED_Y, "y", y), (NEED_W, "w", w))
                if need & bit}
        res = {}
        tensors = {"x": x, "y": y, "w": w, "g": g}
        for step in self.planner.plan("bwd", need, "", math, cfg).steps:
            res.update(self._run(step, tensors, {k: v for k, v in outs.items() if k in step.outputs}, math))
        # placeholders only for the gradients not asked for (a .get default would allocate all three)
        return tuple(res["g" + n] if "g" + n in res else t.new_empty(0) for n, t in (("x", x), ("y", y), ("w", w)))

    def double_backward(self, x, y, w, g, a, b, c, need: int, cfg: Optional[LaunchConfig] = None,
                        math: Optional[torch.dtype] = None):
        """(dx, dy, dw, dg) of the trilinear identity; a, b, c may be None."""
        math = math_dtype_of((x, y, w, g, a, b, c), math)
        have = "".join(k for k, t in zip("abc", (a, b, c)) if t is not None)
        if cfg is None:
            cfg = self._tuned("dbwd", f"dbwd{need}{have}", x, math,
                              lambda c_: self.double_backward(x, y, w, g, a, b, c, need, c_, math))
        like = {"x": x, "y": y, "w": w, "g": g}
        names = [n for bit, n in zip((1, 2, 4, 8), "xywg") if need & bit]
        tensors = {"x": x, "y": y, "w": w, "g": g, "a": a, "b": b, "c": c}
        written = {}
        for step in self.planner.plan("dbwd", need, have, math, cfg).steps:
            written.update(self._run(step, tensors, {"d" + n: (like[n].shape, like[n].dtype) for n in names
                                                     if "d" + n in step.outputs}, math))
        # outputs with no contributing term (e.g. dg without cotangents) are zero; zero-filled only
        # then (a .get default would fill every output: one extra kernel and a full write each)
        return tuple((written["d" + n] if "d" + n in written else torch.zeros_like(like[n])) if n in names
                     else like[n].new_empty(0) for n in "xywg")

    def bwd_parts(self, need: int, cfg: LaunchConfig) -> tuple:
        """The need bitmasks of the kernels ``backward`` launches with ``cfg`` (planner.bwd_parts)."""
        return self.planner.bwd_parts(need, cfg)

    def dbwd_parts(self, need: int, math: torch.dtype = torch.float32) -> tuple:
        """The need bitmasks of the kernels ``double_backward`` launches in math dtype ``math``
        (planner.dbwd_parts)."""
        return self.planner.dbwd_parts(need, math)

    def _run(self, step: KernelStep, tensors, outputs, math: torch.dtype):
        """Allocate the outputs (``outputs[name]`` = (shape, dtype), on x's device), launch ``step``,
        reduce partials. Buffers added into more than once (row partials, outputs several kernels add
        into) are kept in float32 for half-precision results and rounded once at the end."""
        k = self._step_kernel(step)
        cfg = step.launch
        x = tensors["x"]
        n = x.shape[0]
        res, partial, wide = {}, {}, {}
        poison = _poison()  # once per launch, not per buffer (an environment read is a few us)
        for name, (shape, dtype) in outputs.items():
            if name in step.row_partials:
                partial[name] = (shape, dtype)
            else:
                dt = acc_dtype(dtype) if name in step.acc_outputs else dtype
                if dt != dtype:
                    wide[name] = dtype
                res[name] = _alloc(shape, x, name in step.zero_filled or name in wide, dt, poison)
        if n == 0:
            res.update({name: torch.zeros(shape, dtype=dt, device=x.device) for name, (shape, dt) in partial.items()})
            return {name: t.to(wide.get(name, t.dtype)) for name, t in res.items()}
        programs = None
        if partial:
            programs = min(triton.cdiv(n, cfg.rows), 4 * num_sms(x.device))
            for name, (shape, dtype) in partial.items():
                res[name] = _alloc((programs, shape[-1]), x, name in step.zero_filled, acc_dtype(dtype), poison)
        k.launch(tensors, res, n, cfg, math, programs)
        for name, (_, dtype) in partial.items():  # deterministic, no precision loss
            res[name] = res[name].sum(0, dtype=torch.float64).to(dtype)
        for name, dt in wide.items():
            res[name] = res[name].to(dt)
        return res
