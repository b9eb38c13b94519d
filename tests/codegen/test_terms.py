"""The double backward's terms merged into weighted-factor sums (codegen/terms.py): which paths
merge, that the sums are shared between outputs, that the kernels do less arithmetic, and that
every second-order gradient, dg included, still matches e3nn in float64 (outputs NaN-poisoned)."""
import re

import pytest
import torch

from equikernels import settings
from equikernels._compat import o3
from equikernels.codegen.emit import Group, generate
from equikernels.codegen.plan_types import KernelChoice
from equikernels.codegen.terms import Combo, merge
from equikernels.ir import double_backward_tables
from equikernels.ops import plan_of, spec_of, tensor_product
from equikernels.ops import tp as ops_tp
from equikernels.problem import TPProblem
from problems import default_dtype, mul_ir_to_ir_mul
from tp_checks import _inputs, _rel

I1, I2 = "3x0e+3x1o", "0e+1o+2e"


def _spec(shared=False) -> dict:
    i1, i2 = o3.Irreps(I1), o3.Irreps(I2)
    # each output irrep once: no two instructions share coefficients (those would merge across instructions)
    io = o3.Irreps("+".join(f"3x{ir}" for ir in sorted({ir for _, r1 in i1 for _, r2 in i2 for ir in r1 * r2})))
    ins = [(a, b, c, "uvu", True) for a, (_, r1) in enumerate(i1) for b, (_, r2) in enumerate(i2)
           for c, (_, r) in enumerate(io) if r in r1 * r2]
    return dict(irreps_in1=i1, irreps_in2=i2, irreps_out=io, instructions=ins, shared_weights=shared,
                internal_weights=False)


def _problem(shared=False):
    return TPProblem.create(**_spec(shared))


def _groups(p):
    tables = double_backward_tables(plan_of(spec_of(p, "ir_mul")).table, "abc", "xywg")
    return [Group(t, "d" + n) for n, t in tables.items()]


def _names(f):
    return sorted((fac.operand, None if w is None else w.operand) for fac, w in f.terms)


def test_terms_merge_and_share_their_sums():
    groups = _groups(_problem())
    items = [(gi, p, {}) for gi, g in enumerate(groups) for p in g.table.paths]
    merged = merge(items, frozenset("xywgabc"))
    combos = {gi: [f for i, p, _ in merged if i == gi for f in p.factors if isinstance(f, Combo)]
              for gi in range(len(groups))}
    names = [g.out_ptr for g in groups]
    dg, dy = combos[names.index("dg")], combos[names.index("dy")]
    # dg = T(a, y, w) + T(x, b, w) + T(x, y, c): the first and last terms become one path over a * w + x * c
    n_instr = len(_problem().instructions)
    assert len(dg) == n_instr and all(_names(f) == [("a", "w"), ("x", "c")] for f in dg)
    assert len(dy) == n_instr and {f.terms for f in dy} <= {f.terms for f in dg}  # the same sums
    for gi, g in enumerate(groups):
        kept = sum(1 for i, _, _ in merged if i == gi)
        assert kept == len(g.table.paths) - len(combos[gi]), g.out_ptr
    # dx's terms differ in two factors' worth of channels (y / b against the weight): left alone
    assert not combos[names.index("dx")] and not combos[names.index("dw")]


def test_shared_weights_are_not_merged():
    groups = _groups(_problem(shared=True))
    items = [(gi, p, {}) for gi, g in enumerate(groups) for p in g.table.paths]
    assert merge(items, frozenset("xygab")) == items


def _products(src: str) -> int:
    return sum(ln.count("*") for ln in src.splitlines() if re.match(r"\s+(s|t|m|acc|racc|h)\d+ = ", ln))


def test_merged_kernel_does_less_arithmetic():
    groups = _groups(_problem())
    rows = frozenset("xywgabc")
    plain = generate("k", groups, "ir_mul", KernelChoice(row_operands=rows))[0]
    merged = generate("k", groups, "ir_mul", KernelChoice(row_operands=rows, merge=True))[0]
    assert not re.search(r"\bm\d+ = ", plain)
    sums = re.findall(r"\bm\d+ = (.*)", merged)
    assert sums and all(re.fullmatch(r"a_\w+ \* w_\w+ \+ x_\w+ \* c_\w+", s) for s in sums)
    assert _products(merged) < 0.85 * _products(plain)


@pytest.mark.parametrize("merged", [True, False])
@pytest.mark.parametrize("layout", ["ir_mul", "mul_ir"])
def test_all_second_order_gradients_match_e3nn(merged, layout, monkeypatch, tmp_path):
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    _check_second_order(merged, layout, "cpu")


@pytest.mark.gpu
def test_all_second_order_gradients_match_e3nn_gpu(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")
    _check_second_order(True, "ir_mul", "cuda")


def _check_second_order(merged, layout, device):
    spec = _spec()
    p = TPProblem.create(**spec)
    with default_dtype(torch.float64):  # e3nn's coefficients computed in float64
        e3 = o3.TensorProduct(**spec).to(device)
    irr = [spec["irreps_in1"], spec["irreps_in2"], None, spec["irreps_out"]]
    to_l = (lambda t, i: t if i is None else mul_ir_to_ir_mul(t, i)) if layout == "ir_mul" else (lambda t, i: t)
    x, y, w = _inputs(p, 6, torch.float64, device)
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(6, p.dim_out, generator=gen, dtype=torch.float64).to(device)
    r = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(device) for t in (x, y, w)]

    def orders(fn, xs):
        """d/d(x, y, w, g) of <gx, Rx> + <gy, Ry> + <gw, Rw>, with (gx, gy, gw) the gradient along g."""
        xs = [t.clone().requires_grad_() for t in xs]
        grads = torch.autograd.grad(fn(*xs[:3]), xs[:3], xs[3], create_graph=True)
        return torch.autograd.grad(sum((a * b).sum() for a, b in zip(grads, xs[4:])), xs[:4])

    ref = orders(e3, [x, y, w, g] + r)
    # kernels and direct-launch recipes are kept per plan: built again under this test's settings
    plan_of.cache_clear()
    ops_tp._DBWD_DIRECT.clear()
    try:
        with settings.override(dbwd_merge=merged):
            ours = orders(lambda a, b, c: tensor_product(p, a, b, c, layout=layout, backend="triton"),
                          [to_l(t, i) for t, i in zip([x, y, w, g] + r, irr + irr[:3])])
            src = "".join(m.body for st in plan_of(spec_of(p, layout)).kernels.planner.plan(
                "dbwd", 15, "abc", torch.float64).steps for m in st.members)
    finally:
        plan_of.cache_clear()
        ops_tp._DBWD_DIRECT.clear()
    assert bool(re.search(r"\bm\d+ = ", src)) == merged
    for name, a, b, i in zip("xywg", ours, ref, irr):
        assert not a.isnan().any() and _rel(a, to_l(b, i)) <= 1e-10, f"d/d{name}: {_rel(a, to_l(b, i)):.2e}"
