"""The convolution's plan is what its launcher runs: each direction's kernels, in order, with the
plan's launch shape and register cap; the decisions of one channel-wise problem are pinned in
float32 and float64 for both dataflows."""
import pytest
import torch

from conv_checks import awkward_graph, channelwise
from equikernels import ConvGraph, settings
from equikernels.codegen import conv as cc
from equikernels.codegen.conv_planner import ConvPlanner
from equikernels.catalog import problem as catalog_problem
from equikernels.codegen.plan_types import ConvPlan
from equikernels.ops import plan_of, spec_of
from equikernels.problem import TPProblem

XYW, XYWG = 0b111, 0b1111


def _tables():
    return plan_of(spec_of(TPProblem.create(**channelwise()), "ir_mul"))


def _decisions(plan: ConvPlan):
    return [(s.names, s.mode, s.owner, s.sections, s.launch.rows, s.launch.num_warps, s.maxnreg, s.hoist,
             s.prefetch, s.choice.in1_outer, s.scatter, s.zero_filled, s.per_edge, s.stages) for s in plan.steps]


# (direction, need, have, math) -> decisions of the deterministic dataflow (node-parallel kernels owning
# destinations; gx / dx per edge, summed per source). float32: forward and backward edge loops staged
# in 3 pipeliner stages, the double backward's next edge loaded into registers. float64: 4 warps
# forward, 1 backward with shared inner sums, 2 double backward, the gradients' edge loops staged in 2
# stages, nothing prefetched into registers or held across the edge loop
PINNED = {
    ("fwd", 0, "", torch.float32): [(("out",), "nodes", "dst", "in1", 1, 1, 0, True, "", False, (), (), None, 3)],
    ("fwd", 0, "", torch.float64): [(("out",), "nodes", "dst", "in1", 1, 4, 0, True, "", False, (), (), None, 0)],
    ("bwd", XYW, "", torch.float32): [(("x", "y", "w"), "nodes", "dst", "in1all", 1, 1, 0, True, "", False,
                                       (), (), "gx", 3)],
    ("bwd", XYW, "", torch.float64): [(("x", "y", "w"), "nodes", "dst", "in1all", 1, 1, 0, False, "", True,
                                       (), (), "gx", 2)],
    ("dbwd", XYWG, "abc", torch.float32): [
        (("g",), "nodes", "dst", "in1", 1, 1, 0, False, "all", True, (), (), None, 0),
        (("x", "y", "w"), "nodes", "dst", "in1all", 1, 1, 0, False, "all", True, (), (), "dx", 0)],
    ("dbwd", XYWG, "abc", torch.float64): [
        (("g",), "nodes", "dst", "in1", 1, 2, 0, False, "", True, (), (), None, 2),
        (("x", "y", "w"), "nodes", "dst", "in1all", 1, 2, 0, False, "", True, (), (), "dx", 2)],
}


@pytest.mark.parametrize("key", list(PINNED), ids=lambda k: f"{k[0]}-{str(k[3])[6:]}")
def test_decisions_pinned(key):
    direction, need, have, math = key
    planner = ConvPlanner(_tables())
    with settings.override(triton_interpret=False):
        det = planner.plan("deterministic", direction, need, have, math)
        atomic = planner.plan("atomic", direction, need, have, math)
    assert _decisions(det) == PINNED[key]
    assert det.arrangement == atomic.arrangement == "nodes"
    # atomic: the same kernels, but gx / dx added into zero-filled rows instead of written per edge
    for d, a in zip(det.steps, atomic.steps):
        xo = d.per_edge
        assert a.per_edge is None and a.scatter == ((xo,) if xo else ())
        assert a.zero_filled == ((xo,) if xo else ()) and a.acc_outputs == frozenset(a.scatter)
        assert (a.launch, a.hoist, a.prefetch, a.stages, a.choice) == (d.launch, d.hoist, d.prefetch, d.stages, d.choice)
        assert ("num_stages=3" in d.body) == (d.stages == 3) and ("tl.range(" in d.body) == bool(d.stages)
    assert planner.plan("deterministic", direction, need, have, math) is planner.plan(
        "deterministic", direction, need, have, math)


def test_settings_reach_the_plan():
    planner = ConvPlanner(_tables())
    with settings.override(conv_maxnreg_bwd=96, conv_grad_loops="one", conv_atomic="edges"):
        det = planner.plan("deterministic", "bwd", XYW, "", torch.float32)
        atomic = planner.plan("atomic", "bwd", XYW, "", torch.float32)
    assert [(s.sections, s.maxnreg) for s in det.steps] == [("one", 96)]
    assert atomic.arrangement == "edges" and [(s.mode, s.launch.rows, s.launch.num_warps, s.scatter, s.maxnreg)
                                              for s in atomic.steps] == [("edges", 4, 4, ("gx",), 0)]
    with pytest.raises(ValueError, match="flow: expected 'atomic' or 'deterministic'"):
        planner.plan("sideways", "fwd")


def _launched(monkeypatch):
    seen = []
    real = cc._ConvKernel.launch

    def spy(self, tensors, outputs, graph, cfg, dtype, programs=None):
        fn = self.fn

        class _Fn:
            def __getitem__(_, grid):
                launch = fn[grid]

                def call(*args, **kw):
                    seen.append((self.step.name, kw["ROWS"], kw["num_warps"], getattr(fn, "maxnreg", 0)))
                    return launch(*args, **kw)
                return call
        self.fn = _Fn()
        try:
            return real(self, tensors, outputs, graph, cfg, dtype, programs)
        finally:
            self.fn = fn
    monkeypatch.setattr(cc._ConvKernel, "launch", spy)
    return seen


@pytest.mark.parametrize("math", [torch.float32, torch.float64])
def test_launches_follow_the_plan(monkeypatch, math):
    """The launcher runs the plan's kernels in order with the plan's rows, warps and register cap
    (the interpreter runs the kernels; a capped float32 backward included)."""
    tables = _tables()
    p = tables.problem
    src, dst = awkward_graph(4, 6)
    graph = ConvGraph.build(src, dst, 4)
    g = torch.Generator().manual_seed(0)
    mk = lambda *s: torch.randn(*s, generator=g, dtype=math)  # noqa: E731
    x, y, w, gr = mk(4, p.dim_in1), mk(6, p.dim_in2), mk(6, p.weight_numel), mk(4, p.dim_out)
    ks = cc.ConvKernels(tables, "deterministic")
    seen = _launched(monkeypatch)
    with settings.override(conv_maxnreg_bwd=96):
        ks.forward(x, y, w, graph)
        ks.backward(x, y, w, gr, graph, "xyw")
        ks.double_backward(x, y, w, gr, x, y, w, graph, "xywg")
        plans = [ks.planner.plan("deterministic", d, n, h, math) for d, n, h in
                 (("fwd", 0, ""), ("bwd", XYW, ""), ("dbwd", XYWG, "abc"))]
    want = [(s.name, s.launch.rows, s.launch.num_warps, s.maxnreg) for pl in plans for s in pl.steps]
    assert seen == want
    assert [m for *_, m in want] == [0, 96, 0, 0]
    assert [wp for _, _, wp, _ in want] == ([1, 1, 1, 1] if math == torch.float32 else [4, 1, 2, 2])


_SOURCES = """
import hashlib, sys
sys.path.insert(0, {tests!r})
from equikernels import settings
from equikernels.codegen.conv_planner import ConvPlanner
from equikernels.ops import plan_of, spec_of
from equikernels.problem import TPProblem
from conv_checks import channelwise
kw = channelwise()
kw["shared_weights"] = True  # the weight gradient sums over edges: an edge-parallel kernel
planner = ConvPlanner(plan_of(spec_of(TPProblem.create(**kw), "ir_mul")))
with settings.override(triton_interpret=False, conv_atomic="edges"):
    steps = [s for d, n, h in (("fwd", 0, ""), ("bwd", 7, ""), ("dbwd", 15, "abc"))
             for s in planner.plan("atomic", d, n, h).steps]
print(sorted({{s.mode for s in steps}}), hashlib.sha256(repr([s.body for s in steps]).encode()).hexdigest())
"""


def test_generated_source_does_not_depend_on_the_hash_seed():
    """Kernel sources are cache keys: a source that changed with Python's string hashing would
    recompile in every process (edge-parallel kernels listed their index loads in set order)."""
    import os
    import subprocess
    import sys

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outs = []
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        res = subprocess.run([sys.executable, "-c", _SOURCES.format(tests=tests)], env=env, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        outs.append(res.stdout.strip().splitlines()[-1])
    assert "edges" in outs[0]
    assert outs[0] == outs[1] == outs[2], outs


def test_kernel_layout_of_mul_ir_channelwise_products():
    from equikernels.codegen.conv_planner import kernel_layout
    uvu = TPProblem.create(**channelwise())
    assert kernel_layout(uvu, "mul_ir") == "ir_mul"
    assert kernel_layout(uvu, "ir_mul") == "ir_mul"
    with settings.override(conv_layout="asked"):
        assert kernel_layout(uvu, "mul_ir") == "mul_ir"
    from equikernels.codegen.conv_planner import IR_MUL_MIN_EDGES
    assert kernel_layout(uvu, "mul_ir", IR_MUL_MIN_EDGES - 1) == "mul_ir"  # small graphs: no permutations
    assert kernel_layout(uvu, "mul_ir", IR_MUL_MIN_EDGES) == "ir_mul"
    with settings.override(conv_layout="ir_mul"):
        assert kernel_layout(uvu, "mul_ir", 10) == "ir_mul"
    # y read differently in the two layouts, a fully connected path, or nothing to permute: as asked
    assert kernel_layout(TPProblem.create(**channelwise(i2="2x0e+2x1o")), "mul_ir") == "mul_ir"
    uvw = TPProblem.create("2x0e+2x1o", "0e+1o", "2x1o", [(0, 1, 0, "uvw", True), (1, 0, 0, "uvw", True)])
    assert kernel_layout(uvw, "mul_ir") == "mul_ir"
    scalars = TPProblem.create(**channelwise(i1="3x0e", i2="0e", filt="0e"))
    assert kernel_layout(scalars, "mul_ir") == "mul_ir"


def test_float64_backward_runs_in_channel_parts():
    """A channel-wise float64 backward of 128 channels runs as two kernels of 64 channels: the first
    allocates (zero-filling only what is added into), the second writes into its buffers and adds
    into gy; float32 and the forward keep one kernel."""
    from equikernels.plan import conv_plan_for
    p = catalog_problem("mace-mp-medium-L2")
    plan = conv_plan_for(p, "atomic", "bwd", torch.float64, "ir_mul")
    assert [st.channels for st in plan.steps] == [(0, 64), (64, 128)]
    first, second = plan.steps
    assert first.zero_filled == ("gx",) and first.continues == ()
    assert second.zero_filled == () and set(second.continues) == {"gx", "gy", "gw"}
    assert "gy" not in second.scatter  # the second part adds into gy after a load, as measured
    assert "i64_" in second.body and "i128_" not in second.body
    det = conv_plan_for(p, "deterministic", "bwd", torch.float64, "ir_mul")
    assert [st.channels for st in det.steps] == [(0, 64), (64, 128)] and det.steps[0].zero_filled == ()
    for dtype, direction in ((torch.float32, "bwd"), (torch.float64, "fwd"), (torch.float64, "dbwd")):
        assert all(st.channels == (0, 0) for st in conv_plan_for(p, "atomic", direction, dtype, "ir_mul").steps)
    scalars_in = TPProblem.create(**channelwise("128x0e", "0e+1o+2e+3o", "0e+1o+2e+3o"))
    assert len(conv_plan_for(scalars_in, "atomic", "bwd", torch.float64, "ir_mul").steps) == 1
    with settings.override(conv_channel_parts_bwd=1):
        assert [st.channels for st in conv_plan_for(p, "atomic", "bwd", torch.float64, "ir_mul").steps] == [(0, 0)]
    with settings.override(conv_channel_parts=3):  # does not divide 128: one part
        assert len(conv_plan_for(p, "atomic", "bwd", torch.float64, "ir_mul").steps) == 1
    mixed = TPProblem.create(**channelwise("4x0e+2x1o", "0e+1o", "0e+1o"))
    with settings.override(conv_channel_parts=2):  # first-input segments of different widths: one part
        assert len(conv_plan_for(mixed, "atomic", "bwd", torch.float64, "ir_mul").steps) == 1


def test_double_backward_carries_dg_in_channel_parts():
    """A float32 channel-wise double backward of 128 channels computes dg, dx, dy, dw in one kernel
    per channel part of 64, the second adding into dy with atomics; float64, conv_dbwd_dg="apart"
    and products of fewer than 128 channels keep dg in a kernel of its own."""
    from equikernels.catalog import uvu_problem
    from equikernels.codegen.conv_planner import conv_channel_parts, conv_dbwd_dg
    p = catalog_problem("mace-mp-medium-L2")
    tables = plan_of(spec_of(p, "ir_mul"))
    dg_apart = [("dg",), ("dx", "dy", "dw")]
    assert conv_dbwd_dg(p, torch.float32) == "fused" and conv_dbwd_dg(p, torch.float64) == "apart"
    assert conv_channel_parts(p, "dbwd", torch.float32, carried=True) == 2
    for flow, first_scatter in (("atomic", ("dx",)), ("deterministic", ())):
        plan = cc.ConvKernels(tables, flow).conv_plan("dbwd", "xywg", "abc", torch.float32)
        assert [(st.channels, st.names) for st in plan.steps] == [((0, 64), ("g", "x", "y", "w")),
                                                                  ((64, 128), ("g", "x", "y", "w"))]
        first, second = plan.steps
        # dy has no channels: the first part writes it, the second adds its partial sums with atomics
        assert first.scatter == first_scatter and "dy" not in first.scatter
        assert second.scatter == tuple(sorted(first_scatter + ("dy",)))
        assert "dy" in second.continues and "dg" in second.continues
    f64 = cc.ConvKernels(tables, "atomic").conv_plan("dbwd", "xywg", "abc", torch.float64)
    assert [st.outputs for st in f64.steps] == dg_apart and all(st.channels == (0, 0) for st in f64.steps)
    with settings.override(conv_dbwd_dg="apart"):
        apart = cc.ConvKernels(tables, "atomic").conv_plan("dbwd", "xywg", "abc", torch.float32)
        assert [st.outputs for st in apart.steps] == dg_apart
    with settings.override(conv_dbwd_dg="fused", conv_channel_parts_dbwd=1):
        one = cc.ConvKernels(tables, "atomic").conv_plan("dbwd", "xywg", "abc", torch.float64)
        assert [(st.channels, st.outputs) for st in one.steps] == [((0, 0), ("dg", "dx", "dy", "dw"))]
        assert one.steps[0].scatter == ("dx",)
    narrow = TPProblem.create(**uvu_problem("32x0e+32x1o", "0e+1o+2e", "32x0e+32x1o+32x1e+32x2e"))
    assert conv_dbwd_dg(narrow, torch.float32) == "apart"
    plan = cc.ConvKernels(plan_of(spec_of(narrow, "ir_mul")), "atomic").conv_plan("dbwd", "xywg", "abc", torch.float32)
    assert [st.outputs for st in plan.steps] == dg_apart
