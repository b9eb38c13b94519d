"""Pure-PyTorch evaluation of a path table: the CPU fallback and the oracle for the kernels.

Each path is one ``einsum`` over gathered segments and a dense copy of its coefficients, so the
result is differentiable to any order on any device and dtype.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Dict, Optional

import opt_einsum  # a dependency of e3nn
import torch

from .dtypes import math_dtype_of
from .ir import Factor, Path, Table

LAYOUTS = ("mul_ir", "ir_mul")
_LABEL_LETTERS = "uvwqrstpo"
_COMP_LETTERS = "abcdefghijk"


def factor_index(table: Table, f: Factor, labels, layout: str) -> torch.Tensor:
    """Flat feature indices of a factor, shape [*sizes of the labels it uses, dim]."""
    seg = table.operand(f.operand).segments[f.segment]
    return _factor_index(seg.offset, seg.mul, seg.dim, f.base, f.strides, tuple(labels), layout)


@functools.lru_cache(maxsize=4096)
def _factor_index(offset, mul, dim, base, strides, labels, layout):
    sizes = dict(labels)
    used = [l for l, _ in labels if l in dict(strides)]
    st = dict(strides)
    ch = torch.full([sizes[l] for l in used], base, dtype=torch.long)
    for n, l in enumerate(used):
        shape = [1] * len(used)
        shape[n] = sizes[l]
        ch = ch + st[l] * torch.arange(sizes[l]).reshape(shape)
    comp = torch.arange(dim)
    if layout == "mul_ir":
        idx = offset + ch[..., None] * dim + comp
    else:
        idx = offset + comp * mul + ch[..., None]
    return idx, "".join(_LABEL_LETTERS[[l for l, _ in labels].index(l)] for l in used)


def factor_view(table: Table, f: Factor, labels, layout: str):
    """(start, shape, strides) of a factor inside a feature row: its indices are affine in every
    label and the component, so the factor is a strided view of the row (no gather needed)."""
    seg = table.operand(f.operand).segments[f.segment]
    return _factor_view(seg.offset, seg.mul, seg.dim, f.base, f.strides, tuple(labels), layout)


@functools.lru_cache(maxsize=4096)
def _factor_view(offset, mul, dim, base, strides, labels, layout):
    sizes, st = dict(labels), dict(strides)
    used = [l for l, _ in labels if l in st]
    scale, comp_stride = (dim, 1) if layout == "mul_ir" else (1, mul)
    start = offset + (base * dim if layout == "mul_ir" else base)
    return start, tuple(sizes[l] for l in used) + (dim,), tuple(st[l] * scale for l in used) + (comp_stride,)


@functools.lru_cache(maxsize=4096)
def _dense_coefficients(entries, dims):
    cg = torch.zeros(dims, dtype=torch.float64)
    for comps, k, c in entries:
        cg[tuple(comps) + (k,)] += c
    return cg


def _gather(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return t.index_select(-1, idx.reshape(-1).to(t.device)).reshape(t.shape[:-1] + idx.shape)


def _factor(t: torch.Tensor, table: Table, f: Factor, labels, layout: str) -> torch.Tensor:
    """The factor's elements of every row, [rows?, *label sizes, dim]: a strided view of a
    contiguous tensor (cheap, and differentiable like any view), else a gather."""
    start, shape, strides = factor_view(table, f, labels, layout)
    if (t.is_contiguous() and t.dim() in (1, 2) and all(s > 0 for s in strides)
            and not torch.compiler.is_compiling()):
        lead = (t.shape[0],) if t.dim() == 2 else ()
        lead_st = (t.stride(0),) if t.dim() == 2 else ()
        return t.as_strided(lead + shape, lead_st + strides, t.storage_offset() + start)
    idx, _ = factor_index(table, f, labels, layout)
    return _gather(t, idx)


def evaluate(table: Table, tensors: Dict[str, torch.Tensor], layout: str = "mul_ir",
             reduce_rows: bool = False, rows: Optional[int] = None, math_dtype: Optional[torch.dtype] = None,
             out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Evaluate ``table``. Row-carrying tensors are [rows, dim]; row-free ones (shared weights) [dim].

    With ``reduce_rows`` the output is summed over rows (the gradient of a shared weight). Operands
    may have different dtypes: all are computed in ``math_dtype`` (default: math_dtype_of), the
    result is returned in ``out_dtype`` (default: the first operand's dtype). Autocast is off
    inside: the precision is the one asked for, not the ambient one.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    ref = next(iter(tensors.values()))
    out_dtype = out_dtype or ref.dtype
    math = math_dtype_of(tensors.values(), math_dtype)
    if any(t is not None and t.dtype != math for t in tensors.values()):
        tensors = {k: (t.to(math) if t is not None else None) for k, t in tensors.items()}
    if rows is None:
        rows = next((t.shape[0] for t in tensors.values() if t is not None and t.dim() == 2), 1)
    out_op = table.operand(table.output)
    out_shape = (out_op.dim,) if reduce_rows else (rows, out_op.dim)
    dev = ref.device.type
    with torch.autocast(dev, enabled=False) if autocast_on(dev) else contextlib.nullcontext():
        out = torch.zeros(out_shape, dtype=math, device=ref.device)
        for path in table.paths:
            out = out.index_add(-1, *_path_contribution(table, path, tensors, layout, reduce_rows))
    return out.to(out_dtype)


def autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except (TypeError, RuntimeError):  # a device type autocast does not know
        return False


_ROWS_FOR_PATHS = 1024  # the row count a contraction order is chosen for (it does not depend on it)


@functools.lru_cache(maxsize=4096)
def _pairwise_steps(eq: str, shapes: tuple):
    """The pairwise einsums of the best contraction order (opt_einsum), computed once per equation
    and shape class; torch.einsum would search it again on every call."""
    _, info = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize="auto")
    return tuple((tuple(inds), step[2]) for step in info.contraction_list for inds in [step[0]])


def _einsum(eq: str, ops) -> torch.Tensor:
    if len(ops) < 3 or torch.compiler.is_compiling():  # (traced graphs are optimised by the compiler)
        return torch.einsum(eq, *ops)
    subs = eq.split("->")[0].split(",")
    shapes = tuple(tuple(_ROWS_FOR_PATHS if c == "z" else n for c, n in zip(sub, op.shape))
                   for sub, op in zip(subs, ops))
    try:
        steps = _pairwise_steps(eq, shapes)
    except ImportError:
        return torch.einsum(eq, *ops)
    ops = list(ops)
    for inds, step_eq in steps:
        args = [ops.pop(i) for i in sorted(inds, reverse=True)]
        ops.append(torch.einsum(step_eq, *args))
    return ops[0]


def _path_contribution(table: Table, path: Path, tensors, layout, reduce_rows):
    subs, ops = [], []
    dims = []
    for n, f in enumerate(path.factors):
        idx, lab = factor_index(table, f, path.labels, layout)
        t = tensors[f.operand]
        ops.append(_factor(t, table, f, path.labels, layout))
        subs.append(("z" if t.dim() == 2 else "") + lab + _COMP_LETTERS[n])
        dims.append(idx.shape[-1])
    out_idx, out_lab = factor_index(table, path.output, path.labels, layout)
    k = _COMP_LETTERS[len(path.factors)]
    dims.append(out_idx.shape[-1])
    cg = _dense_coefficients(path.entries, tuple(dims)).to(dtype=ops[0].dtype, device=ops[0].device)
    ops.append(cg)
    subs.append(_COMP_LETTERS[: len(path.factors)] + k)
    if path.weight is not None:
        idx, lab = factor_index(table, path.weight, path.labels, layout)
        t = tensors[path.weight.operand]
        ops.append(_factor(t, table, path.weight, path.labels, layout)[..., 0])
        subs.append(("z" if t.dim() == 2 else "") + lab)
    has_rows = any(s.startswith("z") for s in subs)
    present = set("".join(subs))
    lead = "z" if has_rows and not reduce_rows else ""
    res = _einsum(",".join(subs) + "->" + lead + "".join(c for c in out_lab if c in present) + k, ops)
    if any(c not in present for c in out_lab):
        # an output label no input carries (e.g. d/dy of an unweighted uvu): broadcast over it
        shape = list(res.shape[: len(lead)])
        for n, c in enumerate(out_lab):
            shape.append(out_idx.shape[n] if c in present else 1)
        res = res.reshape(shape + [res.shape[-1]]).expand(*res.shape[: len(lead)], *out_idx.shape)
    if has_rows and not reduce_rows:
        res = res.reshape(res.shape[0], out_idx.numel())
    else:
        res = res.reshape(-1)
    return out_idx.reshape(-1).to(res.device), res
