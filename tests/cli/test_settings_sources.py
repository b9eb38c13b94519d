"""`equikernels settings`: an empty variable is listed as the default it leaves in force; a setting's
name in the wrong case gets a hint; a block size Triton cannot take is refused by name."""
import pytest

from cli_checks import one_line_error
from equikernels import settings
from equikernels.cli import main


@pytest.fixture
def env(monkeypatch):
    def set_(**values):
        for k, v in values.items():
            monkeypatch.setenv(k, v)
        settings.reload()
    yield set_
    monkeypatch.undo()
    settings.reload()


def test_empty_variable_is_the_default(env, capsys):
    env(EQUIKERNELS_ROWS="", EQUIKERNELS_CONV_PREFETCH="")  # empty: unset, except where empty is a value
    assert main(["settings"]) == 0
    by_name = {ln.split()[0]: ln.split()[1:] for ln in capsys.readouterr().out.splitlines()}
    assert by_name["EQUIKERNELS_ROWS"] == ["None", "(default)"]
    assert by_name["EQUIKERNELS_CONV_PREFETCH"] == ["''", "(environment)"]


def test_wrong_case_gets_a_hint(env, capsys):
    env(EQUIKERNELS_autotune="1")
    assert main(["settings"]) == 0
    assert "did you mean EQUIKERNELS_AUTOTUNE?" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["24", "8"])
def test_rconv_block_must_be_a_power_of_two(env, capsys, value):
    env(EQUIKERNELS_RCONV_BLOCK=value)
    assert main(["settings"]) == 2
    one_line_error(capsys, "EQUIKERNELS_RCONV_BLOCK", "power of two >= 16", repr(value))
