"""e3nn-compatible tensor-product modules backed by ``equikernels.ops.tensor_product``.

Constructors take the same arguments as ``e3nn.o3.TensorProduct`` and its subclasses and build
the same irreps, instructions, weights and buffers, so e3nn checkpoints load unchanged. Extra
keyword arguments: ``layout`` ("mul_ir", e3nn's, or "ir_mul"), ``backend`` (None = automatic) and
the precision controls ``math_dtype`` / ``output_dtype`` of ``equikernels.ops.tensor_product``
(inputs and weights may be float16/bfloat16/float32, mixed; math float32 by default).
"""
import contextlib
import math
import warnings
from typing import Dict, Iterator, List, Optional

import torch
from torch import nn

from .._compat import e3nn, o3
from e3nn.o3._tensor_product._instruction import Instruction  # noqa: E402 (after the safe e3nn import)
from e3nn.util.jit import compile_mode  # noqa: E402

from ..ops import tensor_product as _tensor_product
from .frozen import outside_inference_mode
from ..ops.chain import autocast_dtype
from ..ops.tp import check_backend, check_dtypes
from ..problem import MissingWeightError, TensorProductError, TPProblem, parse_irreps
from ._script import script_tensor_product, tp_script_data

__all__ = ["TensorProduct", "FullyConnectedTensorProduct", "ElementwiseTensorProduct", "FullTensorProduct",
           "TensorSquare", "ChannelWiseTensorProduct"]


@compile_mode("script")
class TensorProduct(nn.Module):
    """Drop-in ``e3nn.o3.TensorProduct``: same arguments, weights, ``instructions`` and buffers.

    ``torch.jit.script`` works (as for e3nn's module) and runs a plain-PyTorch form of the same
    product (``nn._script``), not the generated kernels; ``torch.compile`` and ``torch.export``
    keep the fast paths.

    e3nn's code-generation arguments (``compile_left_right``, ``compile_right``,
    ``_specialized_code``, ``_optimize_einsums``) are accepted and do not change the computation;
    ``compile_left_right``, ``compile_right`` and ``_specialized_code`` only select which constants
    ``state_dict`` carries, as in e3nn.
    ``normalization`` is e3nn's deprecated alias of ``irrep_normalization``.
    """

    # types of the TorchScript form's plain attributes (TorchScript cannot infer an empty list's)
    _ts_recs: List[List[int]]
    _ts_modes: List[str]
    _ts_alphas: List[float]
    _ts_blocks: List[List[int]]
    _ts_dims: List[int]

    def __init__(
        self,
        irreps_in1,
        irreps_in2,
        irreps_out,
        instructions: List[tuple],
        in1_var=None,
        in2_var=None,
        out_var=None,
        irrep_normalization: Optional[str] = None,
        path_normalization: Optional[str] = None,
        internal_weights: Optional[bool] = None,
        shared_weights: Optional[bool] = None,
        compile_left_right: bool = True,
        compile_right: bool = False,
        normalization: Optional[str] = None,
        _specialized_code: Optional[bool] = None,
        _optimize_einsums: Optional[bool] = None,
        *,
        layout: str = "mul_ir",
        backend: Optional[str] = None,
        math_dtype: Optional[torch.dtype] = None,
        output_dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        check_dtypes(math_dtype, output_dtype)
        self.math_dtype, self.output_dtype = math_dtype, output_dtype
        # e3nn codegen knobs: they only select which constants state_dict carries (below)
        compile_left_right, compile_right = bool(compile_left_right), bool(compile_right)
        # kept as attributes (code written for e3nn reads them); they do not change the computation
        self._specialized_code = (e3nn.get_optimization_defaults().get("specialized_code", True)
                                  if _specialized_code is None else bool(_specialized_code))
        self._optimize_einsums = (e3nn.get_optimization_defaults().get("optimize_einsums", True)
                                  if _optimize_einsums is None else bool(_optimize_einsums))
        if normalization is not None:
            warnings.warn("`normalization` is deprecated. Use `irrep_normalization` instead.", DeprecationWarning)
            irrep_normalization = normalization
        if layout not in ("mul_ir", "ir_mul"):
            raise TensorProductError(f"layout: expected 'mul_ir' or 'ir_mul', got {layout!r}")
        check_backend(backend)  # said at construction, not at the first call
        self.problem = TPProblem.create(
            irreps_in1, irreps_in2, irreps_out, instructions, in1_var, in2_var, out_var,
            irrep_normalization, path_normalization, internal_weights, shared_weights)
        p = self.problem
        self.layout = layout
        self.backend = backend
        self.irreps_in1 = o3.Irreps(irreps_in1)
        self.irreps_in2 = o3.Irreps(irreps_in2)
        self.irreps_out = o3.Irreps(irreps_out)
        # e3nn exposes the *normalised* path weight (sqrt(alpha)) in .instructions
        self.instructions = [
            Instruction(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight, coef, i.path_shape(p))
            for i, coef in zip(p.instructions, p.path_coefficients)
        ]
        self.shared_weights = p.shared_weights
        self.internal_weights = p.internal_weights
        self.weight_numel = p.weight_numel
        if self.internal_weights and self.weight_numel > 0:
            self.weight = nn.Parameter(torch.randn(self.weight_numel))
        else:
            self.register_buffer("weight", torch.Tensor())  # e3nn always defines .weight (persisted)
        # e3nn persists this buffer (1 where some nonzero path reaches an output component)
        if self.irreps_out.dim > 0:
            mask = [
                (torch.ones if any(ins.i_out == k and ins.path_weight != 0 and 0 not in ins.path_shape
                                   for ins in self.instructions) else torch.zeros)(mul * ir.dim)
                for k, (mul, ir) in enumerate(self.irreps_out)
            ]
            output_mask = torch.cat(mask)
        else:
            output_mask = torch.ones(0)
        self.register_buffer("output_mask", output_mask)
        # e3nn's generated-code submodules persist their constants in state_dict; mirror them so
        # checkpoints load both ways (never used to compute: our coefficients live in the IR)
        self._compiled_main_left_right = _CodegenConstants(
            _e3nn_constants(self, _specialized_code) if compile_left_right else {})
        self._compiled_main_right = _CodegenConstants(
            _e3nn_constants(self, _specialized_code, right=True) if compile_right else {})
        self._derived()

    def _derived(self) -> None:
        """What the TorchScript form needs (plain attributes: not in state_dict, as in e3nn)."""
        (self._ts_recs, self._ts_modes, self._ts_alphas, self._ts_blocks,
         self._ts_w3j) = tp_script_data(self)
        self._ts_ir_mul = self.layout == "ir_mul"
        self._ts_dims = [self.problem.dim_in1, self.problem.dim_in2, self.problem.dim_out]

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        if "_ts_dims" not in self.__dict__:  # pickled by an earlier version
            self._derived()
            self.__dict__.setdefault("_specialized_code", True)
            self.__dict__.setdefault("_optimize_einsums", True)

    def __repr__(self) -> str:
        npath = sum(math.prod(i.path_shape) for i in self.instructions)
        lay = "" if self.layout == "mul_ir" else f", layout={self.layout}"
        return (f"{self.__class__.__name__}({self.irreps_in1.simplify()} x {self.irreps_in2.simplify()} "
                f"-> {self.irreps_out.simplify()} | {npath} paths | {self.weight_numel} weights{lay})")

    # --- weights ---------------------------------------------------------------------------------
    def _get_weights(self, weight) -> Optional[torch.Tensor]:
        if isinstance(weight, (list, tuple)):  # e3nn also accepts one tensor per weighted instruction
            shapes = [i.path_shape for i in self.instructions if i.has_weight]
            if len(weight) != len(shapes):
                raise ValueError(f"weight: expected {len(shapes)} tensors (one per weighted instruction), "
                                 f"got {len(weight)}")
            lead = (lambda w, s: w.shape[:w.dim() - len(s)]) if not self.shared_weights else (lambda w, s: ())
            weight = torch.cat([w.reshape(lead(w, s) + (math.prod(s),)) for w, s in zip(weight, shapes)], -1)
        if weight is None:
            if self.weight_numel > 0 and not self.internal_weights:
                raise MissingWeightError("weight: required, this tensor product has internal_weights=False "
                                 f"(expected shape {'(' if self.shared_weights else '(..., '}{self.weight_numel},))")
            weight = self.weight
        elif (not self.shared_weights and self.weight_numel > 0 and isinstance(weight, torch.Tensor)
              and weight.dim() < 2):
            raise TensorProductError(f"weight: per-row weights (shared_weights=False) need a batch dimension, "
                                     f"[..., {self.weight_numel}], got shape {tuple(weight.shape)}")
        return weight if self.weight_numel > 0 else None

    def weight_view_for_instruction(self, instruction: int, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        """View of the weights of one instruction, shaped ``batch + path_shape`` (as e3nn)."""
        ins = self.instructions[instruction]
        if not ins.has_weight:
            raise ValueError(f"Instruction {instruction} has no weights.")
        offset = sum(math.prod(i.path_shape) for i in self.instructions[:instruction] if i.has_weight)
        weight = self._get_weights(weight)
        return weight.narrow(-1, offset, math.prod(ins.path_shape)).view(weight.shape[:-1] + ins.path_shape)

    def weight_views(self, weight: Optional[torch.Tensor] = None, yield_instruction: bool = False):
        for k, ins in enumerate(self.instructions):
            if ins.has_weight:
                view = self.weight_view_for_instruction(k, weight)
                yield (k, ins, view) if yield_instruction else view

    def visualize(self, weight: Optional[torch.Tensor] = None, plot_weight: bool = True, aspect_ratio=1, ax=None):
        """e3nn's drawing of the product's paths, coloured by the mean square of each path's weights
        (matplotlib); returns ``(fig, ax)``."""
        return o3.TensorProduct.visualize(self, weight=weight, plot_weight=plot_weight, aspect_ratio=aspect_ratio,
                                          ax=ax)

    # --- evaluation ------------------------------------------------------------------------------
    @torch.jit.unused
    def _tp(self, x: torch.Tensor, y: torch.Tensor, weight: Optional[torch.Tensor]) -> torch.Tensor:
        w = self._get_weights(weight)
        if torch.jit.is_tracing():  # a trace holds plain operations, not the kernels' Functions
            return self._traced_tp(x, y, w)
        return _tensor_product(self.problem, x, y, w, layout=self.layout, backend=self.backend,
                               math_dtype=self.math_dtype, output_dtype=self.output_dtype)

    @torch.jit.unused
    def _traced_tp(self, x: torch.Tensor, y: torch.Tensor, w: Optional[torch.Tensor]) -> torch.Tensor:
        """``_tp`` under torch.jit.trace, whose saved graph cannot hold the kernels' autograd Functions:
        the plain-PyTorch form (e3nn's broadcasting, any number of rows), in the ops' math and output dtypes.
        (Inside torch.func transforms the ops' autograd chain takes its plain form itself.)"""
        for name, t in (("x", x), ("y", y), ("weight", w)):
            if t is not None and not (isinstance(t, torch.Tensor) and t.is_floating_point()):
                raise TypeError(f"{name}: expected a floating-point torch.Tensor, got "
                                f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
        dtypes = {t.dtype for t in (x, y, w) if t is not None}
        if torch.float64 in dtypes and len(dtypes) > 1:
            raise TypeError(f"x, y, weight: float64 operands cannot be mixed with other dtypes, got "
                            f"{', '.join(sorted(str(d) for d in dtypes))}")
        compute = self.math_dtype or (torch.float64 if torch.float64 in dtypes else torch.float32)
        out_dtype = self.output_dtype or autocast_dtype(x) or x.dtype
        w = torch.empty(0, dtype=compute, device=x.device) if w is None else w.to(compute)
        with torch.autocast(x.device.type, enabled=False) if autocast_dtype(x) else contextlib.nullcontext():
            out = self._script_tp(x.to(compute), y.to(compute), w)
        return out.to(out_dtype)

    def _script_tp(self, x: torch.Tensor, y: torch.Tensor, weight: Optional[torch.Tensor]) -> torch.Tensor:
        """The TorchScript form of ``_tp`` (plain PyTorch, e3nn's broadcasting)."""
        if x.shape[-1] != self._ts_dims[0]:
            raise ValueError(f"x: expected last dimension {self._ts_dims[0]} (irreps_in1), got {x.shape[-1]}")
        if y.shape[-1] != self._ts_dims[1]:
            raise ValueError(f"y: expected last dimension {self._ts_dims[1]} (irreps_in2), got {y.shape[-1]}")
        if weight is None:
            if self.weight_numel > 0 and not self.internal_weights:
                raise ValueError("weight: required, this tensor product has internal_weights=False")
            w = self.weight
        else:
            w = weight
        if self.weight_numel > 0 and w.shape[-1] != self.weight_numel:
            raise ValueError(f"weight: expected last dimension {self.weight_numel}, got {w.shape[-1]}")
        if self.weight_numel > 0 and (w.dim() != 1 if self.shared_weights else w.dim() < 2):
            raise ValueError("weight: expected shape [weight_numel] (shared) or [..., weight_numel] with a batch "
                             "dimension (shared_weights=False)")
        # the Wigner-3j blocks are cast to x's dtype: integers would truncate them (TorchScript prints no dtype)
        if not (x.is_floating_point() or x.is_complex()):
            raise TypeError("x: expected a floating-point tensor, got an integer or bool tensor")
        if y.dtype != x.dtype:
            raise TypeError("y: dtype does not match x's; the TorchScript form takes x, y and weight in one dtype")
        if self.weight_numel > 0 and w.dtype != x.dtype:
            raise TypeError("weight: dtype does not match x's; the TorchScript form takes x, y and weight in one dtype")
        return script_tensor_product(x, y, w, self.shared_weights, self._ts_recs, self._ts_modes, self._ts_alphas,
                                     self._ts_blocks, self._ts_w3j, self._ts_dims[2], self._ts_ir_mul)

    @outside_inference_mode
    def forward(self, x: torch.Tensor, y: torch.Tensor, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x``: [..., irreps_in1.dim], ``y``: [..., irreps_in2.dim] -> [..., irreps_out.dim]. ``weight``
        may also be a list with one tensor per weighted instruction (as e3nn)."""
        if torch.jit.is_scripting():
            return self._script_tp(x, y, weight)
        return self._tp(x, y, weight)

    @torch.jit.export
    def right(self, y: torch.Tensor, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The linear map ``x -> TP(x, y)`` as a matrix [..., irreps_in1.dim, irreps_out.dim] (as e3nn)."""
        if torch.jit.is_scripting():
            n = self._ts_dims[0]
            eye = torch.eye(n, dtype=y.dtype, device=y.device).reshape([n] + [1] * (y.dim() - 1) + [n])
            return self._script_tp(eye, y.unsqueeze(0), weight).movedim(0, -2)
        return self._right(y, weight)

    @torch.jit.unused
    def _right(self, y: torch.Tensor, weight: Optional[torch.Tensor]) -> torch.Tensor:
        n = self.problem.dim_in1
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"y: expected a torch.Tensor, got {type(y).__name__}")
        if y.dim() == 0 or y.shape[-1] != self.problem.dim_in2:  # named here: the call below sees y unsqueezed
            raise ValueError(f"y: expected last dimension {self.problem.dim_in2} (irreps_in2), got shape "
                             f"{tuple(y.shape)}")
        eye = torch.eye(n, dtype=y.dtype, device=y.device).reshape((n,) + (1,) * (y.dim() - 1) + (n,))
        return self._tp(eye, y.unsqueeze(0), weight).movedim(0, -2)


class _CodegenConstants(nn.Module):
    """Stand-in for an e3nn generated-code submodule: holds the constants e3nn persists in its
    state_dict (wigner-3j blocks ``_w3j_l1_l2_l3``, ``_triu_indices_m``) and nothing else.

    Loading is lenient (matching keys are copied, others ignored, none reported missing): which
    constants e3nn persists depends on its version and codegen options, and all are constants.
    """

    def __init__(self, constants: Dict[str, torch.Tensor]) -> None:
        super().__init__()
        for name, value in constants.items():
            self.register_buffer(name, value)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        with torch.no_grad():
            for name, buf in self._buffers.items():
                value = state_dict.get(prefix + name)
                if value is not None and buf is not None and value.shape == buf.shape:
                    buf.copy_(value)


def _e3nn_constants(tp: "TensorProduct", specialized: Optional[bool], right: bool = False
                    ) -> Dict[str, torch.Tensor]:
    """The buffers e3nn's left-right codegen registers (``right``: its ``compile_right`` codegen's): a
    wigner-3j block for every path it does not special-case when ``_specialized_code`` (left-right:
    l = 0 factors, and (1,1,1) in "uuu"; right: l = 0 factors in weighted "uvw"/"uvu"/"uvv" and in
    "uuu"), triangle indices for "uvu<v"/"u<vw" (no right codegen); in the default dtype, as e3nn."""
    if specialized is None:
        specialized = e3nn.get_optimization_defaults()["specialized_code"]
    consts: Dict[str, torch.Tensor] = {}
    for ins in tp.instructions:
        (m1, ir1), (m2, ir2), (mo, iro) = tp.irreps_in1[ins.i_in1], tp.irreps_in2[ins.i_in2], tp.irreps_out[ins.i_out]
        mode = ins.connection_mode
        if 0 in ins.path_shape or 0 in (m1, m2, mo) or (right and mode in ("uvu<v", "u<vw")):
            continue  # e3nn emits no code for empty paths
        ls = (ir1.l, ir2.l, iro.l)
        any0 = 0 in ls
        if right:
            rules = {"uvw": any0 and ins.has_weight, "uvu": any0 and ins.has_weight,
                     "uvv": any0 and ins.has_weight, "uuu": any0}
        else:
            rules = {"uvw": any0, "uvu": any0 and ins.has_weight, "uvv": any0, "uuw": any0 and ins.has_weight,
                     "uuu": any0 or ls == (1, 1, 1)}
        special = specialized and rules.get(mode, False)
        name = "_w3j_{}_{}_{}".format(*ls)
        if not special and name not in consts:  # (order matters: e3nn's graph reads w3j, then triu)
            consts[name] = o3.wigner_3j(*ls)
        if mode in ("uvu<v", "u<vw") and f"_triu_indices_{m1}" not in consts:
            consts[f"_triu_indices_{m1}"] = torch.triu_indices(m1, m1, 1)
    return consts


def _irreps(value, name: str):
    """``o3.Irreps(value)``, with a clear error naming the argument (catchable as e3nn's)."""
    parse_irreps(value, name)
    return o3.Irreps(value)


def _filter(filter_ir_out, name="filter_ir_out"):
    if filter_ir_out is None:
        return None
    try:
        return [o3.Irrep(ir) for ir in filter_ir_out]
    except (ValueError, TypeError, AssertionError):
        raise TensorProductError(f"{name}: expected an iterable of irreps such as ['0e', '1o'], "
                         f"got {filter_ir_out!r}") from None


class FullyConnectedTensorProduct(TensorProduct):
    """Every allowed (in1, in2) -> out path, "uvw" weights (``e3nn.o3.FullyConnectedTensorProduct``)."""

    def __init__(self, irreps_in1, irreps_in2, irreps_out, irrep_normalization: Optional[str] = None,
                 path_normalization: Optional[str] = None, **kwargs) -> None:
        irreps_in1, irreps_in2 = _irreps(irreps_in1, "irreps_in1"), _irreps(irreps_in2, "irreps_in2")
        irreps_out = _irreps(irreps_out, "irreps_out")
        instr = [(a, b, c, "uvw", True, 1.0)
                 for a, (_, ir1) in enumerate(irreps_in1)
                 for b, (_, ir2) in enumerate(irreps_in2)
                 for c, (_, ir) in enumerate(irreps_out) if ir in ir1 * ir2]
        super().__init__(irreps_in1, irreps_in2, irreps_out, instr, irrep_normalization=irrep_normalization,
                         path_normalization=path_normalization, **kwargs)


class ElementwiseTensorProduct(TensorProduct):
    """``z_u = x_u (x) y_u``, no weights (``e3nn.o3.ElementwiseTensorProduct``)."""

    def __init__(self, irreps_in1, irreps_in2, filter_ir_out=None, irrep_normalization: Optional[str] = None,
                 **kwargs) -> None:
        irreps_in1 = _irreps(irreps_in1, "irreps_in1").simplify()
        irreps_in2 = _irreps(irreps_in2, "irreps_in2").simplify()
        filter_ir_out = _filter(filter_ir_out)
        if irreps_in1.num_irreps != irreps_in2.num_irreps:
            raise TensorProductError(f"irreps_in1 ({irreps_in1}) and irreps_in2 ({irreps_in2}) must have the same "
                                     "number of irreps for an elementwise product")
        # split blocks so that the two inputs are aligned block by block
        a, b = [(m, ir) for m, ir in irreps_in1], [(m, ir) for m, ir in irreps_in2]
        k = 0
        while k < len(a):
            (m1, ir1), (m2, ir2) = a[k], b[k]
            if m1 < m2:
                b[k:k + 1] = [(m1, ir2), (m2 - m1, ir2)]
            elif m2 < m1:
                a[k:k + 1] = [(m2, ir1), (m1 - m2, ir1)]
            k += 1
        out, instr = [], []
        for k, ((mul, ir1), (_, ir2)) in enumerate(zip(a, b)):
            for ir in ir1 * ir2:
                if filter_ir_out is None or ir in filter_ir_out:
                    instr.append((k, k, len(out), "uuu", False))
                    out.append((mul, ir))
        super().__init__(a, b, out, instr, irrep_normalization=irrep_normalization, **kwargs)


class FullTensorProduct(TensorProduct):
    """``z_uv = x_u (x) y_v`` for every pair, no weights, sorted output (``e3nn.o3.FullTensorProduct``)."""

    def __init__(self, irreps_in1, irreps_in2, filter_ir_out: Iterator = None,
                 irrep_normalization: Optional[str] = None, **kwargs) -> None:
        irreps_in1 = _irreps(irreps_in1, "irreps_in1").simplify()
        irreps_in2 = _irreps(irreps_in2, "irreps_in2").simplify()
        filter_ir_out = _filter(filter_ir_out)
        out, instr = [], []
        for a, (m1, ir1) in enumerate(irreps_in1):
            for b, (m2, ir2) in enumerate(irreps_in2):
                for ir in ir1 * ir2:
                    if filter_ir_out is None or ir in filter_ir_out:
                        instr.append((a, b, len(out), "uvuv", False))
                        out.append((m1 * m2, ir))
        out, perm, _ = o3.Irreps(out).sort()
        instr = [(a, b, perm[c], mode, hw) for a, b, c, mode, hw in instr]
        super().__init__(irreps_in1, irreps_in2, out, instr, irrep_normalization=irrep_normalization, **kwargs)


def _square_alpha(norm: str, l1: int, l2: int, lo: int, diagonal: bool) -> float:
    """TensorSquare's per-path normalisation (e3nn bakes it into path_weight with irrep_normalization='none').

    ``diagonal`` marks the symmetric u == v paths ("uuu"/"uuw"), whose norm differs from the
    generic product: the even-l part of x_u (x) x_u has a larger second moment.
    """
    d1, d2, do = 2 * l1 + 1, 2 * l2 + 1, 2 * lo + 1
    if not diagonal:
        return {"component": do, "norm": d1 * d2, "none": 1}[norm]
    if norm == "component":
        return do / (d1 + 2) if lo == 0 else do / 2
    if norm == "norm":
        return do * d1 if lo == 0 else d1 * (d1 + 2) / 2
    return 1


_SQUARE_MODES = {"pair": ("uvuv", "uvw"), "triangle": ("uvu<v", "u<vw"), "diagonal": ("uuu", "uuw")}


class TensorSquare(TensorProduct):
    """``x (x) x`` reduced into irreps (``e3nn.o3.TensorSquare``); forward takes ``(x, weight=None)``.

    Without ``irreps_out`` it is weightless ("uvuv", "uvu<v", "uuu" paths, sorted output); with
    ``irreps_out`` it is fully connected ("uvw", "u<vw", "uuw").
    """

    def __init__(self, irreps_in, irreps_out=None, filter_ir_out: Iterator = None,
                 irrep_normalization: Optional[str] = None, **kwargs) -> None:
        norm = "component" if irrep_normalization is None else irrep_normalization
        if norm not in ("component", "norm", "none"):
            raise TensorProductError(f"irrep_normalization: expected 'component', 'norm' or 'none', got {norm!r}")
        irreps_in = _irreps(irreps_in, "irreps_in").simplify()
        filter_ir_out = _filter(filter_ir_out)
        instr = []
        if irreps_out is not None and filter_ir_out is not None:
            raise TensorProductError("irreps_out and filter_ir_out: give at most one (both given is ambiguous)")
        weighted = irreps_out is not None
        targets = list(enumerate(_irreps(irreps_out, "irreps_out").simplify())) if weighted else None
        out = []  # weightless case: one output block per path, sorted at the end
        for a, (m, ir1) in enumerate(irreps_in):
            for b, (m2, ir2) in enumerate(irreps_in):
                if a > b:
                    continue  # x_a (x) x_b with a > b duplicates the a < b path
                if weighted:
                    dests = [(c, ir) for c, (_, ir) in targets if ir in ir1 * ir2]
                else:
                    dests = [(None, ir) for ir in ir1 * ir2 if filter_ir_out is None or ir in filter_ir_out]
                for c, ir in dests:
                    if a < b:
                        kinds = [("pair", m * m2, False)]
                    else:  # x_a (x) x_a: strictly upper triangle u < v, plus the diagonal u == v
                        kinds = [("triangle", m * (m - 1) // 2, False)] if m > 1 else []
                        if ir.l % 2 == 0:  # (the odd-l part of x_u (x) x_u vanishes by antisymmetry)
                            kinds.append(("diagonal", m, True))
                    for kind, mul_out, diagonal in kinds:
                        if not weighted:
                            c = len(out)
                            out.append((mul_out, ir))
                        alpha = _square_alpha(norm, ir1.l, ir2.l, ir.l, diagonal)
                        instr.append((a, b, c, _SQUARE_MODES[kind][weighted], weighted, alpha))
        if weighted:
            irreps_out = o3.Irreps(irreps_out).simplify()
        else:
            irreps_out, perm, _ = o3.Irreps(out).sort()
            instr = [(a, b, perm[c], mode, hw, al) for a, b, c, mode, hw, al in instr]
        super().__init__(irreps_in, irreps_in, irreps_out, instr, irrep_normalization="none", **kwargs)
        self.irreps_in = irreps_in

    def __repr__(self) -> str:
        npath = sum(math.prod(i.path_shape) for i in self.instructions)
        return (f"{self.__class__.__name__}({self.irreps_in} -> {self.irreps_out.simplify()} | {npath} paths | "
                f"{self.weight_numel} weights)")

    @outside_inference_mode
    def forward(self, x: torch.Tensor, weight: Optional[torch.Tensor] = None  # pylint: disable=arguments-differ
                ) -> torch.Tensor:
        if torch.jit.is_scripting():
            return self._script_tp(x, x, weight)
        return self._tp(x, x, weight)


class ChannelWiseTensorProduct(TensorProduct):
    """Channel-wise ("uvu") product as NequIP/MACE build it: one weighted path per allowed
    (in1, in2, ir_out) with output multiplicity ``mul_in1``, output irreps sorted (not simplified).

    ``filter_ir_out`` may be irreps ("64x0e+64x1o": only the irrep types matter) or a list of
    irreps. Defaults to per-row external weights (``shared_weights=False, internal_weights=False``),
    the convolution use case; pass ``shared_weights=True`` for module-held weights.
    """

    def __init__(self, irreps_in1, irreps_in2, filter_ir_out=None, irrep_normalization: Optional[str] = None,
                 path_normalization: Optional[str] = None, **kwargs) -> None:
        irreps_in1, irreps_in2 = _irreps(irreps_in1, "irreps_in1"), _irreps(irreps_in2, "irreps_in2")
        if isinstance(filter_ir_out, (str, o3.Irreps)):
            filter_ir_out = [ir for _, ir in o3.Irreps(filter_ir_out)]
        filter_ir_out = _filter(filter_ir_out)
        out, instr = [], []
        for a, (m1, ir1) in enumerate(irreps_in1):
            for b, (_, ir2) in enumerate(irreps_in2):
                for ir in ir1 * ir2:
                    if filter_ir_out is None or ir in filter_ir_out:
                        instr.append((a, b, len(out), "uvu", True))
                        out.append((m1, ir))
        out, perm, _ = o3.Irreps(out).sort()
        instr = [(a, b, perm[c], mode, hw) for a, b, c, mode, hw in instr]
        if kwargs.get("shared_weights") is None:
            kwargs["shared_weights"] = False
        super().__init__(irreps_in1, irreps_in2, out, instr, irrep_normalization=irrep_normalization,
                         path_normalization=path_normalization, **kwargs)
