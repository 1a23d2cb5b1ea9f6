"""TPC-H data, its 22 queries as materialized views, and a refresh stream.

    python -m bench.tpch --scale 0.01 --batches 10       # maintain all 22 views, time each batch
    python -m bench.tpch --per-query                      # per query: maintenance vs DuckDB recompute
    python -m bench.tpch --explain                        # EXPLAIN of every view
    python -m bench.tpch --report                         # per query: what is incremental, what is not

Data comes from ``tpchgen-cli`` (the ``bench`` extra), generated as Parquet
into a directory and loaded with ``apply_changes``. The refresh stream
follows the spirit of TPC-H's refresh functions, and adds updates:

* new orders with their lineitems (copies of existing orders under new keys,
  for a random customer, so every foreign key still points somewhere);
* deletes of existing orders with all their lineitems;
* updates of existing rows: prices, discounts, quantities, dates, statuses,
  priorities, comments and account balances of lineitems, orders, customers,
  parts, partsupps and suppliers.

Batches are generated from a DuckDB connection holding the current tables
(the reference the tests recompute the queries on), deterministically from
a seed. The query texts live in ``tests/fixtures/tpch/qNN.sql`` (standard
TPC-H SQL with the specification's validation parameters).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import duckdb
import pyarrow as pa

QUERIES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tpch"

SCHEMA = {
    "region": "r_regionkey BIGINT PRIMARY KEY, r_name VARCHAR, r_comment VARCHAR",
    "nation": "n_nationkey BIGINT PRIMARY KEY, n_name VARCHAR, n_regionkey BIGINT, n_comment VARCHAR",
    "supplier": "s_suppkey BIGINT PRIMARY KEY, s_name VARCHAR, s_address VARCHAR, s_nationkey BIGINT, "
                "s_phone VARCHAR, s_acctbal DECIMAL(15,2), s_comment VARCHAR",
    "customer": "c_custkey BIGINT PRIMARY KEY, c_name VARCHAR, c_address VARCHAR, c_nationkey BIGINT, "
                "c_phone VARCHAR, c_acctbal DECIMAL(15,2), c_mktsegment VARCHAR, c_comment VARCHAR",
    "part": "p_partkey BIGINT PRIMARY KEY, p_name VARCHAR, p_mfgr VARCHAR, p_brand VARCHAR, p_type VARCHAR, "
            "p_size INTEGER, p_container VARCHAR, p_retailprice DECIMAL(15,2), p_comment VARCHAR",
    "partsupp": "ps_partkey BIGINT, ps_suppkey BIGINT, ps_availqty INTEGER, ps_supplycost DECIMAL(15,2), "
                "ps_comment VARCHAR, PRIMARY KEY (ps_partkey, ps_suppkey)",
    "orders": "o_orderkey BIGINT PRIMARY KEY, o_custkey BIGINT, o_orderstatus VARCHAR, o_totalprice DECIMAL(15,2), "
              "o_orderdate DATE, o_orderpriority VARCHAR, o_clerk VARCHAR, o_shippriority INTEGER, o_comment VARCHAR",
    "lineitem": "l_orderkey BIGINT, l_partkey BIGINT, l_suppkey BIGINT, l_linenumber INTEGER, "
                "l_quantity DECIMAL(15,2), l_extendedprice DECIMAL(15,2), l_discount DECIMAL(15,2), "
                "l_tax DECIMAL(15,2), l_returnflag VARCHAR, l_linestatus VARCHAR, l_shipdate DATE, "
                "l_commitdate DATE, l_receiptdate DATE, l_shipinstruct VARCHAR, l_shipmode VARCHAR, "
                "l_comment VARCHAR, PRIMARY KEY (l_orderkey, l_linenumber)",
}
TABLES = tuple(SCHEMA)
KEYS = {
    "region": ("r_regionkey",), "nation": ("n_nationkey",), "supplier": ("s_suppkey",),
    "customer": ("c_custkey",), "part": ("p_partkey",), "partsupp": ("ps_partkey", "ps_suppkey"),
    "orders": ("o_orderkey",), "lineitem": ("l_orderkey", "l_linenumber"),
}
# Queries whose result is decided by ORDER BY ... LIMIT (top-K views).
TOP_K = frozenset({2, 3, 10, 18, 21})

# Updates per table: column -> new value (SQL over the row and a per-row random h in [0, 1000)).
UPDATES = {
    "lineitem": {
        "l_extendedprice": "CAST(l_extendedprice * (0.9 + h / 5000) AS DECIMAL(15,2))",
        "l_discount": "CAST((h % 11) / 100 AS DECIMAL(15,2))",
        "l_quantity": "CAST(1 + h % 50 AS DECIMAL(15,2))",
        "l_shipdate": "l_shipdate + CAST(h % 61 - 30 AS INTEGER)",
        "l_receiptdate": "l_receiptdate + CAST(h % 21 - 10 AS INTEGER)",
        "l_returnflag": "['R', 'A', 'N'][1 + h % 3]",
        "l_linestatus": "['O', 'F'][1 + h % 2]",
        "l_shipmode": "['MAIL', 'SHIP', 'AIR', 'TRUCK'][1 + h % 4]",
    },
    "orders": {
        "o_orderstatus": "['F', 'O', 'P'][1 + h % 3]",
        "o_totalprice": "CAST(o_totalprice * (0.9 + h / 5000) AS DECIMAL(15,2))",
        "o_orderdate": "o_orderdate + CAST(h % 91 - 45 AS INTEGER)",
        "o_orderpriority": "['1-URGENT', '2-HIGH', '3-MEDIUM', '4-NOT SPECIFIED', '5-LOW'][1 + h % 5]",
        "o_comment": "CASE WHEN h % 4 = 0 THEN 'special packages requests' ELSE o_comment END",
    },
    "customer": {
        "c_acctbal": "CAST(c_acctbal + (h - 500) AS DECIMAL(15,2))",
        "c_mktsegment": "['BUILDING', 'AUTOMOBILE', 'MACHINERY', 'HOUSEHOLD', 'FURNITURE'][1 + h % 5]",
    },
    "part": {
        "p_retailprice": "CAST(p_retailprice * (0.9 + h / 5000) AS DECIMAL(15,2))",
        "p_container": "['MED BOX', 'SM CASE', 'LG BOX', 'JUMBO PKG'][1 + h % 4]",
    },
    "partsupp": {
        "ps_supplycost": "CAST(ps_supplycost * (0.5 + h / 1000) AS DECIMAL(15,2))",
        "ps_availqty": "CAST(h * 10 AS INTEGER)",
    },
    "supplier": {
        "s_acctbal": "CAST(s_acctbal + (h - 500) AS DECIMAL(15,2))",
        "s_comment": "CASE WHEN h % 3 = 0 THEN 'Customer slow Complaints' ELSE s_comment END",
    },
}


def query_files() -> dict[str, str]:
    """qNN -> the query text (comments stripped)."""
    out = {}
    for path in sorted(QUERIES.glob("q*.sql")):
        lines = [line for line in path.read_text().splitlines() if not line.strip().startswith("--")]
        out[path.stem] = "\n".join(lines).strip().rstrip(";")
    return out


def without_limit(sql: str) -> str:
    """The query with its final LIMIT removed (its ORDER BY then only orders: views ignore it)."""
    return re.sub(r"\s+limit\s+\d+\s*$", "", sql, flags=re.IGNORECASE)


def tpchgen() -> str:
    found = shutil.which("tpchgen-cli") or str(Path(sys.executable).with_name("tpchgen-cli"))
    if not Path(found).exists():
        raise RuntimeError("tpchgen-cli is not installed (pip install -e '.[bench]')")
    return found


def generate(scale: float, directory: Path) -> None:
    """Write the eight tables as Parquet files into ``directory`` (unless they are there)."""
    if all((directory / f"{t}.parquet").exists() for t in TABLES):
        return
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run([tpchgen(), "parquet", "-s", str(scale), "-o", str(directory), "--overwrite"],
                   check=True, capture_output=True)


def reference(directory: Path, database: Path | None = None, memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB database holding the generated tables with the schema's types and keys.

    In memory by default; with ``database``, a fresh file there (an earlier one
    is replaced: refreshes change it) whose buffer pool ``memory_limit`` caps,
    so DuckDB keeps its tables on disk and spills what does not fit beside it
    (``<database>.tmp``): at SF 10 a native in-memory copy would not fit beside ivm's.
    """
    if database is None:
        con = duckdb.connect()
    else:
        for stale in (database, database.with_name(database.name + ".wal")):
            stale.unlink(missing_ok=True)
        config = {"temp_directory": str(database.with_name(database.name + ".tmp"))}
        if memory_limit:
            config["memory_limit"] = memory_limit
        con = duckdb.connect(str(database), config=config)
        con.execute("SET enable_progress_bar = false")  # a file database shows one on long loads
    for table in TABLES:
        con.execute(f"CREATE TABLE {table} ({unkeyed(table)})")
        con.execute(f"INSERT INTO {table} SELECT * FROM read_parquet('{directory / (table + '.parquet')}')")
    return con


def unkeyed(table: str) -> str:
    """The table's columns without its PRIMARY KEY: DuckDB holds a key's index (ART) in memory,
    outside the buffer pool (SF 10's lineitem key did not fit in 1.5 GB); ``Refresh.apply``
    replaces rows by key without it."""
    columns = re.sub(r",\s*PRIMARY KEY \([^)]*\)", "", SCHEMA[table])
    return columns.replace(" PRIMARY KEY", "")


def create_tables(db) -> None:  # noqa: ANN001  (an ivm.Database)
    for table, columns in SCHEMA.items():
        db.execute(f"CREATE TABLE {table} ({columns})")


def load(db, con: duckdb.DuckDBPyConnection) -> None:  # noqa: ANN001
    """Copy every table of the reference into ivm (one insert batch per table)."""
    for table in TABLES:
        db.apply_changes(table, con.sql(f"SELECT * FROM {table}").to_arrow_table())


def load_files(db, directory: Path, con: duckdb.DuckDBPyConnection,  # noqa: ANN001
               loaded: Callable[[str], None] | None = None, piece_rows: int | None = None) -> None:
    """Load every table's Parquet file into ivm, as ``load`` does.

    Each batch is read row group by row group and handed over with one
    contiguous chunk per column (a stored run holds one chunk per column, and
    combining a whole chunked table at once would hold it twice). The types
    are the reference's (the files hold string_view where the tables hold
    strings). With ``piece_rows``, a table comes in pieces (``read_pieces``)
    so the load's transient is a piece, not the table (TPC-H SF 10's lineitem
    is ~10 GB in Arrow); without, in one batch.
    """
    for table in TABLES:
        schema = con.sql(f"SELECT * FROM {table} LIMIT 0").to_arrow_table().schema
        for batch in read_pieces(directory / f"{table}.parquet", schema, piece_rows):
            db.apply_changes(table, batch)
            del batch
            pa.default_memory_pool().release_unused()
        if loaded is not None:
            loaded(table)


def read_pieces(path: Path, schema: pa.Schema, first_rows: int | None = None) -> Iterator[pa.Table]:
    """A Parquet file as tables of ``schema`` with one chunk per column: one table when
    ``first_rows`` is None, else pieces of whole row groups: the first of at most ``first_rows``
    rows, each later one of fewer than 1/PROBE_COST of the rows before it (a piece has at least
    one row group). Smaller later pieces keep the insert's key check a probe of the stored runs:
    a batch of 1/PROBE_COST or more of a relation's rows reads the whole relation instead
    (storage/relation.py), a copy of it, and joins it with the batch.

    Row groups are read one at a time and cast (new buffers per column); when a piece is
    complete, each column's pieces are concatenated and dropped before the next column's.
    """
    import pyarrow.parquet as pq

    from storage.relation import PROBE_COST

    file = pq.ParquetFile(path)
    pieces: list[list[pa.Array]] = [[] for _ in schema]
    held = stored = 0
    for group in range(file.metadata.num_row_groups):
        limit = first_rows if stored == 0 else (stored - 1) // PROBE_COST
        if first_rows is not None and held and held + file.metadata.row_group(group).num_rows > limit:
            yield _contiguous(pieces, schema)
            stored, held = stored + held, 0
        rows = file.read_row_group(group, columns=schema.names)
        for i, field in enumerate(schema):
            pieces[i].extend(rows.column(field.name).cast(field.type).chunks)
        held += rows.num_rows
        del rows
    if held or not stored:
        yield _contiguous(pieces, schema)


def _contiguous(pieces: list[list[pa.Array]], schema: pa.Schema) -> pa.Table:
    columns = []
    for i, field in enumerate(schema):
        chunks, pieces[i] = pieces[i], []
        columns.append(pa.concat_arrays(chunks) if chunks else pa.array([], field.type))
        del chunks
    return pa.Table.from_arrays(columns, schema=schema)


@dataclass
class Refresh:
    """Generates change batches against the tables held by ``con`` and applies them there."""

    con: duckdb.DuckDBPyConnection
    seed: int = 1
    new_orders: int = 10
    deleted_orders: int = 10
    updates: int = 20  # rows per updated table
    step: int = 0

    def _sample(self, table: str, n: int, salt: int) -> str:
        keys = ", ".join(KEYS[table])
        return (f"(SELECT * FROM {table} ORDER BY hash({keys}, {self.seed}, {self.step}, {salt}) LIMIT {n})")

    def batches(self) -> list[tuple[str, pa.Table]]:
        """One refresh: (table, changes with __op) in the order to apply them."""
        self.step += 1
        out = self._new_orders()
        for salt, (table, columns) in enumerate(UPDATES.items()):
            out.append((table, self._updates(table, columns, salt)))
        return out + self._deletes()  # after the updates, which may touch the deleted rows

    def _new_orders(self) -> list[tuple[str, pa.Table]]:
        start = self.con.execute("SELECT max(o_orderkey) + 1 FROM orders").fetchone()[0]
        self.con.execute(
            f"""CREATE OR REPLACE TEMP TABLE __renum AS
                SELECT o_orderkey AS old, {start} + row_number() OVER (ORDER BY o_orderkey) AS new
                FROM {self._sample('orders', self.new_orders, 101)}"""
        )
        # A new order belongs to any customer, also one that had none (Q13, Q22 change).
        orders = self.con.sql(
            f"""SELECT r.new AS o_orderkey,
                       CAST(1 + hash(r.new, {self.seed}) % (SELECT max(c_custkey) FROM customer) AS BIGINT) AS o_custkey,
                       o.* EXCLUDE (o_orderkey, o_custkey), 'c' AS __op
               FROM orders o JOIN __renum r ON o.o_orderkey = r.old"""
        ).to_arrow_table()
        lines = self.con.sql(
            """SELECT r.new AS l_orderkey, l.* EXCLUDE (l_orderkey), 'c' AS __op
               FROM lineitem l JOIN __renum r ON l.l_orderkey = r.old"""
        ).to_arrow_table()
        return [("orders", _reorder(orders, "orders")), ("lineitem", _reorder(lines, "lineitem"))]

    def _deletes(self) -> list[tuple[str, pa.Table]]:
        self.con.execute(
            f"CREATE OR REPLACE TEMP TABLE __gone AS SELECT o_orderkey FROM {self._sample('orders', self.deleted_orders, 202)}"
        )
        lines = self.con.sql(
            "SELECT l.*, 'd' AS __op FROM lineitem l WHERE l_orderkey IN (SELECT o_orderkey FROM __gone)"
        ).to_arrow_table()
        orders = self.con.sql(
            "SELECT o.*, 'd' AS __op FROM orders o WHERE o_orderkey IN (SELECT o_orderkey FROM __gone)"
        ).to_arrow_table()
        return [("lineitem", lines), ("orders", orders)]

    def _updates(self, table: str, columns: dict[str, str], salt: int) -> pa.Table:
        keys = ", ".join(KEYS[table])
        replaced = ", ".join(f"{expr} AS {name}" for name, expr in columns.items())
        sample = self._sample(table, self.updates, 300 + salt)
        rows = self.con.sql(
            f"""SELECT * REPLACE ({replaced}), 'u' AS __op
                FROM (SELECT *, CAST(hash({keys}, {self.seed}, {self.step}) % 1000 AS INTEGER) AS h FROM {sample})"""
        ).to_arrow_table()
        return _reorder(rows.drop_columns(["h"]), table)

    def apply(self, table: str, changes: pa.Table) -> None:
        """Apply a batch to the reference tables (as ivm applies it)."""
        ops = changes.column("__op").to_pylist()
        assert len(set(ops)) <= 1, "one kind of operation per batch"
        rows = changes.drop_columns(["__op"])  # noqa: F841  (read by DuckDB)
        if not ops:
            return
        match = " AND ".join(f"r.{k} = {table}.{k}" for k in KEYS[table])
        self.con.execute(f"DELETE FROM {table} WHERE EXISTS (SELECT 1 FROM rows r WHERE {match})")
        if ops[0] != "d":  # inserts and upserts: the row replaces any row of its key
            self.con.execute(f"INSERT INTO {table} SELECT * FROM rows")


def _reorder(rows: pa.Table, table: str) -> pa.Table:
    """Columns in the table's order, then __op."""
    names = [c.split()[0] for c in SCHEMA[table].split(", ") if not c.startswith("PRIMARY KEY")]
    names = [n for n in names if n in rows.column_names]
    return rows.select(names + ["__op"])


# --- what is incremental ---------------------------------------------------------------


def incrementality(explain: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(operators of note, source table -> whole-relation reads a change to it may run) from EXPLAIN.

    Each read is "relations (step)": a top-K refill runs only when deletions
    leave the buffer shorter than LIMIT + OFFSET; every other marked step runs
    whenever its inputs are not empty.
    """
    notes = []
    text = "\n".join(explain)
    for marker, label in (("AntiJoin", "anti join"), ("SemiJoin", "semi join"), ("EXCEPT", "EXCEPT"),
                          ("INTERSECT", "INTERSECT"), ("=MIN(", "MIN"), ("=MAX(", "MAX"),
                          ("(DISTINCT", "aggregate over DISTINCT values"), ("TopK ", "top-K"),
                          ("Window ", "window"), ("Recursive ", "recursion")):
        if marker in text:
            notes.append(label)
    if "number of matching right rows" in text:
        notes.append("per-row match counts (non-equi correlation)")
    reads: dict[str, list[str]] = {}
    source = None
    for line in explain:
        if line.startswith("on a change to "):
            source = line[len("on a change to "):].rstrip(":")
            reads[source] = []
        elif source and " := " in line and "[reads all of " in line:
            step, _, relations = line.split(" := ", 1)[1].partition("  [reads all of ")
            kind = "top-K refill" if step.startswith("refill:") else step.strip()
            reads[source].append(f"{relations.split(']')[0]} ({kind})")
    return notes, {s: sorted(set(r)) for s, r in reads.items()}


def report(db, names) -> None:  # noqa: ANN001
    print("| query | operators of note | whole-relation reads a change may run (step) |")
    print("| --- | --- | --- |")
    for name in names:
        notes, reads = incrementality(db.sql(f"EXPLAIN {name}").column(0).to_pylist())
        scans = "; ".join(f"{s}: {', '.join(r)}" for s, r in reads.items() if r) or "none"
        print(f"| {name} | {', '.join(notes) or '-'} | {scans} |")


# --- the benchmark -------------------------------------------------------------------


def _ms(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] * 1000


def per_query(directory: Path, scale: float, refreshes: int, new_orders: int, check: bool,
              only: list[str] | None = None) -> int:
    """Each query alone in its own database, under the same refreshes; DuckDB recomputes it after each.

    A refresh is 10 change batches (new orders, their lineitems, updates of six
    tables, deleted lineitems and orders); its maintenance time is the sum of
    the ``apply_changes`` calls. Recompute runs the query once on DuckDB over
    the tables as they are after the same refresh. Both are reported as wall
    time and as CPU time of the process (all its threads): on a shared
    machine the CPU times are the steadier measure.
    """
    import ivm

    queries = {n: s for n, s in query_files().items() if not only or n in only}
    start = reference(directory)
    initial = {t: start.sql(f"SELECT * FROM {t}").to_arrow_table() for t in TABLES}
    start.close()
    con = reference(directory)
    refresh = Refresh(con, new_orders=new_orders, deleted_orders=new_orders)
    stream, recompute, recompute_cpu = [], {name: [] for name in queries}, {name: [] for name in queries}
    for _ in range(refreshes):
        batch = refresh.batches()
        for table, changes in batch:
            refresh.apply(table, changes)
        stream.append(batch)
        for name, sql in queries.items():
            began, cpu = time.perf_counter(), time.process_time()
            con.sql(sql).to_arrow_table()
            recompute[name].append(time.perf_counter() - began)
            recompute_cpu[name].append(time.process_time() - cpu)
    rows = sum(c.num_rows for _, c in stream[0])
    print(f"scale {scale}: {refreshes} refreshes of ~{rows} changed rows in {len(stream[0])} batches; "
          "each query alone in its own database")
    print("| query | maintain median ms | p95 ms | max ms | DuckDB recompute median ms | recompute / maintain "
          "| maintain CPU ms | recompute CPU ms | CPU ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, sql in queries.items():
        db = ivm.connect()
        create_tables(db)
        for table in TABLES:
            db.apply_changes(table, initial[table])
        db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
        times, cpu_times = [], []
        for batch in stream:
            began, cpu = time.perf_counter(), time.process_time()
            for table, changes in batch:
                db.apply_changes(table, changes)
            times.append(time.perf_counter() - began)
            cpu_times.append(time.process_time() - cpu)
        problem = ""
        if check:
            from tests.oracle.compare import multiset_diff

            if without_limit(sql) == sql:  # top-K results with ties are checked by tests/test_tpch.py
                diff = multiset_diff(db.sql(f"SELECT * FROM {name}"), con.sql(sql).to_arrow_table())
                problem = f" DIFFERS: {diff}" if diff else ""
        db.close()
        maintain, again = statistics.median(times), statistics.median(recompute[name])
        maintain_cpu, again_cpu = statistics.median(cpu_times), statistics.median(recompute_cpu[name])
        print(f"| {name} | {maintain * 1000:.1f} | {_ms(times, 95):.1f} | {max(times) * 1000:.1f} | "
              f"{again * 1000:.1f} | {again / maintain:.2f} | {maintain_cpu * 1000:.1f} | {again_cpu * 1000:.1f} | "
              f"{again_cpu / maintain_cpu:.2f} |{problem}")
    con.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--new-orders", type=int, default=10)
    parser.add_argument("--data", type=Path, default=None, help="directory for the generated Parquet files")
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN of every view")
    parser.add_argument("--report", action="store_true", help="print which parts of each view are incremental")
    parser.add_argument("--check", action="store_true", help="compare every view with DuckDB after each batch")
    parser.add_argument("--per-query", action="store_true",
                        help="one database per view: each query's maintenance time vs its recompute in DuckDB")
    parser.add_argument("--queries", default="", help="with --per-query: only these (e.g. q01,q03)")
    args = parser.parse_args()

    import ivm
    from ivm.errors import UnsupportedError

    directory = args.data or Path(tempfile.mkdtemp(prefix="tpch"))
    generate(args.scale, directory)
    if args.per_query:
        return per_query(directory, args.scale, args.batches, args.new_orders, args.check,
                         [q for q in args.queries.split(",") if q])
    con = reference(directory)
    db = ivm.connect()
    create_tables(db)
    load(db, con)
    created = {}
    for name, sql in query_files().items():
        try:
            db.execute(f"CREATE MATERIALIZED VIEW {name} AS {sql}")
            created[name] = sql
        except UnsupportedError as e:
            print(f"{name}: not created: {e}")
    if args.report:
        report(db, created)
        return 0
    if args.explain:
        for name in created:
            print("\n".join(db.sql(f"EXPLAIN {name}").column(0).to_pylist()))
            print()
        return 0
    refresh = Refresh(con, new_orders=args.new_orders, deleted_orders=args.new_orders)
    times: list[float] = []
    recompute: list[float] = []
    for _ in range(args.batches):
        batch = refresh.batches()
        start = time.perf_counter()
        for table, changes in batch:
            db.apply_changes(table, changes)
        times.append(time.perf_counter() - start)
        for table, changes in batch:
            refresh.apply(table, changes)
        start = time.perf_counter()
        results = {name: con.sql(sql).to_arrow_table() for name, sql in created.items()}
        recompute.append(time.perf_counter() - start)
        if args.check:
            from tests.oracle.compare import multiset_diff

            for name, want in results.items():
                diff = multiset_diff(db.sql(f"SELECT * FROM {name}"), want)
                if diff:
                    print(f"{name}: {diff}")
    rows = sum(len(c) for _, c in batch)
    print(f"scale {args.scale}: {len(created)} views, {args.batches} refreshes of ~{rows} changed rows "
          f"(in {len(batch)} batches each)")
    print(f"incremental: median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms per refresh")
    print(f"recompute of all views in DuckDB: median {statistics.median(recompute) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
