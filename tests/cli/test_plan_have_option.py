"""`equikernels plan --have`: a set of one or more cotangents of "abc"; anything else is named as --have."""
import pytest
import torch

from cli_checks import one_line_error
from equikernels.catalog import problem
from equikernels.cli import main
from equikernels.plan import plan_for


@pytest.mark.parametrize("have", ["", "aab", "abca", " a", "a,b", "d"])
def test_degenerate_have_is_one_line_error(have, capsys):
    assert main(["plan", "nequip-water", "--direction", "dbwd", "--have", have]) == 2
    one_line_error(capsys, "--have: expected letters of 'abc'", repr(have))


def test_api_names_its_parameter():
    with pytest.raises(ValueError, match=r"^have: expected letters of 'abc'.*got ''"):
        plan_for(problem("nequip-water"), "dbwd", torch.float64, have="")


def test_order_of_letters_is_the_launchers():
    p = problem("nequip-water")
    ba, ab = (plan_for(p, "dbwd", torch.float64, have=h) for h in ("ba", "ab"))
    assert ba.have == "ab" and [s.name for s in ba.steps] == [s.name for s in ab.steps]
