"""TorchScript forms of the e3nn-compatible modules (``torch.jit.script(module)`` runs these).

They are plain PyTorch (one einsum per instruction with e3nn's Wigner-3j blocks), the reference
semantics without the generated kernels: TorchScript cannot call the Triton or custom-op paths.
``torch.export`` / ``torch.compile`` keep the fast paths.
"""
from __future__ import annotations

from typing import List, Tuple

import torch

from .._compat import o3

# per-instruction integer record of a tensor product, in this order:
# start1, mul1, dim1, start2, mul2, dim2, i_out, w_offset, w3j_offset, has_weight
TPRecord = List[int]


def tp_script_data(tp) -> Tuple[List[TPRecord], List[str], List[float], List[List[int]], torch.Tensor]:
    """(records, modes, path weights, output blocks [mul, dim], flat Wigner-3j blocks) of ``tp``."""
    def starts(irreps):
        out, s = [], 0
        for mul, ir in irreps:
            out.append(s)
            s += mul * ir.dim
        return out

    s1, s2 = starts(tp.irreps_in1), starts(tp.irreps_in2)
    recs, modes, alphas, w3js = [], [], [], []
    w_off = c_off = 0
    for ins in tp.instructions:
        (m1, ir1), (m2, ir2), (_, iro) = (tp.irreps_in1[ins.i_in1], tp.irreps_in2[ins.i_in2],
                                          tp.irreps_out[ins.i_out])
        n_w = 1
        for s in ins.path_shape:
            n_w *= s
        if n_w > 0 and (m1 > 0 and m2 > 0):
            # float64 whatever the default dtype: the form also runs float64 modules built under float32
            c = o3.wigner_3j(ir1.l, ir2.l, iro.l, dtype=torch.float64).reshape(-1)
            recs.append([s1[ins.i_in1], m1, ir1.dim, s2[ins.i_in2], m2, ir2.dim, ins.i_out,
                         w_off, c_off, int(ins.has_weight)])
            modes.append(ins.connection_mode)
            alphas.append(float(ins.path_weight))
            w3js.append(c)
            c_off += c.numel()
        if ins.has_weight:
            w_off += n_w
    blocks = [[mul, ir.dim] for mul, ir in tp.irreps_out]
    flat = torch.cat(w3js) if w3js else torch.zeros(0, dtype=torch.float64)
    return recs, modes, alphas, blocks, flat


def _block(t: torch.Tensor, start: int, mul: int, dim: int, ir_mul: bool) -> torch.Tensor:
    """[rows, mul, dim] view of one irreps block of a [rows, features] tensor."""
    b = t.narrow(1, start, mul * dim)
    if ir_mul:
        return b.reshape(-1, dim, mul).transpose(1, 2)
    return b.reshape(-1, mul, dim)


def script_tensor_product(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, shared: bool,
                          recs: List[List[int]], modes: List[str], alphas: List[float], blocks: List[List[int]],
                          w3j: torch.Tensor, dim_out: int, ir_mul: bool) -> torch.Tensor:
    """TP(x, y, weight) with e3nn's broadcasting: x [..., dim1], y [..., dim2], weight [nw] shared or
    [..., nw] per row (empty when unweighted) -> [..., dim_out]."""
    # zero-width views: the batch shapes broadcast without reading a column (irreps may be empty)
    lead = torch.broadcast_tensors(x.narrow(-1, 0, 0), y.narrow(-1, 0, 0))[0].shape[:-1]
    if not shared and weight.shape[-1] > 0:  # weighted (an empty batch still has nw columns)
        rows_x = x.narrow(-1, 0, 0).expand(list(lead) + [0])
        lead = torch.broadcast_tensors(rows_x, weight.narrow(-1, 0, 0))[0].shape[:-1]
    shape: List[int] = list(lead)
    rows = 1
    for s in shape:
        rows *= s
    x2 = x.expand(shape + [x.shape[-1]]).reshape(rows, x.shape[-1])
    y2 = y.expand(shape + [y.shape[-1]]).reshape(rows, y.shape[-1])
    w = weight
    if not shared and weight.shape[-1] > 0:
        w = weight.expand(shape + [weight.shape[-1]]).reshape(rows, weight.shape[-1])
    w3j = w3j.to(device=x.device, dtype=x.dtype)
    outs: List[List[torch.Tensor]] = [[] for _ in blocks]
    z = "" if shared else "z"
    for k in range(len(recs)):
        s1, m1, d1, s2, m2, d2, io, w_off, c_off, has_w = recs[k]
        mode = modes[k]
        mo, do = blocks[io][0], blocks[io][1]
        a = _block(x2, s1, m1, d1, ir_mul)
        b = _block(y2, s2, m2, d2, ir_mul)
        c = w3j.narrow(0, c_off, d1 * d2 * do).reshape(d1, d2, do)
        if mode == "uvw":
            ww = w.narrow(-1, w_off, m1 * m2 * mo).reshape(list(w.shape[:-1]) + [m1, m2, mo])
            r = torch.einsum("zui,zvj,ijk," + z + "uvw->zwk", [a, b, c, ww])
        elif mode == "uvu" or mode == "uvv" or mode == "uvuv":
            tgt = "zuk" if mode == "uvu" else ("zvk" if mode == "uvv" else "zuvk")
            if has_w == 1:
                ww = w.narrow(-1, w_off, m1 * m2).reshape(list(w.shape[:-1]) + [m1, m2])
                r = torch.einsum("zui,zvj,ijk," + z + "uv->" + tgt, [a, b, c, ww])
            else:
                r = torch.einsum("zui,zvj,ijk->" + tgt, [a, b, c])
        elif mode == "uuw":
            if has_w == 1:
                ww = w.narrow(-1, w_off, m1 * mo).reshape(list(w.shape[:-1]) + [m1, mo])
                r = torch.einsum("zui,zuj,ijk," + z + "uw->zwk", [a, b, c, ww])
            else:
                r = torch.einsum("zui,zuj,ijk->zk", [a, b, c]).unsqueeze(1)
        elif mode == "uuu":
            if has_w == 1:
                ww = w.narrow(-1, w_off, m1)
                r = torch.einsum("zui,zuj,ijk," + z + "u->zuk", [a, b, c, ww])
            else:
                r = torch.einsum("zui,zuj,ijk->zuk", [a, b, c])
        else:  # "uvu<v" / "u<vw": the strictly upper pairs u < v
            iu = torch.triu_indices(m1, m2, 1, device=x.device)
            r = torch.einsum("zui,zvj,ijk->zuvk", [a, b, c])[:, iu[0], iu[1]]
            n_p = iu.shape[1]
            if mode == "uvu<v":
                if has_w == 1:
                    r = r * w.narrow(-1, w_off, n_p).unsqueeze(-1)
            else:
                ww = w.narrow(-1, w_off, n_p * mo).reshape(list(w.shape[:-1]) + [n_p, mo])
                r = torch.einsum("zpk," + z + "pw->zwk", [r, ww])
        r = alphas[k] * r.reshape(rows, mo, do)
        outs[io].append(r.transpose(1, 2).reshape(rows, mo * do) if ir_mul else r.reshape(rows, mo * do))
    parts: List[torch.Tensor] = []
    for io in range(len(blocks)):
        n = blocks[io][0] * blocks[io][1]
        if n == 0:
            continue
        acc = x2.new_zeros(rows, n)
        for r in outs[io]:
            acc = acc + r
        parts.append(acc)
    out = torch.cat(parts, dim=1) if len(parts) > 0 else x2.new_zeros(rows, dim_out)
    return out.reshape(shape + [dim_out])


def linear_script_data(lin) -> Tuple[List[List[int]], List[float], List[List[int]], List[List[int]]]:
    """(weight records [start, mul_in, dim, i_out, w_offset, mul_out], path weights,
    bias records [i_out, b_offset, numel], output blocks [mul, dim]) of an ``nn.Linear``."""
    starts, s = [], 0
    for mul, ir in lin.irreps_in:
        starts.append(s)
        s += mul * ir.dim
    recs, alphas, biases = [], [], []
    w_off = b_off = 0
    for ins in lin.instructions:
        n = 1
        for d in ins.path_shape:
            n *= d
        if ins.i_in == -1:
            biases.append([ins.i_out, b_off, n])
            b_off += n
            continue
        (mi, ir), mo = lin.irreps_in[ins.i_in], lin.irreps_out[ins.i_out].mul
        if n > 0:
            recs.append([starts[ins.i_in], mi, ir.dim, ins.i_out, w_off, mo])
            alphas.append(float(ins.path_weight))
        w_off += n
    return recs, alphas, biases, [[mul, ir.dim] for mul, ir in lin.irreps_out]


def script_linear(features: torch.Tensor, w: torch.Tensor, b: torch.Tensor, shared: bool, f: bool,
                  recs: List[List[int]], alphas: List[float], biases: List[List[int]], blocks: List[List[int]],
                  f_out: int, ir_mul: bool) -> torch.Tensor:
    """The equivariant linear map of ``nn.Linear.forward`` (e3nn's broadcasting of weights and biases)."""
    nf = 2 if f else 1
    lead = features.shape[:features.dim() - nf]
    probe = features.new_zeros(lead)
    if not shared:
        if w.numel() > 0:
            # per-row weights: lead + [numel], or lead + [f_in, f_out, numel] with f_in / f_out
            probe = torch.broadcast_tensors(probe, w.new_zeros(w.shape[:w.dim() - (3 if f else 1)]))[0]
        if b.numel() > 0:
            probe = torch.broadcast_tensors(probe, b.new_zeros(b.shape[:b.dim() - nf]))[0]
    out_lead: List[int] = list(probe.shape)
    if f:
        out_lead.append(f_out)
    fx, fy = ("x", "y") if f else ("", "")
    eq = ("..." + fx + "iu,..." + fx + fy + "uw->..." + fy + "iw") if ir_mul else (
        "..." + fx + "ui,..." + fx + fy + "uw->..." + fy + "wi")
    parts: List[List[torch.Tensor]] = [[] for _ in blocks]
    for k in range(len(recs)):
        start, mi, d, io, w_off, mo = recs[k]
        xs = features.narrow(-1, start, mi * d)
        xs = xs.reshape(list(xs.shape[:-1]) + [d, mi]) if ir_mul else xs.reshape(list(xs.shape[:-1]) + [mi, d])
        ws = w.narrow(-1, w_off, mi * mo)
        ws = ws.reshape(list(ws.shape[:-1]) + [mi, mo])
        y = torch.einsum(eq, [xs, ws])
        parts[io].append(alphas[k] * y.reshape(list(y.shape[:-2]) + [mo * d]))
    for rec in biases:
        parts[rec[0]].append(b.narrow(-1, rec[1], rec[2]))
    outs: List[torch.Tensor] = []
    for io in range(len(blocks)):
        n = blocks[io][0] * blocks[io][1]
        if n == 0:
            continue
        acc = features.new_zeros(out_lead + [n])
        for p in parts[io]:
            acc = acc + p
        outs.append(acc)
    if len(outs) == 0:
        return features.new_zeros(out_lead + [0])
    return torch.cat(outs, dim=-1)
