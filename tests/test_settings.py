"""The settings module: every variable the package reads is a documented setting, parsed once and
validated; overrides and re-reads; no environment reads anywhere else in the package."""
import ast
import re
from pathlib import Path

import pytest
import torch

from equikernels import settings
from equikernels.settings import SettingsError

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "equikernels"
DOC = ROOT / "docs" / "configuration.md"


def _sources(*suffixes):
    return [p for p in sorted(PACKAGE.rglob("*")) if p.suffix in suffixes and p.name != "settings.py"]


def test_docs_table_matches_the_settings():
    text = DOC.read_text()
    begin, end = "<!-- settings table: begin -->\n", "<!-- settings table: end -->"
    assert begin in text and end in text, f"{DOC}: the settings table markers are missing"
    documented = text.split(begin, 1)[1].split(end, 1)[0]
    assert documented == settings.table(), (f"{DOC} is out of date: regenerate its table with "
                                            "`equikernels settings --markdown`")
    for f in settings.FIELDS:
        assert f.metadata["doc"].strip(), f"setting {f.name} has no description"


def test_every_variable_named_in_the_package_is_a_setting():
    known = {settings.env_name(f) for f in settings.FIELDS}
    unknown = set()
    for path in _sources(".py", ".cpp", ".h"):
        for name in re.findall(r"\bEQUIKERNELS_[A-Z0-9_]*[A-Z0-9]_?", path.read_text()):
            is_prefix = name.endswith("_") and any(k.startswith(name) for k in known)
            if name not in known and not is_prefix:
                unknown.add(f"{name} ({path.relative_to(ROOT)})")
    assert not unknown, f"variables read but not in equikernels.settings / docs: {sorted(unknown)}"


def test_no_environment_reads_outside_the_settings_module():
    offenders = []
    for path in _sources(".py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv", "environb") \
                    and isinstance(node.value, ast.Name) and node.value.id == "os":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: os.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module == "os" and \
                    any(a.name in ("environ", "getenv") for a in node.names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: from os import ...")
    assert not offenders, "read settings through equikernels.settings.get(): " + ", ".join(offenders)


def test_defaults_and_parsing():
    s = settings.from_environ({})
    assert s == settings.Settings()
    assert (s.backend, s.autotune, s.fast_bwd, s.max_paths, s.rows) == ("auto", False, True, 40, None)
    s = settings.from_environ({"EQUIKERNELS_AUTOTUNE": "1", "EQUIKERNELS_ROWS": "8", "EQUIKERNELS_ROWS_BWD": "2",
                               "EQUIKERNELS_L2_PREFETCH": "row", "EQUIKERNELS_L2_PREFETCH_BWD": "16",
                               "EQUIKERNELS_EDGE_CHUNK": "5000", "EQUIKERNELS_TUNE_MARGIN": "0.1",
                               "EQUIKERNELS_SPLIT_GW": "0", "EQUIKERNELS_MAX_PATHS": "",  # empty: unset
                               "EQUIKERNELS_CONV_PREFETCH": "",  # empty is a value here
                               "TRITON_INTERPRET": "1", "WORLD_SIZE": "4"})
    assert (s.autotune, s.split_gw, s.max_paths, s.edge_chunk, s.tune_margin) == (True, False, 40, 5000, 0.1)
    assert [s.per_kind("rows", k) for k in settings.KINDS] == [8, 2, 8]
    assert [s.per_kind("l2_prefetch", k) for k in settings.KINDS] == ["row", 16, "row"]
    assert (s.conv_prefetch, s.triton_interpret, s.world_size) == ("", True, 4)


@pytest.mark.parametrize("name,value,expected", [
    ("EQUIKERNELS_ROWS", "four", "a power of two >= 1"),
    ("EQUIKERNELS_ROWS_FWD", "0", "a power of two >= 1"),
    ("EQUIKERNELS_CONV_WARPS", "3", "a power of two >= 1"),  # a Triton block or warp count: 3 fails deep in Triton
    ("EQUIKERNELS_UVW_WB", "12", "a power of two >= 1"),
    ("EQUIKERNELS_TUNE_ROUNDS", "0", "an integer >= 1"),
    ("EQUIKERNELS_AUTOTUNE", "maybe", "0 or 1"),
    ("EQUIKERNELS_BACKEND", "cuda", "one of 'auto', 'triton', 'reference'"),
    ("EQUIKERNELS_L2_PREFETCH", "soon", "'off', 'row' or an integer >= 0"),
    ("EQUIKERNELS_TUNE_MIN_GAIN_MS", "-1", "a number >= 0"),
    ("EQUIKERNELS_EDGE_CHUNK", "-5", "'auto' or a non-negative integer"),
    ("LOCAL_RANK", "x", "an integer >= 0"),
])
def test_bad_value_names_the_variable(name, value, expected):
    with pytest.raises(SettingsError) as err:
        settings.from_environ({name: value})
    msg = str(err.value)
    assert msg.startswith(f"{name}: expected") and expected in msg and repr(value) in msg and "\n" not in msg


def test_get_is_cached_and_follows_reload(monkeypatch):
    monkeypatch.setenv("EQUIKERNELS_ROWS", "2")  # the test suite re-reads after monkeypatch changes
    first = settings.get()
    assert first.rows == 2 and settings.get() is first
    monkeypatch.setenv("EQUIKERNELS_ROWS", "bad")
    with pytest.raises(SettingsError, match="EQUIKERNELS_ROWS: expected a power of two"):
        settings.get()
    monkeypatch.delenv("EQUIKERNELS_ROWS")
    assert settings.get().rows is None


def test_override_validates_nests_and_restores(monkeypatch):
    monkeypatch.delenv("EQUIKERNELS_AUTOTUNE", raising=False)
    before = settings.get()
    with settings.override(autotune=True, rows_bwd="4") as s:
        assert s is settings.get() and (s.autotune, s.rows_bwd) == (True, 4)
        with settings.override(rows_bwd=None, l2_prefetch="off"):
            assert (settings.get().rows_bwd, settings.get().l2_prefetch, settings.get().autotune) == (None, "off", True)
        assert settings.get().rows_bwd == 4
    assert settings.get() == before
    with pytest.raises(SettingsError, match=r"override\(rows=...\): expected a power of two >= 1, got '0'"):
        with settings.override(rows=0):
            pass
    with pytest.raises(SettingsError, match="unknown setting 'no_such'"):
        with settings.override(no_such=1):
            pass
    with pytest.raises(RuntimeError):
        with settings.override(poison=True):
            raise RuntimeError("inside")
    assert settings.get() == before


def test_override_reaches_the_code(monkeypatch):
    from equikernels.codegen.tp import default_config
    monkeypatch.delenv("EQUIKERNELS_ROWS", raising=False)
    with settings.override(rows_dbwd=8, warps=2):
        cfg = default_config("dbwd", torch.float32)
    assert (cfg.rows, cfg.num_warps) == (8, 2)
