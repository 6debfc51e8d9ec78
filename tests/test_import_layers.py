"""Imports point down: horizon <- simulator, executor, predictors <- experiments.

Read from the source (every import statement of every module, at module level or inside a
function), so a lazy import cannot hide a wrong direction; and no cycle among module-level
imports of the project's own modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("horizon", "simulator", "executor", "predictors", "experiments")
ALLOWED = {  # package -> the project packages it may import
    "horizon": {"horizon"},
    "simulator": {"horizon", "simulator"},
    "executor": {"horizon", "executor"},
    "predictors": {"horizon", "predictors"},
    "experiments": set(PACKAGES),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def imports(path: Path, top_level_only: bool, mods: dict | None = None) -> list[tuple[int, str]]:
    """``(line, imported module)`` of the project's packages in ``path``. ``from pkg import x``
    names ``pkg.x`` where that is a module (of ``mods``), else ``pkg``."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = [m if m in (mods or {}) else node.module for m in subs]
        else:
            continue
        found += [(node.lineno, n) for n in dict.fromkeys(names) if n.split(".")[0] in PACKAGES]
    return found


def test_every_import_points_down():
    wrong = []
    for name, path in modules().items():
        package = name.split(".")[0]
        for line, target in imports(path, top_level_only=False):
            if target.split(".")[0] not in ALLOWED[package]:
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_no_module_level_import_cycle():
    mods = modules()
    graph = {name: sorted(_edges(path, mods) - {name}) for name, path in mods.items()}
    cycles = _cycles(graph)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def _edges(path: Path, mods: dict[str, Path]) -> set[str]:
    """The project modules ``path`` runs at import time. ``from pkg import sub`` of a submodule
    is an edge to ``pkg.sub`` alone: Python imports the submodule even while ``pkg`` itself is
    still initialising, so that idiom is no cycle."""
    return {t for _, t in imports(path, True, mods) if t in mods}


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}, [["a", "b", "c"]]),
        ({"a": ["b"], "b": [], "c": ["b"]}, []),
    ],
)
def test_the_cycle_finder_finds_cycles(graph, expected):
    assert _cycles(graph) == expected


def test_the_direction_check_sees_lazy_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\n\ndef f():\n    from experiments.run import main\n")
    assert imports(f, top_level_only=False) == [(4, "experiments.run")]
    assert imports(f, top_level_only=True) == []
