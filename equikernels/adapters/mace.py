"""mace-torch: interaction blocks and the symmetric contraction.

Interaction blocks: mace-torch's own fusion hook is used. Every interaction block calls
``conv_tp(node_feats, edge_attrs, tp_weights, edge_index)`` (gather from ``edge_index[0]``,
scatter-sum onto ``edge_index[1]``, ``node_feats.shape[0]`` rows) when it has a ``conv_fusion``
attribute; the block gets that attribute and its (converted) ``conv_tp`` answers the four-argument
call with the fused convolution. The blocks' own code, normalisation included, runs unchanged.

``SymmetricContraction``: its ``forward(x [N, channels, d], node_attrs [N, elements])`` runs the
path table of ``equikernels.models.symmetric_contraction`` built from the module's own U buffers,
with per-node weights ``node_attrs @ W`` (exactly mace-torch's ``ekc,be`` contraction) from the
module's own parameters: selected by element for one-hot attributes, multiplied otherwise.

Element-indexed skip products (``skip_tp``, node features times one-hot node attributes): as
``ElementLinear`` on the same weight (``element_indexed``).
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch
from torch import nn

from ..models.cpu_contraction import MonomialContraction
from ..models.symmetric_contraction import contraction_op, contraction_table
from ..nn.frozen import frozen_key, held
from ..ops.table_chain import TableOp
from ..ops.tp import resolve_backend
from .classes import accelerated_class, original_class, register_overrides
from .fused import fusable_tp, message_passing
from .element_indexed import element_linear_apply, one_hot_groups
from .registry import Adapter, NotFused, register

CONV, CONTRACTION = "mace", "mace_contraction"


# --- interaction blocks -------------------------------------------------------------------------
def _conv_overrides(cls: type) -> dict:
    def forward(self, x: torch.Tensor, y: torch.Tensor, weight: Optional[torch.Tensor] = None,
                edge_index: Optional[torch.Tensor] = None) -> torch.Tensor:
        if torch.jit.is_scripting():  # TorchScript: the product's own forward, gathered and summed
            if edge_index is None:
                return self._ek_script_forward(x, y, weight)
            msg = self._ek_script_forward(x.index_select(0, edge_index[0]), y, weight)
            return msg.new_zeros(x.shape[0], msg.shape[1]).index_add(0, edge_index[1], msg)
        if edge_index is None:
            return cls.forward(self, x, y, weight)
        return message_passing(self, x, y, weight, edge_index[0], edge_index[1], x.shape[0])

    forward.__doc__ = ("``forward(x, y, weight)`` as before; ``forward(node_feats, edge_attrs, weights, edge_index)``"
                       " (mace-torch's conv_fusion call): the fused convolution.")
    return {"forward": forward}


register_overrides(CONV, _conv_overrides)


def _is_mace(module: nn.Module, name: str) -> bool:
    return any(c.__module__.startswith("mace.modules") and c.__name__ == name for c in type(module).__mro__)


def _interaction_matches(module: nn.Module) -> bool:
    return _is_mace(module, "InteractionBlock") and hasattr(module, "conv_tp")


def _interaction_apply(block: nn.Module) -> str:
    tp = block.conv_tp
    if getattr(block, "conv_fusion", None) == CONV and getattr(type(tp), "_ek_adapter", None) == CONV:
        return ""  # done by an earlier call
    if hasattr(block, "conv_fusion"):
        raise NotFused(f"already fused by mace-torch (conv_fusion={block.conv_fusion!r})")
    if "conv_fusion" not in inspect.getsource(original_class(block).forward):
        raise NotFused("this mace-torch version's forward has no conv_fusion call")
    why = fusable_tp(tp)
    if why:
        raise NotFused(why)
    tp.__class__ = accelerated_class(CONV, type(tp))
    block.conv_fusion = CONV
    return "conv_tp gather -> tensor product -> scatter-sum fused into tensor_product_conv (conv_fusion)"


register(Adapter(CONV, _interaction_matches, _interaction_apply))


# --- symmetric contraction ----------------------------------------------------------------------
def _weights(contraction) -> list:
    """mace-torch's parameters in degree order nu = 1..correlation (it stores them highest first)."""
    corr = contraction.correlation
    return [contraction.weights_max if nu == corr else contraction.weights[corr - 1 - nu]
            for nu in range(1, corr + 1)]


def _u_tensors(c, nu: int) -> torch.Tensor:
    """mace-torch's ``U_tensors(nu)`` without building a dict of every buffer per call (host time)."""
    u = c._buffers.get(f"U_matrix_{nu}")
    return u if u is not None else c.U_tensors(nu)


def _op(sc) -> TableOp:
    """The path table of ``sc``, rebuilt when its U buffers change (load_state_dict, .to())."""
    us = [[_u_tensors(c, nu) for nu in range(1, c.correlation + 1)] for c in sc.contractions]
    flat = [u for per in us for u in per]
    key = frozen_key(flat)
    cached = sc.__dict__.get("_ek_op")
    if cached is None or cached[0] != key:
        channels = sc.contractions[0].num_features
        table, _ = contraction_table(channels, [ir.l for _, ir in sc.irreps_in], [ir.l for _, ir in sc.irreps_out], us)
        cached = sc.__dict__["_ek_op"] = (key, contraction_op(table, "ir_mul"), held(flat))
    return cached[1]


def _weight_table(sc) -> torch.Tensor:
    """[elements, K * channels]: every contraction's weights side by side; kept between calls while
    no weight requires a gradient and none has changed."""
    params = [w for c in sc.contractions for w in _weights(c)]
    if any(p.requires_grad for p in params) or torch.compiler.is_compiling():
        return torch.cat([w.reshape(w.shape[0], -1) for w in params], dim=1)
    key = frozen_key(params)
    cached = sc.__dict__.get("_ek_table")
    if cached is None or cached[0] != key:
        cached = sc.__dict__["_ek_table"] = (key, torch.cat([w.reshape(w.shape[0], -1) for w in params], dim=1),
                                             held(params))
    return cached[1]


def _mono(sc) -> MonomialContraction:
    """The CPU evaluation of ``sc``, rebuilt with its path table (U buffers changed)."""
    op = _op(sc)
    cached = sc.__dict__.get("_ek_mono")
    if cached is None or cached[0] is not op:
        us = [[_u_tensors(c, nu) for nu in range(1, c.correlation + 1)] for c in sc.contractions]
        mono = MonomialContraction(sc.contractions[0].num_features, [ir.l for _, ir in sc.irreps_in],
                                   [ir.l for _, ir in sc.irreps_out], us)
        cached = sc.__dict__["_ek_mono"] = (op, mono)
    return cached[1]


def _contraction_overrides(cls: type) -> dict:
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():  # TorchScript compiles mace-torch's own forward
            return self._ek_script_forward(x, y)
        n, channels = x.shape[0], x.shape[1]
        table = _weight_table(self)
        groups = one_hot_groups(y, table.shape[0])
        if groups is not None:  # one-hot: W[z] of each node's element, selected
            w = table.index_select(0, groups.element)
        else:  # [N, elements] @ [elements, K * channels]: mace's W[z] summed over y
            w = y.to(table.dtype) @ table
        xt = x.transpose(1, 2).reshape(n, -1)  # ir_mul in and out
        if resolve_backend(None, x.device) == "cpu":  # no kernels: the monomial-basis evaluation
            sizes = [sum(p.shape[1] for p in _weights(c)) * channels for c in self.contractions]
            ws = [part.view(n, -1, channels).transpose(0, 1) for part in w.split(sizes, dim=1)]
            out = _mono(self)(xt, ws, "ir_mul")
        else:
            out = _op(self)({"x": xt, "w": w})
        blocks, off = [], 0
        for _, ir in self.irreps_out:  # back to mace's [N, channels * (2l + 1)] per output irrep
            d = ir.dim
            blocks.append(out[:, off:off + channels * d].reshape(n, d, channels).transpose(1, 2).reshape(n, -1))
            off += channels * d
        return torch.cat(blocks, dim=-1)

    forward.__signature__ = inspect.signature(cls.forward)
    return {"forward": forward}


register_overrides(CONTRACTION, _contraction_overrides)


def _contraction_matches(module: nn.Module) -> bool:
    return _is_mace(module, "SymmetricContraction") and hasattr(module, "contractions")


def _contraction_apply(sc: nn.Module) -> str:
    if getattr(type(sc), "_ek_adapter", None) == CONTRACTION:
        return ""
    contractions = list(sc.contractions)
    channels = contractions[0].num_features
    if any(mul != channels for mul, _ in sc.irreps_in):
        raise NotFused(f"input irreps {sc.irreps_in} have unequal multiplicities")
    if len(contractions) != len(sc.irreps_out) or any(mul != channels for mul, _ in sc.irreps_out):
        raise NotFused(f"expected one contraction per output irrep, {channels} channels each, got {sc.irreps_out}")
    for c in contractions:
        if not getattr(c, "internal_weights", True) or any(
                bool(b) for name, b in c.named_buffers() if name.endswith("_zeroed")):
            raise NotFused("a contraction has external or structurally zero weights")
    _op(sc)  # builds the table now: an unsupported U fails here, not in the first forward
    sc.__class__ = accelerated_class(CONTRACTION, type(sc))
    return f"symmetric contraction ({len(_op(sc).table.paths)} paths) as equikernels path tables"


register(Adapter(CONTRACTION, _contraction_matches, _contraction_apply))


# --- element-indexed skip product ----------------------------------------------------------------
def _skip_matches(block: nn.Module) -> bool:
    return _is_mace(block, "InteractionBlock")


register(Adapter("mace_skip", _skip_matches, element_linear_apply, child="skip_tp"))
