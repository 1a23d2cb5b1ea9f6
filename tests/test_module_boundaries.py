"""No module reaches into another's privates (issue 25).

A name with a leading underscore belongs to the module that defines it.
Every attribute read or call ``x._name`` in the product's packages, where
``x`` is not ``self``, ``cls`` or ``super()``, must name something that
module defines itself (its own classes' fields and methods); reaching into
another module's object needs a public name there instead. The few
third-party internals used on purpose are listed with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ivm", "delta_operators", "sql_frontend", "storage", "flight_server")

# (file, the attribute's source text): third-party internals with no public equivalent.
ALLOWED = {
    ("ivm/execute/spark/executor.py", "frame._jdf"): "pyspark: unpersisting a cached plan needs the JVM DataFrame",
    ("ivm/execute/spark/session.py", "_session.sparkContext._jsc"): "pyspark: a stopped SparkContext has no public flag",
    ("flight_server/errors.py", "sys._getframe"): "CPython: the caller's frame, for the error's origin",
}


def _defined(tree: ast.AST) -> set[str]:
    """Every name a module defines: functions, classes, assigned names, its objects' attributes, keyword
    fields."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)  # its own objects' fields (setting another's private is a reach too)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
    return names


def _reaches(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    mine = _defined(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in ("self", "cls"):
            continue
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
            continue
        if node.attr not in mine:
            found.append(ast.unparse(node))
    return found


def test_no_module_reads_or_calls_another_modules_private_names():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            found += [f"{relative}: {text}" for text in _reaches(path) if (relative, text) not in ALLOWED]
    assert not found, "private names used outside their module:\n" + "\n".join(found)


def test_the_check_sees_a_reach_into_another_module(tmp_path):
    """The check is not vacuous: a module calling another's private method is caught, its own is not."""
    module = tmp_path / "m.py"
    module.write_text("class A:\n    def _mine(self):\n        return 1\n\n"
                      "def f(engine, a):\n    a._mine()\n    engine._pending = None\n    return engine._maintain()\n")
    assert sorted(_reaches(module)) == ["engine._maintain", "engine._pending"]
