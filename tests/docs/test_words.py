"""The package, tests, README, docs, examples, benchmark scripts and changelog speak of the product
only: no numbered work periods, no development machines, no tracker issue numbers, no references to
files outside the repository."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the same expression as `grep -rniE "session[ -]?[0-9]|\blent\b|issue #?[0-9]" equikernels tests ...`
DIARY = re.compile(r"session[ -]?[0-9]|\blent\b|issue #?[0-9]", re.I)
# notes, design documents and dated result folders that are not part of the repository (the
# patterns are split so that this file does not match them)
MISSING_FILES = re.compile("(DESIGN|ANCHORS|METHOD|HOPPER|KINDS|NOTES)" + r"\.md|" + "DESIGN" + r" ?§|"
                           + "§" + r"[0-9]|" + "/work" + r"/|benchmarks/results/\w+_20\d\d")
TOPS = ("equikernels", "tests", "docs", "examples", "benchmarks", "devtools")
DATA = ("benchmarks/results", "benchmarks/baselines", "examples/data")  # measured records, not prose


def _files():
    for top in TOPS:
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file() and p.suffix in (".py", ".md", ".cpp", ".txt", ".json", ".yaml", ".sh") \
                    and not str(p.relative_to(ROOT)).startswith(DATA):
                yield p
    yield ROOT / "README.md"
    yield ROOT / "CHANGELOG.md"


def test_no_development_diary_words():
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}" for p in _files()
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if DIARY.search(line) or MISSING_FILES.search(line)]
    assert not hits, "\n".join(hits)
