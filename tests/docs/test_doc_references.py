"""What the prose of README.md and docs/*.md names exists: every inline `equikernels ...` command
parses, every `--option` is an option of the command line (or of the pip / torchrun / cmake lines
shown), every `equikernels.<name>` resolves and every repository file it points to is there."""
import importlib
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCED = re.compile(r"```.*?```", re.S)
SPAN = re.compile(r"`([^`\n]+)`")
OTHER_TOOLS = {"--nproc_per_node", "--index-url"}  # torchrun's and pip's, in the install and DDP lines
# performance.md quotes compiler flags (ptxas, Triton) besides ours
OPTION_DOCS = [p for p in DOCS if p.name != "performance.md"]


def _spans(docs=DOCS):
    return [(path.name, s) for path in docs for s in SPAN.findall(FENCED.sub("", path.read_text()))]


def _options():
    from equikernels.cli import build_parser
    found = set()
    parser = build_parser()
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            found.update(o for o in action.option_strings if o.startswith("--"))
            if getattr(action, "choices", None) and isinstance(action.choices, dict):
                stack.extend(action.choices.values())
    return found


def test_inline_commands_parse():
    from equikernels.cli import build_parser
    for name, span in _spans():
        words = shlex.split(span)
        # a command's or an option's name, or a synopsis, is not a command line
        if words[0] != "equikernels" or len(words) < 3 or "[" in span or words[-1].startswith("--"):
            continue
        try:
            build_parser().parse_args(words[1:])
        except SystemExit as exc:
            raise AssertionError(f"{name}: `{span}` is rejected by the parser") from exc


def test_inline_options_exist():
    options = _options() | OTHER_TOOLS
    missing = sorted({f"{name}: {o}" for name, span in _spans(OPTION_DOCS)
                      for o in re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*", span) if o not in options})
    assert not missing, missing


def _resolve(dotted):
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_named_python_objects_exist():
    names = {m for _, span in _spans() for m in re.findall(r"\bequikernels(?:\.[A-Za-z_]\w*)+", span)}
    assert len(names) >= 10
    bad = []
    for dotted in sorted(names):
        try:
            _resolve(dotted)
        except (ImportError, AttributeError) as exc:
            bad.append(f"{dotted}: {exc}")
    assert not bad, bad


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_linked_files_exist(path):
    text = path.read_text()
    links = re.findall(r"\]\(([^)#\s]+)\)", text)
    files = re.findall(r"`((?:examples|benchmarks|docs|tests|devtools)/[\w./-]*\.\w+)`", text)
    missing = [f for f in links + files if not f.startswith("http") and "<" not in f
               and not (path.parent / f).exists() and not (ROOT / f).exists()]
    assert not missing, missing
