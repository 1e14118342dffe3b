"""No import circle among the modules of sim/ and dse/ (issue #13), counting imports inside
functions too: a lazy import is still a dependency, and a circle makes the layers blur."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in the file). A package's own
    ``__init__`` is left out: importing ``sim.x`` always runs it."""
    mods = {}
    for pkg in ("sim", "dse"):
        for path in (root / pkg).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps |= {node.module} & mods.keys()
                deps |= {f"{node.module}.{a.name}" for a in node.names} & mods.keys()
        packages = {m for m, p in mods.items() if p.name == "__init__.py"}
        graph[name] = deps - packages - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
