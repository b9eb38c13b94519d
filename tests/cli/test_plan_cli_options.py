"""`equikernels plan` refuses options that the chosen direction does not use, instead of printing a
plan that silently ignores them."""
import pytest

from equikernels.cli import main
from cli_checks import one_line_error


@pytest.mark.parametrize("argv, needles", [
    (["--need", "q"], ["need 'q'", "bwd or dbwd", "not fwd"]),
    (["--need", "x", "--conv"], ["need 'x'", "not fwd"]),
    (["--direction", "bwd", "--have", "ab"], ["have 'ab'", "dbwd", "not bwd"]),
    (["--have", "a"], ["have 'a'", "not fwd"]),
])
def test_options_of_another_direction_are_refused(argv, needles, capsys):
    assert main(["plan", "nequip-water", *argv]) == 2
    one_line_error(capsys, *needles)


def test_options_of_the_direction_are_used(capsys):
    assert main(["plan", "nequip-water", "--direction", "dbwd", "--need", "x", "--have", "ab"]) == 0
    assert "need x, have ab" in capsys.readouterr().out
