"""Z-set names and SQL live in one place below storage (issue 25).

``storage/zset.py`` names the weight column and builds every Z-set SQL
(consolidation, rows counted into weights, new - old, the pruning QUALIFY).
Two checks keep it so: no module outside it writes that SQL by hand, and
storage imports nothing from the compiler above it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import duckdb
import pyarrow as pa

from storage import zset

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ivm", "storage", "delta_operators", "sql_frontend", "flight_server")
ABOVE_STORAGE = ("ivm", "delta_operators", "sql_frontend", "flight_server")

# The weight column as source text spells it: {WEIGHT}, {q(WEIGHT)}, {quote(WEIGHT)}, __weight or "__weight",
# after an optional table alias (u.{q(WEIGHT)}).
_W = r"""(?:[\w{}()'"]+\.)?(?:\{(?:q|quote)\(WEIGHT\)\}|\{WEIGHT\}|"?__weight"?)"""
HAND_WRITTEN = {
    "consolidation (HAVING on the summed weight)": re.compile(rf"HAVING\s+SUM\(\s*{_W}"),
    "weights summed into the weight column": re.compile(
        rf"SUM\(\s*{_W}\s*\)(?:\s+AS\s+BIGINT\))?(?:::BIGINT)?\s+AS\s+{_W}"),
    "rows counted into weights": re.compile(rf"COUNT\(\*\)(?:::BIGINT)?(?:\s+AS\s+BIGINT\))?\s+AS\s+{_W}"),
    "the pruning QUALIFY": re.compile(rf"QUALIFY\s+SUM\(\s*{_W}"),
}


def hand_written(text: str) -> list[str]:
    """The kinds of Z-set SQL written by hand in ``text`` (Python source)."""
    return [kind for kind, pattern in HAND_WRITTEN.items() if pattern.search(text)]


def test_no_zset_sql_is_written_outside_storage_zset():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "storage" / "zset.py":
                continue
            found += [f"{path.relative_to(ROOT)}: {kind}" for kind in hand_written(path.read_text())]
    assert not found, "build Z-set SQL with storage/zset.py:\n" + "\n".join(found)


def test_the_check_sees_hand_written_zset_sql():
    """Not vacuous: the forms the call sites used before storage/zset.py are each caught."""
    before = [
        'f"SELECT {cols}, SUM({WEIGHT})::BIGINT AS {WEIGHT} FROM {{d}} GROUP BY ALL HAVING SUM({WEIGHT}) <> 0"',
        "f\"GROUP BY {columns(c, 'x')} HAVING SUM(x.{q(WEIGHT)}) > 0\"",
        'f"SELECT {names}, COUNT(*)::BIGINT AS {WEIGHT} FROM {{rows}} GROUP BY ALL"',
        "f\"SELECT {columns(names, 'r')}, COUNT(*) AS {q(WEIGHT)}, TRUE AS {q(KEEP)}\"",
        'f"SELECT * FROM {{delta}} QUALIFY SUM({WEIGHT}) OVER () <> 0"',
        'f"SELECT {columns}, SUM({quote(WEIGHT)})::BIGINT AS {quote(WEIGHT)} FROM {{rows}} GROUP BY ALL"',
    ]
    assert all(hand_written(text) for text in before)
    assert hand_written(Path(zset.__file__).read_text())  # the builders themselves write it
    assert not hand_written('f"SELECT {consolidate(\'{rows}\', names, template=True)}"')


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_storage_imports_nothing_from_the_layers_above():
    found = [f"{path.relative_to(ROOT)}: {name}" for path in sorted((ROOT / "storage").rglob("*.py"))
             for name in sorted(_imports(path)) if name.split(".")[0] in ABOVE_STORAGE]
    assert not found, "storage must not import the compiler or the runtime:\n" + "\n".join(found)


def test_the_import_check_reads_code_not_comments(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("# from delta_operators.zset import WEIGHT\nimport numpy\n"
                      "def f():\n    from sql_frontend.errors import IvmError\n")
    assert _imports(module) == {"numpy", "sql_frontend.errors"}


def _run(sql: str, **tables: pa.Table) -> list[tuple]:
    con = duckdb.connect()
    for name, table in tables.items():
        con.register(name, table)
    return sorted(con.sql(sql).fetchall(), key=repr)


# Column names a user may choose: spaces, quotes, braces (runner templates are filled by str.format).
ODD = ['a b', 'say "hi"', "x{1}"]


def test_consolidation_sums_equal_rows_and_keeps_what_it_is_asked():
    rows = pa.table({ODD[0]: [1, 1, 2, 3, 3], ODD[1]: ["p", "p", "q", "r", "r"], ODD[2]: [0, 0, 0, 0, 0],
                     zset.WEIGHT: [2, -2, 1, -1, -2]})
    template = zset.consolidate("{t}", ODD, template=True)
    assert _run(template.format(t="t"), t=rows) == [(2, "q", 0, 1), (3, "r", 0, -3)]
    present = zset.consolidate('"t" AS u', ODD, table="u", keep=zset.PRESENT)
    assert _run(present, t=rows) == [(2, "q", 0, 1)]
    every = zset.consolidate('"t"', ODD, keep=zset.EVERY)
    assert _run(every, t=rows) == [(1, "p", 0, 0), (2, "q", 0, 1), (3, "r", 0, -3)]


def test_counted_rows_difference_and_prune_over_odd_names():
    old = pa.table({ODD[0]: [1, 1, 2], ODD[2]: ["a", "a", "b"]})
    counted = _run(zset.count_rows("rows", [ODD[0], ODD[2]]).format(rows="old"), old=old)
    assert counted == [(1, "a", 2), (2, "b", 1)]
    before = pa.table({ODD[0]: [1, 2], ODD[2]: ["a", "b"], zset.WEIGHT: [2, 1]})
    after = pa.table({ODD[0]: [1, 3], ODD[2]: ["a", "c"], zset.WEIGHT: [1, 1]})
    change = zset.difference("old", "new", [ODD[0], ODD[2]]).format(old="o", new="n")
    assert _run(change, o=before, n=after) == [(1, "a", -1), (2, "b", -1), (3, "c", 1)]
    delta = pa.table({ODD[2]: ["k", "k", "m"], "v": [1, 2, 3], zset.WEIGHT: [-1, 1, 1]})
    assert _run(zset.prune("delta", [ODD[2]]).format(delta="d"), d=delta) == [("m", 3, 1)]
