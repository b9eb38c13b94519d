"""The package, tests, README and docs speak of the product only: no numbered work periods, no
development machines, no tracker issue numbers, no references to files outside the repository."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the same expression as `grep -rniE "session ?[0-9]|\blent\b|issue [0-9]" equikernels tests README.md docs`
DIARY = re.compile(r"session ?[0-9]|\blent\b|issue [0-9]", re.I)
# a design document and dated result folders that are not part of the repository
MISSING_FILES = re.compile("DESIGN" + r"(\.md| ?§)|" + "§" + r"[0-9]|benchmarks/results/\w+_20\d\d")


def _files():
    for top in ("equikernels", "tests", "docs"):
        for p in sorted((ROOT / top).rglob("*")):
            if p.is_file() and p.suffix in (".py", ".md", ".cpp", ".txt", ".json", ".yaml", ".sh"):
                yield p
    yield ROOT / "README.md"


def test_no_development_diary_words():
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}" for p in _files()
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if DIARY.search(line) or MISSING_FILES.search(line)]
    assert not hits, "\n".join(hits)
