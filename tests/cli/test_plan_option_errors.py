"""`equikernels plan`: a bad --need / --have is named as the option the user typed."""
import pytest

from cli_checks import one_line_error
from equikernels.cli import main


@pytest.mark.parametrize("argv, needle", [
    (["--need", "xy"], "--need 'xy'"),
    (["--direction", "bwd", "--need", "q"], "--need: expected letters"),
    (["--direction", "bwd", "--need", "xx"], "--need: expected letters of 'xyw' (the gradients asked for: at least "
                                             "one, each once), got 'xx'"),
    (["--direction", "dbwd", "--have", "xyz"], "--have: expected letters"),
    (["--have", "a"], "--have 'a'"),
])
def test_direction_options_are_named_as_typed(argv, needle, capsys):
    assert main(["plan", "nequip-water", *argv]) == 2
    one_line_error(capsys, needle)
