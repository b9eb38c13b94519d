"""`equikernels settings`: every setting with the value in force and its source, the documentation's
table with --markdown, a bad value as one line; output into a closed pipe ends quietly."""
import sys

from equikernels import settings
from equikernels.cli import main
from cli_checks import one_line_error


def test_lists_every_setting_with_the_value_in_force(monkeypatch, capsys):
    monkeypatch.setenv("EQUIKERNELS_ROWS", "4")
    monkeypatch.delenv("EQUIKERNELS_WARPS", raising=False)
    settings.reload()
    try:
        assert main(["settings"]) == 0
    finally:
        monkeypatch.delenv("EQUIKERNELS_ROWS")
        settings.reload()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(settings.FIELDS)
    by_name = {ln.split()[0]: ln.split()[1:] for ln in lines}
    assert by_name["EQUIKERNELS_ROWS"] == ["4", "(environment)"]
    assert by_name["EQUIKERNELS_WARPS"] == ["None", "(default)"]


def test_markdown_is_the_documentation_table(capsys):
    assert main(["settings", "--markdown"]) == 0
    assert capsys.readouterr().out == settings.table()


def test_bad_value_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("EQUIKERNELS_ROWS", "many")
    assert main(["settings"]) == 2
    one_line_error(capsys, "EQUIKERNELS_ROWS", "'many'")


def test_markdown_is_printed_whatever_the_values_in_force(monkeypatch, capsys):
    monkeypatch.setenv("EQUIKERNELS_ROWS", "many")  # the table documents the settings: it reads none
    settings.reload()
    try:
        assert main(["settings", "--markdown"]) == 0
        assert capsys.readouterr().out == settings.table()
    finally:
        monkeypatch.delenv("EQUIKERNELS_ROWS")
        settings.reload()


class _ClosedPipe:
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


def test_a_closed_pipe_ends_the_command_quietly(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["settings"]) == 141
    assert capsys.readouterr().err == ""
