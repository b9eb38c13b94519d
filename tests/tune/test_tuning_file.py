"""The tuning file as users meet it: an empty, truncated or foreign file is reported once and
replaced; `equikernels tune` refuses a location where its results would not outlive the run and
prints entries of any shape."""
import importlib
import json
import warnings

import pytest
import torch

from equikernels import settings, tune
from equikernels.codegen import cache as kcache
tcache = importlib.import_module("equikernels.tune.cache")  # tune.cache is also the name of a function


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for name, value in (("_FALLBACK", None), ("_UNUSABLE", set()), ("_SWEPT", set()), ("_ABSOLUTE", {})):
        monkeypatch.setattr(kcache, name, value)
    monkeypatch.setattr(tcache, "_WARNED", set())
    monkeypatch.setattr(tune, "_CACHE", None)
    monkeypatch.delenv("EQUIKERNELS_TUNE_FILE", raising=False)
    yield
    monkeypatch.undo()
    settings.reload()


@pytest.mark.parametrize("text, why", [
    ("", "empty"),
    ('{"format": 1, "entries": {"a": {"con', "not a JSON file"),
    (json.dumps({"format": 2, "entries": {}}), "another version"),
    ("[1, 2]", "not a tuning file"),
])
def test_unusable_tuning_file_is_reported_once_then_replaced(tmp_path, text, why):
    path = tmp_path / "tuning.json"
    path.write_text(text)
    with pytest.warns(RuntimeWarning, match=why) as record:
        assert tcache.TuneCache(path).get("a") is None
        assert tcache.TuneCache(path).get("a") is None
    msgs = [str(w.message) for w in record if "tuning file" in str(w.message)]
    assert len(msgs) == 1 and str(path) in msgs[0] and "\n" not in msgs[0]
    tcache.TuneCache(path).put("b", {"config": {"rows": 2}})
    tcache._WARNED.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tcache.TuneCache(path).get("b")["config"] == {"rows": 2}


def test_missing_tuning_file_is_silent(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tcache.TuneCache(tmp_path / "none.json").get("a") is None


@pytest.mark.parametrize("variable", ["EQUIKERNELS_CACHE_DIR", "EQUIKERNELS_TUNE_FILE"])
def test_tune_command_refuses_a_location_it_cannot_keep(variable, tmp_path, monkeypatch, capsys):
    """Tunings written to the private fallback would vanish at exit: the command says so first."""
    from cli_checks import one_line_error
    from equikernels.cli import main
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    blocker = tmp_path / "blocker"
    if variable == "EQUIKERNELS_CACHE_DIR":
        blocker.write_text("a file, not a directory")
        monkeypatch.setenv(variable, str(blocker))
        where = blocker / "tuning.json"
    else:
        blocker.mkdir()
        monkeypatch.setenv(variable, str(blocker))
        where = blocker
    assert main(["tune", "--problems", "nequip-water"]) == 2
    one_line_error(capsys, variable, str(where), "writable")


def _fake_run(monkeypatch, step):
    cli = importlib.import_module("equikernels.cli.tune")
    monkeypatch.setattr(cli, "_device", lambda value: torch.device("cpu"))
    monkeypatch.setattr(cli, "_problem_step", step)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)


def test_tune_command_prints_entries_without_times(tmp_path, monkeypatch, capsys):
    """Entries another writer stored without times are listed with '-', not an error."""
    from equikernels.cli import main
    monkeypatch.setenv("EQUIKERNELS_TUNE_FILE", str(tmp_path / "t.json"))

    def step(name, rows, dtype, layout, device):
        tune.cache().put("d|t|e|v|tp|x|fwd|64", {"config": {"rows": 2}, "ms": None})
        tune.cache().put("d|t|e|v|tp|x|bwd7|64", {"config": {"rows": 4}, "ms": 0.5, "default_ms": "?"})
    _fake_run(monkeypatch, step)
    assert main(["tune", "--problems", "nequip-water"]) == 0
    out = capsys.readouterr().out
    assert "tuned 2 kernel configurations" in out and "0.500" in out


def test_tune_command_fails_when_its_writes_fell_back(tmp_path, monkeypatch, capsys):
    """A tuning file that becomes unwritable during the run: the command ends in an error, not a
    report pointing at a temporary file."""
    from equikernels.cli import main
    target = tmp_path / "t.json"
    monkeypatch.setenv("EQUIKERNELS_TUNE_FILE", str(target))

    def step(name, rows, dtype, layout, device):
        target.mkdir()  # a directory where the file should go
        tune.cache().put("d|t|e|v|tp|x|fwd|64", {"config": {"rows": 2}, "ms": 1.0})
    _fake_run(monkeypatch, step)
    with pytest.warns(RuntimeWarning, match="unusable"):
        assert main(["tune", "--problems", "nequip-water"]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the progress bar
    assert "Traceback" not in err and "EQUIKERNELS_TUNE_FILE" in last and str(target) in last
    assert "could not be written" in last
