"""Edge lists in reverse-pair order: edge e + E/2 is edge e reversed.

A full neighbour list holds every pair twice, i -> j with shift S and j -> i with -S, and the two
have the same length to the last bit. In reverse-pair order everything that depends only on the
length (radial basis, envelope, radial MLP: the convolution weights) is computed for the first half
and shared with the second. ``data["paired_edges"]`` (a bool tensor; on the CPU, reading it costs no
device sync) declares the order; the model checks it unless its inputs are trusted.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import Tensor

KEY = "paired_edges"
DECLARED = torch.tensor(True)  # the value a producer puts under KEY


def reverse_pair_order(sender: Tensor, receiver: Tensor, unit_shifts: Optional[Tensor], num_nodes: int
                       ) -> Optional[Tensor]:
    """The permutation that puts a full edge list into reverse-pair order, or None when some edge has
    no reverse (not a full list) or the sort key would overflow. One host sync per call."""
    e = sender.numel()
    if e == 0 or e % 2:
        return None
    if unit_shifts is None:
        s = torch.zeros(e, 3, dtype=torch.int64, device=sender.device)
    else:
        s = torch.round(unit_shifts).to(torch.int64)
    smax = int(s.abs().max())
    base = 2 * smax + 1
    if num_nodes * num_nodes * base ** 3 >= 2 ** 62:
        return None
    # the canonical direction: sender < receiver, or a self-image with a lexicographically positive shift
    positive = (s[:, 0] > 0) | ((s[:, 0] == 0) & ((s[:, 1] > 0) | ((s[:, 1] == 0) & (s[:, 2] > 0))))
    fwd = (sender < receiver) | ((sender == receiver) & positive)
    a = torch.where(fwd, sender, receiver).to(torch.int64)
    b = torch.where(fwd, receiver, sender).to(torch.int64)
    c = torch.where(fwd[:, None], s, -s) + smax
    key = (((a * num_nodes + b) * base + c[:, 0]) * base + c[:, 1]) * base + c[:, 2]
    idx_f = torch.nonzero(fwd).squeeze(1)
    idx_b = torch.nonzero(~fwd).squeeze(1)
    if idx_f.numel() != idx_b.numel():
        return None
    kf, of = torch.sort(key[idx_f], stable=True)
    kb, ob = torch.sort(key[idx_b], stable=True)
    if not torch.equal(kf, kb):
        return None
    return torch.cat([idx_f[of], idx_b[ob]])


def is_paired(sender: Tensor, receiver: Tensor, shifts: Tensor) -> bool:
    """Whether edge e + E/2 reverses edge e for every e (one host sync)."""
    e = sender.numel()
    if e % 2:
        return False
    h = e // 2
    ok = (sender[h:] == receiver[:h]).all() & (receiver[h:] == sender[:h]).all() & (shifts[h:] == -shifts[:h]).all()
    return bool(ok)


def declared(data: Dict[str, Tensor]) -> bool:
    flag = data.get(KEY)
    return flag is not None and bool(flag)
