"""No function in sim/ or dse/ is longer than 80 lines (issue #13): a long function is a
sign that several concerns share one room. The allow-list is temporary and names each
exception by file and qualified name; an entry whose function is short again fails too,
so the list cannot go stale."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80
#: (file, qualified name) -> why it is still long; remove the entry when it is split
ALLOWED: dict[tuple[str, str], str] = {}


def long_functions(root: Path = ROOT, limit: int = MAX_LINES) -> dict[tuple[str, str], int]:
    """(file, qualified name) -> lines, for every function over ``limit`` lines."""
    out = {}
    for pkg in ("sim", "dse"):
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            _visit(tree, "", rel, limit, out)
    return out


def _visit(node: ast.AST, prefix: str, rel: str, limit: int, out: dict) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                lines = child.end_lineno - child.lineno + 1
                if lines > limit:
                    out[(rel, name)] = lines
            _visit(child, name + ".", rel, limit, out)
        else:
            _visit(child, prefix, rel, limit, out)


def test_no_function_over_80_lines():
    found = long_functions()
    over = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not over, "functions over %d lines: %s" % (
        MAX_LINES, ", ".join(f"{f}:{n} ({v} lines)" for (f, n), v in sorted(over.items())))


def test_allow_list_is_not_stale():
    found = long_functions()
    stale = [k for k in ALLOWED if k not in found]
    assert not stale, f"allowed long functions that are short now (remove them): {stale}"


def test_the_check_sees_a_long_function(tmp_path):
    (tmp_path / "sim").mkdir()
    (tmp_path / "dse").mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(85))
    (tmp_path / "sim" / "m.py").write_text(f"class A:\n    def f(self):\n{body}\n")
    (tmp_path / "dse" / "n.py").write_text("def g():\n    return 1\n")
    assert long_functions(tmp_path) == {("sim/m.py", "A.f"): 86}
