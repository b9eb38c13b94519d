"""e3nn-compatible equivariant linear layer (``e3nn.o3.Linear``) in plain PyTorch.

An equivariant linear map is one small GEMM per (input block, output block) pair; PyTorch's matmul
is already optimal for it, so there is no kernel here. Same arguments, ``weight``/``bias``
parameters, ``instructions`` (with e3nn's normalised ``path_weight``) and ``output_mask`` buffer
as e3nn, plus ``layout`` ("mul_ir" or "ir_mul").
"""
import contextlib
import functools
import itertools
import math
from typing import List, Optional, Tuple, Union

import torch
from torch import nn

from .._compat import o3
from e3nn.o3._linear import Instruction  # noqa: E402 (after the safe e3nn import)
from e3nn.o3 import _linear as _e3nn_linear  # noqa: E402
from e3nn.util.jit import compile_mode  # noqa: E402

from ..problem import (MissingWeightError, TensorProductError, TensorProductIndexError, TensorProductTypeError,
                       parse_irreps)
from ..ops.chain import functorch_wrapped
from ..reference import autocast_on
from ._block_linear import block_linear
from ._dense_weight import spread
from ._script import linear_script_data, script_linear
from .blocks import rows_by_component
from .frozen import frozen_key, held, outside_inference_mode, state_without, tracing, version

__all__ = ["Linear"]

# CUDA, rows x dim_in x dim_out up to this: one matrix product with the block-sparse weight spread
# into a dense [dim_in, dim_out] matrix (one launch, no copies) instead of a product per block plus
# the copies that regroup the components. Small graphs are bound by host work, where launches count,
# not FLOPs (SevenNet-0's 480-wide linears on 1,728 atoms: 4e8)
DENSE_MAX_MACS = 5e8
DENSE_DEVICES = ("cuda",)
_DENSE_CACHES = ("_dense_idx", "_dense_w", "_dense_dev", "_dense_gather")
_CACHES = _DENSE_CACHES + ("_terms", "_scaled")  # rebuilt on first use: not saved with the model
# where the per-block path keeps its input instead of the regrouped copies the weight gradient reads,
# making them again in the backward: on CUDA memory is what limits the system size, on the CPU time
RECOMPUTE_DEVICES = ("cuda",)
_top_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", lambda ignore: None)
# frozen weights in the ir_mul layout: one strided batched product per instruction, reading and
# writing the blocks in place (nn/_block_linear.py), instead of regrouping copies and a concatenation
BLOCK_DEVICES = ("cuda",)


class _Recomputed:
    """What autograd keeps in place of a saved copy: the function that makes the copy again."""
    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


class _Recipes(torch.autograd.graph.saved_tensors_hooks):
    """Saved-tensor hooks under which the registered copies are not kept for the backward but made
    again from their source when it unpacks them; every other saved tensor is kept as it is. The weight
    gradient then holds ``features`` itself (often alive anyway) instead of a regrouped copy of it."""

    def __init__(self):
        self.copies = {}  # id -> (tensor, make); the tensor held so that its id stays its own
        super().__init__(self._pack, self._unpack)

    @staticmethod
    def for_call(w: torch.Tensor, features: torch.Tensor) -> Optional["_Recipes"]:
        """Hooks for one forward that saves copies for a weight gradient; None where nothing is saved
        (no weight gradient), where the graph is traced or under a torch.func transform, or where other
        saved-tensor hooks (activation checkpointing, offloading) are in force and must see every tensor."""
        if not (w.requires_grad and torch.is_grad_enabled()) or features.device.type not in RECOMPUTE_DEVICES:
            return None
        if torch.compiler.is_compiling() or _top_hooks(False) is not None or functorch_wrapped(features):
            return None  # torch.func transforms refuse saved-tensor hooks
        return _Recipes()

    def add(self, t: torch.Tensor, make) -> None:
        """Keep ``make`` (which returns ``t``'s values again) instead of ``t`` wherever ``t`` is saved."""
        self.copies[id(t)] = (t, make)

    def _pack(self, t):
        entry = self.copies.get(id(t))
        return _Recomputed(entry[1]) if entry is not None and entry[0] is t else t

    @staticmethod
    def _unpack(saved):
        return saved.make() if isinstance(saved, _Recomputed) else saved

    def __exit__(self, *exc):
        self.copies.clear()  # the copies are freed with the forward's locals
        return super().__exit__(*exc)


def _linear_instructions(instructions) -> List[Tuple[int, int]]:
    """(i_in, i_out) pairs of integers; a float index is refused, as e3nn (which indexes with it) does."""
    form = "a list of (i_in, i_out) pairs"
    if isinstance(instructions, (str, bytes)) or not hasattr(instructions, "__iter__"):
        raise TensorProductTypeError(f"instructions: expected {form}, got {instructions!r}")
    out = []
    for k, ins in enumerate(instructions):
        if isinstance(ins, (str, bytes)) or not hasattr(ins, "__iter__") or len(tuple(ins)) != 2:
            raise TensorProductTypeError(f"instructions[{k}]: expected an (i_in, i_out) pair, got {ins!r}")
        for v in ins:
            if isinstance(v, bool) or not hasattr(v, "__index__"):
                raise TensorProductTypeError(f"instructions[{k}]: indices must be integers, got {v!r} "
                                             f"({type(v).__name__})")
        out.append(tuple(int(v) for v in ins))
    return out


@compile_mode("script")
class Linear(nn.Module):
    """Drop-in ``e3nn.o3.Linear`` (``_optimize_einsums`` is accepted, kept and unused).

    ``torch.jit.script`` works (as for e3nn's module) and runs a plain-PyTorch form of the map.

    ``f_in``/``f_out`` add an extra channel axis: features [..., f_in, irreps_in.dim] ->
    [..., f_out, irreps_out.dim] with weights [f_in, f_out, weight_numel].
    """

    # types of the TorchScript form's plain attributes (TorchScript cannot infer an empty list's)
    _ts_recs: List[List[int]]
    _ts_alphas: List[float]
    _ts_biases: List[List[int]]
    _ts_blocks: List[List[int]]
    _ts_f: List[int]

    def __init__(
        self,
        irreps_in,
        irreps_out,
        *,
        f_in: Optional[int] = None,
        f_out: Optional[int] = None,
        internal_weights: Optional[bool] = None,
        shared_weights: Optional[bool] = None,
        instructions: Optional[List[Tuple[int, int]]] = None,
        biases: Union[bool, List[bool], None] = False,
        path_normalization: str = "element",
        _optimize_einsums: Optional[bool] = None,
        layout: str = "mul_ir",
    ) -> None:
        super().__init__()
        self._optimize_einsums = _optimize_einsums  # e3nn's codegen knob: kept (code reads it), unused
        if path_normalization not in ("element", "path"):
            raise TensorProductError(f"path_normalization: expected 'element' or 'path', got {path_normalization!r}")
        if layout not in ("mul_ir", "ir_mul"):
            raise ValueError(f"layout: expected 'mul_ir' or 'ir_mul', got {layout!r}")
        if (f_in is None) != (f_out is None):
            raise TensorProductError(f"f_in and f_out: give both or neither (got f_in={f_in}, f_out={f_out})")
        parse_irreps(irreps_in, "irreps_in")  # a clear error naming the argument
        parse_irreps(irreps_out, "irreps_out")
        irreps_in, irreps_out = o3.Irreps(irreps_in), o3.Irreps(irreps_out)
        if instructions is None:
            instructions = [(i, o) for i, (_, ir_i) in enumerate(irreps_in)
                            for o, (_, ir_o) in enumerate(irreps_out) if ir_i == ir_o]
        instructions = _linear_instructions(instructions)
        for i_in, i_out in instructions:
            if not 0 <= i_in < len(irreps_in):
                raise TensorProductIndexError(f"instructions: {i_in} is not a valid index for irreps_in ({irreps_in})")
            if not 0 <= i_out < len(irreps_out):
                raise TensorProductIndexError(f"instructions: {i_out} is not a valid index for irreps_out "
                                              f"({irreps_out})")
            if irreps_in[i_in].ir != irreps_out[i_out].ir:
                raise TensorProductError(f"instructions: {i_in} and {i_out} do not have the same irrep "
                                         f"({irreps_in[i_in].ir} vs {irreps_out[i_out].ir})")

        def fan_in(i_in, i_out):
            # "element": every input channel feeding this output block; "path": this path's only
            n = sum(irreps_in[i if path_normalization == "element" else i_in].mul
                    for i, o in instructions if o == i_out) * (f_in or 1)
            return 1.0 if n == 0 else n

        self.instructions = [Instruction(i, o, (irreps_in[i].mul, irreps_out[o].mul), fan_in(i, o) ** -0.5)
                             for i, o in instructions]
        if biases is None:
            biases = [False] * len(irreps_out)
        if isinstance(biases, bool):
            biases = [biases and ir.is_scalar() for _, ir in irreps_out]
        if not hasattr(biases, "__iter__"):
            raise TensorProductTypeError(f"biases: expected a bool or one bool per irreps_out entry, got {biases!r}")
        biases = list(biases)
        if len(biases) != len(irreps_out):
            raise TensorProductError(f"biases: expected {len(irreps_out)} booleans (one per irreps_out entry), "
                                     f"got {len(biases)}")
        for b, (_, ir) in zip(biases, irreps_out):
            if b and not ir.is_scalar():
                raise TensorProductError(f"biases: only scalar (0e) outputs can have a bias, not {ir}")
        # e3nn encodes biases as instructions with i_in = -1
        self.instructions += [Instruction(-1, o, (mul_ir.dim,), 1.0)
                              for o, (b, mul_ir) in enumerate(zip(biases, irreps_out)) if b]

        if shared_weights is False and internal_weights is None:
            internal_weights = False
        shared_weights = True if shared_weights is None else shared_weights
        internal_weights = True if internal_weights is None else internal_weights
        if internal_weights and not shared_weights:
            raise TensorProductError("internal_weights=True requires shared_weights=True")
        self.internal_weights, self.shared_weights = bool(internal_weights), bool(shared_weights)
        self.irreps_in, self.irreps_out = irreps_in, irreps_out
        self.f_in, self.f_out, self.layout = f_in, f_out, layout
        self.weight_numel = sum(math.prod(i.path_shape) for i in self.instructions if i.i_in != -1)
        self.bias_numel = sum(math.prod(i.path_shape) for i in self.instructions if i.i_in == -1)
        if self.internal_weights and self.weight_numel > 0:
            self.weight = nn.Parameter(torch.randn(*((f_in, f_out) if f_in is not None else ()), self.weight_numel))
        else:
            self.register_buffer("weight", torch.Tensor())
        if self.internal_weights and self.bias_numel > 0:
            self.bias = nn.Parameter(torch.zeros(*((f_out,) if f_out is not None else ()), self.bias_numel))
        else:
            self.register_buffer("bias", torch.Tensor())
        if irreps_out.dim > 0:
            reached = {i.i_out for i in self.instructions if 0 not in i.path_shape}
            output_mask = torch.cat([(torch.ones if o in reached else torch.zeros)(mul_ir.dim)
                                     for o, mul_ir in enumerate(irreps_out)])
        else:
            output_mask = torch.ones(0)
        self.register_buffer("output_mask", output_mask)
        self._set_weight_index_slices()
        self._derived()

    def _set_weight_index_slices(self) -> None:
        """e3nn's ``weight_index_slices`` (newer e3nn versions define it): per instruction, its slice of
        the flat weights and its 2D shape, offsets counted over every instruction as e3nn counts them."""
        slices = getattr(_e3nn_linear, "LinearSlices", None)
        if slices is None:
            return
        self.weight_index_slices, offset = [], 0
        for ins in self.instructions:
            n = math.prod(ins.path_shape)
            self.weight_index_slices.append(slices(slice(offset, offset + n, None), ins.path_shape))
            offset += n

    def _derived(self) -> None:
        """Plain-int forms of the irreps (the hot path, TorchScript): torch.compile cannot guard on
        e3nn Irreps objects, TorchScript cannot read them."""
        self._ts_recs, self._ts_alphas, self._ts_biases, self._ts_blocks = linear_script_data(self)
        self._ts_f = [self.f_in or 0, self.f_out or 0, self.irreps_in.dim]  # (0: no f axes)
        self._in_dims = [mul_ir.dim for mul_ir in self.irreps_in]
        self._in_blocks = [(mul, ir.dim) for mul, ir in self.irreps_in]
        self._out_blocks = [(mul, ir.dim) for mul, ir in self.irreps_out]
        self._in_dim, self._out_dim = self.irreps_in.dim, self.irreps_out.dim
        self._fast_plan()

    def __getstate__(self):
        return state_without(self, _CACHES)

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        if any(k not in self.__dict__ for k in ("_ts_f", "_in_blocks", "_out_blocks", "_in_dim")):  # older pickle
            self.__dict__.setdefault("_optimize_einsums", None)
            self._derived()

    def _script_forward(self, features: torch.Tensor, weight: Optional[torch.Tensor],
                        bias: Optional[torch.Tensor]) -> torch.Tensor:
        """The TorchScript form of ``forward`` (plain PyTorch)."""
        f = self._ts_f[0] > 0
        if features.shape[-1] != self._ts_f[2] or (f and features.shape[-2] != self._ts_f[0]):
            raise ValueError(f"features: expected trailing dimension {self._ts_f[2]} (irreps_in), "
                             f"got shape {features.shape}")
        # weights and biases are cast to the features' dtype: integers would truncate them
        if not (features.is_floating_point() or features.is_complex()):
            raise TypeError("features: expected a floating-point tensor, got an integer or bool tensor")
        w = self.weight if weight is None else weight
        b = self.bias if bias is None else bias
        if (weight is None and self.weight_numel > 0 or bias is None and self.bias_numel > 0) \
                and not self.internal_weights:
            raise ValueError("weight/bias: required, this Linear has internal_weights=False")
        return script_linear(features, w.to(features.dtype), b.to(features.dtype), self.shared_weights, f,
                             self._ts_recs, self._ts_alphas, self._ts_biases, self._ts_blocks, self._ts_f[1],
                             self.layout == "ir_mul")

    def __repr__(self) -> str:
        lay = "" if self.layout == "mul_ir" else f", layout={self.layout}"
        return f"{self.__class__.__name__}({self.irreps_in} -> {self.irreps_out} | {self.weight_numel} weights{lay})"

    def _param(self, name: str, value, numel: int, tail: Tuple[int, ...], x: torch.Tensor) -> Optional[torch.Tensor]:
        """Resolve and check ``weight``/``bias``; returns it with batch dims first (or None if empty)."""
        if value is None:
            if numel > 0 and not self.internal_weights:
                want = tail if self.shared_weights else "(..., " + ", ".join(map(str, tail)) + ")"
                raise ValueError(f"{name}: required, this Linear has internal_weights=False (expected shape {want})")
            value = getattr(self, name)
        if numel == 0:
            return None
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
        if value.dtype != x.dtype:
            # float16/bfloat16/float32 mix (e.g. float32 parameters, half features): computed in the
            # features' dtype, as torch.nn.Linear does under autocast; float64 mixes nothing
            if torch.float64 in (value.dtype, x.dtype) or not value.is_floating_point():
                raise TypeError(f"{name}: dtype {value.dtype} does not match features ({x.dtype})")
            if not autocast_on(x.device.type):
                value = value.to(x.dtype)
        if value.device != x.device:
            raise ValueError(f"{name}: device {value.device} does not match features ({x.device})")
        ok = value.shape == tail if self.shared_weights else value.shape[value.dim() - len(tail):] == tail
        if not ok:
            want = tail if self.shared_weights else "(...,) + " + str(tail)
            raise ValueError(f"{name}: expected shape {want}, got {tuple(value.shape)}")
        return value

    def weight_view_for_instruction(self, instruction: int, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        """View of the weights of one (non-bias) instruction, ``batch + (f_in, f_out,) + (mul_in, mul_out)``."""
        ins = self.instructions[instruction]
        if ins.i_in == -1:
            raise ValueError(f"instruction: {instruction} is a bias, it has no weights")
        if weight is None:
            if not self.internal_weights:
                raise MissingWeightError("weight: required, this Linear has internal_weights=False")
            weight = self.weight
        offset = sum(math.prod(i.path_shape) for i in self.instructions[:instruction] if i.i_in != -1)
        return weight.narrow(-1, offset, math.prod(ins.path_shape)).view(weight.shape[:-1] + ins.path_shape)

    def weight_views(self, weight: Optional[torch.Tensor] = None, yield_instruction: bool = False):
        """Per-instruction views ``batch + (f_in, f_out,) + (mul_in, mul_out)`` of the (non-bias) weights."""
        weight = self.weight if weight is None else weight
        offset = 0
        for k, ins in enumerate(self.instructions):
            if ins.i_in == -1:
                continue
            n = math.prod(ins.path_shape)
            view = weight.narrow(-1, offset, n).view(weight.shape[:-1] + ins.path_shape)
            offset += n
            yield (k, ins, view) if yield_instruction else view

    # --- fast path: internal shared weights, no bias, no f axes, same dtype, no autocast --------
    def _fast_plan(self):
        """Per output block, its (input block, mul_in, ir dim, weight offset, mul_out) terms; None when
        the general path is needed (biases, f axes, unreached or empty blocks). Built once."""
        plan = self.__dict__.get("_plan", False)
        if plan is not False:
            return plan
        plan = None
        ok = (self.f_in is None and self.internal_weights and self.shared_weights and self.bias_numel == 0
              and self.weight_numel > 0 and all(m > 0 for m, _ in self.irreps_in)
              and all(m > 0 for m, _ in self.irreps_out))
        if ok:
            blocks = [[] for _ in self.irreps_out]
            alpha, w_off = [], 0
            for ins in self.instructions:
                (mi, ir), mo = self.irreps_in[ins.i_in], self.irreps_out[ins.i_out].mul
                blocks[ins.i_out].append((ins.i_in, mi, ir.dim, w_off, mo))  # input block index
                alpha.append(torch.full((mi * mo,), ins.path_weight, dtype=torch.float64))
                w_off += mi * mo
            if all(blocks):
                plan = (blocks, {"cpu64": torch.cat(alpha)})
        self.__dict__["_plan"] = plan
        self.__dict__["_scaled"] = None
        return plan

    def _in_sizes(self) -> List[int]:
        return self._in_dims

    def _scaled_weight(self, alpha: torch.Tensor, dtype: torch.dtype, traced: bool) -> torch.Tensor:
        """weight * path weights in ``dtype`` (the features': float32 masters round to half for
        half features, as autocast would), one op; kept between calls while the weight is frozen
        and unchanged (inference: no per-call work at all), never under a tracer (``traced``)."""
        w = self.weight
        akey = (w.device, w.dtype)
        if akey in alpha:
            alpha = alpha[akey]
        else:  # per device and dtype, so no host->device copy per call; not kept from a trace (a constant there)
            made = alpha["cpu64"].to(device=w.device, dtype=w.dtype)
            if not traced:
                alpha[akey] = made
            alpha = made
        if w.requires_grad or traced or functorch_wrapped(w):
            return (w * alpha).to(dtype)
        key = (frozen_key((w,)), dtype)
        cached = self.__dict__.get("_scaled")
        if cached is None or cached[0] != key:
            cached = (key, (w * alpha).to(dtype), held((w,)))
            self.__dict__["_scaled"] = cached
        return cached[1]

    def _dense_index(self, plan):
        """(flat positions in the [dim_in, dim_out] matrix, weight index) of every weight, each position
        written once; None when two weights share a position (repeated instructions)."""
        cached = self.__dict__.get("_dense_idx", False)
        if cached is not False:
            return cached
        blocks, _ = plan
        ir_mul = self.layout == "ir_mul"
        in_off = [0, *itertools.accumulate(self._in_dims)]
        dout = self.irreps_out.dim
        flats, srcs, o_off = [], [], 0
        for k, terms in enumerate(blocks):
            mo_blk, ir_o = self.irreps_out[k]
            for start, mi, d, w_off, mo in terms:
                u = torch.arange(mi).view(mi, 1, 1)
                v = torch.arange(mo).view(1, mo, 1)
                c = torch.arange(d).view(1, 1, d)
                row = in_off[start] + (c * mi + u if ir_mul else u * d + c)
                col = o_off + (c * mo + v if ir_mul else v * d + c)
                flats.append((row * dout + col).reshape(-1))
                srcs.append((w_off + u * mo + v + 0 * c).reshape(-1))
            o_off += mo_blk * ir_o.dim
        flat, src = torch.cat(flats), torch.cat(srcs)
        idx = (flat, src) if torch.unique(flat).numel() == flat.numel() else None
        self.__dict__["_dense_idx"] = idx
        return idx

    def _dense_weight(self, alpha, dtype: torch.dtype, idx) -> torch.Tensor:
        """[dim_in, dim_out] in ``dtype``: the weights times their path weights at their places, zeros
        elsewhere. A frozen weight's matrix is kept between calls; a trained one's is one op (the
        zero-padded weights gathered to every place, times the path weights there). Not under a tracer."""
        w = self.weight
        din, dout = self.irreps_in.dim, self.irreps_out.dim
        if w.requires_grad or functorch_wrapped(w):
            key = (w.device, w.dtype)
            gather = self.__dict__.setdefault("_dense_gather", {})
            if key not in gather:
                flat, src = idx
                place = torch.full((din * dout,), w.numel(), dtype=torch.long)
                place[flat] = src
                scale = torch.zeros(din * dout, dtype=torch.float64)
                scale[flat] = alpha["cpu64"].reshape(-1)[src]
                gather[key] = (place.to(w.device), scale.to(device=w.device, dtype=w.dtype))
            place, scale = gather[key]
            return spread(w, place, scale, (din, dout)).to(dtype)  # one autograd node, its backward one too
        ws = self._scaled_weight(alpha, dtype, False)
        cached = self.__dict__.get("_dense_w")
        if cached is not None and cached[0] is ws and cached[2] == version(ws):
            return cached[1]
        dev = self.__dict__.setdefault("_dense_dev", {})
        if ws.device not in dev:
            dev[ws.device] = (idx[0].to(ws.device), idx[1].to(ws.device))
        flat, src = dev[ws.device]
        dense = ws.new_zeros(din * dout).index_copy(0, flat, ws.index_select(0, src)).view(din, dout)
        self.__dict__["_dense_w"] = (ws, dense, version(ws))  # holds ws: its identity stays unique
        return dense

    def _block_terms(self, plan, w: torch.Tensor):
        """(per-instruction [mul_in, mul_out] views of ``w``, the terms of ``block_linear``)."""
        cached = self.__dict__.get("_terms")
        if cached is None:
            blocks, _ = plan
            in_off = [0, *itertools.accumulate(self._in_dims)]
            terms, views, o_off = [], [], 0
            for k, entries in enumerate(blocks):
                for start, mi, d, w_off, mo in entries:
                    terms.append((in_off[start], mi, d, o_off, mo, len(views)))
                    views.append((w_off, mi, mo))
                mo_blk, ir_o = self.irreps_out[k]
                o_off += mo_blk * ir_o.dim
            cached = self.__dict__["_terms"] = (tuple(terms), tuple(views))
        terms, views = cached
        return [w.narrow(0, off, mi * mo).view(mi, mo) for off, mi, mo in views], terms

    def _fast(self, features: torch.Tensor, plan) -> torch.Tensor:
        """One matmul per instruction on a strided view of the block (no einsum, no per-call checks);
        on small CUDA inputs one matmul with the dense weight."""
        blocks, alpha = plan
        lead = features.shape[:-1]
        x = features.reshape(-1, features.shape[-1])
        n = x.shape[0]
        traced = tracing()  # (the dense and block forms keep per-device tensors; a tracer takes the plain one)
        if (features.device.type in DENSE_DEVICES and not traced
                and n * x.shape[1] * self._out_dim <= DENSE_MAX_MACS):
            idx = self._dense_index(plan)
            if idx is not None:
                out = torch.mm(x, self._dense_weight(alpha, features.dtype, idx))
                return out.view(lead + (out.shape[-1],))
        w = self._scaled_weight(alpha, features.dtype, traced)
        ir_mul = self.layout == "ir_mul"
        if (ir_mul and not w.requires_grad and features.device.type in BLOCK_DEVICES
                and not traced and not functorch_wrapped(features)
                and not functorch_wrapped(w)):
            weights, terms = self._block_terms(plan, w)
            out = block_linear(x, weights, terms, self.irreps_out.dim)
            return out.view(lead + (out.shape[-1],))
        # one split (its backward is one cat) rather than a narrow per block (each a zero-filled slice backward)
        parts = x.split(self._in_sizes(), dim=1)
        recipes = _Recipes.for_call(w, features)
        if recipes is None and len(parts) > 1 and w.requires_grad and torch.is_grad_enabled():
            # the matmuls of the l > 0 blocks save copies of them for the weight gradient; a saved view
            # of a scalar block would keep all of ``features`` alive besides, so scalars are copied too
            dims = {start: d for terms in blocks for start, _, d, _, _ in terms}
            if any(d > 1 for d in dims.values()):
                parts = [p.contiguous() if dims.get(k) == 1 else p for k, p in enumerate(parts)]
        outs = []
        with recipes if recipes is not None else contextlib.nullcontext():
            for terms in blocks:
                acc = None
                for start, mi, d, w_off, mo in terms:
                    ws = w.narrow(0, w_off, mi * mo).view(mi, mo)
                    xs = parts[start]
                    if d == 1:
                        y = torch.mm(xs, ws)
                        acc = y if acc is None else acc + y
                        continue
                    rows = rows_by_component(xs, n, d, mi, ir_mul)  # a copy unless the block is ir_mul-contiguous
                    if recipes is not None and rows._base is None:  # a view of the input costs nothing to keep
                        recipes.add(rows, functools.partial(rows_by_component, xs, n, d, mi, ir_mul))
                    if ir_mul:  # [N*d, mi] @ [mi, mo]: one copy of the strided block, then one matrix product
                        y = torch.mm(rows, ws).view(n, d * mo)
                    else:  # [N, mi, d] -> [N*d, mi] @ W -> [N, d, mo] -> [N, mo, d]
                        y = torch.mm(rows, ws).view(n, d, mo).transpose(1, 2).reshape(n, mo * d)
                    acc = y if acc is None else acc + y
                outs.append(acc)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        return out.view(lead + (out.shape[-1],))

    @outside_inference_mode
    def forward(self, features: torch.Tensor, weight: Optional[torch.Tensor] = None,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``features`` [..., (f_in,) irreps_in.dim] -> [..., (f_out,) irreps_out.dim]."""
        if torch.jit.is_scripting():
            return self._script_forward(features, weight, bias)
        return self._forward(features, weight, bias)

    @torch.jit.unused
    def _forward(self, features: torch.Tensor, weight: Optional[torch.Tensor],
                 bias: Optional[torch.Tensor]) -> torch.Tensor:
        if weight is None and bias is None and isinstance(features, torch.Tensor):
            plan = self._fast_plan()
            if (plan is not None and features.dim() >= 1 and features.shape[-1] == self._ts_f[2]
                    and (features.dtype == self.weight.dtype
                         or (features.dtype in (torch.float16, torch.bfloat16) and self.weight.dtype == torch.float32))
                    and features.device == self.weight.device
                    and not autocast_on(features.device.type)
                    and not torch.jit.is_tracing()):  # (its caches would enter a trace as constants)
                return self._fast(features, plan)
        if not isinstance(features, torch.Tensor):
            raise TypeError(f"features: expected a torch.Tensor, got {type(features).__name__}")
        if not features.is_floating_point():
            raise TypeError(f"features: expected a floating-point tensor, got {features.dtype}")
        f = self.f_in is not None
        want = ((self.f_in,) if f else ()) + (self._in_dim,)
        if features.dim() < len(want) or tuple(features.shape[-len(want):]) != want:
            raise ValueError(f"features: expected trailing shape {want} (irreps_in={self.irreps_in}"
                             f"{', f_in' if f else ''}), got {tuple(features.shape)}")
        ftail = (self.f_in, self.f_out) if f else ()
        w = self._param("weight", weight, self.weight_numel, ftail + (self.weight_numel,), features)
        b = self._param("bias", bias, self.bias_numel, ((self.f_out,) if f else ()) + (self.bias_numel,), features)

        lead = features.shape[:features.dim() - len(want)]  # batch dims
        for t, n in ((w, len(ftail) + 1), (b, int(f) + 1)):
            if t is not None and not self.shared_weights:
                try:
                    lead = torch.broadcast_shapes(lead, t.shape[:t.dim() - n])
                except RuntimeError:
                    raise ValueError(f"weight/bias: batch dimensions {tuple(t.shape[:t.dim() - n])} do not "
                                     f"broadcast with features {tuple(features.shape[:features.dim() - len(want)])}"
                                     ) from None
        out_lead = lead + ((self.f_out,) if f else ())

        ir_mul = self.layout == "ir_mul"
        # einsum over one block: u/w input/output channels, i irrep component, x/y the f axes
        fx, fy = ("x", "y") if f else ("", "")
        eq = (f"...{fx}iu,...{fx}{fy}uw->...{fy}iw" if ir_mul else f"...{fx}ui,...{fx}{fy}uw->...{fy}wi")
        # plain ints, not e3nn Irreps (which torch.compile cannot guard on)
        starts = [0, *itertools.accumulate(self._in_dims)]
        blocks = [[] for _ in self._out_blocks]
        w_off = b_off = 0
        for ins in self.instructions:
            n = math.prod(ins.path_shape)
            if ins.i_in == -1:
                blocks[ins.i_out].append(b.narrow(-1, b_off, n))  # scalars: both layouts agree
                b_off += n
                continue
            (mi, d), mo = self._in_blocks[ins.i_in], self._out_blocks[ins.i_out][0]
            if n == 0:
                continue
            ws = w.narrow(-1, w_off, n).reshape(w.shape[:-1] + (mi, mo))
            w_off += n
            xs = features.narrow(-1, starts[ins.i_in], mi * d)
            xs = xs.reshape(xs.shape[:-1] + ((d, mi) if ir_mul else (mi, d)))
            y = torch.einsum(eq, xs, ws)
            blocks[ins.i_out].append(ins.path_weight * y.reshape(y.shape[:-2] + (mo * d,)))
        outs = []
        for o, (mo, d) in enumerate(self._out_blocks):
            if mo * d == 0:
                continue
            parts = blocks[o]
            if not parts:
                outs.append(features.new_zeros(out_lead + (mo * d,)))
                continue
            acc = parts[0]
            for p in parts[1:]:
                acc = acc + p
            outs.append(acc.expand(out_lead + (mo * d,)))
        if not outs:
            return features.new_zeros(out_lead + (0,))
        return torch.cat(outs, dim=-1)
