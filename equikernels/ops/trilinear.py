"""The double backward of a trilinear T(x, y, w) by the trilinear identity.

With g the cotangent of T's output and (a, b, c) those of its backward's outputs (gx, gy, gw),

    S = <g, T(a, y, w) + T(x, b, w) + T(x, y, c)>

so dS/dg is the sum of three forwards and dS/dx, dS/dy, dS/dw are backwards of T at swapped
operands. Where T mixes in terms that do not depend on w, T(x, y, c) includes them: they are taken
out again with T(x, y, 0) (exact, T is affine in w). Composed from the chain's own differentiable
ops, every order of derivative works.
"""
from __future__ import annotations

import torch

from .batching import batched_cotangents, legacy_batched


def have_of(a, b, c) -> str:
    """The cotangents present (None: absent), as a fused double backward's ``have``."""
    return ("a" if a is not None else "") + ("b" if b is not None else "") + ("c" if c is not None else "")


def _acc(old, new):
    return new if old is None else old + new


def double_backward(chain, call, math, x, y, w, g, a, b, c, nx, ny, nw, ng):
    """(dx, dy, dw, dg) of ``chain``'s operation, None for those not asked for (nx ... ng); a, b, c
    the cotangents, None where absent.

    When no higher derivative is being recorded (the usual force-training step) one fused pass
    computes all four results; otherwise the identity is composed from the chain's forward and
    backward, which are differentiable themselves. Batched cotangents (``ops.batching``) take the
    chain's custom ops.
    """
    if legacy_batched(g, a, b, c):
        with batched_cotangents():
            return _double_backward(chain, call, math, x, y, w, g, a, b, c, nx, ny, nw, ng)
    return _double_backward(chain, call, math, x, y, w, g, a, b, c, nx, ny, nw, ng)


def _double_backward(chain, call, math, x, y, w, g, a, b, c, nx, ny, nw, ng):
    if not torch.is_grad_enabled():
        # plain arithmetic, not generators: this runs once per force-training step and is host time
        need = nx + 2 * ny + 4 * nw + 8 * ng
        if a is None and b is None and c is None:  # no cotangent reaches any result
            return tuple(torch.zeros_like(t) if f else None for f, t in zip((nx, ny, nw, ng), (x, y, w, g)))
        have = have_of(a, b, c)
        m = chain.method
        if chain.eager(x, y, w, g, a, b, c):
            res = m.direct_dbwd(call, x, y, w, g, a, b, c, have, need, math) if m.direct_dbwd is not None else None
            if res is None:
                res = m.dbwd(call, x, y, w, g, a, b, c, have, need, math)
        else:
            res = chain.dbwd(call, x, y, w, g, a, b, c, have, need, math)
        return tuple(r if n else None for r, n in zip(res, (nx, ny, nw, ng)))
    dx = dy = dw = dg = None
    c0 = torch.zeros_like(c) if c is not None and chain.method.unweighted(call) else None
    if ng:
        for args in ((a, y, w), (x, b, w), (x, y, c)):
            if all(t is not None for t in args):
                dg = _acc(dg, chain.fwd(call, *args, math, g.dtype))  # dg in g's dtype
        if c0 is not None:
            dg = dg - chain.fwd(call, x, y, c0, math, g.dtype)
    if b is not None and (nx or nw):  # from T(x, b, w): d/dx and d/dw
        rx, _, rw = chain.bwd(call, x, b, w, g, (1 if nx else 0) | (4 if nw else 0), math)
        dx = _acc(dx, rx) if nx else dx
        dw = _acc(dw, rw) if nw else dw
    if c is not None and (nx or ny):  # from T(x, y, c)
        need = (1 if nx else 0) | (2 if ny else 0)
        rx, ry, _ = chain.bwd(call, x, y, c, g, need, math)
        if c0 is not None:
            rx0, ry0, _ = chain.bwd(call, x, y, c0, g, need, math)
            rx, ry = (rx - rx0 if nx else rx), (ry - ry0 if ny else ry)
        dx = _acc(dx, rx) if nx else dx
        dy = _acc(dy, ry) if ny else dy
    if a is not None and (ny or nw):  # from T(a, y, w)
        _, ry, rw = chain.bwd(call, a, y, w, g, (2 if ny else 0) | (4 if nw else 0), math)
        dy = _acc(dy, ry) if ny else dy
        dw = _acc(dw, rw) if nw else dw
    if ng and dg is None:
        dg = torch.zeros_like(g)
    return dx, dy, dw, dg
