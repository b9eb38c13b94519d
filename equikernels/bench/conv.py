"""The graph convolution, side by side: ``out[dst[e]] += TP(x[src[e]], y[e], w[e])`` on a periodic,
rattled Cu fcc graph (a = 3.6 A, r_cut 6 A, edges sorted by destination), MACE-MP-medium's layer-2
product. equikernels (``ir_mul``, ``dataflow="auto"``), cuEquivariance's fused channel-wise product
(``indices_1=src, indices_out=dst``, ``ir_mul``) and OpenEquivariance's deterministic
``TensorProductConv`` (e3nn layout). Directions as for the batched product. Correctness: every
implementation against e3nn in float64 (the product on gathered rows, then ``index_add``) on a
small graph of the same lattice.
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import ase.build
import numpy as np
import torch

from .._compat import o3
from ..models.data import neighbour_list
from ..ops import ConvGraph, tensor_product_conv
from . import timing as T
from .tp import Absent, Spec, all_orders, cue_weight_perm, import_cue, import_oeq, oeq_order

IMPLS = ("equikernels", "cuequivariance", "openequivariance")
REPEATS = {256: (4, 4, 4), 1008: (6, 6, 7), 2916: (9, 9, 9), 10192: (13, 14, 14), 19652: (17, 17, 17)}


def cu_graph(atoms: int, device, r_cut: float = 6.0, seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """(src, dst, nodes) of the Cu fcc graph with ``atoms`` atoms (one of ``REPEATS``), sorted by (dst, src)."""
    if atoms not in REPEATS:
        raise ValueError(f"atoms: one of {sorted(REPEATS)}, got {atoms}")
    a = ase.build.bulk("Cu", "fcc", a=3.6, cubic=True).repeat(REPEATS[atoms])
    a.rattle(0.05, seed=seed)
    ei = torch.as_tensor(neighbour_list(a.positions, a.cell[:], a.pbc, r_cut)[0])
    src, dst = ei[0], ei[1]  # messages from sender to receiver
    order = torch.argsort(dst * len(a) + src)
    return src[order].to(device), dst[order].to(device), len(a)


def build(impl: str, spec: Spec, src, dst, n: int, dtype, device, dataflow: str = "auto",
          deterministic: bool = True) -> Tuple[Callable, Callable, Callable]:
    """``(fn, raw, w_from_e3nn)``: ``fn(x, y, w)`` takes e3nn layouts (the error check), ``raw`` the
    implementation's own layouts (timed), ``w_from_e3nn`` maps e3nn-ordered weights to its own.
    ``dataflow``: equikernels' (``auto``, ``atomic``, ``deterministic``, ``unfused``);
    ``deterministic``: OpenEquivariance's deterministic kernel or its atomic one."""
    P = spec.P
    to_ir = lambda x, y: (spec.conv_in1.to_ir_mul(x), spec.conv_in2.to_ir_mul(y))  # noqa: E731
    if impl == "equikernels":
        graph = ConvGraph.build(src, dst, n)

        def raw(x, y, w):
            return tensor_product_conv(P, x, y, w, None, None, n, graph=graph, layout="ir_mul", dataflow=dataflow,
                                       validate=False)

        def fn(x, y, w):
            return spec.conv_out.to_mul_ir(raw(*to_ir(x, y), w))
        return fn, raw, lambda w: w
    if impl == "cuequivariance":
        cue, cuet, descriptors, O3_e3nn = import_cue()
        irr = lambda s: cue.Irreps(O3_e3nn, s)  # noqa: E731
        i1, i2, io = irr(spec.kw["irreps_in1"]), irr(spec.kw["irreps_in2"]), irr(spec.kw["irreps_out"])
        with T.default_dtype(dtype):
            m = cuet.ChannelWiseTensorProduct(i1, i2, io, layout=cue.ir_mul, shared_weights=False,
                                              internal_weights=False, device=device, dtype=dtype, math_dtype=dtype)
            perm = cue_weight_perm(spec, descriptors.channelwise_tensor_product(i1, i2, io)).to(device)

        def raw(x, y, w):
            return m(x, y, w, indices_1=src, indices_out=dst, size_out=n)

        def fn(x, y, w):
            return spec.conv_out.to_mul_ir(raw(*to_ir(x, y), w.index_select(-1, perm)))
        return fn, raw, lambda w: w.index_select(-1, perm)
    if impl == "openequivariance":
        if device.type != "cuda":
            raise Absent("openequivariance needs a CUDA device")
        oeq = import_oeq()
        npdt = {torch.float32: np.float32, torch.float64: np.float64}[dtype]
        order = oeq_order(spec)
        perm = torch.cat([torch.arange(spec.w_slices[k][0], spec.w_slices[k][0] + spec.w_slices[k][1])
                          for k in order]).to(device)
        prob = oeq.TPProblem(spec.kw["irreps_in1"], spec.kw["irreps_in2"], spec.kw["irreps_out"],
                             [tuple(spec.kw["instructions"][k]) for k in order], shared_weights=False,
                             internal_weights=False, irrep_dtype=npdt, weight_dtype=npdt)
        conv = oeq.TensorProductConv(prob, deterministic=deterministic)
        # int64 indices, out[rows] += f(x[cols]); the deterministic kernel also wants the edges sorted by
        # (row, col), as cu_graph gives them, and the transpose permutation
        rows, cols = dst.long().contiguous(), src.long().contiguous()
        tperm = torch.argsort(cols * n + rows)
        w_from = lambda w: conv.reorder_weights_from_e3nn(w.index_select(-1, perm).contiguous(), True)  # noqa: E731

        def raw(x, y, w):
            return conv(x, y, w, rows, cols, tperm) if deterministic else conv(x, y, w, rows, cols)
        return (lambda x, y, w: raw(x, y, w_from(w))), raw, w_from
    raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLS}")


def reference(spec: Spec, src, dst, n: int, device, seed: int = 0):
    """Seeded float64 inputs and e3nn's float64 results (gathered product, then ``index_add``)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(device)  # noqa: E731
    e = len(src)
    inp = {"x": r(n, spec.d1), "y": r(e, spec.d2), "w": r(e, spec.nw), "g": r(n, spec.d3),
           "Rx": r(n, spec.d1), "Ry": r(e, spec.d2), "Rw": r(e, spec.nw)}
    with T.default_dtype(torch.float64):
        m = o3.TensorProduct(**spec.kw).to(device)

    def e3nn_conv(x, y, w):
        return torch.zeros(n, spec.d3, dtype=x.dtype, device=x.device).index_add(0, dst, m(x[src], y, w))
    return inp, all_orders(e3nn_conv, *(inp[k] for k in ("x", "y", "w", "g", "Rx", "Ry", "Rw")), 2)


def errors(fn, dtype, inp, ref) -> Dict[str, float]:
    t = {k: v.to(dtype) for k, v in inp.items()}
    res = all_orders(fn, *(t[k] for k in ("x", "y", "w", "g", "Rx", "Ry", "Rw")), 2)
    return {k: T.rel_err(v, ref[k]) for k, v in res.items()}


def direction_calls(raw, x, y, w, g, Rx, Ry, Rw) -> Dict[str, Callable]:
    """Timed calls per direction of ``raw`` on the given inputs: ``fwd``; ``bwd``, the gradients of
    (x, y, w) given ``g`` on a retained graph; ``dbwd``, the gradients of ``<gx, Rx> + <gy, Ry> + <gw, Rw>``
    in (x, y, w, g). Graphs are built here, outside the timing."""
    xg, yg, wg = (t.detach().requires_grad_() for t in (x, y, w))
    out = raw(xg, yg, wg)
    gg = g.detach().requires_grad_()
    gx, gy, gw = torch.autograd.grad(out, (xg, yg, wg), gg, create_graph=True, retain_graph=True)
    L = (gx * Rx).sum() + (gy * Ry).sum() + (gw * Rw).sum()

    def fwd(i):
        with torch.no_grad():
            return raw(x, y, w)
    return {"fwd": fwd,
            "bwd": lambda i: torch.autograd.grad(out, (xg, yg, wg), g, retain_graph=True),
            "dbwd": lambda i: torch.autograd.grad(L, (xg, yg, wg, gg), retain_graph=True)}


def directions(raw, spec: Spec, e: int, n: int, w_from, dtype, device) -> Dict[str, Callable]:
    """``direction_calls`` on seeded random inputs in the implementation's own layouts."""
    gen = torch.Generator(device=device).manual_seed(1)
    mk = lambda *s: torch.randn(*s, device=device, generator=gen, dtype=dtype)  # noqa: E731
    x, y, w, g = mk(n, spec.d1), mk(e, spec.d2), w_from(mk(e, spec.nw)), mk(n, spec.d3)
    return direction_calls(raw, x, y, w, g, torch.randn_like(x), torch.randn_like(y), torch.randn_like(w))
