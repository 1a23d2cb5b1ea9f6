"""What user SQL may reach: the database's own tables and views, nothing outside them.

ivm runs a client's SELECT (and the queries inside INSERT, CREATE TABLE AS,
UPDATE, DELETE, DEFAULT and views) on DuckDB, whose SQL can also read files
and URLs (``read_csv``, ``read_text``, ``glob``), run SQL held in a string
(``query``), inspect itself (``duckdb_settings``), and whose statements can
attach databases, copy to files, load extensions and store secrets. Every
DuckDB instance ivm opens is locked against all of that (``ivm.execute.duck.connect``);
this module refuses the same SQL earlier, by name, before anything runs:

* a statement of DuckDB's own (ATTACH, COPY, INSTALL, LOAD, PRAGMA, CREATE
  SECRET, ...), matched on the text's first words, so it is refused even
  where sqlglot cannot parse it;
* a table function in FROM or LATERAL other than the few that only compute
  rows (``TABLE_FUNCTIONS``).

>>> import sqlglot
>>> check_tree(sqlglot.parse_one("SELECT * FROM read_csv('/etc/passwd')", dialect="duckdb"))
Traceback (most recent call last):
  ...
storage.errors.AccessDeniedError: table function read_csv is not allowed: SQL reads only this database's tables and views (reading files, URLs or DuckDB's own state is not available)
"""

from __future__ import annotations

import re

from sqlglot import exp

from sql_frontend.errors import AccessDeniedError
from sql_frontend.limits import echo

# Table functions that only compute rows from their arguments. TUMBLE, HOP and
# SESSION are ivm's window functions (expanded into plain SELECTs).
TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest", "json_each", "json_tree",
                             "tumble", "hop", "session"})

# Statements of DuckDB's own: they reach files, extensions, secrets, other
# databases or DuckDB's settings (ivm's settings are its own SET).
DUCKDB_STATEMENTS = re.compile(
    r"\s*(ATTACH|DETACH|COPY|INSTALL|FORCE\s+INSTALL|UPDATE\s+EXTENSIONS|LOAD|PRAGMA|EXPORT|IMPORT|CALL|USE"
    r"|(CREATE|DROP)\s+(OR\s+REPLACE\s+)?((PERSISTENT|TEMP|TEMPORARY)\s+)?SECRET|RESET)\b",
    re.IGNORECASE)

TABLES_ONLY = "SQL reads only this database's tables and views"


def check_statement(text: str) -> None:
    """Refuse a statement of DuckDB's own; ``text`` is one statement as the user wrote it."""
    if DUCKDB_STATEMENTS.match(text):
        raise AccessDeniedError(f"statement {echo(text)} is not allowed: {TABLES_ONLY} "
                                "(files, extensions, secrets and DuckDB settings are not available)")


def check_tree(tree: exp.Expression) -> None:
    """Refuse a table function other than ``TABLE_FUNCTIONS`` anywhere in ``tree``."""
    for node in tree.find_all(exp.Table, exp.Lateral):
        call = node.this
        if isinstance(call, exp.Func) and function_name(call) not in TABLE_FUNCTIONS:
            raise AccessDeniedError(f"table function {function_name(call)} is not allowed: {TABLES_ONLY} "
                                    "(reading files, URLs or DuckDB's own state is not available)")


def function_name(call: exp.Func) -> str:
    """The function's name, lower case (sqlglot renames a few: ``range`` is GENERATE_SERIES)."""
    if isinstance(call, exp.Explode):  # ``pg_catalog.unnest(a)`` (psql's \d+) is parsed as EXPLODE, rendered UNNEST
        return "unnest"
    return (call.name if isinstance(call, exp.Anonymous) else call.sql_name()).lower()

