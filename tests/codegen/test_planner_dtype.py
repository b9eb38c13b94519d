"""float64 plans split finer than float32 ones (a float64 value takes two registers): the double
backward's channel parts and the forward's paths per kernel follow the math dtype, and one launcher
runs both dtypes' plans with their own kernels."""
import pytest
import torch

from equikernels import settings
from equikernels.bench.tp import all_orders
from equikernels.catalog import problem as catalog_problem
from equikernels.catalog import uvu_problem
from equikernels.codegen.planner import F64_FWD_PART_PATHS
from equikernels.ops import plan_of, spec_of, tensor_product
from equikernels.problem import TPProblem
from tp_checks import _rel

F32, F64 = torch.float32, torch.float64


@pytest.mark.parametrize("name, parts32, parts64", [("mace-mp-medium-L2", 1, 2), ("mace-large", 2, 4)])
def test_double_backward_channel_parts_halve_in_float64(name, parts32, parts64):
    planner = plan_of(spec_of(catalog_problem(name), "ir_mul")).kernels.planner
    with settings.override(dbwd_channel_parts=None):
        assert (planner.dbwd_channel_parts(F32), planner.dbwd_channel_parts(F64)) == (parts32, parts64)
        (step,) = planner.plan("dbwd", 15, "abc", F64).steps
    assert len(step.members) == parts64


def test_narrow_products_and_many_paths_keep_their_double_backward():
    p = TPProblem.create(**uvu_problem("32x0e+32x1o", "0e+1o", "32x0e+32x1o"))
    planner = plan_of(spec_of(p, "ir_mul")).kernels.planner
    assert planner.dbwd_channel_parts(F64) == planner.dbwd_channel_parts(F32) == 1
    # 68 paths of 64 channels: dg apart in float32, and so in float64 (one kernel would not fit)
    benzene = plan_of(spec_of(catalog_problem("nequip-revmd17-benzene"), "ir_mul")).kernels.planner
    assert benzene.dbwd_channel_parts(F64) == 1 and benzene.dbwd_parts(15, F64) == benzene.dbwd_parts(15, F32)


def test_float64_forward_split_into_parts_of_fewer_paths():
    planner = plan_of(spec_of(catalog_problem("nequip-revmd17-benzene"), "ir_mul")).kernels.planner
    (s32,), (s64,) = planner.plan("fwd", 0, "", F32).steps, planner.plan("fwd", 0, "", F64).steps
    assert len(s32.members) == 2 and len(s64.members) > 2
    assert planner.choice("fwd", F64).part_paths == F64_FWD_PART_PATHS
    assert not {m.name for m in s32.members} & {m.name for m in s64.members}
    # a forward that fits one kernel stays one kernel
    small = plan_of(spec_of(catalog_problem("nequip-lips"), "ir_mul")).kernels.planner
    assert len(small.plan("fwd", 0, "", F64).steps[0].members) == 1


def test_one_launcher_runs_each_dtypes_own_kernels(monkeypatch, tmp_path):
    """float64 (two channel parts, dy zero-filled and added into) then float32 (one kernel) double
    backward through one launcher, outputs NaN-poisoned, against the reference."""
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")
    p = TPProblem.create(**uvu_problem("64x0e+64x1o", "0e+1o", "64x0e+64x1o"))
    kernels = plan_of(spec_of(p, "mul_ir")).kernels
    with settings.override(autotune=False, dbwd_channel_parts=None):
        s64, s32 = (kernels.planner.plan("dbwd", 15, "abc", dt).steps[0] for dt in (F64, F32))
        assert (len(s64.members), len(s32.members)) == (2, 1) and s64.key == s32.key
        g = torch.Generator().manual_seed(3)
        ins = [torch.randn(5, d, generator=g, dtype=F64) for d in
               (p.dim_in1, p.dim_in2, p.weight_numel, p.dim_out, p.dim_in1, p.dim_in2, p.weight_numel)]
        ref = all_orders(lambda a, b, c: tensor_product(p, a, b, c, backend="reference"), *ins, 2)
        for dt, tol in ((F64, 1e-10), (F32, 1e-4)):
            got = all_orders(lambda a, b, c: tensor_product(p, a, b, c, backend="triton"),
                             *(t.to(dt) for t in ins), 2)
            for k in ("dx", "dy", "dw", "dg"):
                assert _rel(got[k].double(), ref[k]) <= tol, f"{dt} {k}: {_rel(got[k].double(), ref[k]):.2e}"
        assert kernels._step_kernel(s64) is not kernels._step_kernel(s32)


@pytest.mark.parametrize("name", ["mace-mp-medium-L2", "mace-large"])
def test_float64_backward_row_takes_two_warps(name):
    """A MACE product's backward runs one row per program; in float64 that row spreads over two
    warps (in one, each thread's values spill)."""
    planner = plan_of(spec_of(catalog_problem(name), "ir_mul")).kernels.planner
    with settings.override(autotune=False):
        shapes = {dt: [(s.launch.rows, s.launch.num_warps) for s in planner.plan("bwd", 7, "", dt).steps]
                  for dt in (F32, F64)}
    assert shapes == {F32: [(1, 1)], F64: [(1, 2)]}


@pytest.mark.parametrize("name", ["mace-mp-medium-L2", "mace-large"])
def test_backward_loads_ahead_follow_the_math_dtype_and_layout(name):
    """A MACE product's backward in ir_mul issues its loads 32 ahead in float32 and 16 in float64;
    in mul_ir 4 in both (deeper is slower there)."""
    problem = catalog_problem(name)
    got = {}
    with settings.override(autotune=False, prefetch=None, prefetch_bwd=None):
        for layout in ("ir_mul", "mul_ir"):
            planner = plan_of(spec_of(problem, layout)).kernels.planner
            got[layout] = [planner.plan("bwd", 7, "", dt).steps[0].choice.prefetch for dt in (F32, F64)]
    assert got == {"ir_mul": [32, 16], "mul_ir": [4, 4]}


def test_one_launcher_runs_each_dtypes_own_backward(monkeypatch, tmp_path):
    """A wide channel-wise backward of one name is built per math dtype (its loads ahead differ):
    float64 then float32 through one launcher, each with its own kernel, outputs NaN-poisoned,
    against the reference."""
    from problems import wide_channelwise_problem
    monkeypatch.setenv("EQUIKERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EQUIKERNELS_POISON", "1")
    p = wide_channelwise_problem()
    kernels = plan_of(spec_of(p, "ir_mul")).kernels
    with settings.override(autotune=False, prefetch=None, prefetch_bwd=None):
        s64, s32 = (kernels.planner.plan("bwd", 7, "", dt).steps[0] for dt in (F64, F32))
        assert s64.key == s32.key and [m.name for m in s64.members] == [m.name for m in s32.members]
        assert s64.choice.prefetch != s32.choice.prefetch
        g = torch.Generator().manual_seed(4)
        x, y, w, gr = (torch.randn(3, d, generator=g, dtype=F64) for d in (p.dim_in1, p.dim_in2, p.weight_numel,
                                                                            p.dim_out))

        def grads(backend, dt):
            a, b, c = (t.to(dt).requires_grad_() for t in (x, y, w))
            return torch.autograd.grad(tensor_product(p, a, b, c, backend=backend), (a, b, c), gr.to(dt))
        ref = grads("reference", F64)
        for dt, tol in ((F64, 1e-10), (F32, 1e-4)):
            for name, u, v in zip(("gx", "gy", "gw"), grads("triton", dt), ref):
                assert _rel(u.double(), v) <= tol, f"{dt} {name}: {_rel(u.double(), v):.2e}"
        k64, k32 = kernels._step_kernel(s64), kernels._step_kernel(s32)
    assert k64 is not k32
    assert [open(k.source_path).read().endswith(m.body) for k, m in ((k64, s64.members[0]), (k32, s32.members[0]))] \
        == [True, True]
