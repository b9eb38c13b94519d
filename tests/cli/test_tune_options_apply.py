"""`equikernels tune`: an option that does not apply to what is tuned (--rows or --layout without
--problems, --atoms without --model or with --structure) is a one-line error naming it, not ignored;
the options that apply reach the tuning with their values."""
import importlib

import pytest

from cli_checks import one_line_error
from equikernels.cli import main
from equikernels.cli import tune as tune_cli


@pytest.mark.parametrize("argv, option", [
    (["--problems", "nequip-water", "--atoms", "500"], "--atoms"),
    (["--model", "m.model", "--structure", "s.xyz", "--atoms", "500"], "--atoms"),
    (["--model", "m.model", "--rows", "1000"], "--rows"),
    (["--model", "m.model", "--layout", "mul_ir"], "--layout"),
])
def test_option_that_does_not_apply(argv, option, capsys):
    assert main(["tune", *argv]) == 2
    one_line_error(capsys, option, "only with")


def test_options_that_apply_are_used(monkeypatch):
    cache = importlib.import_module("equikernels.tune.cache")  # the module: the package's cache() shadows it
    monkeypatch.setattr(cache, "check_persistent", lambda path: None)
    monkeypatch.setattr(tune_cli, "_device", lambda value: "cpu")
    seen = []
    monkeypatch.setattr(tune_cli, "_problem_step", lambda name, rows, dtype, layout, device: seen.append((rows, layout)))

    class _Stop(Exception):
        pass

    def stop():
        raise _Stop
    monkeypatch.setattr(tune_cli.torch.cuda, "synchronize", stop)
    with pytest.raises(_Stop):
        main(["tune", "--problems", "nequip-water", "--rows", "100", "--layout", "mul_ir", "--debug"])
    with pytest.raises(_Stop):
        main(["tune", "--problems", "nequip-water", "--debug"])
    assert seen == [(100, "mul_ir"), (50000, "ir_mul")]


def test_says_that_later_runs_need_autotune(monkeypatch, tmp_path, capsys):
    """The tunings are read only with EQUIKERNELS_AUTOTUNE=1: the command says so when it is not set."""
    from equikernels import settings

    monkeypatch.setenv("EQUIKERNELS_TUNE_FILE", str(tmp_path / "tuning.json"))
    monkeypatch.delenv("EQUIKERNELS_AUTOTUNE", raising=False)
    settings.reload()
    monkeypatch.setattr(tune_cli, "_device", lambda value: "cpu")
    monkeypatch.setattr(tune_cli, "_problem_step", lambda *args: None)
    monkeypatch.setattr(tune_cli.torch.cuda, "synchronize", lambda: None)
    try:
        assert main(["tune", "--problems", "nequip-water"]) == 0
        assert "EQUIKERNELS_AUTOTUNE=1" in capsys.readouterr().out
        with settings.override(autotune=True):
            assert main(["tune", "--problems", "nequip-water"]) == 0
        assert "EQUIKERNELS_AUTOTUNE=1" not in capsys.readouterr().out
    finally:
        monkeypatch.undo()
        settings.reload()
