"""Every example in README.md and docs/*.md runs: each fenced ``python`` block is executed (in a fresh
namespace, in a temporary working directory), and each ``equikernels ...`` command line of a
``bash`` block is parsed by the real command-line parser, so a renamed option fails here.

A block preceded by ``<!-- example: gpu -->`` needs a CUDA device, ``<!-- example: mace -->`` needs
mace-torch (the working directory then holds ``mace.model``, a small mace-torch model),
``<!-- example: sevenn -->`` needs SevenNet, ``<!-- example: nequip -->`` the nequip package; they skip
cleanly elsewhere.
"""
import re
import shlex
from pathlib import Path

import pytest
import torch

from random_models import small_random_mace_model

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"(?:<!-- example: (?P<tag>[a-z-]+) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)\n```", re.S)
TAGS = {"gpu", "mace", "sevenn", "nequip"}
# blocks that show how to run the repository itself, not an example
NOT_EXAMPLES = ("<!-- run-command -->", "<!-- test-command -->")


def _blocks(lang):
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            if m.group("lang") != lang:
                continue
            before = text[:m.start()].rstrip().splitlines()[-1:] or [""]
            if before[0] in NOT_EXAMPLES:
                continue
            tag = m.group("tag")
            if tag is not None and tag not in TAGS:
                raise AssertionError(f"{path.name}: unknown example tag {tag!r}; expected one of {sorted(TAGS)}")
            line = text[:m.start()].count("\n") + 1
            out.append(pytest.param(path, line, tag, m.group("body"), id=f"{path.name}:{line}",
                                    marks=[getattr(pytest.mark, tag)] if tag else []))
    return out


def _have(module: str) -> bool:
    try:
        __import__(module)
        return True
    except Exception:
        return False


@pytest.mark.parametrize("path,line,tag,code", _blocks("python"))
def test_python_example(path, line, tag, code, tmp_path, monkeypatch):
    if tag == "gpu" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    monkeypatch.chdir(tmp_path)
    if tag == "sevenn" and not _have("sevenn.calculator"):
        pytest.skip("needs SevenNet")
    if tag == "nequip" and not _have("nequip.model"):
        pytest.skip("needs the nequip package")
    if tag == "mace":
        if not _have("mace"):
            pytest.skip("needs mace-torch")
        torch.save(small_random_mace_model([13, 28, 29, 46, 47, 78, 79]), "mace.model")
    torch.manual_seed(0)
    exec(compile(code, f"{path.name}:{line}", "exec"), {"__name__": "__example__"})


def _commands():
    out = []
    for p in _blocks("bash"):
        path, line, _, body = p.values
        for k, raw in enumerate(body.replace("\\\n", " ").splitlines()):  # joins continued lines
            if "[--" in raw:  # a usage synopsis, not a command
                continue
            words = shlex.split(raw, comments=True)
            if "equikernels.cli" in words:
                words = words[words.index("equikernels.cli") + 1:]
            elif words[:1] == ["equikernels"]:
                words = words[1:]
            else:
                continue
            out.append(pytest.param(words, id=f"{path.name}:{line + 1 + k}"))
    return out


@pytest.mark.parametrize("words", _commands())
def test_cli_example_parses(words):
    from equikernels.cli import build_parser
    try:
        args = build_parser().parse_args(words)
    except SystemExit as exc:
        raise AssertionError(f"`equikernels {' '.join(words)}` is rejected by the parser") from exc
    assert getattr(args, "func", None) is not None


def test_examples_are_found():
    assert len(_blocks("python")) >= 5 and len(_commands()) >= 10
