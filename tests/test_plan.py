"""The printable kernel plan is the planner's: the kernels it lists are the kernels a launch runs, in
order, with its launch shape, for each direction and for the three problem families the heuristics
tell apart; a few standard problems' plans are pinned."""
import pytest
import torch

from equikernels import settings
from equikernels.catalog import fully_connected_problem, uvu_problem
from equikernels.codegen import tp as ct
from equikernels.ops import plan_of, spec_of
from equikernels.plan import main, plan_for
from equikernels.problem import TPProblem

PROBLEMS = {
    "channel-wise": uvu_problem("4x0e+4x1o", "0e+1o", "4x0e+4x1o"),
    "per-row uvw": fully_connected_problem("2x1o+3x0e", "0e+1o", "2x1o+3x0e", shared=False),
    "shared uvw": fully_connected_problem("2x1o+3x0e", "0e+1o", "2x1o+3x0e", shared=True),
}


def _launched(monkeypatch, run):
    seen = []
    real = ct.Kernel.launch

    def spy(self, tensors, outputs, n, cfg, dtype, programs=None):
        seen.append((self.meta.name, max(cfg.rows, self.meta.min_rows), cfg.num_warps))
        return real(self, tensors, outputs, n, cfg, dtype, programs)
    monkeypatch.setattr(ct.Kernel, "launch", spy)
    run()
    return seen


@pytest.mark.parametrize("name", list(PROBLEMS))
@pytest.mark.parametrize("direction", ["fwd", "bwd", "dbwd"])
def test_plan_lists_the_launched_kernels(name, direction, monkeypatch, tmp_path):
    p = TPProblem.create(**PROBLEMS[name])
    with settings.override(cache_dir=str(tmp_path), autotune=False):
        plan = plan_for(p, direction, torch.float32, "ir_mul")
        ks = plan_of(spec_of(p, "ir_mul")).kernels
        x, y, w, g = (torch.randn(5, d) for d in (p.dim_in1, p.dim_in2, p.weight_numel, p.dim_out))
        if direction == "fwd":
            seen = _launched(monkeypatch, lambda: ks.forward(x, y, w))
        elif direction == "bwd":
            seen = _launched(monkeypatch, lambda: ks.backward(x, y, w, g, 7))
        else:
            a, b, c = torch.randn_like(x), torch.randn_like(y), torch.randn_like(w)
            seen = _launched(monkeypatch, lambda: ks.double_backward(x, y, w, g, a, b, c, 15))
    assert [(k.name, k.launch.rows, k.launch.num_warps) for k in plan.steps] == seen
    assert plan.direction == direction and plan.steps and all(len(k.members) == 1 for k in plan.steps)


def test_plan_follows_settings_and_checks_arguments(tmp_path):
    p = TPProblem.create(**PROBLEMS["channel-wise"])
    with settings.override(cache_dir=str(tmp_path), rows_fwd=2, warps_fwd=1, max_paths=1):
        plan = plan_for(p, "fwd", torch.float32)
    assert {(k.launch.rows, k.launch.num_warps) for k in plan.steps} == {(2, 1)} and len(plan.steps[0].members) > 1
    with pytest.raises(ValueError, match="direction: expected one of"):
        plan_for(p, "sideways")
    with pytest.raises(ValueError, match="need: expected letters of 'xyw'"):
        plan_for(p, "bwd", need="xg")


def test_command_prints_a_standard_problem(capsys, tmp_path):
    with settings.override(cache_dir=str(tmp_path)):
        assert main(["nequip-water", "--direction", "bwd"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("nequip-water: bwd of ") and "kernel(s):" in out and "rows x" in out
    with pytest.raises(SystemExit):
        main(["no-such-problem"])


@pytest.mark.parametrize("argv, needle", [(["--need", "x"], "need 'x'"),
                                          (["--direction", "bwd", "--have", "a"], "have 'a'")])
def test_command_refuses_options_of_another_direction(argv, needle, capsys):
    with pytest.raises(SystemExit):
        main(["nequip-water", *argv])
    assert needle in capsys.readouterr().err


def test_standard_plans_pinned(tmp_path):
    """The decisions behind the measured defaults, one per problem class (docs/performance.md)."""
    from equikernels.catalog import problem
    with settings.override(cache_dir=str(tmp_path), autotune=False):
        bwd = plan_for(problem("mace-large"), "bwd", torch.bfloat16)
        (st,) = bwd.steps  # one-warp programs, partial sums, early loads, L2 prefetch, fp32 register cap
        assert (st.launch.rows, st.launch.num_warps) == (1, 1)
        c = st.choice
        assert (c.partial, c.cap_fp32, c.prefetch, c.l2, c.in1_major, c.lazy_budget) == (True, True, 4, 16, True, 1024)
        (st,) = plan_for(problem("mace-large"), "bwd", torch.float64, layout="ir_mul").steps  # a row over two warps
        assert st.choice.prefetch == 16 and (st.launch.rows, st.launch.num_warps) == (1, 2)
        dbwd = plan_for(problem("mace-large"), "dbwd")
        (st,) = dbwd.steps  # one kernel per channel part of 64 computing all four, the second adding into dy
        assert [m.name.rsplit("_", 2)[1:] for m in st.members] == [["c0", "64"], ["c64", "128"]]
        assert st.part == 15 and st.choice.in1_outer and st.choice.prefetch == 16 and st.zero_filled == ("dy",)
        lips = plan_for(problem("nequip-lips"), "dbwd", layout="ir_mul")
        (st,) = lips.steps  # one kernel split by first-input segment, 6 paths per part, adding into dy
        assert len(st.members) == 5 and st.choice.part_paths == 6 and st.zero_filled == ("dy",)
        assert st.choice.prefetch == 16 and st.launch.rows == 8
        dd = plan_for(problem("diffdock-L2"), "dbwd", torch.float64)
        assert [(s.part, s.choice.generator, s.launch.rows, s.launch.num_warps) for s in dd.steps] == [
            (11, "uvw_rows", 2, 4), (4, "uvw_rows", 1, 2)]
        tetris = plan_for(problem("tetris-poly-1"), "bwd")
        assert [(s.part, s.row_partials, s.launch.rows) for s in tetris.steps] == [(7, ("gw",), 8)]


def test_command_prints_a_convolution_plan(capsys, tmp_path):
    from equikernels.plan import conv_plan_for
    with settings.override(cache_dir=str(tmp_path)):
        assert main(["nequip-water", "--dataflow", "deterministic", "--direction", "bwd"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("nequip-water: convolution bwd of ") and "deterministic dataflow" in out
    assert "gx written per edge, summed per source node" in out
    with pytest.raises(ValueError, match="dataflow: expected one of"):
        conv_plan_for(TPProblem.create(**PROBLEMS["channel-wise"]), "unfused")
