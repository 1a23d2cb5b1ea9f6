"""The streaming half of a PostgreSQL source: pgoutput messages -> grouped table batches -> confirmed LSNs.

See ivm/cdc/postgres.py for the contract. Decoding is per message (the wire
protocol is); rows are collected as text per column and turned into Arrow
batches per table and group, cast in bulk by ``apply_changes``.

Schema changes. pgoutput sends a Relation message (the table's columns)
before the first change of a table in a session and again before the first
change after an upstream ALTER TABLE. Each table's rows in a transaction are
kept with the columns they were decoded with (a ``SCHEMA`` entry before
them); a table's rows split into parts where those change, as they do at a
TRUNCATE, so every part has one shape and its own sequence number. A part
whose columns differ from the local table's is preceded by the ALTER TABLEs
that make them equal (``_follow``), so the table changes shape exactly
between the rows before and after the upstream change. The ALTER is
idempotent by comparison (a resent part finds the table already altered), so
it needs no sequence number of its own. A transaction that changes a
table's columns is applied alone, like one with a TRUNCATE: grouped with
others its parts would be numbered differently than when it is resent.
A change ivm cannot follow fails that table alone (``_fail``), as does a
part whose values do not fit the table (``about_the_data``). ``refresh``
(ALTER SOURCE … REFRESH TABLE) loads one table again from upstream.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from dataclasses import dataclass, field
import queue
from typing import Any, ContextManager, Iterator, Protocol

import duckdb
import pyarrow as pa

from ivm.binder import quote
from ivm.cdc import pgoutput
from ivm.cdc.upstream import PART_BITS, Refresh, SourceError, describe_table, duck_type, lsn_int, lsn_text
from ivm.ingest.changes import OP
from ivm.schema_change import is_widening
from sql_frontend.errors import ChangeError, InternalError, IvmError


class Slot(Protocol):
    name: str  # the source's
    publication: str
    slot: str


class Replicating(Protocol):
    """The source's replicator as its stream sees it (ivm/cdc/postgres.py ``Replicator``): the database
    it feeds, its state and progress files, and its connections to the upstream PostgreSQL."""

    db: Any  # the ivm Database (ivm/database.py), through its public methods only
    config: Slot
    state: dict
    progress: dict
    requests: queue.Queue  # Refresh requests, served between two transactions
    batch_rows: int
    batch_seconds: float

    def save(self) -> None: ...

    def report(self, force: bool = False) -> None: ...

    def connect(self) -> Any: ...

    def replication_connection(self) -> Any: ...

    def create_slot(self, replication, slot: str, temporary: bool = False) -> tuple[int, str]: ...

    def reading(self, snapshot_name: str) -> ContextManager[Any]: ...

    def copy_rows(self, cur, upstream: str, table: dict) -> Iterator[pa.Table]: ...

log = logging.getLogger("ivm.sources")

TRUNCATE = "t"
SCHEMA = "s"  # (SCHEMA, columns): the rows after it were decoded with these columns
IDLE = 0.02  # seconds without a message after which pending transactions are applied


@dataclass
class Transaction:
    commit_lsn: int = 0
    end_lsn: int = 0
    commit_time: float = 0.0
    changes: dict[str, list] = field(default_factory=dict)  # local table -> [(op, values)]
    rows: int = 0
    truncates: bool = False
    reshaped: bool = False  # a table's columns changed: applied alone (see the module docstring)
    received: float = 0.0  # when its commit arrived
    first_part: dict[str, int] = field(default_factory=dict)  # resent truncate parts: the first not applied


class Stream:
    def __init__(self, replicator: Replicating, connection):
        self.r, self.connection = replicator, connection
        self.by_upstream = replicator.state["tables"]
        self.relations: dict[int, dict] = {}  # oid -> the table, with the columns its changes are decoded with now
        self.tx: Transaction | None = None
        self.pending: list[Transaction] = []
        self.pending_rows = 0
        self.applied = {t["table"]: self._applied_seq(t["table"]) for t in self.by_upstream.values()}
        self._catalog = None  # a plain connection upstream, for what a Relation message leaves out
        # Tables that stopped following upstream (their state says why): their changes are skipped.
        self.failed = {t["table"]: t["error"] for t in self.by_upstream.values() if t.get("error")}
        present = {o.name for o in self.r.db.objects()}
        for table, why in self.failed.items():  # (again: a crash may have come before a checkpoint kept the mark)
            if table in present:
                self.r.db.fail_table(table, why)

    def source(self, table: str) -> str:
        return f"pg:{self.r.config.name}:{table}"

    def _applied_seq(self, table: str) -> int:
        found = self.r.db.producer_position(self.source(table))
        return -1 if found is None else found[0]

    # --- the loop ----------------------------------------------------------------------
    def run(self, stop: threading.Event, deadline: float | None) -> None:
        cursor = self.connection.cursor()
        self.cursor = cursor
        cursor.start_replication(slot_name=self.r.config.slot, decode=False,
                                 options={"proto_version": "1", "publication_names": self.r.config.publication})
        try:
            self._loop(cursor, stop, deadline)
        finally:
            self._refuse_requests()
        self._flush()
        self.r.report(force=True)
        if self._catalog is not None:
            self._catalog.close()

    def _loop(self, cursor, stop: threading.Event, deadline: float | None) -> None:
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            if self.tx is None and not self.r.requests.empty():  # between two transactions
                # Applying what came before is the stream's own work: its failure stops the source (_serve
                # reports a request's failure to the request only, and the stream goes on).
                self._flush()
                self._serve(self.r.requests.get())
            message = cursor.read_message()
            if message is not None:
                try:
                    self._on(pgoutput.decode(message.payload))
                except SourceError:
                    self._flush()  # keep (and confirm) every transaction committed before the problem
                    raise
                self.r.progress["received_lsn"] = self._text(cursor.wal_end)
                if self.pending_rows >= self.r.batch_rows or (
                        self.pending and time.time() - self.pending[0].received >= self.r.batch_seconds):
                    self._flush()
                continue
            # Nothing buffered: wait a moment for more (a backlog arrives in bursts) before applying.
            if self.pending and select.select([self.connection], [], [], IDLE)[0]:
                continue
            self._flush()
            self._lag()
            self.r.report()
            select.select([self.connection], [], [], 0.2)

    def _serve(self, request: Refresh) -> None:
        """Do what another thread asked (ALTER SOURCE … REFRESH TABLE); its error goes to it, not the source."""
        try:
            self.refresh(request.table)
        except Exception as e:  # noqa: BLE001 - reported to the statement that asked
            request.error = e
        except BaseException:  # the stream is being stopped: so is the request
            request.error = SourceError(f"cannot refresh table {request.table}: source {self.r.config.name} "
                                             "stopped during it")
            raise
        finally:
            request.done.set()

    def _refuse_requests(self) -> None:
        """The stream stops: a request still waiting will not be served."""
        while not self.r.requests.empty():
            request = self.r.requests.get()
            request.error = SourceError(f"cannot refresh table {request.table}: source {self.r.config.name} "
                                             "stopped before it could")
            request.done.set()

    def _text(self, lsn: int) -> str:

        return lsn_text(lsn)

    def _lag(self) -> None:
        progress = self.r.progress
        confirmed = progress.get("confirmed_lsn")
        wal_end = self.cursor.wal_end
        if confirmed and wal_end:
            progress["lag_bytes"] = max(0, wal_end - lsn_int(confirmed)) if self.pending or self.tx else 0
        oldest = self.pending[0].commit_time if self.pending else None
        progress["lag_seconds"] = round(time.time() - oldest, 3) if oldest else 0.0

    # --- messages ----------------------------------------------------------------------------
    def _on(self, m) -> None:
        if isinstance(m, pgoutput.Begin):
            self.tx = Transaction(commit_lsn=m.final_lsn, commit_time=m.commit_time)
        elif isinstance(m, pgoutput.RelationInfo):
            self._relation(m)
        elif isinstance(m, pgoutput.Change):
            self._change(m)
        elif isinstance(m, pgoutput.Truncate):
            for oid in m.oids:
                table = self.relations[oid]["table"]
                self.tx.changes.setdefault(table, []).append((TRUNCATE, None))
            self.tx.truncates = True
        elif isinstance(m, pgoutput.Commit):
            tx, self.tx = self.tx, None
            tx.commit_lsn, tx.end_lsn, tx.received = m.lsn, m.end_lsn, time.time()
            self._drop_applied(tx)
            alone = tx.truncates or tx.reshaped
            if alone:  # parts of one transaction keep their order and numbers: apply it on its own
                self._flush()
            self.pending.append(tx)
            self.pending_rows += tx.rows
            if alone:
                self._flush()

    def _relation(self, m: pgoutput.RelationInfo) -> None:
        upstream = f"{m.namespace}.{m.name}"
        table = self.by_upstream.get(upstream)
        if table is None:
            raise SourceError(f"upstream table {upstream} was added to publication {self.r.config.publication} "
                                   "after the snapshot; drop and create the source again to include it")
        seen = [(name.lower(), oid, typmod) for name, oid, typmod, _ in m.columns]
        current = self.relations.get(m.oid, table)["columns"]  # this session's decoding, else the table's
        if _signature(current, with_typmod=all("typmod" in c for c in current)) == \
                _signature([{"name": n, "oid": o, "typmod": t} for n, o, t in seen],
                           with_typmod=all("typmod" in c for c in current)):
            self.relations.setdefault(m.oid, table)
            return
        columns = self._columns(upstream, seen)
        self.relations[m.oid] = {**table, "upstream": upstream, "columns": columns}
        if self.tx is not None:
            self.tx.reshaped = True
            self.tx.changes.setdefault(table["table"], []).append((SCHEMA, columns))

    def _columns(self, upstream: str, seen: list[tuple[str, int, int]]) -> list[dict]:
        """The columns of a Relation message as the state records them (type None: one ivm cannot hold)."""

        with self._catalog_cursor() as cur:
            cur.execute("SELECT format_type(o, m) FROM unnest(%s::oid[], %s::int[]) WITH ORDINALITY AS x(o, m, i) "
                        "ORDER BY i", ([o for _, o, _ in seen], [t for _, _, t in seen]))
            pg_types = [r[0] for r in cur.fetchall()]
        return [{"name": name, "type": duck_type(pg_type), "pg_type": pg_type, "oid": oid, "typmod": typmod,
                 "not_null": False} for (name, oid, typmod), pg_type in zip(seen, pg_types)]

    @contextlib.contextmanager
    def _catalog_cursor(self):
        if self._catalog is None:
            self._catalog = self.r.connect()
        with self._catalog.cursor() as cur:
            yield cur

    def _change(self, m: pgoutput.Change) -> None:
        table = self.relations[m.oid]
        rows = self.tx.changes.get(table["table"])
        if rows is None:  # the table's first change in the transaction: say what shape its rows have
            rows = self.tx.changes[table["table"]] = [(SCHEMA, table["columns"])]
        names = [c["name"] for c in table["columns"]]
        key = [names.index(k) for k in table["key"]]
        if m.kind == "I":
            rows.append(("c", m.new))
        elif m.kind == "D":
            rows.append(("d", m.old))
        else:
            new = m.new
            if pgoutput.UNCHANGED in new:
                if m.old_kind != "O":
                    column = names[new.index(pgoutput.UNCHANGED)]
                    raise SourceError(f"an update of {table['table']} left the large (TOASTed) value of column "
                                           f"{column} out; set REPLICA IDENTITY FULL on the upstream table")
                new = [o if v is pgoutput.UNCHANGED else v for v, o in zip(new, m.old)]
            moved = not key or (m.old is not None and any(m.old[i] != new[i] for i in key))
            if moved:
                rows.append(("d", m.old))
                rows.append(("c", new))
            else:
                rows.append(("u", new))
        self.tx.rows += 1

    def _drop_applied(self, tx: Transaction) -> None:
        """Forget the tables of a resent transaction that applied it before a restart."""
        for table in list(tx.changes):
            parts = _parts(tx.changes[table])
            keep = [(i, p) for i, p in enumerate(parts) if (tx.commit_lsn << 16 | i) > self.applied[table]]
            if len(keep) == len(parts):
                continue
            if not keep:
                del tx.changes[table]
            else:
                tx.changes[table] = [row for _, (columns, rows) in keep
                                     for row in [*([(SCHEMA, columns)] if columns is not None else []), *rows]]
                tx.first_part[table] = keep[0][0]

    # --- applying ----------------------------------------------------------------------------
    def _flush(self) -> None:
        if not self.pending:
            return
        group, self.pending, self.pending_rows = self.pending, [], 0
        last = group[-1]
        tables: dict[str, list] = {}
        for tx in group:
            for table, rows in tx.changes.items():
                tables.setdefault(table, []).extend(rows)
        for table, rows in tables.items():
            first = last.first_part.get(table, 0) if len(group) == 1 else 0
            for i, (columns, part) in enumerate(_parts(rows)):
                self._apply(table, columns, part, last.commit_lsn << 16 | (first + i))
        self.cursor.send_feedback(write_lsn=last.end_lsn, flush_lsn=last.end_lsn, reply=True)
        progress = self.r.progress
        progress.update(applied_lsn=self._text(last.commit_lsn), confirmed_lsn=self._text(last.end_lsn),
                        last_commit_delay_seconds=round(time.time() - last.commit_time, 3))
        progress["transactions"] += len(group)
        progress["groups"] = progress.get("groups", 0) + 1
        progress["rows"] += sum(tx.rows for tx in group)
        self._lag()
        self.r.report()

    def _apply(self, table: str, columns: list[dict] | None, rows: list, seq: int) -> None:
        """Apply one part of a table's rows (decoded with ``columns``; None: a truncate), after the ALTER
        TABLEs that give the table those columns."""
        db = self.r.db
        if table in self.failed:
            return
        upstream, definition = next((u, t) for u, t in self.by_upstream.items() if t["table"] == table)
        if columns is not None and columns is not definition["columns"]:
            if [(c["name"], c["type"]) for c in columns] != db.table_columns(table):
                try:
                    self._follow(upstream, definition, columns)
                except IvmError as e:
                    self._fail(upstream, definition, f"upstream table {upstream} changed in a way ivm cannot "
                                                     f"follow: {e}")
                    return
            elif columns != definition["columns"]:  # the same local shape (varchar(20) -> text): record it
                self._record(definition, columns)
        names = [c["name"] for c in definition["columns"]]
        if rows and rows[0][0] == TRUNCATE:
            identity = definition["key"] or names
            current = db.sql(f"SELECT {', '.join(quote(c) for c in identity)} FROM {quote(table)}")
            batch = current.append_column(OP, pa.repeat(pa.scalar("d"), current.num_rows))
        else:
            values = list(zip(*[v for _, v in rows]))
            batch = pa.table({name: pa.array(values[i], pa.string()) for i, name in enumerate(names)})
            batch = batch.append_column(OP, pa.array([op for op, _ in rows], pa.string()))
        started = time.perf_counter()
        try:
            db.apply_changes(table, batch, source=self.source(table), seq=seq)
        except ChangeError as e:
            if not about_the_data(e):
                raise
            # apply_changes is atomic per call (a batch that does not convert is logged nowhere and moves
            # no table version), so nothing of this part was applied: the table stops before it.
            self._fail(upstream, definition, f"a change of upstream table {upstream} (commit LSN "
                       f"{self._text(seq >> PART_BITS)}) does not fit table {table}: {str(e).strip()}")
            return
        progress = self.r.progress
        progress["apply_seconds"] = round(progress.get("apply_seconds", 0.0) + time.perf_counter() - started, 3)
        self.applied[table] = seq


    # --- REFRESH TABLE ------------------------------------------------------------------------
    def refresh(self, table: str) -> None:
        """Load ``table`` again from upstream, as PostgreSQL's tablesync worker does; called between two
        transactions, once every transaction received before is applied (``_flush``).

        A TEMPORARY slot made now exports a snapshot: its consistent point L
        splits upstream's commits into those the snapshot holds (before L) and
        those the main stream applies (at or after L, as the apply worker
        applies a synced table's transactions whose commit LSN is at least its
        sync LSN). The table's rows are replaced in one ``apply_changes``
        batch (deletes of every row it holds, inserts of the snapshot's), so
        views change by the difference, with seq (L - 1) << 16 | 0xFFFF: the
        main stream, which has applied only commits before L, drops the
        table's changes committed before L (``_drop_applied``) and applies
        the rest. Then the table's failure, if any, is cleared: in the
        database (recover_table), then in the state.

        An upstream shape other than the local table's is followed first
        (``_alterations``, every row being loaded again); one that cannot be
        raises before anything changes. A table that follows upstream is
        marked failed before such ALTERs and stays failed when a later step
        fails, so a crash or an error never leaves a table half refreshed and
        readable: it is failed (refresh again) or refreshed, never between.
        """
        import psycopg2


        upstream, definition = next((u, t) for u, t in self.by_upstream.items() if t["table"] == table)
        name = self.r.config.name
        if self.pending or self.tx is not None:
            raise InternalError("REFRESH TABLE runs between two transactions, with every one received applied")
        for oid, known in list(self.relations.items()):
            if known is definition:  # the stream decodes what it receives before L with the columns it knows
                self.relations[oid] = {**definition}
        was_failed = table in self.failed
        replication = self.r.replication_connection()
        try:
            consistent, snapshot = self.r.create_slot(replication, self._refresh_slot(), temporary=True)
            with self.r.reading(snapshot) as cur:
                schema, relation = upstream.split(".", 1)
                cur.execute("SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND "
                            "tablename = %s", (self.r.config.publication, schema, relation))
                if cur.fetchone() is None:
                    raise SourceError(f"upstream table {upstream} is no longer in publication "
                                           f"{self.r.config.publication}")
                now = describe_table(cur, schema, relation)
                if now["key"] != definition["key"]:
                    raise SourceError(f"upstream table {upstream} now has {_key_text(now['key'])} where "
                                           f"table {table} has {_key_text(definition['key'])}, which ivm cannot "
                                           f"follow (DROP SOURCE {name}, DROP TABLE {table}, CREATE SOURCE again)")
                columns = now["columns"]
                statements = []
                if [(c["name"], c["type"]) for c in columns] != self.r.db.table_columns(table):
                    statements = self._alterations(upstream, definition, columns, rows_replaced=True)
                if statements and table not in self.failed:
                    self._fail(upstream, definition, f"ALTER SOURCE {name} REFRESH TABLE {table} was altering "
                                                     "it when it stopped")
                if statements:
                    self._alter(upstream, definition, columns, statements)
                elif columns != definition["columns"]:
                    self._record(definition, columns)  # the same local shape (varchar(20) -> text)
                batch = self._replacement(definition, list(self.r.copy_rows(cur, upstream, definition)))
            seq = (consistent - 1) << PART_BITS | ((1 << PART_BITS) - 1)
            if seq <= self.applied[table]:  # cannot be: the stream applied only what committed before the slot
                raise SourceError(f"table {table} has applied changes up to seq {self.applied[table]}, at or "
                                       f"after the snapshot's consistent point {self._text(consistent)}")
            self.r.db.apply_changes(table, batch, source=self.source(table), seq=seq)
            self.applied[table] = seq
        except (IvmError, psycopg2.Error) as e:
            why = str(e).strip() or type(e).__name__
            if table in self.failed and not was_failed:  # marked above, altered: the table stays failed
                self._fail(upstream, definition, f"ALTER SOURCE {name} REFRESH TABLE {table} failed: {why}")
            state = "is still failed" if table in self.failed else "follows upstream as before"
            raise SourceError(f"ALTER SOURCE {name} REFRESH TABLE {table} failed: {why}; the table {state}") \
                from e
        finally:
            replication.close()  # which drops the temporary slot
        if table in self.failed:
            self.r.db.recover_table(table)  # first: a crash before the state says so fails it again at the next open
            del self.failed[table]
            definition.pop("error", None)
            self.r.save()
        log.info("source %s: table %s loaded again from upstream at LSN %s (%d rows)", name, table,
                 self._text(consistent), batch.num_rows)

    def _refresh_slot(self) -> str:
        """A slot name of this process's own, within PostgreSQL's 63 characters."""
        self._refreshes = getattr(self, "_refreshes", 0) + 1
        suffix = f"_refresh_{os.getpid()}_{self._refreshes}"
        return self.r.config.slot[:63 - len(suffix)] + suffix

    def _replacement(self, definition: dict, loaded: list[pa.Table]) -> pa.Table:
        """One batch replacing every row the table holds by ``loaded`` (the snapshot's, text columns).

        Deletes name rows by the table's identity (its key, or every column
        of a table without one), as text cast by DuckDB, which reads back as
        the same value (apply_changes casts them as it does the inserts).
        """
        table = definition["table"]
        names = [c["name"] for c in definition["columns"]]
        identity = definition["key"] or names
        held = self.r.db.table_rows(table)
        with contextlib.closing(duckdb.connect()) as con:
            con.register("held", held)
            deletes = con.sql(f"SELECT {', '.join(f'CAST({quote(c)} AS VARCHAR) AS {quote(c)}' for c in identity)} "
                              "FROM held").to_arrow_table()
        deletes = deletes.append_column(OP, pa.repeat(pa.scalar("d"), deletes.num_rows))
        inserts = pa.concat_tables(loaded) if loaded else pa.table({n: pa.array([], pa.string()) for n in names})
        inserts = inserts.append_column(OP, pa.repeat(pa.scalar("c"), inserts.num_rows))
        return pa.concat_tables([deletes, inserts], promote_options="default").select([*names, OP])

    # --- schema changes -----------------------------------------------------------------------
    def _follow(self, upstream: str, definition: dict, columns: list[dict]) -> None:
        """ALTER the local table to ``columns`` (upstream's now): drops, widenings, then additions.

        Raises IvmError (SourceError, or the ALTER's own error) for a change
        ivm cannot follow, before any ALTER runs (``_alterations`` checks
        what ALTER TABLE would refuse).
        """
        statements = self._alterations(upstream, definition, columns)
        self._alter(upstream, definition, columns, statements)

    def _alter(self, upstream: str, definition: dict, columns: list[dict], statements: list[str]) -> None:
        for statement in statements:
            self.r.db.execute(statement)
        self._record(definition, columns)
        log.info("source %s: table %s follows upstream %s: %s", self.r.config.name, definition["table"], upstream,
                 "; ".join(statements))

    def _alterations(self, upstream: str, definition: dict, columns: list[dict],
                     rows_replaced: bool = False) -> list[str]:
        """The ALTER TABLEs that give the local table ``columns``; SourceError when ivm cannot follow.

        Checked before any runs, so that a change ivm cannot follow alters
        nothing: a type that is not a widening, a key column dropped, a
        column a materialized view reads dropped. (ALTER TABLE stays the
        judge: should it refuse one after another ran, that one stays.)
        With ``rows_replaced`` (REFRESH TABLE: every row is loaded again
        right after) the rows the table holds need no value for an added
        column, so only the order of the columns limits what is followed.
        """
        db, table = self.r.db, definition["table"]
        local = dict(db.table_columns(table))
        names = [c["name"] for c in columns]
        unsupported = [c for c in columns if c["type"] is None]
        if unsupported:
            raise SourceError(f"column {unsupported[0]['name']} of upstream table {upstream} now has type "
                                   f"{unsupported[0]['pg_type']}, which ivm cannot replicate")
        added = [c for c in columns if c["name"] not in local]
        kept = [n for n in local if n in names]
        if names != kept + [c["name"] for c in added]:
            raise SourceError(f"upstream table {upstream} has columns {', '.join(names)} where ivm's table "
                                   f"{table} has {', '.join(local)}: columns renamed or reordered, which ivm cannot "
                                   "follow")
        dropped = [n for n in local if n not in names]
        retyped = [c for c in columns if c["name"] in local and local[c["name"]] != c["type"]]
        for column in retyped:
            if not is_widening(local[column["name"]], column["type"]):
                raise SourceError(f"column {column['name']} of {table} cannot change from "
                                       f"{local[column['name']]} to {column['type']}: ivm changes a column's type only "
                                       "to a wider one")
        for name in dropped:
            if name in definition["key"]:
                raise SourceError(f"column {name} of upstream table {upstream} was dropped, and it is part of "
                                       f"the primary key of {table}")
            readers = db.views_reading(table, name)
            if readers:
                raise SourceError(f"cannot drop column {name} of table {table}: materialized view(s) "
                                       f"{', '.join(readers)} read it (drop them, or change upstream back)")
        facts = self._added_facts(upstream, [c["name"] for c in added]) if added and not rows_replaced else {}
        recorded = {c["name"]: c.get("attnum") for c in definition["columns"]}
        newest = max((n for n in recorded.values() if n is not None), default=None)
        statements = [f"ALTER TABLE {quote(table)} DROP COLUMN {quote(n)}" for n in dropped]
        statements += [f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(c['name'])} TYPE {c['type']}"
                       for c in retyped]
        for column in added:
            if rows_replaced:  # (the column's number is upstream's, from the snapshot's catalog)
                statements.append(f"ALTER TABLE {quote(table)} ADD COLUMN {quote(column['name'])} {column['type']}")
                continue
            attnum, missing, has_default = facts.get(column["name"], (None, None, False))
            if attnum is None:
                raise SourceError(f"column {column['name']} of upstream table {upstream} is gone upstream "
                                       "again: the value its existing rows had cannot be known")
            if newest is not None and attnum <= newest:  # a renamed column keeps its number
                raise SourceError(f"column {column['name']} of upstream table {upstream} is not new (it was "
                                       "renamed), which ivm cannot follow")
            if missing is None and has_default and db.sql(f"SELECT COUNT(*) FROM {quote(table)}").column(0)[0].as_py():
                raise SourceError(f"column {column['name']} of upstream table {upstream} was added with a "
                                       "volatile DEFAULT: PostgreSQL rewrote the existing rows without replicating "
                                       "their values")
            default = "" if missing is None else " DEFAULT '" + missing.replace("'", "''") + "'"
            statements.append(f"ALTER TABLE {quote(table)} ADD COLUMN {quote(column['name'])} "
                              f"{column['type']}{default}")
            column["attnum"] = attnum
        return statements

    def _record(self, definition: dict, columns: list[dict]) -> None:
        """The table's upstream columns are now ``columns`` (in the source's state)."""
        numbers = {c["name"]: c.get("attnum") for c in definition["columns"]}
        for column in columns:  # a column kept keeps its number
            column.setdefault("attnum", numbers.get(column["name"]))
        definition["columns"] = columns
        self.r.save()

    def _added_facts(self, upstream: str, names: list[str]) -> dict[str, tuple[int, str | None, bool]]:
        """Per added column: its number, the value rows older than it have (PostgreSQL's "missing
        value", as text; None: NULL), and whether it has a DEFAULT."""
        schema, name = upstream.split(".", 1)
        with self._catalog_cursor() as cur:
            cur.execute("SELECT lower(a.attname), a.attnum, CASE WHEN a.atthasmissing THEN a.attmissingval::text END, "
                        "d.adbin IS NOT NULL FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid "
                        "AND d.adnum = a.attnum WHERE a.attrelid = %s::regclass AND a.attnum > 0 "
                        "AND NOT a.attisdropped AND lower(a.attname) = ANY(%s)",
                        (f"{quote(schema)}.{quote(name)}", names))
            return {column: (attnum, _array_element(missing), has_default)
                    for column, attnum, missing, has_default in cur.fetchall()}

    def _fail(self, upstream: str, definition: dict, why: str) -> None:
        """The table stops following upstream: its error kept, its reads (and its views') raising it."""
        table = definition["table"]
        message = f"{why}; the table stopped replicating (the other tables of the source go on; once the cause " \
                  f"is fixed, ALTER SOURCE {self.r.config.name} REFRESH TABLE {table} loads it again)"
        self.failed[table] = definition["error"] = message
        self.r.save()
        self.r.db.fail_table(table, message)
        log.error("source %s: %s", self.r.config.name, message)


# DuckDB failures that say nothing about a batch's values: the machine, not the data. A ChangeError raised
# because of one of them (changes.py wraps DuckDB's errors while converting) must stop the source.
_NOT_ABOUT_THE_DATA = (duckdb.OutOfMemoryException, duckdb.IOException, duckdb.InterruptException,
                       duckdb.InternalException, duckdb.FatalException, duckdb.ConnectionException)


def about_the_data(error: BaseException) -> bool:
    """Whether ``apply_changes`` refused a batch for what it holds, so that only its table should fail.

    Exactly a ChangeError (ivm/ingest/changes.py: a value that does not convert to
    its column, a NULL in a NOT NULL or key column, a key inserted twice or
    deleted while missing, a column the table lacks), unless DuckDB failed
    under it for want of memory, disk or time. Every other error (a full
    disk: DiskFullError; the change log failed: LogError; the database
    closed; a table dropped locally) is about this database, not one
    table's data: it stops the source, which resumes where it stopped.
    """
    if not isinstance(error, ChangeError):
        return False
    return not isinstance(error.__cause__ or error.__context__, _NOT_ABOUT_THE_DATA)


def _key_text(key: list[str]) -> str:
    return f"primary key ({', '.join(key)})" if key else "no primary key"


def _signature(columns: list[dict], with_typmod: bool) -> list[tuple]:
    """What a Relation message says of each column (the type modifier too, when recorded)."""
    return [(c["name"], c["oid"], c["typmod"] if with_typmod else None) for c in columns]


def _array_element(text: str | None) -> str | None:
    """The one element of a PostgreSQL array's text (``{5}``, ``{"a b"}``; ``{NULL}``: None)."""
    if text is None:
        return None
    inner = text[1:-1]
    if inner.startswith('"'):
        out, escaped = [], False
        for ch in inner[1:-1]:
            if escaped or ch != "\\":
                out.append(ch)
                escaped = False
            else:
                escaped = True
        return "".join(out)
    return None if inner.upper() == "NULL" else inner


def _parts(rows: list) -> list[tuple[list[dict] | None, list]]:
    """Split a table's rows at truncates and where their columns change: [(columns, rows)], in order.

    A SCHEMA entry gives the columns of the rows after it; it starts a new
    part only when rows of other columns came before it.
    """
    parts, current, columns = [], [], None
    for row in rows:
        if row[0] == SCHEMA:
            if current and row[1] != columns:
                parts.append((columns, current))
                current = []
            columns = row[1]
        elif row[0] == TRUNCATE:
            if current:
                parts.append((columns, current))
            parts.append((None, [row]))
            current = []
        else:
            current.append(row)
    if current:
        parts.append((columns, current))
    return parts
