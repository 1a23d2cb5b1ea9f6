"""Debezium change events -> ``__op`` batches of one table.

Input is newline-delimited JSON, one Debezium event per line: the bare
envelope ``{"before": …, "after": …, "op": …, "source": {…}, "ts_ms": …}`` or
the JSON converter's ``{"schema": {…}, "payload": {…}}`` around it. An empty
line, ``null`` or a wrapper whose payload is null is a tombstone (Kafka's
compaction marker after a delete) and is skipped.

    op   becomes
    c    c (insert) of after
    r    r (snapshot read: insert or replace) of after
    u    u (upsert) of after; d of before then c of after when before has
         another key (a key change) or the table has no key
    d    d of before (only its key columns are needed)
    t    d of every row the table holds at that point (truncate)

Positions make re-delivery idempotent. Each event's position is, by the
first kind every event of the chunk has: ``source.sequence`` (Debezium's
PostgreSQL ``["last commit lsn", "lsn"]``, ordered even across interleaved
transactions), ``source.lsn``, or ``ts_ms``. Positions must not go backwards.
A batch is applied with ``source=<name>, seq=<its last position>``; events
at or below the source's last applied position are skipped (already
applied), except snapshot reads (``r``) sharing that exact position, which
Debezium gives one position for a whole snapshot: those are re-applied as
upserts, which is harmless because nothing later has been applied.

Parsing, validation and casting are vectorised in DuckDB (its JSON
functions) over the chunk's lines. Every problem names its line; a chunk
with any malformed event applies nothing. A chunk without truncates is one
atomic batch; a truncate splits it into batches applied in order.
Debezium's numeric temporal encodings are understood: DATE as days,
TIMESTAMP as micro- (default), milli- (``io.debezium.time.Timestamp`` in
the schema) or nanoseconds, TIME as microseconds. DECIMAL must arrive as a
number or string (``decimal.handling.mode=double|string``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import IO, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ivm.execute import duck
from ivm.binder import quote
from ivm.ingest.changes import OP
from sql_frontend.errors import ChangeError
from sql_frontend.plan import Column

OPS = ("c", "r", "u", "d", "t")
CHUNK_LINES = 100_000
KINDS = ("sequence", "lsn", "ts_ms")
TIME_UNITS = {"io.debezium.time.Timestamp": "ms", "io.debezium.time.MicroTimestamp": "us",
              "io.debezium.time.NanoTimestamp": "ns"}


@dataclass
class Segment:
    """One batch to apply: rows (table columns + __op), or a truncate (rows None)."""

    rows: pa.Table | None
    seq: int | None


@dataclass
class Result:
    events: int = 0
    applied: int = 0
    skipped: int = 0
    tombstones: int = 0
    offsets: list[int] = field(default_factory=list)

    def add(self, other: "Result") -> None:
        self.events += other.events
        self.applied += other.applied
        self.skipped += other.skipped
        self.tombstones += other.tombstones
        self.offsets += other.offsets

    def as_dict(self) -> dict:
        return {"events": self.events, "applied": self.applied, "skipped": self.skipped,
                "tombstones": self.tombstones, "offsets": self.offsets}


def _path(column: str) -> str:
    return "'$.\"" + column.replace("'", "''").replace('"', '\\"') + "\"'"


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class Parser:
    """Turns chunks of event lines into segments for one table."""

    def __init__(self, table: str, columns: tuple[Column, ...], key: tuple[str, ...]):
        self.table, self.columns, self.key = table, columns, key
        self.con = duck.connect(1)  # event text is data, yet nothing here needs a file either
        self.kind: str | None = None  # fixed by the first chunk

    def close(self) -> None:
        self.con.close()

    # --- validation ---------------------------------------------------------------
    def _first(self, sql: str) -> tuple | None:
        return self.con.execute(sql + " ORDER BY line_no LIMIT 1").fetchone()

    def _fail(self, sql: str, message: str) -> None:
        row = self._first(sql)
        if row is not None:
            raise ChangeError(f"Debezium event at line {row[0]}: " + message.format(*row[1:]))

    def _load(self, lines: pa.Array, first_line: int) -> int:
        numbers = pa.array(np.arange(first_line, first_line + len(lines), dtype=np.int64))
        self.con.register("lines", pa.table({"line_no": numbers, "line": lines}))
        blank = "trim(line) IN ('', 'null')"
        self._fail(f"SELECT line_no FROM lines WHERE NOT {blank} AND NOT json_valid(line)", "not valid JSON")
        wrapped = ("(json_type(j) = 'OBJECT' AND json_exists(j, '$.payload') AND json_exists(j, '$.schema'))")
        self.con.execute(f"""
            CREATE OR REPLACE TEMP TABLE ev AS
            WITH v AS (SELECT line_no, CAST(line AS JSON) AS j FROM lines WHERE NOT {blank}),
                 p AS (SELECT line_no, j, CASE WHEN {wrapped} THEN j->'$.payload' ELSE j END AS p FROM v)
            SELECT line_no, json_type(p) AS ptype, p->>'$.op' AS op,
                   p->'$.before' AS b, p->'$.after' AS a,
                   coalesce(json_type(p->'$.before'), 'NULL') AS btype,
                   coalesce(json_type(p->'$.after'), 'NULL') AS atype,
                   p->>'$.source.sequence' AS sequence, p->>'$.source.lsn' AS lsn,
                   coalesce(p->>'$.source.ts_ms', p->>'$.ts_ms') AS ts_ms,
                   j->'$.schema' AS schema
            FROM p""")
        tombstones = self.con.execute(
            f"SELECT (SELECT count(*) FROM lines WHERE {blank}) + (SELECT count(*) FROM ev WHERE ptype = 'NULL')"
        ).fetchone()[0]
        self.con.execute("DELETE FROM ev WHERE ptype = 'NULL'")
        return int(tombstones)

    def _validate(self) -> None:
        ops = ", ".join(_lit(o) for o in OPS)
        self._fail("SELECT line_no, ptype FROM ev WHERE ptype <> 'OBJECT'", "an event must be a JSON object, not {}")
        self._fail("SELECT line_no FROM ev WHERE op IS NULL", "the event has no op (expected c, r, u, d or t)")
        self._fail(f"SELECT line_no, op FROM ev WHERE op NOT IN ({ops})",
                   "unknown op {!r} (expected c, r, u, d or t)")
        self._fail("SELECT line_no, op, atype FROM ev WHERE op IN ('c', 'r', 'u') AND atype <> 'OBJECT'",
                   "a {!r} event needs an after object, not {}")
        self._fail("SELECT line_no, btype FROM ev WHERE op = 'd' AND btype <> 'OBJECT'",
                   "a 'd' event needs a before object (the deleted row's key), not {}")
        if not self.key:
            self._fail("SELECT line_no FROM ev WHERE op = 'u' AND btype <> 'OBJECT'",
                       f"table {self.table} has no primary key, so a 'u' event needs the whole before row "
                       "(REPLICA IDENTITY FULL upstream)")
        names = "[" + ", ".join(_lit(c.name) for c in self.columns) + "]"
        for side, obj in (("after", "a"), ("before", "b")):
            self._fail(f"SELECT line_no, k FROM (SELECT line_no, unnest(json_keys({obj})) AS k FROM ev "
                       f"WHERE {obj[0]}type = 'OBJECT') WHERE NOT list_contains({names}, lower(k))",
                       f"{side} has field {{!r}}, which is not a column of {self.table} "
                       "(did the upstream schema change?)")
        for c in self.columns:
            self._fail(f"SELECT line_no FROM ev WHERE atype = 'OBJECT' AND NOT json_exists(a, {_path(c.name)})",
                       f"after lacks column {c.name} of {self.table} (did the upstream schema change?)")
        for k in self.key:
            self._fail(f"SELECT line_no FROM ev WHERE op = 'd' AND json_extract_string(b, {_path(k)}) IS NULL",
                       f"the 'd' event's before has no value for key column {k}")

    # --- positions ------------------------------------------------------------------
    def _positions(self) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        meta = self.con.sql("""
            SELECT line_no, op,
                   TRY_CAST(json_extract_string(CAST(sequence AS JSON), '$[0]') AS UBIGINT) AS s0,
                   TRY_CAST(json_extract_string(CAST(sequence AS JSON), '$[1]') AS UBIGINT) AS s1,
                   TRY_CAST(lsn AS UBIGINT) AS lsn, TRY_CAST(ts_ms AS UBIGINT) AS ts_ms,
                   sequence IS NOT NULL AND json_valid(sequence) AND s1 IS NOT NULL AS has_sequence
            FROM ev ORDER BY line_no""").to_arrow_table()
        n = meta.num_rows
        if self.kind is None and n:
            has = {"sequence": meta.column("has_sequence"), "lsn": pc.is_valid(meta.column("lsn")),
                   "ts_ms": pc.is_valid(meta.column("ts_ms"))}
            self.kind = next((k for k in KINDS if has[k][0].as_py()), "none")  # the first event's best
        if self.kind in (None, "none"):
            return meta, np.zeros(n, np.uint64), np.zeros(n, np.uint64)
        if self.kind == "sequence":
            missing = pc.invert(meta.column("has_sequence"))
            hi = meta.column("s0").fill_null(0).to_numpy()
            lo = meta.column("s1").fill_null(0).to_numpy()
        else:
            missing = pc.is_null(meta.column(self.kind))
            hi, lo = meta.column(self.kind).fill_null(0).to_numpy(), np.zeros(n, np.uint64)
        if pc.any(missing).as_py():
            line = meta.column("line_no").filter(missing)[0].as_py()
            raise ChangeError(f"Debezium event at line {line}: it has no source.{self.kind}, which earlier events "
                              "have (positions must be of one kind)")
        back = np.flatnonzero((hi[1:] < hi[:-1]) | ((hi[1:] == hi[:-1]) & (lo[1:] < lo[:-1])))
        if back.size:
            line = meta.column("line_no")[int(back[0]) + 1].as_py()
            raise ChangeError(f"Debezium event at line {line}: its position ({self.kind}) is below the previous "
                              "event's; positions must not go backwards (use a connector that sends "
                              "source.sequence)")
        return meta, hi.astype(np.uint64), lo.astype(np.uint64)

    # --- values ---------------------------------------------------------------------
    def _time_units(self) -> dict[str, str]:
        """Column -> unit of numeric timestamps, from the schemas the events carry."""
        units: dict[str, str] = {}
        for (text,) in self.con.execute("SELECT DISTINCT CAST(schema AS VARCHAR) FROM ev WHERE schema IS NOT NULL"
                                        ).fetchall():
            schema = json.loads(text) or {}
            for part in schema.get("fields") or []:
                if part.get("field") != "after":
                    continue
                for f in part.get("fields") or []:
                    unit = TIME_UNITS.get(f.get("name"))
                    if unit and units.setdefault(str(f.get("field")).lower(), unit) != unit:
                        raise ChangeError(f"Debezium events disagree on the time unit of column {f.get('field')}")
        return units

    def _value(self, obj: str, column: Column, units: dict[str, str]) -> str:
        raw = f"json_extract_string({obj}, {_path(column.name)})"
        number = f"json_type({obj}, {_path(column.name)}) IN ('BIGINT', 'UBIGINT')"
        kind = column.type.upper()
        if kind == "DATE":
            return f"CASE WHEN {number} THEN DATE '1970-01-01' + TRY_CAST({raw} AS INTEGER) ELSE TRY_CAST({raw} AS DATE) END"
        if kind.startswith("TIMESTAMP") and "TIME ZONE" not in kind and kind != "TIMESTAMPTZ":
            micros = {"ms": f"TRY_CAST({raw} AS BIGINT) * 1000", "ns": f"TRY_CAST({raw} AS BIGINT) // 1000"}.get(
                units.get(column.name, "us"), f"TRY_CAST({raw} AS BIGINT)")
            return f"CASE WHEN {number} THEN make_timestamp({micros})::{column.type} ELSE TRY_CAST({raw} AS {column.type}) END"
        if kind == "TIME":
            return (f"CASE WHEN {number} THEN TIME '00:00:00' + to_microseconds(TRY_CAST({raw} AS BIGINT)) "
                    f"ELSE TRY_CAST({raw} AS TIME) END")
        return f"TRY_CAST({raw} AS {column.type})"

    def _rows(self, keep: np.ndarray, line_nos: pa.Array) -> pa.Table:
        units = self._time_units()
        moved = ("TRUE" if not self.key else "(btype = 'OBJECT' AND (" + " OR ".join(
            f"json_extract_string(b, {_path(k)}) IS DISTINCT FROM json_extract_string(a, {_path(k)})"
            for k in self.key) + "))")

        def side(obj: str) -> str:
            cols = []
            for c in self.columns:
                value = self._value(obj, c, units)
                raw = f"json_extract_string({obj}, {_path(c.name)})"
                cols.append(f"{value} AS {quote(c.name)}")
                cols.append(f"CASE WHEN {raw} IS NOT NULL AND ({value}) IS NULL THEN {raw} END AS {quote('__bad_' + c.name)}")
            return ", ".join(cols)

        rows = self.con.sql(f"""
            WITH e AS (SELECT * FROM ev)
            SELECT line_no, 0 AS part, 'd' AS {OP}, {side('b')} FROM e WHERE op = 'd' OR (op = 'u' AND {moved})
            UNION ALL
            SELECT line_no, 1 AS part, CASE WHEN op = 'u' AND {moved} THEN 'c' ELSE op END, {side('a')}
            FROM e WHERE op IN ('c', 'r', 'u')
            ORDER BY line_no, part""").to_arrow_table()
        for c in self.columns:
            bad = rows.column("__bad_" + c.name)
            if bad.null_count < rows.num_rows:
                at = pc.is_valid(bad)
                line = rows.column("line_no").filter(at)[0].as_py()
                hint = (" (send decimals as numbers or strings: decimal.handling.mode=double or string)"
                        if c.type.upper().startswith("DECIMAL") else "")
                raise ChangeError(f"Debezium event at line {line}: column {c.name} of {self.table} is {c.type}, "
                                  f"and {bad.filter(at)[0].as_py()!r} cannot be converted{hint}")
        # Every event is checked (a skipped one too: a bad event is never "already applied").
        kept = pc.is_in(rows.column("line_no"), value_set=line_nos.filter(pa.array(keep)))
        return rows.filter(kept).select(["line_no", OP] + [c.name for c in self.columns])

    # --- the whole chunk ----------------------------------------------------------------
    def parse(self, lines: pa.Array, first_line: int, last: int | None) -> tuple[list[Segment], Result]:
        """Segments to apply for a chunk, skipping events at or below position ``last``."""
        result = Result(tombstones=self._load(lines, first_line))
        self._validate()
        meta, hi, lo = self._positions()
        result.events = meta.num_rows
        keep = np.ones(meta.num_rows, bool)
        replay = np.zeros(meta.num_rows, bool)
        if last is not None and self.kind not in (None, "none"):
            lhi, llo = np.uint64(last >> 64), np.uint64(last & ((1 << 64) - 1))
            above = (hi > lhi) | ((hi == lhi) & (lo > llo))
            replay = (hi == lhi) & (lo == llo) & pc.equal(meta.column("op"), "r").to_numpy(zero_copy_only=False)
            keep = above | replay
        result.skipped = int(meta.num_rows - keep.sum())
        result.applied = int(keep.sum())
        rows = self._rows(keep, meta.column("line_no").combine_chunks())
        if not keep.any():
            return [], result
        return self._segments(meta, hi, lo, keep, replay, rows), result

    def _segments(self, meta: pa.Table, hi: np.ndarray, lo: np.ndarray, keep: np.ndarray, replay: np.ndarray,
                  rows: pa.Table) -> list[Segment]:
        """Split kept events into ordered batches: at truncates, and after re-applied snapshot reads."""
        positioned = self.kind not in (None, "none")
        idx = np.flatnonzero(keep)
        is_t = pc.equal(meta.column("op"), "t").to_numpy(zero_copy_only=False)[idx]
        rep = replay[idx]
        boundary = np.ones(len(idx), bool)
        boundary[1:] = is_t[1:] | is_t[:-1] | (rep[1:] != rep[:-1])
        starts = np.flatnonzero(boundary)
        ends = np.append(starts[1:], len(idx))
        lines = meta.column("line_no").to_numpy()
        row_lines = rows.column("line_no").to_numpy()
        segments = []
        for s, e in zip(starts, ends):  # one iteration per batch, not per event
            last = idx[e - 1]
            seq = (int(hi[last]) << 64) | int(lo[last]) if positioned and not rep[s] else None
            if is_t[s]:
                segments.append(Segment(None, seq))
                continue
            mask = (row_lines >= lines[idx[s]]) & (row_lines <= lines[last])
            segments.append(Segment(rows.filter(pa.array(mask)).drop_columns(["line_no"]), seq))
        return segments


def read_chunks(stream: IO[bytes], lines: int = CHUNK_LINES) -> Iterator[tuple[pa.Array, int]]:
    """(lines, number of the first) per chunk of a newline-delimited stream."""
    first, buffered = 1, []
    for raw in stream:
        buffered.append(raw.rstrip(b"\r\n").decode("utf-8", errors="replace"))
        if len(buffered) >= lines:
            yield pa.array(buffered, pa.string()), first
            first += len(buffered)
            buffered = []
    if buffered:
        yield pa.array(buffered, pa.string()), first


def last_position(db, source: str) -> int | None:
    """The last applied seq of a producer source (None when it has applied nothing)."""
    found = db.producer_position(source)
    return None if found is None else found[0]


def ingest(db, table: str, chunks, source: str | None = None) -> Result:
    """Apply Debezium events (chunks of lines) to ``table``; return what happened."""
    table = table.lower()
    definition = db.table_definition(table)
    source = source or f"debezium:{table}"
    parser = Parser(table, definition.columns, definition.primary_key)
    total = Result()
    try:
        for lines, first in chunks:
            segments, result = parser.parse(lines, first, last_position(db, source))
            for segment in segments:
                result.offsets.append(_apply(db, definition, segment, source))
            total.add(result)
    finally:
        parser.close()
    return total


def ingest_text(db, table: str, text: bytes | str, source: str | None = None) -> Result:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    chunks = ((pa.array(lines[i:i + CHUNK_LINES], pa.string()), i + 1) for i in range(0, len(lines), CHUNK_LINES))
    return ingest(db, table, chunks, source)


def _apply(db, definition, segment: Segment, source: str) -> int:
    rows = segment.rows
    if rows is None:  # truncate: delete every row the table holds now
        columns = ", ".join(quote(c) for c in definition.identity)
        current = db.sql(f"SELECT {columns} FROM {quote(definition.name)}")
        rows = current.append_column(OP, pa.repeat(pa.scalar("d"), current.num_rows))
    if segment.seq is None:
        return db.apply_changes(definition.name, rows)
    return db.apply_changes(definition.name, rows, source=source, seq=segment.seq)
