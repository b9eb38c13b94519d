"""`equikernels plan` and `equikernels tune`, whose output depends on the settings, warn on stderr
about an EQUIKERNELS_* variable that is no setting but close to one's name (a misspelt name the
library ignores), naming that setting; other variables of the prefix are left alone."""
from equikernels.cli import main


def test_plan_names_a_misspelt_variable(monkeypatch, capsys):
    monkeypatch.setenv("EQUIKERNELS_ROWS_BWDD", "2")
    assert main(["plan", "nequip-water"]) == 0
    err = capsys.readouterr().err
    assert "equikernels plan: warning: EQUIKERNELS_ROWS_BWDD" in err and "EQUIKERNELS_ROWS_BWD?" in err, err


def test_tune_names_a_misspelt_variable(monkeypatch, capsys):
    monkeypatch.setenv("EQUIKERNELS_TUNE_ROUND", "2")
    assert main(["tune", "--problems", "no-such-problem"]) == 2  # stops at the arguments, after the warning
    err = capsys.readouterr().err
    assert "equikernels tune: warning: EQUIKERNELS_TUNE_ROUND" in err and "EQUIKERNELS_TUNE_ROUNDS?" in err, err


def test_plan_quiet_about_variables_far_from_any_setting(monkeypatch, capsys):
    import os

    from equikernels import settings
    known = {settings.env_name(f) for f in settings.FIELDS}
    for name in [n for n in os.environ if n.startswith(settings.PREFIX) and n not in known]:
        monkeypatch.delenv(name)  # a runner's own EQUIKERNELS_* variables
    monkeypatch.setenv("EQUIKERNELS_CI_RUNNER_NAME", "x")
    assert main(["plan", "nequip-water"]) == 0
    assert "warning" not in capsys.readouterr().err
