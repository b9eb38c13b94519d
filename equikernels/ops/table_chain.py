"""An n-ary path table (``ir.Table``) as a differentiable op whose derivatives are its gradient tables.

The op runs through the autograd chain (``ops.chain.table_apply``: an eager Function, a custom op
with a fake when traced); its backward evaluates the gradient tables (``ir.grad_table``) through
ops of the same kind, so every order of derivative works while only the inputs are saved: the
per-path intermediates stay transient, which keeps force (and force-training) memory at the size
of the inputs. Used where the operation is not trilinear (the symmetric contraction is a
polynomial in its features).

An op evaluates through its method's implementation for the math dtype (``build(table, layout,
math_dtype, name)`` -> ``impl(named, rows, out_dtype)``, e.g. generated kernels) on the triton
backend, else through ``reference.evaluate``. A table ``build`` rejects, or whose first launch
fails (Triton compiles then), falls back to the reference with a warning.
"""
from __future__ import annotations

import warnings
from typing import Callable, Dict, Optional

import torch

from ..dtypes import HALF, STORAGE_DTYPES, math_dtype_of
from ..ir import Factor, Operand, Path, Table, grad_table
from ..reference import evaluate
from .chain import register_table, table_apply
from .tp import resolve_backend


class TableOp:
    """``table`` evaluated in ``layout`` under an autograd Function whose backward is the op of the
    gradient tables. ``out_like``: the operand whose dtype the result takes (the features for the
    forward, the operand a gradient is taken with respect to for a gradient table). ``build``: the
    method's implementation per math dtype (None: the reference only); ``label`` names the
    operation in warnings and errors."""

    def __init__(self, table: Table, layout: str, level: int = 0, backend: Optional[str] = None,
                 out_like: str = "x", build: Optional[Callable] = None, label: str = "table") -> None:
        self.table, self.layout, self.level, self.backend = table, layout, level, backend
        self.out_like, self.build, self.label = out_like, build, label
        self._kernels: Dict[torch.dtype, Optional[Callable]] = {}  # per math dtype: impl, None (reference)
        used = {f.operand for p in table.paths for f in p.factors + ((p.weight,) if p.weight else ())}
        self.names = tuple(o.name for o in table.operands if o.name in used)  # d/dx still reads x
        self._grads: Dict[str, "TableOp"] = {}
        self.key = register_table(self)  # its name in traced graphs

    def __getstate__(self) -> dict:
        """Pickled or copied without its built kernels and gradient ops (generated modules cannot be
        pickled): the copy builds its own and registers under a key of its own."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_kernels", "_grads", "key")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._kernels, self._grads = {}, {}
        self.key = register_table(self)

    def grad(self, wrt: str) -> "TableOp":
        if wrt not in self._grads:
            gt = grad_table(self.table, wrt, f"g{self.level}")
            # the gradient's output gets a name of its own: it is x-shaped but x stays an input
            out = f"d{self.level}_{wrt}"
            target = gt.operand(wrt)
            paths = tuple(Path(p.factors, p.weight, Factor(out, p.output.segment, p.output.base, p.output.strides),
                               p.labels, p.entries) for p in gt.paths)
            gt = Table(gt.operands + (Operand(out, target.dim, target.segments),), out, paths)
            self._grads[wrt] = TableOp(gt, self.layout, self.level + 1, self.backend, wrt, self.build, self.label)
        return self._grads[wrt]

    def __call__(self, tensors: Dict[str, torch.Tensor], out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """Differentiable evaluation. ``out_dtype``: default the ``out_like`` operand's dtype (a table
        linear in its ``wrt`` does not read it: the caller passes that operand's dtype)."""
        if out_dtype is None:
            out_dtype = (tensors[self.out_like] if self.out_like in tensors else tensors[self.names[0]]).dtype
        return table_apply(self, out_dtype, [tensors[n] for n in self.names])

    def evaluate(self, named: Dict[str, torch.Tensor], out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """Plain (non-recording) evaluation: the method's implementation on the triton backend, else
        the reference."""
        ref = next(iter(named.values()))
        rows = ref.shape[0]
        if out_dtype is None:
            out_dtype = named[self.out_like].dtype if self.out_like in named else ref.dtype
        bad = [f"{k}: {v.dtype}" for k, v in named.items() if v.dtype not in STORAGE_DTYPES]
        if bad:
            raise TypeError(f"{self.label}: operands must be float16, bfloat16, float32 or float64, "
                            f"got {', '.join(bad)}")
        math = math_dtype_of(named.values())
        if math == torch.float64 and any(v.dtype in HALF for v in named.values()):
            raise TypeError(f"{self.label}: float64 operands do not mix with float16/bfloat16 ones "
                            f"({', '.join(f'{k}: {v.dtype}' for k, v in named.items())})")
        if self.build is not None and resolve_backend(self.backend, ref.device) == "triton":
            impl = self._impl(math)
            if impl is not None:
                if getattr(impl, "compiled", True):
                    return impl({k: v.contiguous() for k, v in named.items()}, rows, out_dtype)
                try:  # Triton compiles on the first launch: a failure there falls back, later ones raise
                    out = impl({k: v.contiguous() for k, v in named.items()}, rows, out_dtype)
                    impl.compiled = True
                    return out
                except Exception as exc:
                    if "out of memory" in str(exc).lower():
                        raise
                    warnings.warn(f"{self.label}: a level-{self.level} kernel failed to compile or run "
                                  f"({type(exc).__name__}: {exc}); using the reference", RuntimeWarning)
                    self._kernels[math] = None
        return evaluate(self.table, named, self.layout, rows=rows, out_dtype=out_dtype)

    def _impl(self, math: torch.dtype) -> Optional[Callable]:
        if math not in self._kernels:
            try:
                self._kernels[math] = self.build(self.table, self.layout, math, f"sc{self.level}")
            except Exception as exc:  # the generator's Unsupported, or a compile problem: stay correct
                warnings.warn(f"{self.label}: no generated kernel for a level-{self.level} table "
                              f"({type(exc).__name__}: {exc}); using the reference", RuntimeWarning)
                self._kernels[math] = None
        return self._kernels[math]
