"""One head of a multi-head MACE as a model of its own (what mace-torch's ``mace_select_head`` writes)."""
from __future__ import annotations

import copy
from typing import Dict, Optional, Sequence

import torch

from .._compat import default_dtype, o3
from .data import head_index
from .blocks import NonLinearReadout
from .mace import MACE


def select_head(model: MACE, head: Optional[str] = None, argument: str = "head") -> MACE:
    """A single-head copy of ``model`` that gives, for every structure, the energy (and so forces and
    stress) the model gives on head ``head``. ``head`` is resolved as everywhere else (an exact name,
    else the one name differing only in letter case; None: the only head or the one called 'default').
    Each readout keeps the head's output channels and, in a non-linear readout, its hidden block; the
    weights are rescaled by the ratio of the layers' path normalisations, so outputs are unchanged.
    E0s, scale and shift keep the head's row. The result is on ``model``'s device, in its dtype.
    Errors are one line starting with ``argument`` (the caller's name for ``head``)."""
    if not isinstance(model, MACE):
        raise TypeError(f"model: expected an equikernels MACE, got {type(model).__name__}")
    heads = list(model.heads)
    h = head_index(head, heads, unknown=argument + ": {head!r} is not one of the model's heads {heads}",
                   missing=argument + ": the model has several heads {heads} and none is called 'default'; "
                                      "name the head to keep")
    n = len(heads)
    config = copy.deepcopy(model.config)
    config["heads"] = [heads[h]]
    config["atomic_energies_shape"] = [int(config["num_elements"])]
    if "scale_shift_shape" in config:
        config["scale_shift_shape"] = []
    for r in config["readouts"]:
        r["irreps_out"] = "1x0e"
        if r["type"] == "nonlinear":
            r["mlp_irreps"] = str(_per_head(r["mlp_irreps"], n))
            r["num_heads"] = 1
    state = {k: v.detach() for k, v in model.state_dict().items()}
    if n > 1:
        state["atomic_energies"] = state["atomic_energies"][h]
        for name in ("scale", "shift"):
            if name in state and state[name].dim() > 0:
                state[name] = state[name][h]
    with default_dtype(state["atomic_energies"].dtype):
        selected = type(model)(config)  # U matrices and weights come with the state dict below
    for i, (old, new) in enumerate(zip(model.readouts, selected.readouts)):
        if isinstance(old, NonLinearReadout):
            hidden = o3.Irreps(new.linear_1.irreps_out).dim
            block = range(h * hidden, (h + 1) * hidden)  # the head's block of the hidden channels
            state.update(_linear_slice(f"readouts.{i}.linear_1", old.linear_1, new.linear_1, None, block))
            state.update(_linear_slice(f"readouts.{i}.linear_2", old.linear_2, new.linear_2, block, [h]))
        else:
            state.update(_linear_slice(f"readouts.{i}.linear", old.linear, new.linear, None, [h]))
    for name, buf in selected.state_dict().items():  # masks of the new output shapes
        if state[name].shape != buf.shape and name.endswith("output_mask"):
            state[name] = buf
    selected.load_state_dict(state, strict=True)
    if "_compute_dtype" in model.__dict__:  # a mixed precision set on the model
        selected.__dict__["_compute_dtype"] = model.__dict__["_compute_dtype"]
    return selected.to(state["atomic_energies"].device).train(model.training)


def _per_head(irreps: str, n: int) -> "o3.Irreps":
    out = []
    for mul, ir in o3.Irreps(irreps):
        if mul % n:
            raise ValueError(f"readout mlp_irreps {irreps}: {mul}x{ir} is not split evenly over {n} heads")
        out.append((mul // n, ir))
    return o3.Irreps(out)


def _linear_slice(prefix: str, old, new, keep_in: Optional[Sequence[int]], keep_out: Sequence[int]
                  ) -> Dict[str, torch.Tensor]:
    """``new``'s weight and bias from ``old``'s: input channels ``keep_in`` (None: all) and output
    channels ``keep_out`` of every path, rescaled so that the products equal ``old``'s on them."""
    if len(old.irreps_out) != 1 or (keep_in is not None and len(old.irreps_in) != 1):
        raise ValueError(f"{prefix}: a readout over one output irrep was expected, got {old.irreps_in} -> "
                         f"{old.irreps_out}")
    w_old, b_old = old.weight.detach(), old.bias.detach()
    weights, biases, off_w, off_b = [], [], 0, 0
    for io, inew in zip(old.instructions, new.instructions):
        if io.i_in == -1:
            size = io.path_shape[0]
            biases.append(b_old[..., off_b:off_b + size][..., list(keep_out)])
            off_b += size
            continue
        m_in, m_out = io.path_shape
        block = w_old[..., off_w:off_w + m_in * m_out].reshape(*w_old.shape[:-1], m_in, m_out)
        off_w += m_in * m_out
        if keep_in is not None:
            block = block[..., list(keep_in), :]
        block = block[..., list(keep_out)] * (io.path_weight / inew.path_weight)
        weights.append(block.reshape(*w_old.shape[:-1], -1))
    out = {f"{prefix}.weight": torch.cat(weights, -1) if weights else w_old[..., :0]}
    out[f"{prefix}.bias"] = torch.cat(biases, -1) if biases else b_old[..., :0]
    return out
