"""Helpers shared by the tests: random e3nn-style problems, layout converters, e3nn oracles.

``random_problem(seed)`` returns the keyword arguments of an ``e3nn.o3.TensorProduct`` (the same
dict ``equikernels.catalog`` uses), drawn so that every connection mode, every normalisation pair,
shared and per-row weights, random variances, path weights and shared output segments all occur.
"""
from __future__ import annotations

import functools
import itertools
import random
from typing import List, Optional, Sequence, Tuple

import torch

from equikernels._compat import o3
from equikernels.problem import TPProblem

IRREP_NORMALIZATIONS = ("component", "norm", "none")
PATH_NORMALIZATIONS = ("element", "path", "none")
NORMALIZATION_PAIRS = tuple(itertools.product(IRREP_NORMALIZATIONS, PATH_NORMALIZATIONS))
BASE_MODES = ("uvw", "uvu", "uvv", "uuw", "uuu", "uvuv")
TRIANGULAR_MODES = ("uvu<v", "u<vw")
MAX_L = 5
MAX_MUL = 17
MAX_UVUV_OUT = 40  # keep mul_in1 * mul_in2 small for uvuv outputs


# --- e3nn ---------------------------------------------------------------------------------------
from equikernels._compat import default_dtype  # noqa: E402,F401  (re-exported)


def e3nn_tp(kwargs: dict, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """An ``o3.TensorProduct`` built under ``dtype`` (float64 for an exact oracle)."""
    with default_dtype(dtype):
        return o3.TensorProduct(**kwargs)


@functools.lru_cache(maxsize=None)
def e3nn_supports(mode: str) -> bool:
    """Whether the installed e3nn's TensorProduct implements ``mode`` (the triangular ones are new)."""
    try:
        with default_dtype(torch.float64):
            tp = o3.TensorProduct("3x0e", "3x0e", "3x0e" if mode == "uvu<v" else "2x0e",
                                  [(0, 0, 0, mode, True)])
            tp(torch.randn(1, 3), torch.randn(1, 3))
    except Exception:
        return False
    return True


def supported_modes() -> Tuple[str, ...]:
    return BASE_MODES + tuple(m for m in TRIANGULAR_MODES if e3nn_supports(m))


def problem_of(kwargs: dict) -> TPProblem:
    return TPProblem.create(**kwargs)


def e3nn_example_network() -> torch.nn.Module:
    """e3nn's example ``gate_points_2101.Network``, small (one layer, hidden 4x0e+2x1o, scalar output);
    the calling test is skipped where it cannot be imported."""
    import pytest  # noqa: PLC0415

    try:
        from e3nn.nn.models.gate_points_2101 import Network
    except ImportError as exc:  # e3nn 0.4.4's example network needs torch_cluster
        pytest.skip(f"e3nn's example network: {exc}")
    return Network(irreps_in=None, irreps_hidden="4x0e+2x1o", irreps_out="0e", irreps_node_attr=None,
                   irreps_edge_attr="0e+1o", layers=1, max_radius=2.0, number_of_basis=3, radial_layers=1,
                   radial_neurons=4, num_neighbors=2.0, num_nodes=3.0)


# --- random problems ----------------------------------------------------------------------------
def _rand_mul(rng: random.Random) -> int:
    """1..MAX_MUL, skewed towards small values (large ones still occur) to keep the tests fast."""
    return rng.randint(1, MAX_MUL) if rng.random() < 0.5 else rng.randint(1, 6)


def _rand_irrep(rng: random.Random, mul: Optional[int] = None) -> Tuple[int, int, int]:
    return (mul if mul is not None else _rand_mul(rng), rng.randint(0, MAX_L), rng.choice((1, -1)))


def _irreps_str(irreps: Sequence[Tuple[int, int, int]]) -> str:
    return "+".join(f"{m}x{l}{'e' if p == 1 else 'o'}" for m, l, p in irreps)


def _out_mul(rng: random.Random, mode: str, m1: int, m2: int, has_weight: bool) -> int:
    if mode in ("uvw", "u<vw"):
        return _rand_mul(rng)
    if mode == "uuw":
        return _rand_mul(rng) if has_weight else 1
    return {"uvu": m1, "uvv": m2, "uuu": m1, "uvuv": m1 * m2, "uvu<v": m1 * (m1 - 1) // 2}[mode]


def _feasible_modes(m1: int, m2: int, modes: Sequence[str]) -> List[str]:
    ok = []
    for mode in modes:
        if mode in ("uuw", "uuu") and m1 != m2:
            continue
        if mode in TRIANGULAR_MODES and not (m1 == m2 >= 2):
            continue
        if mode == "uvuv" and m1 * m2 > MAX_UVUV_OUT:
            continue
        if mode == "uvu<v" and m1 * (m1 - 1) // 2 > MAX_UVUV_OUT:
            continue
        ok.append(mode)
    return ok


def random_problem(seed: int, modes: Optional[Sequence[str]] = None, force_mode: Optional[str] = None,
                   normalization: Optional[Tuple[str, str]] = None, shared: Optional[bool] = None,
                   max_instructions: int = 6) -> dict:
    """e3nn TensorProduct kwargs for a random valid problem.

    ``force_mode`` makes the first instruction use that mode (the generator retries inputs until it
    can); other instructions draw from ``modes`` (default: every mode the installed e3nn supports).
    """
    rng = random.Random(seed)
    modes = tuple(modes) if modes is not None else supported_modes()
    for _attempt in range(1000):
        in1 = [_rand_irrep(rng) for _ in range(rng.randint(1, 3))]
        in2 = []
        for _ in range(rng.randint(1, 3)):
            # half of the second operand's multiplicities copy one of the first's (for uu* modes)
            in2.append(_rand_irrep(rng, rng.choice(in1)[0] if rng.random() < 0.5 else None))
        if force_mode in TRIANGULAR_MODES + ("uuw", "uuu"):
            # make sure some pair has equal multiplicities
            a, b = rng.randrange(len(in1)), rng.randrange(len(in2))
            m = max(2, in1[a][0]) if force_mode in TRIANGULAR_MODES else in1[a][0]
            in1[a] = (min(m, 9), in1[a][1], in1[a][2])
            in2[b] = (in1[a][0], in2[b][1], in2[b][2])
        candidates = []
        for a, (m1, l1, p1) in enumerate(in1):
            for b, (m2, l2, p2) in enumerate(in2):
                for lo in range(abs(l1 - l2), min(l1 + l2, MAX_L) + 1):
                    candidates.append((a, b, lo, p1 * p2))
        rng.shuffle(candidates)
        if force_mode is not None:  # a pair that admits the forced mode goes first
            candidates.sort(key=lambda c: not _feasible_modes(in1[c[0]][0], in2[c[1]][0], (force_mode,)))
        out: List[Tuple[int, int, int]] = []
        instructions = []
        for a, b, lo, po in candidates[: rng.randint(1, max_instructions)]:
            m1, m2 = in1[a][0], in2[b][0]
            feasible = _feasible_modes(m1, m2, modes)
            if not instructions and force_mode is not None:
                feasible = [force_mode] if force_mode in _feasible_modes(m1, m2, (force_mode,)) else []
            if not feasible:
                continue
            mode = rng.choice(feasible)
            has_weight = True if mode in ("uvw", "u<vw") else rng.random() < 0.7
            mo = _out_mul(rng, mode, m1, m2, has_weight)
            # reuse a compatible output segment half of the time (exercises per-output normalisation)
            reuse = [k for k, (m, l, p) in enumerate(out) if (m, l, p) == (mo, lo, po)]
            if reuse and rng.random() < 0.5:
                i_out = rng.choice(reuse)
            else:
                i_out = len(out)
                out.append((mo, lo, po))
            ins = (a, b, i_out, mode, has_weight)
            r = rng.random()
            if r < 0.35:
                ins = ins + (rng.uniform(0.2, 3.0),)
            elif r < 0.4:
                ins = ins + (1.0,)
            instructions.append(ins)
        if not instructions:
            continue
        if rng.random() < 0.2:  # an output irrep no instruction writes (must stay zero)
            out.append(_rand_irrep(rng))
        break
    else:  # pragma: no cover - extremely unlikely
        raise RuntimeError(f"could not draw a problem for seed {seed}")
    # shuffle the output segments so that instruction order and output order differ
    perm = list(range(len(out)))
    rng.shuffle(perm)
    inv = {old: new for new, old in enumerate(perm)}
    out = [out[k] for k in perm]
    instructions = [(a, b, inv[io], *rest) for a, b, io, *rest in instructions]
    irrep_norm, path_norm = normalization if normalization is not None else rng.choice(NORMALIZATION_PAIRS)
    if shared is None:
        shared = rng.random() < 0.5
    kw = dict(irreps_in1=_irreps_str(in1), irreps_in2=_irreps_str(in2), irreps_out=_irreps_str(out),
              instructions=instructions, irrep_normalization=irrep_norm, path_normalization=path_norm,
              shared_weights=shared, internal_weights=False)
    if rng.random() < 0.3:
        kw["in1_var"] = [rng.uniform(0.3, 3.0) for _ in in1]
        kw["in2_var"] = [rng.uniform(0.3, 3.0) for _ in in2]
        kw["out_var"] = [rng.uniform(0.3, 3.0) for _ in out]
    return kw


# --- tensors ------------------------------------------------------------------------------------
def weight_shape(problem: TPProblem, batch: Tuple[int, ...]) -> Tuple[int, ...]:
    return (problem.weight_numel,) if problem.shared_weights else batch + (problem.weight_numel,)


def random_inputs(problem: TPProblem, batch: Tuple[int, ...], dtype=torch.float64, seed: int = 0,
                  device="cpu") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch + (problem.dim_in1,), generator=g, dtype=torch.float64)
    y = torch.randn(batch + (problem.dim_in2,), generator=g, dtype=torch.float64)
    w = torch.randn(weight_shape(problem, batch), generator=g, dtype=torch.float64)
    return tuple(t.to(device=device, dtype=dtype) for t in (x, y, w))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (0 when both are empty or zero)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    assert a.shape == b.shape, (a.shape, b.shape)
    if b.numel() == 0:
        return 0.0
    scale = b.abs().max().item()
    diff = (a - b).abs().max().item()
    if scale == 0.0:
        return diff
    return diff / scale


# --- evaluation with gradients ------------------------------------------------------------------
def _grads(out, inputs, g):
    """Cotangent-weighted gradients; zeros for inputs the output does not depend on."""
    wanted = [t for t in inputs if t.requires_grad]
    if not out.requires_grad:  # e3nn returns a constant zero tensor when nothing reaches the output
        wanted = []
    got = iter(torch.autograd.grad(out, wanted, g, allow_unused=True)) if wanted else iter(())
    res = []
    for t in inputs:
        if not t.requires_grad:
            res.append(None)
            continue
        d = next(got) if wanted else None
        res.append(torch.zeros_like(t) if d is None else d)
    return res


def e3nn_forward_backward(tp, x, y, w, g):
    """(out, grad_x, grad_y, grad_w) of an e3nn module, in the inputs' dtype."""
    xs = [x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()]
    if tp.weight_numel > 0:
        xs.append(w.detach().clone().requires_grad_())
    out = tp(*xs)
    grads = _grads(out, xs, g)
    if tp.weight_numel == 0:
        grads.append(torch.zeros_like(w))
    return [out.detach()] + grads


def second_order(fn, *inputs):
    """[out, first gradients, second gradients] of ``fn(*inputs)`` (fresh leaves): the gradients of
    sum(out * sin(out)), then of the sum of their squares."""
    ts = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*ts)
    gr = torch.autograd.grad((out * torch.sin(out)).sum(), ts, create_graph=True)
    return [out, *gr, *torch.autograd.grad(sum((t ** 2).sum() for t in gr), ts)]


def ek_forward_backward(problem, x, y, w, g, layout="mul_ir", backend=None):
    """(out, grad_x, grad_y, grad_w) of equikernels.ops.tensor_product."""
    from equikernels.ops import tensor_product

    xs = [t.detach().clone().requires_grad_() for t in (x, y, w)]
    out = tensor_product(problem, xs[0], xs[1], xs[2], layout=layout, backend=backend)
    return [out.detach()] + _grads(out, xs, g)


# --- layouts ------------------------------------------------------------------------------------
def _segments(irreps) -> List[Tuple[int, int]]:
    return [(mul, ir.dim) for mul, ir in o3.Irreps(irreps)]


def mul_ir_to_ir_mul(t: torch.Tensor, irreps) -> torch.Tensor:
    """Reorder the last axis from e3nn's [mul, 2l+1] blocks to component-major [2l+1, mul] blocks."""
    parts, off = [], 0
    for mul, dim in _segments(irreps):
        blk = t[..., off:off + mul * dim]
        parts.append(blk.reshape(t.shape[:-1] + (mul, dim)).transpose(-1, -2).reshape(t.shape[:-1] + (mul * dim,)))
        off += mul * dim
    assert off == t.shape[-1], f"irreps {irreps} have dim {off}, tensor has {t.shape[-1]}"
    return torch.cat(parts, dim=-1) if parts else t


def ir_mul_to_mul_ir(t: torch.Tensor, irreps) -> torch.Tensor:
    parts, off = [], 0
    for mul, dim in _segments(irreps):
        blk = t[..., off:off + mul * dim]
        parts.append(blk.reshape(t.shape[:-1] + (dim, mul)).transpose(-1, -2).reshape(t.shape[:-1] + (mul * dim,)))
        off += mul * dim
    assert off == t.shape[-1], f"irreps {irreps} have dim {off}, tensor has {t.shape[-1]}"
    return torch.cat(parts, dim=-1) if parts else t


def describe(kw: dict) -> str:
    return (f"{kw['irreps_in1']} x {kw['irreps_in2']} -> {kw['irreps_out']} "
            f"{kw['instructions']} {kw.get('irrep_normalization')}/{kw.get('path_normalization')} "
            f"shared={kw.get('shared_weights')}")



def wide_channelwise_problem() -> TPProblem:
    """The smallest MACE-shaped product (uvu, per-row weights, 128 channels per block): the one
    codegen.planner.wide_channelwise selects for partial sums, early loads and the L2 prefetch."""
    i1, i2, io = "128x0e+128x1o", "0e+1o", "128x0e+128x1o+128x1e"
    ins = [(a, b, c, "uvu", True) for a, (_, r1) in enumerate(o3.Irreps(i1)) for b, (_, r2) in enumerate(o3.Irreps(i2))
           for c, (_, r) in enumerate(o3.Irreps(io)) if r in r1 * r2]
    return TPProblem.create(i1, i2, io, ins, shared_weights=False, internal_weights=False)


def silu_second_order_calls(monkeypatch) -> list:
    """The input shapes of every ``ops.silu.second_order`` call from now on (the one-pass derivative)."""
    from equikernels.ops import silu

    seen, real = [], silu.second_order
    monkeypatch.setattr(silu, "second_order", lambda *a: seen.append(tuple(a[0].shape)) or real(*a))
    return seen


def double_grads(module, x):
    """Gradients in (x, parameters) of |d sum(sin(module(x))) / dx|^2: a force-training-like second order."""
    (gx,) = torch.autograd.grad(module(x).sin().sum(), x, create_graph=True)
    return torch.autograd.grad(gx.square().sum(), [x] + list(module.parameters()))
