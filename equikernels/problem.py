"""TPProblem: the static, hashable description of one tensor product, with e3nn's semantics.

Everything downstream (the path table, the generated kernels, the autotuner cache) is keyed by
this object, so it holds plain tuples only and is independent of e3nn objects.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import operator
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from ._compat import o3

MODES = ("uvw", "uvu", "uvv", "uuw", "uuu", "uvuv", "uvu<v", "u<vw")
IRREP_NORMALIZATIONS = ("component", "norm", "none")
PATH_NORMALIZATIONS = ("element", "path", "none")

Irrep = Tuple[int, int, int]  # (mul, l, parity)


class TensorProductError(ValueError, AssertionError):
    """An invalid tensor-product description. A ValueError; also an AssertionError, which is what
    e3nn raises for the same mistakes (parity, triangle rule, multiplicities, normalisation names),
    so code written against e3nn that catches AssertionError keeps working."""

    __str__ = BaseException.__str__  # the message as given (KeyError, a sibling base, would quote it)


class TensorProductTypeError(TensorProductError, TypeError):
    """A wrongly typed argument (e.g. a float instruction index): e3nn raises TypeError here."""


class TensorProductIndexError(TensorProductError, IndexError):
    """An instruction index outside the irreps: e3nn raises IndexError here."""


class TensorProductKeyError(TensorProductError, KeyError):
    """An unknown connection mode: e3nn raises KeyError here."""


class MissingWeightError(ValueError, RuntimeError):
    """A weighted product called without weights (``internal_weights=False``): a ValueError, and the
    RuntimeError e3nn raises for it."""


def parse_irreps(value, name: str) -> Tuple[Irrep, ...]:
    """Irreps (string, e3nn Irreps or list of (mul, (l, p))) -> tuple of (mul, l, p)."""
    try:
        irreps = o3.Irreps(value)
    except Exception as exc:  # e3nn raises ValueError/AssertionError/TypeError depending on version
        raise TensorProductError(f"{name}: expected irreps such as '16x0e+8x1o', got {value!r} ({exc})") from None
    out = []
    for mul, ir in irreps:
        if mul < 0:
            raise TensorProductError(f"{name}: multiplicities must be >= 0, got {mul} in {value!r}")
        out.append((int(mul), int(ir.l), int(ir.p)))
    return tuple(out)


def irreps_str(irreps: Sequence[Irrep]) -> str:
    return "+".join(f"{m}x{l}{'e' if p == 1 else 'o'}" for m, l, p in irreps) or "0x0e"


def irreps_dim(irreps: Sequence[Irrep]) -> int:
    return sum(m * (2 * l + 1) for m, l, _ in irreps)


def ir_mul_index(irreps: Sequence[Irrep]) -> List[int]:
    """``idx`` with ``t_ir_mul = t_mul_ir[..., idx]`` for irreps as (mul, l, p): each block of ``mul``
    copies of a ``2l+1``-dimensional irrep goes from [mul, 2l+1] to [2l+1, mul]."""
    idx, off = [], 0
    for m, l, _ in irreps:
        d = 2 * l + 1
        idx += [off + u * d + i for i in range(d) for u in range(m)]
        off += m * d
    return idx


@dataclass(frozen=True)
class Instruction:
    i_in1: int
    i_in2: int
    i_out: int
    mode: str
    has_weight: bool
    path_weight: float  # as given by the user (before normalisation)

    def path_shape(self, p: "TPProblem") -> Tuple[int, ...]:
        m1, m2, mo = p.irreps_in1[self.i_in1][0], p.irreps_in2[self.i_in2][0], p.irreps_out[self.i_out][0]
        tri = m1 * (m2 - 1) // 2
        return {
            "uvw": (m1, m2, mo), "uvu": (m1, m2), "uvv": (m1, m2), "uuw": (m1, mo), "uuu": (m1,),
            "uvuv": (m1, m2), "uvu<v": (tri,), "u<vw": (tri, mo),
        }[self.mode]

    def num_elements(self, p: "TPProblem") -> int:
        m1, m2 = p.irreps_in1[self.i_in1][0], p.irreps_in2[self.i_in2][0]
        return {
            "uvw": m1 * m2, "uvu": m2, "uvv": m1, "uuw": m1, "uuu": 1, "uvuv": 1, "uvu<v": 1,
            "u<vw": m1 * (m2 - 1) // 2,
        }[self.mode]


_INSTRUCTION_FORM = "(i_in1, i_in2, i_out, mode, has_weight[, path_weight])"


def _index(value, k: int, name: str) -> int:
    """An instruction index: an int (or numpy/torch integer); a float such as 0.0 is refused, as e3nn
    (which indexes the irreps with it) does, rather than truncated."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TensorProductTypeError(f"instructions[{k}]: {name} must be an integer index, got {value!r} "
                                     f"({type(value).__name__})")
    return operator.index(value)


def _as_instruction(ins, k: int) -> Instruction:
    if isinstance(ins, Instruction):
        return ins
    if isinstance(ins, (str, bytes)) or not hasattr(ins, "__iter__"):
        raise TensorProductTypeError(f"instructions[{k}]: expected a tuple {_INSTRUCTION_FORM}, got {ins!r}")
    ins = tuple(ins)
    if len(ins) not in (5, 6):
        raise TensorProductError(f"instructions[{k}]: expected {_INSTRUCTION_FORM}, got {ins!r}")
    i1, i2, io = (_index(v, k, n) for v, n in zip(ins[:3], ("i_in1", "i_in2", "i_out")))
    mode, hw = ins[3:5]
    if not isinstance(mode, str):
        raise TensorProductTypeError(f"instructions[{k}]: mode must be a string such as 'uvw', got {mode!r}")
    try:
        pw = float(ins[5]) if len(ins) == 6 else 1.0
    except (TypeError, ValueError):
        raise TensorProductTypeError(f"instructions[{k}]: path_weight must be a number, got {ins[5]!r}") from None
    if not (math.isfinite(pw) and pw >= 0):  # e3nn takes its square root
        raise TensorProductError(f"instructions[{k}]: path_weight must be a finite number >= 0, got {ins[5]!r}")
    return Instruction(i1, i2, io, mode, bool(hw), pw)


def _instructions(instructions) -> Tuple[Instruction, ...]:
    if isinstance(instructions, (str, bytes)) or not hasattr(instructions, "__iter__"):
        raise TensorProductTypeError(f"instructions: expected a list of tuples {_INSTRUCTION_FORM}, "
                                     f"got {instructions!r}")
    return tuple(_as_instruction(ins, k) for k, ins in enumerate(instructions))


def _variances(value, n: int, name: str) -> Tuple[float, ...]:
    if value is None:
        return (1.0,) * n
    try:
        vals = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise TensorProductTypeError(f"{name}: expected one number (variance) per irrep, {n} in all, "
                                     f"got {value!r}") from None
    if len(vals) != n:
        raise TensorProductError(f"{name}: expected {n} variances (one per irrep), got {len(vals)}")
    if not all(math.isfinite(v) and v >= 0 for v in vals):
        raise TensorProductError(f"{name}: variances must be finite and >= 0, got {value!r}")
    return vals


@dataclass(frozen=True)
class TPProblem:
    irreps_in1: Tuple[Irrep, ...]
    irreps_in2: Tuple[Irrep, ...]
    irreps_out: Tuple[Irrep, ...]
    instructions: Tuple[Instruction, ...]
    in1_var: Tuple[float, ...]
    in2_var: Tuple[float, ...]
    out_var: Tuple[float, ...]
    irrep_normalization: str = "component"
    path_normalization: str = "element"
    shared_weights: bool = True
    internal_weights: bool = False
    path_coefficients: Tuple[float, ...] = field(default=(), compare=False, repr=False)
    spec_json: str = field(default="", compare=False, repr=False)

    @staticmethod
    def create(
        irreps_in1,
        irreps_in2,
        irreps_out,
        instructions,
        in1_var=None,
        in2_var=None,
        out_var=None,
        irrep_normalization: Optional[str] = None,
        path_normalization: Optional[str] = None,
        internal_weights: Optional[bool] = None,
        shared_weights: Optional[bool] = None,
    ) -> "TPProblem":
        """Validate e3nn-style arguments and resolve defaults exactly as ``o3.TensorProduct`` does."""
        i1 = parse_irreps(irreps_in1, "irreps_in1")
        i2 = parse_irreps(irreps_in2, "irreps_in2")
        io = parse_irreps(irreps_out, "irreps_out")
        irrep_normalization = "component" if irrep_normalization is None else irrep_normalization
        path_normalization = "element" if path_normalization is None else path_normalization
        if irrep_normalization not in IRREP_NORMALIZATIONS:
            raise TensorProductError(f"irrep_normalization: expected one of {IRREP_NORMALIZATIONS}, "
                                     f"got {irrep_normalization!r}")
        if path_normalization not in PATH_NORMALIZATIONS:
            raise TensorProductError(f"path_normalization: expected one of {PATH_NORMALIZATIONS}, "
                                     f"got {path_normalization!r}")
        instrs = _instructions(instructions)
        for k, ins in enumerate(instrs):
            _validate_instruction(ins, k, i1, i2, io)
        if shared_weights is False and internal_weights is None:
            internal_weights = False
        if shared_weights is None:
            shared_weights = True
        if internal_weights is None:
            internal_weights = shared_weights and any(i.has_weight for i in instrs)
        if internal_weights and not shared_weights:
            raise TensorProductError("internal_weights=True requires shared_weights=True")
        p = TPProblem(
            i1, i2, io, instrs,
            _variances(in1_var, len(i1), "in1_var"),
            _variances(in2_var, len(i2), "in2_var"),
            _variances(out_var, len(io), "out_var"),
            irrep_normalization, path_normalization, bool(shared_weights), bool(internal_weights),
        )
        object.__setattr__(p, "path_coefficients", p._normalisation())
        # JSON form carried by the custom ops; precomputed so torch.compile sees a constant
        object.__setattr__(p, "spec_json", json.dumps(problem_to_spec(p), separators=(",", ":")))
        return p.with_sizes()

    def with_sizes(self) -> "TPProblem":
        """This problem with its derived sizes computed (a first ``cached_property`` access inside
        torch.compile traces the property's lock, which dynamo refuses); call it on copies made with
        ``dataclasses.replace``."""
        for name in ("dim_in1", "dim_in2", "dim_out", "weight_numel"):
            getattr(self, name)
        return self

    def _normalisation(self) -> Tuple[float, ...]:
        """sqrt(alpha) per instruction, the constant e3nn multiplies each path by."""
        coeffs = []
        for ins in self.instructions:
            (_, l1, _), (_, l2, _), (_, lo, _) = (
                self.irreps_in1[ins.i_in1], self.irreps_in2[ins.i_in2], self.irreps_out[ins.i_out])
            alpha = {"component": 2 * lo + 1, "norm": (2 * l1 + 1) * (2 * l2 + 1), "none": 1}[
                self.irrep_normalization]
            if self.path_normalization == "element":
                x = sum(self.in1_var[i.i_in1] * self.in2_var[i.i_in2] * i.num_elements(self)
                        for i in self.instructions if i.i_out == ins.i_out)
            elif self.path_normalization == "path":
                x = self.in1_var[ins.i_in1] * self.in2_var[ins.i_in2] * ins.num_elements(self)
                x *= len([i for i in self.instructions if i.i_out == ins.i_out])
            else:
                x = 1
            if x > 0.0:
                alpha /= x
            alpha *= self.out_var[ins.i_out]
            alpha *= ins.path_weight
            coeffs.append(math.sqrt(alpha))
        return tuple(coeffs)

    # --- derived sizes -------------------------------------------------------------------------
    @functools.cached_property
    def dim_in1(self) -> int:
        return irreps_dim(self.irreps_in1)

    @functools.cached_property
    def dim_in2(self) -> int:
        return irreps_dim(self.irreps_in2)

    @functools.cached_property
    def dim_out(self) -> int:
        return irreps_dim(self.irreps_out)

    @functools.cached_property
    def weight_numel(self) -> int:
        return sum(math.prod(i.path_shape(self)) for i in self.instructions if i.has_weight)

    def key(self) -> str:
        """Stable content hash (used for op registry keys and caches)."""
        return hashlib.sha256(repr(self).encode()).hexdigest()[:16]

    def describe(self) -> str:
        return (f"{irreps_str(self.irreps_in1)} x {irreps_str(self.irreps_in2)} -> {irreps_str(self.irreps_out)}"
                f" ({len(self.instructions)} paths, {self.weight_numel} weights,"
                f" {'shared' if self.shared_weights else 'per-row'})")


def _validate_instruction(ins: Instruction, k: int, i1, i2, io) -> None:
    where = f"instructions[{k}]"
    if ins.mode not in MODES:
        raise TensorProductKeyError(f"{where}: unknown connection mode {ins.mode!r}; expected one of {MODES}")
    for idx, irreps, name in ((ins.i_in1, i1, "i_in1"), (ins.i_in2, i2, "i_in2"), (ins.i_out, io, "i_out")):
        if not 0 <= idx < len(irreps):
            raise TensorProductIndexError(f"{where}: {name}={idx} out of range for irreps with {len(irreps)} entries")
    (m1, l1, p1), (m2, l2, p2), (mo, lo, po) = i1[ins.i_in1], i2[ins.i_in2], io[ins.i_out]
    if p1 * p2 != po:
        raise TensorProductError(f"{where}: parity mismatch, {l1}{'eo'[p1 < 0]} x {l2}{'eo'[p2 < 0]} cannot give "
                         f"{lo}{'eo'[po < 0]}")
    if not abs(l1 - l2) <= lo <= l1 + l2:
        raise TensorProductError(f"{where}: l_out={lo} violates the triangle rule for l1={l1}, l2={l2}")
    need = {
        "uvu": (m1 == mo, "mul_in1 == mul_out"), "uvv": (m2 == mo, "mul_in2 == mul_out"),
        "uuw": (m1 == m2, "mul_in1 == mul_in2"), "uuu": (m1 == m2 == mo, "mul_in1 == mul_in2 == mul_out"),
        "uvuv": (m1 * m2 == mo, "mul_in1 * mul_in2 == mul_out"),
        "uvu<v": (m1 == m2 and m1 * (m1 - 1) // 2 == mo, "mul_in1 == mul_in2 and mul_out == m(m-1)/2"),
        "u<vw": (m1 == m2, "mul_in1 == mul_in2"),
    }.get(ins.mode)
    if m1 * m2 * mo == 0:  # an empty path contributes nothing: e3nn accepts any mode there
        return
    if need is not None and not need[0]:
        raise TensorProductError(f"{where}: mode {ins.mode!r} requires {need[1]} (got {m1}, {m2}, {mo})")
    if ins.mode in ("uvw", "u<vw") and not ins.has_weight:
        raise TensorProductError(f"{where}: mode {ins.mode!r} requires has_weight=True")
    if ins.mode == "uuw" and not ins.has_weight and mo != 1:
        raise TensorProductError(f"{where}: unweighted 'uuw' requires mul_out == 1 (got {mo})")


def problem_to_spec(p: TPProblem) -> dict:
    """JSON-able form (the custom ops carry it as a string so exported graphs stay self-contained)."""
    return {
        "irreps_in1": p.irreps_in1, "irreps_in2": p.irreps_in2, "irreps_out": p.irreps_out,
        "instructions": [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight, i.path_weight)
                         for i in p.instructions],
        "in1_var": p.in1_var, "in2_var": p.in2_var, "out_var": p.out_var,
        "irrep_normalization": p.irrep_normalization, "path_normalization": p.path_normalization,
        "shared_weights": p.shared_weights, "internal_weights": p.internal_weights,
    }


def problem_from_spec(d: dict) -> TPProblem:
    s = lambda irreps: "+".join(f"{m}x{l}{'e' if par == 1 else 'o'}" for m, l, par in irreps) or ""  # noqa: E731
    return TPProblem.create(
        s(d["irreps_in1"]), s(d["irreps_in2"]), s(d["irreps_out"]), [tuple(i) for i in d["instructions"]],
        d["in1_var"], d["in2_var"], d["out_var"], d["irrep_normalization"], d["path_normalization"],
        d["internal_weights"], d["shared_weights"],
    )
