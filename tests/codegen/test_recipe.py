"""Pinned recipes (codegen.recipe): a direction plan resolved into launches, pointer parameters in the
order of the plan's kernels, for the products the launcher pins; None for the others."""
import torch

from equikernels import settings
from equikernels.catalog import fully_connected_problem, uvu_problem
from equikernels.codegen.recipe import BwdRecipe, DbwdRecipe
from equikernels.ops import plan_of, spec_of
from equikernels.problem import TPProblem


def test_recipes_follow_the_plan(tmp_path):
    p = TPProblem.create(**uvu_problem("4x0e+4x1o", "0e+1o", "4x0e+4x1o"))
    with settings.override(cache_dir=str(tmp_path), autotune=False):
        ks = plan_of(spec_of(p, "ir_mul")).kernels
        r = ks.recipe("bwd", 7, "", torch.float32)
        (step,) = ks.planner.plan("bwd", 7, "", torch.float32).steps
        slots = ("x", "y", "w", "g", "gx", "gy", "gw")
        assert isinstance(r, BwdRecipe) and r.rows == step.launch.rows and r.order == (0, 1, 2)
        assert tuple(slots[i] for i in r.args) == step.inputs + step.outputs
        assert r.launch.consts[0] == step.launch.rows and r.launch.num_warps == step.launch.num_warps
        d = ks.recipe("dbwd", 15, "abc", torch.float32, (torch.float32,) * 4)
        steps = ks.planner.plan("dbwd", 15, "abc", torch.float32).steps
        assert isinstance(d, DbwdRecipe) and len(d.launches) == sum(len(s.members) for s in steps)
        assert d.written and sorted(d.res) == [7, 8, 9, 10]
        # half-precision outputs that kernels add into need a float32 buffer: no recipe for those
        with settings.override(dbwd_paths=1, dbwd_one=True):  # kernels are built once per layout: a fresh one
            split = plan_of(spec_of(p, "mul_ir")).kernels
            assert split.planner.plan("dbwd", 15, "abc", torch.float32).steps[0].acc_outputs
            assert split.recipe("dbwd", 15, "abc", torch.float32, (torch.bfloat16,) * 4) is None
            assert split.recipe("dbwd", 15, "abc", torch.float32, (torch.float32,) * 4) is not None
        uvw = TPProblem.create(**fully_connected_problem("2x1o+3x0e", "0e+1o", "2x1o+3x0e", shared=False))
        assert plan_of(spec_of(uvw, "ir_mul")).kernels.recipe("bwd", 7, "", torch.float32) is None
