"""Follow a PostgreSQL publication: initial snapshot, then logical replication (pgoutput).

    ivm replicate --data DIR --dsn 'host=… dbname=…' --publication P [--slot S]
    CREATE SOURCE name FROM POSTGRES CONNECTION 'dsn' PUBLICATION 'P' [SLOT 'S']

A source's state lives in ``DIR/sources/<name>.json`` (written atomically):
its configuration, the phase (snapshot -> streaming, or failed with the
error) and the upstream tables with their columns. Progress (LSNs, lag) is
in ``DIR/sources/<name>.progress.json``, read by ``ivm status``.

1. Snapshot. First every check that can fail (``Replicator.check``):
   PostgreSQL reachable with logical decoding, the slot name free, the
   publication's tables replicable, and each local table of the same name a
   table with the same columns, types and key that holds no rows. Only then
   are missing tables created and the state saved with phase "snapshot"
   (naming the tables it fills); then the slot is
   created with ``EXPORT_SNAPSHOT`` on a replication connection; another
   connection reads every published table with ``SET TRANSACTION SNAPSHOT``
   (exactly the data before the slot's consistent point) through ``COPY …
   TO STDOUT (FORMAT csv)``, parsed by Arrow and applied as ``r`` rows. Then
   the phase becomes "streaming". A crash during the snapshot cannot resume
   it (the exported snapshot died with its connection): the next start
   drops the slot, deletes the rows loaded so far and starts again. That
   is safe because a snapshot only ever fills tables that were empty when
   it began; a check that fails changes no table and starts no snapshot.
   A new source whose snapshot fails (a value that does not fit its column,
   PostgreSQL gone) is undone before the error reaches the caller: slot
   dropped, tables it created dropped, rows it loaded deleted, state
   forgotten (``Replicator.begin``/``undo``); CREATE SOURCE returns only
   once the snapshot is consistent.
2. Streaming. ``START_REPLICATION`` of pgoutput from the slot's confirmed
   LSN. Committed transactions are grouped (until the stream is idle for
   20 ms, or ``batch_rows`` rows, or ``batch_seconds`` after the first) and
   applied per table with ``apply_changes(table, batch,
   source="pg:<name>:<table>", seq=<commit LSN> << 16 | part)``.
   Only after every table of a group is durable is the group's end LSN
   confirmed (``send_feedback(flush_lsn=…)``). After a restart PostgreSQL
   resends what was not confirmed; per table, changes of a transaction whose
   seq the table has already applied are dropped, so nothing is applied
   twice (the database's idempotent producers check the same again).
3. Upstream tables need a primary key or ``REPLICA IDENTITY FULL`` (without
   a key the local table is a bag). Tables fail one by one (ivm/cdc/stream.py
   ``Stream._fail``): a part of a table's changes that ``apply_changes``
   refuses for its data (a value that does not convert to its column, a
   NULL or repeated key: ``about_the_data``) is not applied (the call is
   atomic) and fails that table alone: its error is kept in the source's
   state (``failed_tables``), reads of it and of its views raise it, its
   later changes are skipped, and the other tables go on; the group's LSN
   is confirmed once they are durable. Any other error (disk full, the
   change log failed, PostgreSQL gone) stops the source with the error in
   its state (``ivm status``); nothing confirmed is lost and nothing after
   it is confirmed, and every open resumes it where it stopped.
4. Schema changes (ivm/cdc/stream.py): a Relation message with other columns
   than the table's is applied to the local table by ``ALTER TABLE`` before
   the first change of the new shape, in order with the data: ADD COLUMN
   (existing rows get the default PostgreSQL gave them), DROP COLUMN, a
   widening type change. One ivm cannot follow (a column a view reads
   dropped, a narrowing type, a rename) alters nothing and fails that table
   alone, as in 3.
5. Recovery: ``ALTER SOURCE name REFRESH TABLE t`` (``Sources.refresh``)
   loads one table again, failed or not, on the source's stream thread
   between two transactions, as PostgreSQL's tablesync worker does: a
   TEMPORARY slot exporting its snapshot (``create_slot``), the table read
   in it (``reading``, ``copy_rows``), its rows replaced in one batch, and
   the main stream dropping the table's changes committed before the slot's
   consistent point (``Stream.refresh``). DROP SOURCE also ends a failure:
   the tables stay, ordinary tables with their rows.
Status (``sources_status``: SHOW SOURCES, ``ivm status``): the state
(snapshotting, streaming, failed, or stopped when no live process runs it),
the progress the source writes, and for a failed or stopped source what
pg_replication_slots says of its slot; past the source's
``wal_warning_seconds`` (CREATE SOURCE … WITH, default 60) a warning that the
slot holds WAL upstream, and how much.

A transaction touching several tables is applied as one batch per table, so
a read between them can see part of it; every read after the group sees all.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.csv as pacsv

from ivm.binder import quote
from ivm.ingest.changes import OP
from ivm.cdc.upstream import Refresh, SourceError, check_upstream, describe, lsn_int, lsn_text
from sql_frontend.errors import IvmError, UnsupportedError

WAL_WARNING_SECONDS = 60.0  # default: a source failing or stopped this long warns that its slot holds WAL
UPSTREAM_FACTS_SECONDS = 1.0  # how long a slot's facts read from pg_replication_slots serve status calls
UPSTREAM_ERROR_SECONDS = 30.0  # ... and how long "cannot reach it" does (each try may wait the connect timeout)


@dataclass
class SourceConfig:
    name: str
    dsn: str
    publication: str
    slot: str
    wal_warning_seconds: float = WAL_WARNING_SECONDS


def _write_json(path: Path, doc: dict, sync: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def sources_dir(db) -> Path:
    if db.path is None:
        raise UnsupportedError("a PostgreSQL source needs a database on disk: start the server with "
                               "`ivm serve --data DIR`, or open it with `ivm.connect(DIR)`; a source confirms "
                               "LSNs upstream only once their changes are on disk")
    return Path(db.path) / "sources"


def _process_alive(pid) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def source_state(state: dict, progress: dict) -> str:
    """snapshotting | streaming | failed | stopped, from a source's state and progress files.

    A source runs in a process that says so in its progress file (``running``
    and its ``pid``); when that process is gone, or stopped it, the source is
    stopped, whatever phase it was in.
    """
    if state.get("error"):
        return "failed"
    if not (progress.get("running") and _process_alive(progress.get("pid"))):
        return "stopped"
    return "streaming" if state["phase"] == "streaming" else "snapshotting"


_slot_facts: dict[tuple[str, str], tuple[float, dict]] = {}  # (dsn, slot) -> (when read, facts)
_slot_facts_lock = threading.Lock()


def slot_facts(dsn: str, slot: str) -> dict:
    """What PostgreSQL says of a slot: exists, active, retained_bytes (WAL it holds), lag_bytes; or error.

    Read again at most every UPSTREAM_FACTS_SECONDS (status is polled), with a
    short connect timeout; an unreachable server is tried again only after
    UPSTREAM_ERROR_SECONDS, so that a dashboard polling SHOW STATUS does not
    wait for the timeout every time.
    """
    import psycopg2

    key = (dsn, slot)
    with _slot_facts_lock:
        found = _slot_facts.get(key)
        if found is not None and time.monotonic() - found[0] < (
                UPSTREAM_ERROR_SECONDS if "error" in found[1] else UPSTREAM_FACTS_SECONDS):
            return found[1]
    try:
        with contextlib.closing(psycopg2.connect(dsn, connect_timeout=3)) as conn, conn.cursor() as cur:
            cur.execute("SELECT active, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
                        "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
                        "FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            row = cur.fetchone()
        facts = {"exists": False} if row is None else \
            {"exists": True, "active": row[0], "retained_bytes": row[1], "lag_bytes": row[2]}
    except psycopg2.Error as e:
        facts = {"error": str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}
    with _slot_facts_lock:
        _slot_facts[key] = (time.monotonic(), facts)
    return facts


def _bytes_text(n: int) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"


def source_status(state: dict, progress: dict, now: float | None = None) -> dict:
    """One source's row of ``ivm status`` / SHOW SOURCES (see sources_status)."""
    now = time.time() if now is None else now
    current = source_state(state, progress)
    threshold = state.get("wal_warning_seconds", WAL_WARNING_SECONDS)
    row = {"name": state["name"], "kind": "postgres", "publication": state["publication"], "slot": state["slot"],
           "phase": state["phase"], "status": "failed: " + state["error"] if state.get("error") else "ok",
           "tables": sorted(t["table"] for t in state.get("tables", {}).values()),
           # tables that stopped following an upstream schema change (the others go on)
           "failed_tables": {t["table"]: t["error"] for t in state.get("tables", {}).values() if t.get("error")},
           **{k: v for k, v in progress.items() if k not in ("running", "pid")},
           "state": current, "last_error": state.get("error"), "warning": None}
    if current in ("failed", "stopped"):
        # Nothing follows the slot now: what it holds is what PostgreSQL says, not the last progress written.
        since = state.get("failed_since") if current == "failed" else progress.get("updated")
        facts = slot_facts(state["dsn"], state["slot"]) if state["phase"] != "new" else {"exists": False}
        row["lag_bytes"], row["lag_seconds"] = facts.get("lag_bytes"), None
        if facts.get("lag_bytes") == 0:
            row["lag_seconds"] = 0.0
        row["retained_wal_bytes"] = facts.get("retained_bytes")
        idle = None if since is None else now - since
        if facts.get("exists") is not False and idle is not None and idle >= threshold:
            held = (f"holds {_bytes_text(facts['retained_bytes'])} of WAL upstream" if "retained_bytes" in facts
                    else f"may hold WAL upstream (cannot read pg_replication_slots: {facts.get('error')})")
            doing = "failing" if current == "failed" else "stopped"
            row["warning"] = (f"source {state['name']} has been {doing} for {int(idle)} s and its replication "
                              f"slot {state['slot']} {held}, which PostgreSQL keeps until the source follows it "
                              f"again: fix the source, or DROP SOURCE {state['name']} to drop the slot")
    return row


def sources_status(path: str | os.PathLike) -> list[dict]:
    """Every source of the database at ``path``, from its files (and, for one not running, from upstream).

    Per source: name, kind, publication, slot, phase, status ("ok" or
    "failed: why"), tables, the progress the source last wrote (applied,
    confirmed and received LSN, lag_bytes, lag_seconds, transactions, rows
    applied, snapshot rows per table, updated), and ``state`` (snapshotting,
    streaming, failed or stopped), ``last_error``, and ``warning`` when it
    has been failed or stopped for ``wal_warning_seconds`` while its slot
    exists upstream (naming how much WAL the slot retains when PostgreSQL
    can be asked). For a failed or stopped source lag_bytes is what
    pg_replication_slots says (None when unknown), not the last progress.
    """
    found = []
    for state_file in sorted((Path(path) / "sources").glob("*.json")):
        if state_file.name.endswith(".progress.json"):
            continue
        state = json.loads(state_file.read_text())
        progress_file = state_file.with_name(state["name"] + ".progress.json")
        progress = json.loads(progress_file.read_text()) if progress_file.exists() else {}
        found.append(source_status(state, progress))
    return found


class Replicator:
    """Runs one source: snapshot if needed, then streaming, until stopped.

    ``say``, when given, is told what the source does in plain lines: the
    rows of each snapshot table, then every ``say_every`` seconds the rows
    applied, the confirmed LSN and the lag (``ivm replicate`` prints them).
    """

    def __init__(self, db, config: SourceConfig, *, batch_rows: int = 50_000, batch_seconds: float = 0.1,
                 auto: bool = False, say: Callable[[str], None] | None = None, say_every: float = 10.0):
        import psycopg2  # noqa: F401  (fail early and clearly when the driver is missing)

        self.db, self.config = db, config
        self.batch_rows, self.batch_seconds = batch_rows, batch_seconds
        self.dir = sources_dir(db)
        self.state_file = self.dir / f"{config.name}.json"
        self.progress_file = self.dir / f"{config.name}.progress.json"
        self.state: dict = {}
        self.auto = auto  # runs inside the database (CREATE SOURCE), resumed by every open
        self.progress = {"applied_lsn": None, "confirmed_lsn": None, "received_lsn": None, "lag_bytes": 0,
                         "lag_seconds": 0.0, "last_commit_delay_seconds": None, "transactions": 0, "rows": 0,
                         "snapshot_rows": {}}
        self._last_progress = 0.0
        self.say, self.say_every = say, say_every
        self._last_said = time.monotonic()
        self._made_slot = False  # this run created the slot (so undoing a failed snapshot drops it)
        self._made_tables: list[str] = []  # local tables this run created
        self._new = False  # this run made the source (it had no state file)
        # Work the stream thread does between two transactions for other threads (REFRESH TABLE): Refresh items.
        self.requests: queue.Queue[Refresh] = queue.Queue()

    # --- state ------------------------------------------------------------------------
    def save(self) -> None:
        _write_json(self.state_file, self.state, sync=True)

    def report(self, force: bool = False) -> None:
        now = time.time()
        if force or now - self._last_progress >= 0.5:
            self.progress["updated"] = now
            _write_json(self.progress_file, self.progress, sync=False)
            self._last_progress = now
        if self.say is not None and self.state.get("phase") == "streaming" and \
                time.monotonic() - self._last_said >= self.say_every:
            self._last_said = time.monotonic()
            p = self.progress
            lag = f"{p.get('lag_bytes') or 0} bytes, {p.get('lag_seconds') or 0.0} s"
            self.say(f"source {self.config.name}: streaming: {p['rows']} rows applied "
                     f"({p['transactions']} transactions), confirmed LSN {p.get('confirmed_lsn')}, lag {lag}")

    def _load(self) -> None:
        c = self.config
        if self.state_file.exists():
            self.state = json.loads(self.state_file.read_text())
            if (self.state["publication"], self.state["slot"]) != (c.publication, c.slot):
                raise SourceError(f"source {c.name} follows publication {self.state['publication']} with slot "
                                  f"{self.state['slot']}; drop it to follow another")
            if self.state.get("auto") and not self.auto:
                raise SourceError(f"source {c.name} was made by CREATE SOURCE and runs inside the database "
                                  "whenever it is open (ivm serve); ivm replicate does not run it")
            self.state["dsn"] = c.dsn
            self.config.wal_warning_seconds = self.state.get("wal_warning_seconds", c.wal_warning_seconds)
        else:
            self.state = {"name": c.name, "dsn": c.dsn, "publication": c.publication, "slot": c.slot,
                          "phase": "new", "tables": {}, "error": None, "auto": self.auto,
                          "wal_warning_seconds": c.wal_warning_seconds}
        if self.progress_file.exists():
            self.progress.update(json.loads(self.progress_file.read_text()))

    def _fail(self, message: str) -> None:
        """Record why the source stopped, and since when it has been failing (the WAL warning counts from it)."""
        self.state["error"] = message
        self.state.setdefault("failed_since", None)
        if self.state["failed_since"] is None:
            self.state["failed_since"] = time.time()

    # --- running ------------------------------------------------------------------------
    def run(self, seconds: float | None = None, stop: threading.Event | None = None) -> None:
        """Snapshot (when needed), then stream until ``stop`` is set or ``seconds`` pass."""
        connection = self.begin()
        self.follow(connection, stop, seconds)

    def begin(self):
        """Snapshot (when needed), and return the replication connection to stream from.

        A source that has no state file yet (new: CREATE SOURCE, or the first
        ``ivm replicate``) and fails before its snapshot is consistent leaves
        nothing behind: no state, no slot upstream, no table it created, no row
        in a table it found empty (see ``undo``). A snapshot cut short by a
        crash is started again by the next run instead (see the module
        docstring); when that fails, the source stays, failed, until DROP SOURCE.
        """
        new = self._new = not self.state_file.exists()
        self._load()
        self.progress.update(running=True, pid=os.getpid())
        try:
            if self.state["phase"] != "streaming":
                connection = self._snapshot()
            else:
                connection = self.replication_connection()
            self.state.update(error=None, failed_since=None)
            self.save()
            return connection
        except Exception as e:
            if new:
                raise self.undo(e) from e
            self._stopped(e)
            raise SourceError(_message(e)) from e

    def follow(self, connection, stop: threading.Event | None = None, seconds: float | None = None) -> None:
        """Stream from ``connection`` (``begin``'s) until ``stop`` is set or ``seconds`` pass, or a failure."""
        import psycopg2

        stop = stop or threading.Event()
        deadline = None if seconds is None else time.monotonic() + seconds
        try:
            try:
                self._stream(connection, stop, deadline)
            finally:
                connection.close()
        except (IvmError, psycopg2.Error) as e:
            self._stopped(e)
            raise SourceError(_message(e)) from e
        except BaseException:  # KeyboardInterrupt in ivm replicate: stopped, not failed
            self._stopped(None)
            raise
        self._stopped(None)

    def _stopped(self, error: Exception | None) -> None:
        """The source no longer runs here: record why (``error``; None: it was asked to stop)."""
        if error is not None:
            self._fail(_message(error))
            if self.state_file.exists():
                self.save()
        self.progress["running"] = False
        if self.state_file.exists():  # a source that has no state has no progress either
            self.report(force=True)

    def abandon(self) -> SourceError:
        """Undo a CREATE SOURCE that a crash cut short in its snapshot (its state says ``creating``).

        Its caller never heard that it succeeded, so it is undone as a failure
        would have been (``undo``): the slot (the name was checked free, so it
        is this source's), the tables it created, the rows it loaded.
        """
        self._load()
        self._made_slot = True
        self._made_tables = list(self.state.get("made_tables", []))
        return self.undo(SourceError(f"the process stopped during it, before CREATE SOURCE {self.config.name} "
                                     "returned"))

    def undo(self, error: BaseException) -> SourceError:
        """Undo a new source whose snapshot failed: the error to raise, saying what could not be undone.

        Drops the slot if this run made it, deletes the rows the snapshot
        loaded into tables it found empty, drops the tables it created (or
        empties one a view now reads), and forgets the source.
        """
        import psycopg2

        message = _message(error)
        if self.state.get("phase") not in (None, "new"):
            message = f"source {self.config.name} could not take its snapshot: {message}"
        left = []
        if self._made_slot:
            try:
                self._drop_slot(wait=10.0)
            except psycopg2.Error as e:
                left.append(f"its replication slot {self.config.slot} is left upstream ({str(e).strip()}): drop it "
                            f"there with SELECT pg_drop_replication_slot('{self.config.slot}')")
        dropped = set()
        for name in reversed(self._made_tables):
            try:
                self.db.execute(f"DROP TABLE {quote(name)}")
                dropped.add(name)
            except IvmError as e:  # a view was made on it meanwhile: it stays, emptied below
                left.append(f"table {name} stays, empty ({e})")
        try:
            self._clear_tables(skip=dropped)
        except IvmError as e:
            left.append(f"the tables it loaded could not all be emptied ({e})")
        for path in (self.state_file, self.progress_file):
            path.unlink(missing_ok=True)
        if left:
            message += "; nothing else was kept, except: " + "; ".join(left)
        return SourceError(message)

    def connect(self):
        import psycopg2

        connection = psycopg2.connect(self.config.dsn)
        connection.autocommit = True
        return connection

    def replication_connection(self):
        import psycopg2
        from psycopg2.extras import LogicalReplicationConnection

        return psycopg2.connect(self.config.dsn, connection_factory=LogicalReplicationConnection)

    # --- snapshot -------------------------------------------------------------------------
    def _snapshot(self):
        if self.state["phase"] == "snapshot":  # a snapshot was cut short: start it again
            self._drop_slot()
            self._clear_tables()
        tables = self.check()
        self.state["tables"] = tables
        self.progress.update(rows=0, transactions=0, snapshot_rows={}, confirmed_lsn=None, applied_lsn=None)
        self._create_tables()
        # From here on a restart empties these tables again: they are new or were empty (checked above).
        self.state.update(phase="snapshot", filling=sorted(t["table"] for t in tables.values()))
        if self.auto and self._new:
            # A CREATE SOURCE that has not returned: a crash before the snapshot is consistent undoes it at
            # the next open (abandon), as its failure would have.
            self.state.update(creating=True, made_tables=list(self._made_tables))
        self.save()
        self.report(force=True)
        replication = self.replication_connection()
        try:
            consistent, snapshot_name = self.create_slot(replication, self.config.slot)
            self._made_slot = True
            if self.say is not None:
                self.say(f"source {self.config.name}: snapshot of publication {self.config.publication} "
                         f"({len(tables)} tables) into slot {self.config.slot}")
            with self.reading(snapshot_name) as cur:
                for upstream, table in self.state["tables"].items():
                    self._copy(cur, upstream, table)
                    if self.say is not None:
                        self.say(f"  {table['table']}: {self.progress['snapshot_rows'][table['table']]} rows")
        except BaseException:
            replication.close()  # the slot is in use while its connection lives: undo drops it after this
            raise
        self.state.update(phase="streaming", consistent_lsn=lsn_text(consistent))
        for key in ("filling", "creating", "made_tables"):
            self.state.pop(key, None)
        self.progress["confirmed_lsn"] = self.state["consistent_lsn"]
        self.save()
        if self.say is not None:
            self.say(f"source {self.config.name}: snapshot done: {self.progress['rows']} rows at LSN "
                     f"{self.state['consistent_lsn']}; streaming")
            self._last_said = time.monotonic()  # the first streaming line comes say_every later
        self.report(force=True)
        return replication

    def create_slot(self, replication, slot: str, temporary: bool = False) -> tuple[int, str]:
        """Create a logical slot on ``replication`` exporting its snapshot: (consistent LSN, snapshot name).

        The snapshot sees exactly the transactions committed before the
        consistent point; the slot decodes those committed at or after it.
        It can be imported (``reading``) while ``replication`` stays open and
        idle. A TEMPORARY slot is dropped when that connection closes.
        """
        kind = "TEMPORARY LOGICAL" if temporary else "LOGICAL"
        cursor = replication.cursor()
        cursor.execute(f"CREATE_REPLICATION_SLOT {quote(slot)} {kind} pgoutput EXPORT_SNAPSHOT")
        _, consistent, snapshot_name, _ = cursor.fetchone()
        return lsn_int(consistent), snapshot_name

    @contextlib.contextmanager
    def reading(self, snapshot_name: str):
        """A cursor on a new connection reading in an exported snapshot (``create_slot``), read only."""
        reader = self.connect()
        try:
            reader.autocommit = False
            with reader.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
                yield cur
            reader.rollback()
        finally:
            reader.close()

    def _copy(self, cur, upstream: str, table: dict) -> None:
        """Load an upstream table into its local one, as ``r`` rows, batch by batch (the initial snapshot)."""
        loaded = self.progress["snapshot_rows"]
        loaded[table["table"]] = 0
        for rows in self.copy_rows(cur, upstream, table):
            rows = rows.append_column(OP, pa.repeat(pa.scalar("r"), rows.num_rows))
            try:
                self.db.apply_changes(table["table"], rows)
            except IvmError as e:
                raise SourceError(f"upstream table {upstream}: {str(e).strip()}") from e
            loaded[table["table"]] += rows.num_rows
            self.progress["rows"] += rows.num_rows
            self.report()

    def copy_rows(self, cur, upstream: str, table: dict) -> Iterator[pa.Table]:
        """The rows of an upstream table as ``cur``'s snapshot sees them: Arrow tables of text columns (the
        local table's types are DuckDB's casts of PostgreSQL's text, as for a streamed change)."""
        names = [c["name"] for c in table["columns"]]
        schema, name = upstream.split(".", 1)
        select_sql = f"SELECT {', '.join(quote(n) for n in names)} FROM {quote(schema)}.{quote(name)}"
        with tempfile.TemporaryFile(dir=self.dir) as spool:
            cur.copy_expert(f"COPY ({select_sql}) TO STDOUT WITH (FORMAT csv)", spool)
            if spool.tell() == 0:  # an empty table
                return
            spool.seek(0)
            # PostgreSQL's CSV writes NULL as an unquoted empty field and nothing else: not Arrow's default
            # null spellings, which would turn the text 'NA', 'null' or 'NaN' into NULL.
            options = pacsv.ConvertOptions(column_types={n: pa.string() for n in names}, null_values=[""],
                                           strings_can_be_null=True, quoted_strings_can_be_null=False)
            reader = pacsv.open_csv(spool, read_options=pacsv.ReadOptions(column_names=names, block_size=8 << 20),
                                    convert_options=options)
            for batch in reader:
                yield pa.Table.from_batches([batch])

    def check(self) -> dict:
        """The upstream tables a new snapshot loads, after every check that can fail; writes nothing.

        PostgreSQL must be reachable (also for replication) with logical
        decoding on, the slot name free, every published table replicable
        (see ``describe``), no two of them named alike here, and each local
        table of the same name written by no other source, and a table with
        the same columns, types and key that holds no rows: a snapshot fills
        its tables from empty, so that they equal upstream and a snapshot cut
        short can start again by emptying them. Raises SourceError naming
        every problem found.
        """
        import psycopg2

        c = self.config
        try:
            with contextlib.closing(self.connect()) as conn:
                tables = describe(conn, c.publication)
                check_upstream(conn, c.slot)
            self.replication_connection().close()  # pg_hba.conf and the REPLICATION attribute
        except psycopg2.Error as e:
            raise SourceError(f"cannot reach PostgreSQL for source {c.name}: {str(e).strip()}") from None
        problems = []
        local: dict[str, str] = {}
        for upstream, table in tables.items():
            if table["table"] in local:
                problems.append(f"upstream tables {local[table['table']]} and {upstream} would both replicate "
                                f"into table {table['table']}")
            local[table["table"]] = upstream
        others = self._tables_of_other_sources()
        problems += [f"table {table['table']} is written by source {others[table['table']]}"
                     for table in tables.values() if table["table"] in others]
        problems += [p for upstream, table in tables.items() if (p := self._local_problem(upstream, table))]
        if problems:
            raise SourceError(f"source {c.name} cannot replicate publication {c.publication}: {'; '.join(problems)}")
        return tables

    def _tables_of_other_sources(self) -> dict[str, str]:
        """local table -> the other source of this database that replicates into it."""
        found = {}
        for path in sorted(self.dir.glob("*.json")) if self.dir.exists() else []:
            if path.name.endswith(".progress.json") or path == self.state_file:
                continue
            other = json.loads(path.read_text())
            found.update({t["table"]: other["name"] for t in other.get("tables", {}).values()})
        return found

    def _local_problem(self, upstream: str, table: dict) -> str | None:
        """Why the local table of ``upstream`` cannot take its snapshot, or None (absent, or fit and empty)."""
        name = table["table"]
        kind = self.db.kind_of(name)
        if kind is None:
            return None
        if kind == "view":
            return f"{name} is a materialized view, which upstream {upstream} would replicate into"
        existing = self.db.table_definition(name)
        mine = [(col.name, col.type) for col in existing.columns]
        theirs = [(col["name"], col["type"]) for col in table["columns"]]
        if mine != theirs:
            return (f"table {name} has columns {_columns_text(mine)} but upstream {upstream} has "
                    f"{_columns_text(theirs)} ({_difference(mine, theirs)}); drop it first")
        if list(existing.primary_key) != table["key"]:
            return (f"table {name} has {_key_text(existing.primary_key)} but upstream {upstream} has "
                    f"{_key_text(table['key'])}; drop it first")
        held = self.db.sql(f"SELECT COUNT(*) AS n FROM {quote(name)}").column(0)[0].as_py()
        if held:
            return (f"table {name} already holds {held} rows: a source's snapshot fills its tables from empty "
                    f"(so that they equal upstream); DELETE FROM {name} or DROP TABLE {name} first")
        return None

    def _create_tables(self) -> None:
        """Create the local tables that do not exist yet (``check`` vetted those that do)."""
        for table in self.state["tables"].values():
            columns = ", ".join(f"{quote(c['name'])} {c['type']}" + (" NOT NULL" if c["not_null"] else "")
                                for c in table["columns"])
            key = f", PRIMARY KEY ({', '.join(quote(k) for k in table['key'])})" if table["key"] else ""
            if self.db.kind_of(table["table"]) is None:
                self.db.execute(f"CREATE TABLE {quote(table['table'])} ({columns}{key})")
                self._made_tables.append(table["table"])

    def _clear_tables(self, skip: set[str] = frozenset()) -> None:
        """Delete every row loaded by a snapshot that did not finish.

        Only the tables its state names as being filled (they were empty when
        it began); a state without that list (written before ivm recorded it)
        clears nothing, and the new snapshot's check then refuses tables that
        hold rows instead of emptying them.
        """
        objects = {o.name for o in self.db.objects()}
        for table in self.state["tables"].values():
            if table["table"] not in objects or table["table"] not in self.state.get("filling", ()) or \
                    table["table"] in skip:
                continue
            identity = table["key"] or [c["name"] for c in table["columns"]]
            rows = self.db.sql(f"SELECT {', '.join(quote(c) for c in identity)} FROM {quote(table['table'])}")
            if rows.num_rows:
                self.db.apply_changes(table["table"], rows.append_column(OP, pa.repeat(pa.scalar("d"), rows.num_rows)))

    def _drop_slot(self, wait: float = 0.0) -> None:
        """Drop the slot upstream if it exists; for up to ``wait`` seconds, wait for a connection just closed
        to release it (its walsender ends a moment after the client)."""
        import psycopg2
        import psycopg2.errors

        deadline = time.monotonic() + wait
        with contextlib.closing(self.connect()) as conn, conn.cursor() as cur:
            while True:
                try:
                    cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                                "WHERE slot_name = %s", (self.config.slot,))
                    return
                except psycopg2.errors.ObjectInUse:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.05)

    def drop(self) -> None:
        """Drop the upstream slot and forget the source (its tables stay).

        When PostgreSQL cannot be reached the slot cannot go, so neither does
        the source: SourceError, and nothing changes. A table that had stopped
        following an upstream schema change becomes readable again: like the
        source's other tables it now follows nothing and keeps its rows.
        """
        import psycopg2

        try:
            self._drop_slot(wait=10.0)
        except psycopg2.Error as e:
            raise SourceError(f"cannot drop replication slot {self.config.slot} of source {self.config.name} "
                              f"upstream: {str(e).strip()}; the source is kept (DROP SOURCE again once PostgreSQL "
                              "is reachable)") from None
        if self.state_file.exists():
            present = {o.name for o in self.db.objects()}
            tables = json.loads(self.state_file.read_text()).get("tables", {}).values()
            for table in (t["table"] for t in tables if t.get("error") and t["table"] in present):
                self.db.recover_table(table)
        for path in (self.state_file, self.progress_file):
            path.unlink(missing_ok=True)

    # --- streaming ---------------------------------------------------------------------------
    def _stream(self, connection, stop: threading.Event, deadline: float | None) -> None:
        from ivm.cdc.stream import Stream

        Stream(self, connection).run(stop, deadline)


def _message(error: BaseException) -> str:
    """An error as a source reports it; one ivm or PostgreSQL did not anticipate also says what kind it is."""
    import psycopg2

    message = str(error).strip()
    if isinstance(error, (IvmError, psycopg2.Error)):
        return message or type(error).__name__
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _columns_text(columns: list[tuple[str, str]]) -> str:
    return ", ".join(f"{name} {type_}" for name, type_ in columns)


def _difference(mine: list[tuple[str, str]], theirs: list[tuple[str, str]]) -> str:
    """How local columns differ from upstream's: missing here, not upstream, other types, or another order."""
    my_types, their_types = dict(mine), dict(theirs)
    parts = []
    if missing := [(n, t) for n, t in theirs if n not in my_types]:
        parts.append("missing here: " + _columns_text(missing))
    if extra := [(n, t) for n, t in mine if n not in their_types]:
        parts.append("not upstream: " + _columns_text(extra))
    if retyped := [n for n, t in mine if n in their_types and their_types[n] != t]:
        parts.append("other types: " + ", ".join(f"{n} is {my_types[n]} here, {their_types[n]} upstream"
                                                 for n in retyped))
    return "; ".join(parts) or "the same columns in another order"


def _key_text(key) -> str:
    return f"primary key ({', '.join(key)})" if key else "no primary key"
