"""The thin layer between ivm and DuckDB's Python API.

Every statement ivm runs goes through here, for two reasons of cost (a delta
is small, so fixed costs are most of the work):

* DuckDB 2.0's public calls cost two statements each: ``con.sql(q)`` binds
  ``q`` for its schema and plans it again to run it, and an Arrow fetch after
  ``con.execute(q)`` reads the result back through a second statement.
  ``_submit`` (what relations use internally) plans once and returns Arrow;
  it is private, so it is used only where present.
* Most statements run once per batch with the same text and new data.
  ``Runner`` prepares each text once over *holders*, objects registered once
  whose Arrow data is swapped before each execution. Under DuckDB 1.x that
  skips parsing, binding and optimizing (measured: 2.4 ms -> 1.0 ms for a
  join with GROUP BY over 1,400 rows). DuckDB 2.0 binds and optimizes a
  prepared statement again on every EXECUTE (duckdb#20885), so there it
  saves the parse only: TPC-H q01's state merge over 620 rows, 7.4 ms
  plain and 5.8 ms prepared, of which 0.4 ms is execution (session 10).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import weakref
from typing import Any

import duckdb
import pyarrow as pa

BATCH_SIZE = 131072

# Set on every DuckDB instance ivm opens, in this order (the last one freezes
# them). User SQL reaches all of them: a read, a view's SQL (recomputed on the
# mirrors, compiled onto the maintenance instances), a DEFAULT expression on
# the binder. So none may open a file or URL (read_csv, read_text, glob, COPY,
# ATTACH, EXPORT), install or load an extension, create a persistent secret, or
# change a setting. DuckDB refuses all of those with a PermissionException
# (``refused`` below turns it into ivm's AccessDeniedError).
LOCKDOWN = (
    ("enable_external_access", "false"),
    ("autoinstall_known_extensions", "false"),
    ("autoload_known_extensions", "false"),
    ("allow_community_extensions", "false"),
    ("lock_configuration", "true"),
)


def connect(threads: int | None = None, temp_directory: str | os.PathLike | None = None,
            memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB instance that sees only what ivm registers on it (see LOCKDOWN).

    ``temp_directory``: where DuckDB may spill operators larger than memory; it
    is the only directory the instance can reach, so it must be one the engine
    made for it alone (``Scratch``). None: it never spills. ``memory_limit``
    (DuckDB's, e.g. "6GB"): set here because the configuration is locked after.
    Python replacement scans are off as well: a query naming a variable of the
    calling frame would otherwise read that object.
    """
    config: dict[str, Any] = {"python_enable_replacements": False,
                              "temp_directory": str(temp_directory) if temp_directory is not None else ""}
    if threads:
        config["threads"] = threads
    if memory_limit:
        config["memory_limit"] = memory_limit
    con = duckdb.connect(config=config)
    try:
        for name, value in LOCKDOWN:
            con.execute(f"SET {name} = {value}")
    except BaseException:
        con.close()
        raise
    return con


class Scratch:
    """The DuckDB temp directories of one engine: a fresh directory, one subdirectory per instance.

    Made with ``tempfile.mkdtemp`` (under $TMPDIR, mode 0700) and removed by
    ``close`` (or, for an engine that failed to open, when it is collected or
    the process exits), so DuckDB's spill files live where the engine chose,
    never in the server's working directory, and two instances never share
    one (their file names would collide). The name holds the process id: a
    killed process's directories are removed by the next engine made.
    """

    PREFIX = "ivm-duckdb-"

    def __init__(self) -> None:
        _remove_orphans(self.PREFIX)
        self.root = tempfile.mkdtemp(prefix=f"{self.PREFIX}{os.getpid()}-")
        self._remove = weakref.finalize(self, shutil.rmtree, self.root, ignore_errors=True)

    def directory(self, name: str) -> str:
        return os.path.join(self.root, name)

    def close(self) -> None:
        self._remove()


def arrow(con: duckdb.DuckDBPyConnection, sql: str) -> pa.Table:
    submit = getattr(con, "_submit", None)
    if submit is not None:
        return submit(sql, None, "arrow", BATCH_SIZE).arrow_table()
    return con.sql(sql).to_arrow_table()


class Holder:
    """A registered Arrow source whose data is swapped between executions."""

    def __init__(self, table: pa.Table):
        self.table = table
        self.schema = table.schema

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.table.__arrow_c_stream__(requested_schema)


_ids = itertools.count()


class Statement:
    """One SQL text prepared over named Arrow inputs.

    The text names its inputs as ``{name}`` placeholders.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, template: str):
        self.con = con
        self.id = next(_ids)
        self.template = template
        self.holders: dict[str, Holder] = {}
        self.ready = False

    def _prepare(self, inputs: dict[str, pa.Table]) -> None:
        self.id = next(_ids)
        self.holders = {}
        names = {}
        for name, table in inputs.items():
            registered = f"__ivm_s{self.id}_{name}"
            self.holders[name] = Holder(table)
            self.con.register(registered, self.holders[name])
            names[name] = f'"{registered}"'
        self.con.execute(f'PREPARE "__ivm_p{self.id}" AS {self.template.format(**names)}')
        self.ready = True

    def run(self, **inputs: pa.Table) -> pa.Table:
        if not self.ready or any(not t.schema.equals(self.holders[n].schema) for n, t in inputs.items()):
            self._prepare(inputs)
        for name, table in inputs.items():
            self.holders[name].table = table
        try:
            return arrow(self.con, f'EXECUTE "__ivm_p{self.id}"')
        finally:
            for holder in self.holders.values():
                holder.table = holder.schema.empty_table()


class Runner:
    """Runs SQL templates over Arrow inputs on one cursor, preparing each once."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.con = con
        self._statements: dict[str, Statement] = {}

    def run(self, template: str, **inputs: pa.Table) -> pa.Table:
        statement = self._statements.get(template)
        if statement is None:
            statement = self._statements[template] = Statement(self.con, template)
        return statement.run(**inputs)


def _remove_orphans(prefix: str) -> None:
    """Remove this user's ``<prefix><pid>-*`` temp directories whose process is gone."""
    parent = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):].split("-", 1)[0]
        path = os.path.join(parent, name)
        try:
            if not pid.isdigit() or os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # alive under another user, or already gone
            continue
