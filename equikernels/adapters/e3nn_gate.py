"""e3nn's ``nn.Gate`` in a few operations.

e3nn's Gate extracts its three input groups into fresh zero tensors with one in-place copy per irreps
block, multiplies the gated irreps by their gates through an ``ElementwiseTensorProduct`` and
concatenates: each copy and product is its own autograd node. Here the input is one ``split`` at
every group boundary, each group its piece (or its pieces concatenated), each gate is broadcast
over its irrep's components by one index, and the gated block is one multiplication; the
activations are the module's own ``Activation`` submodules (their functions and normalisation
constants), their blocks split the same way. A split's backward is one concatenation, where a
slice's is a zero-filled copy of the whole input, added to the others. Same submodules, no
parameters; the fused forward is checked against e3nn's on a random input when the adapter runs.
"""
from __future__ import annotations

from typing import List, Tuple

import torch
from torch import nn

from .._compat import e3nn  # noqa: F401  (safe e3nn import first)
from ..nn.frozen import make_fx_tracing, tracing
from .classes import accelerated_class, original_class, register_overrides
from .registry import Adapter, NotFused, register

GATE = "e3nn_gate"
Slices = List[Tuple[int, int]]


def _group_slices(extract) -> List[Slices]:
    """Per output group of e3nn's ``Extract``, the (start, length) input slices in output order, merged
    where adjacent."""
    irreps_in = extract.irreps_in
    starts = [irreps_in[:i].dim for i in range(len(irreps_in))]
    groups = []
    for ins in extract.instructions:
        slices: Slices = []
        for i in ins:
            start, length = starts[i], irreps_in[i].dim
            if slices and slices[-1][0] + slices[-1][1] == start:
                slices[-1] = (slices[-1][0], slices[-1][1] + length)
            else:
                slices.append((start, length))
        groups.append(slices)
    return groups


def _expand_index(irreps_gated) -> torch.Tensor:
    """For every column of the gated features (e3nn's mul_ir layout), the index of its gate."""
    idx, g = [], 0
    for mul, ir in irreps_gated:
        idx.append(torch.arange(g, g + mul).repeat_interleave(ir.dim))
        g += mul
    return torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long)


def _segments(groups: List[Slices], dim: int) -> Tuple[List[int], List[List[int]]]:
    """The input cut at every slice boundary: (segment sizes covering [0, dim), per group the indices
    of its segments in order)."""
    cuts = sorted({0, dim} | {b for slices in groups for s, n in slices for b in (s, s + n)})
    index = {start: k for k, start in enumerate(cuts[:-1])}
    sizes = [b - a for a, b in zip(cuts[:-1], cuts[1:])]
    members = []
    for slices in groups:
        ids = []
        for s, n in slices:
            k = index[s]
            while cuts[k] < s + n:
                ids.append(k)
                k += 1
        members.append(ids)
    return sizes, members


def _block_sizes(activation: nn.Module) -> List[int]:
    """The widths of an ``Activation``'s input blocks (read once: torch.compile cannot guard on e3nn's Irreps)."""
    return [mul * ir.dim for mul, ir in activation.irreps_in]


def _activate(activation: nn.Module, x: torch.Tensor, sizes: List[int]) -> torch.Tensor:
    """e3nn's ``Activation`` of ``x`` [..., irreps_in.dim], its blocks (widths ``sizes``) one ``split`` of ``x``."""
    acts = list(activation.acts)
    if not acts:
        return torch.zeros_like(x)
    if len(acts) == 1:
        return x if acts[0] is None else acts[0](x)
    parts = x.split(sizes, dim=-1)
    return torch.cat([p if a is None else a(p) for a, p in zip(acts, parts)], dim=-1)


class _GatePlan:
    def __init__(self, gate: nn.Module):
        self.scalars, self.gates, self.gated = _group_slices(gate.sc.cut)
        self.dim, self.irreps_in = gate.irreps_in.dim, str(gate.irreps_in)
        self.split = _segments([self.scalars, self.gates, self.gated], self.dim)
        self.expand = _expand_index(gate.irreps_gated)
        self.act_sizes = (_block_sizes(gate.act_scalars), _block_sizes(gate.act_gates))
        self._on = {}

    def expand_on(self, device: torch.device) -> torch.Tensor:
        if tracing():  # a trace records the copy only when the cache is empty: both check runs must record it
            return self.expand.to(device)
        t = self._on.get(device)
        if t is None:
            t = self._on[device] = self.expand.to(device)
        return t


def _plan(gate: nn.Module) -> _GatePlan:
    plan = gate.__dict__.get("_ek_gate")
    if plan is None or not all(hasattr(plan, a) for a in ("split", "act_sizes", "dim")):  # unpickled, or by an earlier version
        plan = gate.__dict__["_ek_gate"] = _GatePlan(gate)
    return plan


def _fused(gate: nn.Module, features: torch.Tensor) -> torch.Tensor:
    plan = _plan(gate)
    sizes, members = plan.split
    if not torch.jit.is_tracing() and (features.dim() == 0 or features.shape[-1] != plan.dim):
        raise ValueError(f"features: expected last dimension {plan.dim} (irreps_in={plan.irreps_in}), "
                         f"got shape {tuple(features.shape)}")
    parts = features.split(sizes, dim=-1)
    scalars, gates, gated = (parts[ids[0]] if len(ids) == 1 else
                             torch.cat([parts[k] for k in ids], dim=-1) if ids else features.narrow(-1, 0, 0)
                             for ids in members)
    scalars = _activate(gate.act_scalars, scalars, plan.act_sizes[0])
    if not plan.gates:
        return scalars
    gates = _activate(gate.act_gates, gates, plan.act_sizes[1])
    gated = gated * gates.index_select(-1, plan.expand_on(features.device))
    return torch.cat([scalars, gated], dim=-1)


def _overrides(cls: type) -> dict:
    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():  # TorchScript compiles e3nn's own forward
            return self._ek_script_forward(features)
        if make_fx_tracing():  # nequip's compilation (make_fx, decomposed) got wrong forces from the split form
            return self._ek_script_forward(features)
        return _fused(self, features)

    def restore(gate: nn.Module) -> None:
        # built here rather than on the next call, which may be traced by torch.compile (it cannot
        # read e3nn's Irreps)
        gate.__dict__["_ek_gate"] = _GatePlan(gate)

    forward.__doc__ = "e3nn's Gate: the same values, extracted by slices and gated by one multiplication."
    return {"forward": forward, "_ek_restore": restore}


register_overrides(GATE, _overrides)


def _e3nn_gate(cls: type):
    """e3nn's Gate class among ``cls``'s bases (itself included), or None."""
    return next((c for c in cls.__mro__ if c.__name__ == "Gate" and c.__module__.startswith("e3nn.nn")), None)


def _matches(module: nn.Module) -> bool:
    return _e3nn_gate(original_class(module)) is not None


def _check(gate: nn.Module) -> str:
    """Why the fused forward cannot stand in for ``gate``'s (its values are compared when it is applied), or ""."""
    if type(gate).forward is not _e3nn_gate(type(gate)).forward:
        return f"{type(gate).__name__} overrides forward(); its semantics are unknown"
    return ""


def _apply(gate: nn.Module) -> str:
    if getattr(type(gate), "_ek_adapter", None) == GATE:
        return ""
    base = _e3nn_gate(type(gate))
    why = _check(gate)
    if why:
        raise NotFused(why)
    try:
        gate.__dict__["_ek_gate"] = _GatePlan(gate)
        dim = gate.irreps_in.dim
    except (AttributeError, TypeError, ValueError) as exc:
        raise NotFused(f"not e3nn's Gate structure ({exc})") from None
    x = torch.randn(3, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    held = next(iter(list(gate.parameters()) + list(gate.buffers())), None)
    x = x.to(held.device if held is not None else torch.device("cpu"))
    try:
        with torch.no_grad():
            want, got = base.forward(gate, x), _fused(gate, x)
    except Exception as exc:  # noqa: BLE001 - any failure means: leave e3nn's forward
        del gate.__dict__["_ek_gate"]
        raise NotFused(f"the fused gate could not run ({type(exc).__name__}: {exc})") from None
    if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-10, atol=1e-12):
        del gate.__dict__["_ek_gate"]
        raise NotFused("the fused gate does not reproduce e3nn's values for this gate")
    gate.__class__ = accelerated_class(GATE, type(gate))
    return (f"gate {gate.irreps_in} -> {gate.irreps_out}: slices and one gating multiplication "
            "instead of extraction copies and a tensor product")


register(Adapter(GATE, _matches, _apply, check=_check))
