"""Session 14 A/B (issue 4): the eager double-backward host path as of session 13 (commit 8560b04),
exec'd over a copy of equikernels.ops.tp's namespace by host_probe.py --ab."""
SOURCE = '''
def _cot(t: Optional[Tensor], like: Tensor, wanted: bool) -> Optional[Tensor]:
    """A usable cotangent, or None when autograd gave none (or the output was a placeholder)."""
    if not wanted or t is None or t.shape != like.shape:
        return None
    return t.contiguous()


def _bwd_backward(ctx, ga, gb, gc):
    """Trilinear identity: S = <g, T(a,y,w) + T(x,b,w) + T(x,y,c)>, (a,b,c) the cotangents.

    When no higher derivative is being recorded (the usual force-training step) one fused op
    computes all four results; otherwise the same identity is composed from tp_fwd / tp_bwd, which
    are differentiable themselves, so any order works.
    """
    x, y, w, g = ctx.saved_tensors
    spec, be, m = ctx.spec, ctx.backend, ctx.math
    a, b, c = _cot(ga, x, ctx.need & NEED_X), _cot(gb, y, ctx.need & NEED_Y), _cot(gc, w, ctx.need & NEED_W)
    nx, ny, nw, ng = ctx.needs_input_grad[:4]
    if not torch.is_grad_enabled():
        need = sum(bit for bit, n in zip((1, 2, 4, 8), (nx, ny, nw, ng)) if n)
        have = "".join(k for k, t in zip("abc", (a, b, c)) if t is not None)
        res = None
        if FAST_BWD and be == "triton" and _eager(x, y, w, g, *(t for t in (a, b, c) if t is not None)):
            res = _dbwd_direct(x, y, w, g, a, b, c, spec, have, need, m)
        if res is None:
            e = x.new_empty(0) if len(have) < 3 else None  # placeholder for a missing cotangent
            res = dbwd(x, y, w, g, a if a is not None else e, b if b is not None else e,
                       c if c is not None else e, spec, be, have, need, m)
        return tuple(r if n else None for r, n in zip(res, (nx, ny, nw, ng))) + (None, None, None, None)
    dx = dy = dw = dg = None

    def acc(old, new):
        return new if old is None else old + new

    if ng:
        for args in ((a, y, w), (x, b, w), (x, y, c)):
            if all(t is not None for t in args):
                dg = acc(dg, fwd(*args, spec, be, m, g.dtype))  # dg in g's dtype
    if b is not None and (nx or nw):  # from T(x, b, w): d/dx and d/dw
        rx, _, rw = bwd(x, b, w, g, spec, be, (NEED_X if nx else 0) | (NEED_W if nw else 0), m)
        dx = acc(dx, rx) if nx else dx
        dw = acc(dw, rw) if nw else dw
    if c is not None and (nx or ny):  # from T(x, y, c)
        rx, ry, _ = bwd(x, y, c, g, spec, be, (NEED_X if nx else 0) | (NEED_Y if ny else 0), m)
        dx = acc(dx, rx) if nx else dx
        dy = acc(dy, ry) if ny else dy
    if a is not None and (ny or nw):  # from T(a, y, w)
        _, ry, rw = bwd(a, y, w, g, spec, be, (NEED_Y if ny else 0) | (NEED_W if nw else 0), m)
        dy = acc(dy, ry) if ny else dy
        dw = acc(dw, rw) if nw else dw
    if ng and dg is None:
        dg = torch.zeros_like(g)
    return dx, dy, dw, dg, None, None, None, None


def _env_tuning_or_poison() -> bool:
    """EQUIKERNELS_AUTOTUNE=1 or EQUIKERNELS_POISON=1 (both need TPKernels' full path), read per call
    as the full path reads them (tests toggle them)."""
    return os.environ.get("EQUIKERNELS_AUTOTUNE") == "1" or os.environ.get("EQUIKERNELS_POISON") == "1"


def _dbwd_direct(x: Tensor, y: Tensor, w: Tensor, g: Tensor, a: Optional[Tensor], b: Optional[Tensor],
                 c: Optional[Tensor], spec: str, have: str, need: int, math_dtype: Optional[torch.dtype]):
    """(dx, dy, dw, dg) as _dbwd_impl computes them (zeros for a result no term contributes to, an
    empty placeholder for one not in ``need``), or None where the full path must run. a, b, c: the
    cotangents, None where absent (``have`` names the others)."""
    if x.dim() != 2 or not need or _env_tuning_or_poison():
        return None
    key = (spec, have, need, x.dtype, y.dtype, w.dtype, g.dtype, a.dtype if a is not None else None,
           b.dtype if b is not None else None, c.dtype if c is not None else None, math_dtype)
    d = _DBWD_DIRECT.get(key, False)
    if d is False:
        d = _DBWD_DIRECT[key] = _dbwd_direct_plan(spec, have, need, x, y, w, g, a, b, c, math_dtype)
    n = x.shape[0]
    if d is None or n == 0:
        return None
    ops = (x, y, w, g)
    t = [x, y, w, g, a, b, c]
    for launch, rows, args, new in d.launches:
        for i in new:
            t.append(_empty_like(ops[i]))  # operands are contiguous: so are these
        nblk = (n + rows - 1) // rows
        launch(nblk, [t[i] for i in args], (n, nblk))
    return tuple(t[j] if j >= 0 else (torch.zeros_like(o) if j == -1 else o.new_empty(0))
                 for j, o in zip(d.res, ops))
'''
