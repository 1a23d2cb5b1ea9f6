"""No import circle in ivm/, delta_operators/ or sql_frontend/ (issue 25).

Every import counts, also those inside functions and under ``TYPE_CHECKING``:
a circle there is a pair of modules that cannot be read, tested or moved
apart. A stage that needs part of the engine names that part as a
``Protocol`` of its own (e.g. ``ivm.reads.reads.Readable``) instead of
importing the engine that imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ivm", "delta_operators", "sql_frontend")

def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``path`` imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    known = modules()
    # A package's __init__ and its modules are one thing: edges to a package (``from ivm import x``
    # resolved to ``ivm``) are left out, or every module would close a circle through it.
    graph = {name: {m for m in imports(path, known) if m != name and not known[m].name == "__init__.py"}
             for name, path in known.items()}
    found = circles(graph)
    assert not found, f"import circles: {[sorted(c) for c in found]}"


def test_a_circle_is_found_however_it_is_imported():
    """The check above can fail: a circle through a function-level or TYPE_CHECKING import is one."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [frozenset({"a", "b", "c"})]


def test_imports_count_those_in_functions_and_under_type_checking(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ivm.engine import Engine\n"
                      "def f():\n    from ivm.catalog import check_name\n")
    known = modules()
    assert imports(source, known) == {"ivm.engine", "ivm.catalog"}
