"""The package's imports point down its layers and form no circle.

Every import of every module counts, function-local ones included (a local import hides a
dependency from the reader, not from the layering). Layers, lowest first, are listed in ``LAYERS``;
a module may import its own layer and any layer below it. A new top-level module or sub-package
must be placed in ``LAYERS``.
"""
import ast
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "equikernels"

LAYERS: List[Tuple[str, Tuple[str, ...]]] = [
    ("foundation", ("settings", "dtypes", "_compat", "_e3nn_constants", "_files", "_version")),
    ("problem", ("problem", "catalog")),
    ("ir", ("ir",)),
    ("reference/codegen", ("reference", "codegen")),
    ("plan/tune", ("plan", "tune")),
    ("ops", ("ops",)),
    ("nn", ("nn",)),
    ("models", ("models", "default_model", "adapters", "accelerate")),
    ("experimental", ("experimental",)),  # opt-in paths; models only hold hooks it registers into
    ("calculators/training", ("calculators", "training", "lammps", "bench")),
    ("cli", ("cli", "__main__")),
    ("package", ("",)),  # equikernels/__init__.py: the public face, above everything
]

# imports that break the rules today, each to be removed by moving code (importer, imported): the
# tests fail on any other breach, and on an entry here that no longer occurs
KNOWN: Dict[Tuple[str, str], str] = {
}

Edge = Tuple[str, str, int]  # (importing module, imported module, line)


def modules() -> Dict[str, Path]:
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mods: Dict[str, Path]) -> List[Edge]:
    """Every import of a package module by a package module (``from a import b`` of a submodule
    ``b`` counts as an import of ``a.b``)."""
    edges = []
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_pkg, node)
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                targets = subs + ([base] if len(subs) < len(node.names) else [])
            else:
                continue
            for t in targets:
                while t and t not in mods and "." in t:  # import a.b.c of a non-module name: its module
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != mod:
                    edges.append((mod, t, node.lineno))
    return edges


def layer_of(mod: str) -> Optional[int]:
    rest = mod[len(PACKAGE) + 1:] if mod != PACKAGE else ""
    for i, (_, names) in enumerate(LAYERS):
        for n in names:
            if rest == n or (n and rest.startswith(n + ".")):
                return i
    return None


def _where(mods: Dict[str, Path], edge: Edge) -> str:
    src, dst, line = edge
    return f"{mods[src].relative_to(ROOT)}:{line} imports {dst}"


def upward(mods: Dict[str, Path], edges: List[Edge]) -> List[str]:
    out = []
    for e in edges:
        a, b = layer_of(e[0]), layer_of(e[1])
        if a is not None and b is not None and b > a and (e[0], e[1]) not in KNOWN:
            out.append(f"{_where(mods, e)} (layer '{LAYERS[b][0]}' is above '{LAYERS[a][0]}')")
    return out


def circles(mods: Dict[str, Path], edges: List[Edge]) -> List[str]:
    """Strongly connected components of more than one module, each with the imports inside it."""
    graph: Dict[str, Set[str]] = {m: set() for m in mods}
    for a, b, _ in edges:
        graph[a].add(b)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    comps: List[Set[str]] = []

    def visit(v: str) -> None:  # Tarjan; the package is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return [f"circle of {sorted(c)}: " + "; ".join(_where(mods, e) for e in edges if e[0] in c and e[1] in c)
            for c in comps]


def test_every_module_has_a_layer():
    missing = [m for m in modules() if layer_of(m) is None]
    assert not missing, f"place these modules in LAYERS of {Path(__file__).name}: {missing}"


def test_imports_point_down():
    mods = modules()
    bad = upward(mods, imports(mods))
    assert not bad, "imports must point down the layers (problem -> ir -> ... -> cli):\n" + "\n".join(bad)


def test_no_import_circles():
    mods = modules()
    bad = circles(mods, imports(mods))
    assert not bad, "modules that import each other (move the shared part down):\n" + "\n".join(bad)


def test_no_private_names_from_other_packages():
    """``from a.b import _name`` only within a's own sub-package."""
    mods = modules()
    bad = []
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(mod, path.name == "__init__.py", node)
                if not base.startswith(PACKAGE):
                    continue
                home = lambda m: m.split(".")[:2]  # noqa: E731 - equikernels.<sub-package or module>
                for a in node.names:
                    target = f"{base}.{a.name}"
                    if a.name.startswith("_") and not a.name.startswith("__") and target not in mods \
                            and home(base) != home(mod) and (mod, target) not in KNOWN:
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name} from {base}")
    assert not bad, "private names used across packages (make them public or move them):\n" + "\n".join(bad)


def test_known_breaches_still_occur():
    """An entry of KNOWN that no longer occurs is removed from it (the list only shrinks)."""
    mods = modules()
    seen = {(a, b) for a, b, _ in imports(mods)}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(mod, path.name == "__init__.py", node)
                seen |= {(mod, f"{base}.{a.name}") for a in node.names}
    stale = [k for k in KNOWN if k not in seen]
    assert not stale, f"remove from KNOWN in {Path(__file__).name} (fixed): {stale}"


def test_checker_sees_local_imports_and_circles(tmp_path):
    """The checker itself: a function-local import closes a circle; an import upward is named."""
    a = ast.parse("def f():\n    from .b import g\n")
    node = next(n for n in ast.walk(a) if isinstance(n, ast.ImportFrom))
    assert _resolve("equikernels.models.a", False, node) == "equikernels.models.b"
    mods = {"equikernels.ops.x": ROOT / "equikernels" / "ops" / "x.py",
            "equikernels.models.y": ROOT / "equikernels" / "models" / "y.py"}
    edges = [("equikernels.ops.x", "equikernels.models.y", 3), ("equikernels.models.y", "equikernels.ops.x", 5)]
    assert upward(mods, edges) == ["equikernels/ops/x.py:3 imports equikernels.models.y "
                                   "(layer 'models' is above 'ops')"]
    assert len(circles(mods, edges)) == 1
