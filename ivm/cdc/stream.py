"""The streaming half of a PostgreSQL source: pgoutput messages -> grouped table batches -> confirmed LSNs.

See ivm/cdc/postgres.py for the contract. Decoding is per message (the wire
protocol is); rows are collected as text per column and turned into Arrow
batches per table and group, cast in bulk by ``apply_changes``.
"""

from __future__ import annotations

import select
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from ivm.binder import quote
from ivm.cdc import pgoutput
from ivm.changes import OP

if TYPE_CHECKING:
    from ivm.cdc.postgres import Replicator

TRUNCATE = "t"
IDLE = 0.02  # seconds without a message after which pending transactions are applied


@dataclass
class Transaction:
    commit_lsn: int = 0
    end_lsn: int = 0
    commit_time: float = 0.0
    changes: dict[str, list] = field(default_factory=dict)  # local table -> [(op, values)]
    rows: int = 0
    truncates: bool = False
    received: float = 0.0  # when its commit arrived
    first_part: dict[str, int] = field(default_factory=dict)  # resent truncate parts: the first not applied


class Stream:
    def __init__(self, replicator: "Replicator", connection):
        from ivm.cdc.postgres import SourceError, lsn_int

        self.r, self.connection = replicator, connection
        self.SourceError, self.lsn_int = SourceError, lsn_int
        self.by_upstream = replicator.state["tables"]
        self.relations: dict[int, dict] = {}  # oid -> recorded table
        self.tx: Transaction | None = None
        self.pending: list[Transaction] = []
        self.pending_rows = 0
        self.applied = {t["table"]: self._applied_seq(t["table"]) for t in self.by_upstream.values()}

    def source(self, table: str) -> str:
        return f"pg:{self.r.config.name}:{table}"

    def _applied_seq(self, table: str) -> int:
        found = self.r.db._engine.producers.last().get(self.source(table))
        return -1 if found is None else found[0]

    # --- the loop ----------------------------------------------------------------------
    def run(self, stop: threading.Event, deadline: float | None) -> None:
        cursor = self.connection.cursor()
        self.cursor = cursor
        cursor.start_replication(slot_name=self.r.config.slot, decode=False,
                                 options={"proto_version": "1", "publication_names": self.r.config.publication})
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            message = cursor.read_message()
            if message is not None:
                try:
                    self._on(pgoutput.decode(message.payload))
                except self.SourceError:
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
            self.r._report()
            select.select([self.connection], [], [], 0.2)
        self._flush()
        self.r._report(force=True)

    def _text(self, lsn: int) -> str:
        from ivm.cdc.postgres import lsn_text

        return lsn_text(lsn)

    def _lag(self) -> None:
        progress = self.r.progress
        confirmed = progress.get("confirmed_lsn")
        wal_end = self.cursor.wal_end
        if confirmed and wal_end:
            progress["lag_bytes"] = max(0, wal_end - self.lsn_int(confirmed)) if self.pending or self.tx else 0
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
            if tx.truncates:  # parts of one transaction keep their order: apply it on its own
                self._flush()
            self.pending.append(tx)
            self.pending_rows += tx.rows
            if tx.truncates:
                self._flush()

    def _relation(self, m: pgoutput.RelationInfo) -> None:
        upstream = f"{m.namespace}.{m.name}"
        table = self.by_upstream.get(upstream)
        if table is None:
            raise self.SourceError(f"upstream table {upstream} was added to publication {self.r.config.publication} "
                                   "after the snapshot; drop and create the source again to include it")
        seen = [(name.lower(), oid) for name, oid, _, _ in m.columns]
        recorded = [(c["name"], c["oid"]) for c in table["columns"]]
        if seen != recorded:
            raise self.SourceError(f"upstream table {upstream} changed: its columns are now "
                                   f"{', '.join(n for n, _ in seen)} (types {[o for _, o in seen]}), recorded "
                                   f"{', '.join(n for n, _ in recorded)} (types {[o for _, o in recorded]}); "
                                   "the source stopped before that change")
        self.relations[m.oid] = table

    def _change(self, m: pgoutput.Change) -> None:
        table = self.relations[m.oid]
        rows = self.tx.changes.setdefault(table["table"], [])
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
                    raise self.SourceError(f"an update of {table['table']} left the large (TOASTed) value of column "
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
                tx.changes[table] = [row for _, p in keep for row in p]
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
            for i, part in enumerate(_parts(rows)):
                self._apply(table, part, last.commit_lsn << 16 | (first + i))
        self.cursor.send_feedback(write_lsn=last.end_lsn, flush_lsn=last.end_lsn, reply=True)
        progress = self.r.progress
        progress.update(applied_lsn=self._text(last.commit_lsn), confirmed_lsn=self._text(last.end_lsn),
                        last_commit_delay_seconds=round(time.time() - last.commit_time, 3))
        progress["transactions"] += len(group)
        progress["groups"] = progress.get("groups", 0) + 1
        progress["rows"] += sum(tx.rows for tx in group)
        self._lag()
        self.r._report()

    def _apply(self, table: str, rows: list, seq: int) -> None:
        db = self.r.db
        definition = next(t for t in self.by_upstream.values() if t["table"] == table)
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
        db.apply_changes(table, batch, source=self.source(table), seq=seq)
        progress = self.r.progress
        progress["apply_seconds"] = round(progress.get("apply_seconds", 0.0) + time.perf_counter() - started, 3)
        self.applied[table] = seq


def _parts(rows: list) -> list[list]:
    """Split a table's rows at truncates: [rows before], [truncate], [rows after], …"""
    parts, current = [], []
    for row in rows:
        if row[0] == TRUNCATE:
            if current:
                parts.append(current)
            parts.append([row])
            current = []
        else:
            current.append(row)
    if current:
        parts.append(current)
    return parts
