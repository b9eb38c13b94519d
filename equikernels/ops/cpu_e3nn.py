"""The batched tensor product on CPU through e3nn's own ``o3.TensorProduct``.

On CPU e3nn multiplies the inputs out and applies each instruction's CG block as one large matmul,
with autograd (any order) for the gradients; for fully connected products with shared weights that
is faster than the dense per-instruction contractions of ``ops.cpu_tp``. Channel-wise products take
``ops.cpu_grouped`` before this module. For a problem e3nn can
express, one module per (problem, dtype) is built (``internal_weights=False``, the same irreps,
instructions, variances, normalisations and ``shared_weights``, so the flat weight layout is the
same) and called with our operands; the ``ir_mul`` layout is permuted to ``mul_ir`` and back.

``use_e3nn`` is the static rule choosing between the two CPU paths per problem.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import Tensor

from .._compat import default_dtype, o3
from ..problem import TPProblem, irreps_str

E3NN_MODES = ("uvw", "uvu", "uvv", "uuw", "uuu", "uvuv")  # the triangular modes are ours only
# e3nn's class as imported, so that code swapping e3nn.o3.TensorProduct for ours later still gets e3nn's
E3NN_TENSOR_PRODUCT = o3.TensorProduct
DTYPES = (torch.float32, torch.float64)


def expressible(problem: TPProblem) -> bool:
    """Whether ``o3.TensorProduct`` computes this problem (no triangular modes, nothing empty)."""
    # with no non-empty path e3nn returns a constant, not a function of the operands
    return (all(ins.mode in E3NN_MODES for ins in problem.instructions)
            and any(min(problem.irreps_in1[i.i_in1][0], problem.irreps_in2[i.i_in2][0],
                        problem.irreps_out[i.i_out][0]) > 0 for i in problem.instructions))


@functools.lru_cache(maxsize=None)
def use_e3nn(problem: TPProblem) -> bool:
    """The CPU default for this problem: e3nn unless it cannot express it, or every weighted path is
    a fully connected (uvw) path with per-row weights -- there e3nn contracts one small weight
    matrix per row while the dense path batches the rows (diffdock-L2, fwd+bwd: about 2x faster)."""
    if not expressible(problem):
        return False
    weighted = [ins for ins in problem.instructions if ins.has_weight]
    return problem.shared_weights or not weighted or any(ins.mode != "uvw" for ins in weighted)


def applicable(problem: TPProblem, x: Tensor, y: Tensor, w: Tensor, math_dtype: Optional[torch.dtype],
               out_dtype: Optional[torch.dtype]) -> bool:
    """Whether this call can run through e3nn: CPU rows x features, one dtype (float32 or float64)
    for every operand, math and output (e3nn has no mixed precision)."""
    dt = x.dtype
    return (x.device.type == "cpu" and dt in DTYPES and x.dim() == 2 and x.shape[0] > 0
            and y.dtype == dt and (w.numel() == 0 or w.dtype == dt) and math_dtype in (None, dt)
            and out_dtype in (None, dt) and use_e3nn(problem))


class _E3nnPlan:
    """The e3nn module of one (problem, dtype) and the column permutations of the ir_mul layout."""

    def __init__(self, problem: TPProblem, dtype: torch.dtype):
        with default_dtype(dtype):  # e3nn builds its CG constants in the default dtype
            self.module = E3NN_TENSOR_PRODUCT(
                irreps_str(problem.irreps_in1), irreps_str(problem.irreps_in2), irreps_str(problem.irreps_out),
                [(i.i_in1, i.i_in2, i.i_out, i.mode, i.has_weight, i.path_weight) for i in problem.instructions],
                in1_var=list(problem.in1_var), in2_var=list(problem.in2_var), out_var=list(problem.out_var),
                irrep_normalization=problem.irrep_normalization, path_normalization=problem.path_normalization,
                internal_weights=False, shared_weights=problem.shared_weights)
        # the module's generated graph itself: forward() only re-checks shapes tensor_product checked
        self.main = getattr(self.module, "_compiled_main_left_right", self.module)
        # ir_mul column j of segment (mul, dim) holds (i, u) at i*mul+u; mul_ir holds it at u*dim+i
        self.to_mul_ir = {n: _perm(irr) for n, irr in (("x", problem.irreps_in1), ("y", problem.irreps_in2))}
        self.from_mul_ir = torch.argsort(_perm(problem.irreps_out))

    def __call__(self, x: Tensor, y: Tensor, w: Tensor, layout: str) -> Tensor:
        if layout == "ir_mul":
            x = x.index_select(1, self.to_mul_ir["x"])
            y = y.index_select(1, self.to_mul_ir["y"])
        out = self.main(x, y, w)
        return out.index_select(1, self.from_mul_ir) if layout == "ir_mul" else out


def _perm(irreps) -> Tensor:
    """Index p with mul_ir = ir_mul[:, p]."""
    idx, off = [], 0
    for mul, l, _ in irreps:
        d = 2 * l + 1
        idx += [off + i * mul + u for u in range(mul) for i in range(d)]
        off += mul * d
    return torch.tensor(idx, dtype=torch.long)


@functools.lru_cache(maxsize=None)
def e3nn_plan(problem: TPProblem, dtype: torch.dtype) -> _E3nnPlan:
    return _E3nnPlan(problem, dtype)


def forward(problem: TPProblem, layout: str, x: Tensor, y: Tensor, w: Tensor) -> Tensor:
    """[rows, dim_out] in x's dtype, differentiable to any order by autograd (``applicable`` holds)."""
    return e3nn_plan(problem, x.dtype)(x, y, w, layout)
