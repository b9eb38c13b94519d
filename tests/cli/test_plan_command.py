"""`equikernels plan` prints the planner's plan of a standard problem or of each distinct tensor
product of a model file, and bad input ends in one line naming the argument or file."""
import pytest
import torch

from equikernels import settings
from equikernels.catalog import problem
from equikernels.cli import main
from equikernels.codegen.conv_planner import STAGES_F64
from equikernels.default_model import default_model_path
from equikernels.models import load
from equikernels.plan import conv_plan_for, plan_for
from equikernels.problem import TPProblem
from cli_checks import one_line_error


def test_prints_a_standard_problem_plan(capsys, tmp_path):
    with settings.override(cache_dir=str(tmp_path), autotune=False):
        assert main(["plan", "mace-large", "--direction", "dbwd"]) == 0
        plan = plan_for(problem("mace-large"), "dbwd", torch.float32)
    out = capsys.readouterr().out
    assert out.startswith("mace-large: dbwd of " + problem("mace-large").describe())
    assert f"{len(plan.steps)} kernel(s):" in out
    listed = [ln.split()[1] for ln in out.splitlines() if ln.split()[0] in {f"{i}." for i in range(1, 10)}]
    assert listed == [s.name for s in plan.steps]


def test_model_lists_its_products(capsys, tmp_path):
    """An interaction block's product runs inside the fused convolution: its convolution plan is printed."""
    path = default_model_path()
    users = {}
    for name, m in load(path, device="cpu").named_modules():
        if isinstance(getattr(m, "problem", None), TPProblem):
            users.setdefault((m.problem, m.layout), []).append(name)
    with settings.override(cache_dir=str(tmp_path), autotune=False):
        assert main(["plan", "--model", path, "--direction", "bwd", "--dtype", "float64"]) == 0
        plans = {key: conv_plan_for(key[0], "atomic", "bwd", torch.float64, key[1]) for key in users}
    out = capsys.readouterr().out
    assert users and f"{len(users)} distinct tensor product(s)" in out.splitlines()[0]
    assert out.count("runs inside the fused graph convolution (InteractionBlock)") == len(users)
    for (p, layout), names in users.items():
        assert f"convolution bwd of {p.describe()} [{layout}], atomic dataflow" in out
        assert all(f"{n} (InteractionBlock)" in out for n in names)
        assert all(s.name in out for s in plans[(p, layout)].steps)
    assert "tp_bwd" not in out  # no batched-product kernel listed
    # without --dtype the plan is the one the model runs: the bundled model is float64
    assert next(t for t in load(path, device="cpu").parameters()).dtype == torch.float64
    with settings.override(cache_dir=str(tmp_path), autotune=False):
        assert main(["plan", "--model", path]) == 0
    out = capsys.readouterr().out
    assert "dtype float64 (math float64)" in out and "dtype float32" not in out


def test_conv_with_a_model_is_refused(capsys):
    """A model's products are planned as they run: --conv (a standard problem's option) would do nothing."""
    assert main(["plan", "--model", default_model_path(), "--conv"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("equikernels plan: error: --conv applies to a standard problem;") and "\n" not in err


@pytest.mark.parametrize("argv, flow", [(["--conv"], "atomic"), (["--dataflow", "deterministic"], "deterministic")])
def test_prints_a_standard_problem_conv_plan(argv, flow, capsys, tmp_path):
    with settings.override(cache_dir=str(tmp_path), autotune=False):
        assert main(["plan", "nequip-water", "--direction", "dbwd", "--dtype", "float64", *argv]) == 0
        plan = conv_plan_for(problem("nequip-water"), flow, "dbwd", torch.float64)
    out = capsys.readouterr().out
    assert out.startswith(f"nequip-water: convolution dbwd of {problem('nequip-water').describe()} [mul_ir], "
                          f"kernels in ir_mul from 400,000 edges (x and out permuted), {flow} dataflow")
    listed = [ln.split()[1] for ln in out.splitlines() if ln.split()[0] in {f"{i}." for i in range(1, 10)}]
    assert listed == [s.name for s in plan.steps] and len(listed) == 2
    assert out.count("1 edge(s) x 2 warps per program step") == 2
    assert out.count(f"edge loop staged {STAGES_F64}") == 2  # the float64 double backward is staged


def test_conv_plan_says_where_the_edge_loop_is_staged(capsys, tmp_path):
    with settings.override(cache_dir=str(tmp_path), autotune=False):
        assert main(["plan", "nequip-water", "--direction", "bwd", "--dtype", "float32", "--conv"]) == 0
    assert "prefetch off; edge loop staged 3;" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needles", [
    (["no-such-problem"], ["problem: expected one of", "mace-large", "'no-such-problem'"]),
    (["--model", "/no/such/file.model"], ["/no/such/file.model"]),
    ([], ["--model FILE", "nequip-water"]),
    (["mace-large", "--model", "x.model"], ["not both"]),
    (["mace-large", "--direction", "bwd", "--need", "g"], ["need: expected letters"]),
])
def test_bad_input_is_one_line(argv, needles, capsys):
    assert main(["plan", *argv]) == 2
    one_line_error(capsys, *needles)
