"""Read latency over Arrow Flight while a writer ingests (issue 5's benchmark).

    python -m bench.flight --rows 100000 --rate 50000 --seconds 20 [--durable] [--writers N]

Starts a real ``ivm serve`` (in memory, loopback; ``--durable``: with
``--data`` in a temporary directory, so every batch is on disk before it is
acknowledged and the maintainer folds it in the background), creates

    items(id PK, grp, amount)                 --rows rows
    by_grp    = SELECT grp, COUNT(*), SUM(amount) FROM items GROUP BY grp
    all_items = SELECT id, grp, amount FROM items WHERE amount >= 0   (every row)

and, while one writer (``--writers N``: N writers, each at 1/N of the rate)
upserts batches into ``items`` at a target rate through plain Flight DoPut
(each acknowledged with its offset; a writer is a process of its own with
its batches built before the clock starts, so the readers' process measures
reads, not the load generator), measures:

* a 1-row lookup, ``SELECT * FROM by_grp WHERE grp = ?`` through ADBC
  (prepare, bind, execute, fetch), next to the same row recomputed from the
  table in the same run (``... FROM items WHERE grp = ? GROUP BY grp``);
* a full read of ``all_items`` (``--rows`` rows) through pyarrow.flight;
* acknowledged-to-visible: right after each acknowledged write, a read; the
  offset it reports must be >= the write's, and the write's rows must be in
  it. The lag is zero by construction (reads see every acknowledged write);
  the time reported is that of the read itself.

Reports medians and p99 and the ingest rate actually achieved (it is the
target unless the machine cannot keep up, which the report says).

The PostgreSQL door (``ivm serve --pg-port``) is measured beside Flight SQL
on the same server before the ingest starts: the same 1-row lookup through
psycopg 3 (server-side prepared, binary results) and the full read of
``all_items`` next to pyarrow.flight's: through ADBC's PostgreSQL driver
(``COPY (query) TO STDOUT (FORMAT binary)`` into an Arrow table, as Flight's
client lands in Arrow: the acceptance ratio), through psycopg (binary,
``fetchall``: Python objects), received by libpq, and by a raw socket.
``--doors-only`` measures just that comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import platform
import queue
import random
import socket
import struct
import tempfile
import time
from pathlib import Path

import adbc_driver_flightsql.dbapi as flight_sql
import asyncpg
import adbc_driver_postgresql.dbapi as adbc_pg
import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.flight as fl

from flight_server.process import ServerProcess

GROUPS = 1000


def quantiles(samples: list[float]) -> dict[str, float]:
    ms = np.array(samples) * 1000
    if not len(ms):
        return {"n": 0, "median_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {"n": len(ms), "median_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max())}


def items(ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "grp": pa.array(ids % GROUPS, pa.int64()),
                     "amount": pa.array(np.round(rng.uniform(0, 100, len(ids)), 2)),
                     "__op": pa.array(["u"] * len(ids))})  # upsert by key


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def put(client: fl.FlightClient, table: pa.Table) -> int:
    writer, reader = client.do_put(fl.FlightDescriptor.for_path("items"), table.schema)
    writer.write_table(table)
    writer.done_writing()
    ack = reader.read()
    writer.close()  # raises the server's error, if any
    return json.loads(ack.to_pybytes())["offset"]


def prepared_batches(rows: int, batch: int, count: int, seed: int = 1) -> list[pa.Table]:
    """``count`` upserts of ``batch`` random existing rows, built before the clock starts."""
    rng = np.random.default_rng(seed)
    return [items(rng.choice(rows, batch, replace=False), rng) for _ in range(count)]


def write_at_rate(uri: str, batches: list[pa.Table], rate: float, ready, stop, sent, commits) -> None:
    """The writer process: DoPut ``batches`` in a loop at ``rate`` rows/s until ``stop`` is set.

    A process of its own, with its batches built up front: in the readers'
    process it held their GIL while building and sending (a lookup waited
    behind it), which measured the client, not the server.
    """
    client = fl.connect(uri)
    interval = batches[0].num_rows / rate
    ready.set()
    next_at = time.perf_counter()
    for i in itertools.count():
        if stop.is_set():
            break
        table = batches[i % len(batches)]
        started = time.perf_counter()
        put(client, table)
        commits.put(time.perf_counter() - started)
        with sent.get_lock():
            sent.value += table.num_rows
        next_at += interval
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        else:
            next_at = time.perf_counter()  # behind: do not build up a backlog
    client.close()


class Ingest:
    """Upserts ``batch`` random existing rows every ``batch / rate`` seconds, from ``writers`` separate
    processes (each at ``rate / writers``)."""

    def __init__(self, uri: str, rows: int, rate: float, batch: int, seconds: float, writers: int = 1):
        context = multiprocessing.get_context("spawn")
        # Enough distinct batches for the run (cycled if it runs longer), at most 100 per writer.
        count = max(1, min(100, int(rate / writers * seconds * 4 / batch) + 1))
        self.readies, self.stop = [context.Event() for _ in range(writers)], context.Event()
        self.sent = context.Value("q", 0)
        self.commits = context.Queue()
        self.processes = [context.Process(target=_writer, args=(uri, rows, batch, count, rate / writers, ready,
                                                                self.stop, self.sent, self.commits, 1 + k), daemon=True)
                          for k, ready in enumerate(self.readies)]
        self.process = self.processes[0]
        self.errors: list[str] = []
        self.commit_seconds: list[float] = []

    def __enter__(self) -> "Ingest":
        for process in self.processes:
            process.start()
        for ready, process in zip(self.readies, self.processes):
            while not ready.wait(0.1) and process.is_alive():  # its batches are built: the clock starts
                pass
            if not ready.is_set():
                raise RuntimeError(f"a writer process failed to start (exit code {process.exitcode})")
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.elapsed = time.perf_counter() - self.started
        deadline = time.monotonic() + 60
        while any(p.is_alive() for p in self.processes) and time.monotonic() < deadline:
            self._drain()
            for process in self.processes:
                process.join(0.05)
        self._drain()
        for process in self.processes:
            if process.is_alive():
                process.kill()
                self.errors.append("a writer did not stop within 60 s")
            elif process.exitcode:
                self.errors.append(f"a writer failed (exit code {process.exitcode}; see its stderr)")

    def _drain(self) -> None:
        while True:
            try:
                self.commit_seconds.append(self.commits.get_nowait())
            except queue.Empty:
                return

    @property
    def achieved(self) -> float:
        return self.sent.value / self.elapsed


def _writer(uri: str, rows: int, batch: int, count: int, rate: float, ready, stop, sent, commits, seed: int) -> None:
    write_at_rate(uri, prepared_batches(rows, batch, count, seed), rate, ready, stop, sent, commits)


def time_lookups(cur, sql: str, seconds: float) -> list[float]:
    rng = random.Random(2)
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        grp = rng.randrange(GROUPS)
        started = time.perf_counter()
        cur.execute(sql, (grp,))
        rows = cur.fetchall()
        samples.append(time.perf_counter() - started)
        assert len(rows) == 1 and rows[0][0] == grp
    return samples


def time_full_reads(client: fl.FlightClient, rows: int, seconds: float) -> list[float]:
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples) < 5:
        started = time.perf_counter()
        info = client.get_flight_info(fl.FlightDescriptor.for_path("all_items"))
        table = client.do_get(info.endpoints[0].ticket).read_all()
        samples.append(time.perf_counter() - started)
        assert table.num_rows == rows
    return samples


def time_pg_lookups(conn: psycopg.Connection, sql: str, seconds: float) -> list[float]:
    """The 1-row lookup over pgwire: psycopg, prepared on the server, binary results."""
    rng = random.Random(2)
    samples = []
    cur = conn.cursor(binary=True)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        grp = rng.randrange(GROUPS)
        started = time.perf_counter()
        cur.execute(sql, (grp,), prepare=True)
        rows = cur.fetchall()
        samples.append(time.perf_counter() - started)
        assert len(rows) == 1 and rows[0][0] == grp
    return samples


def time_pg_full_reads(conn: psycopg.Connection, rows: int, seconds: float, fetch: bool = True) -> list[float]:
    """The full read over pgwire; ``fetch=False`` stops when libpq holds every row (no Python objects made)."""
    samples = []
    cur = conn.cursor(binary=True)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples) < 5:
        started = time.perf_counter()
        cur.execute("SELECT * FROM all_items")
        got = len(cur.fetchall()) if fetch else cur.pgresult.ntuples
        samples.append(time.perf_counter() - started)
        assert got == rows
    return samples


def time_pg_adbc_reads(port: int, rows: int, seconds: float, uri: str | None = None,
                       query: str = "SELECT * FROM all_items") -> list[float]:
    """The full read over pgwire into Arrow: ADBC's PostgreSQL driver (binary COPY, parsed in C);
    ``uri``: another server than ivm's on ``port`` (PostgreSQL itself, for reference)."""
    samples = []
    with adbc_pg.connect(uri or f"postgresql://bench@127.0.0.1:{port}/ivm", autocommit=True) as conn, \
            conn.cursor() as cur:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or len(samples) < 5:
            started = time.perf_counter()
            cur.execute(query)
            table = cur.fetch_arrow_table()
            samples.append(time.perf_counter() - started)
            assert table.num_rows == rows
    return samples


def time_pg_copy_stream(port: int, rows: int, seconds: float, user: str = "bench", database: str = "ivm",
                        host: str = "127.0.0.1") -> list[float]:
    """The full read streamed over pgwire: asyncpg's ``copy_from_query`` in binary format, every CopyData
    message received and parsed by the client's protocol code, the tuples' bytes handed to a sink
    (which keeps only their count: turning them into objects is the client's choice, not the stream)."""
    async def main() -> list[float]:
        conn = await asyncpg.connect(host=host, port=port, user=user, database=database)
        samples: list[float] = []
        received = [0]

        async def sink(data: bytes) -> None:
            received[0] += len(data)

        try:
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline or len(samples) < 5:
                received[0] = 0
                started = time.perf_counter()
                status = await conn.copy_from_query("SELECT * FROM all_items" if database == "ivm" else
                                                    "SELECT id, grp, amount FROM items", output=sink, format="binary")
                samples.append(time.perf_counter() - started)
                assert status == f"COPY {rows}" and received[0] > rows, (status, received[0])
        finally:
            await conn.close()
        return samples
    return asyncio.run(main())


def postgres_reference(rows: int, seconds: float) -> dict | None:
    """The same full read from PostgreSQL itself (a throwaway server on a Unix socket, the ``items``
    rows copied in), through the same clients: what the protocol and the clients cost without ivm.
    None when no PostgreSQL server binaries are installed."""
    from tests.cdc.pg_server import PostgresServer, bin_dir  # the tests' throwaway server

    try:
        bin_dir()
    except (FileNotFoundError, IndexError, RuntimeError):
        return None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with PostgresServer(port=port) as pg:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE items (id BIGINT PRIMARY KEY, grp BIGINT, amount DOUBLE PRECISION)")
            with conn.cursor().copy("COPY items FROM STDIN") as copy:
                for row in items(np.arange(rows), np.random.default_rng(0)).drop_columns(["__op"]).to_pylist():
                    copy.write_row((row["id"], row["grp"], row["amount"]))
            version = conn.execute("SHOW server_version").fetchone()[0]
        samples = time_pg_adbc_reads(port, rows, seconds, uri=f"postgresql://postgres@/postgres?host={pg.root}&port={port}",
                                     query="SELECT id, grp, amount FROM items")
        stream = time_pg_copy_stream(port, rows, seconds, user="postgres", database="postgres", host=str(pg.root))
    return {"version": version, "adbc": quantiles(samples), "copy_stream": quantiles(stream)}


def _pg_message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def time_pg_raw_reads(port: int, seconds: float) -> list[float]:
    """The full read over pgwire as the server delivers it: a raw socket sends Parse/Bind (binary
    results)/Describe/Execute/Sync and reads bytes until ReadyForQuery, parsing nothing."""
    ready = b"Z\x00\x00\x00\x05I"
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        body = struct.pack("!i", 196608) + b"user\x00bench\x00\x00"
        sock.sendall(struct.pack("!i", len(body) + 4) + body)
        seen = b""
        while not seen.endswith(ready):
            seen += sock.recv(65536)
        query = (_pg_message(b"P", b"\x00SELECT * FROM all_items\x00\x00\x00")
                 + _pg_message(b"B", b"\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01")
                 + _pg_message(b"D", b"P\x00") + _pg_message(b"E", b"\x00\x00\x00\x00\x00") + _pg_message(b"S"))
        samples = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or len(samples) < 5:
            started = time.perf_counter()
            sock.sendall(query)
            tail = b""
            while tail != ready:
                tail = (tail + sock.recv(1 << 20))[-6:]
            samples.append(time.perf_counter() - started)
    return samples


def doors(server: ServerProcess, cur, rows: int, seconds: float) -> dict:
    """Flight SQL and pgwire side by side on the same server, no ingest running."""
    lookup = "SELECT * FROM by_grp WHERE grp = ?"
    result = {"flight_lookup": quantiles(time_lookups(cur, lookup, seconds))}
    with psycopg.connect(f"host=127.0.0.1 port={server.pg_port} user=bench dbname=ivm connect_timeout=20",
                         autocommit=True) as conn:
        result["pg_lookup"] = quantiles(time_pg_lookups(conn, lookup.replace("?", "%s"), seconds))
        with fl.connect(server.uri) as client:
            result["flight_full_read"] = quantiles(time_full_reads(client, rows, seconds))
        result["pg_full_adbc"] = quantiles(time_pg_adbc_reads(server.pg_port, rows, seconds))
        result["pg_full_stream"] = quantiles(time_pg_copy_stream(server.pg_port, rows, seconds))
        result["pg_full_read"] = quantiles(time_pg_full_reads(conn, rows, seconds))
        result["pg_full_receive"] = quantiles(time_pg_full_reads(conn, rows, seconds / 2, fetch=False))
        result["pg_full_raw"] = quantiles(time_pg_raw_reads(server.pg_port, seconds / 2))
    return result


def visibility(uri: str, writes: int) -> dict:
    """Write a marker row, then read it back at once, ``writes`` times."""
    client = fl.connect(uri)
    lags, read_seconds = [], []
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        for i in range(writes):
            marker = pa.table({"id": pa.array([10**12 + i], pa.int64()), "grp": pa.array([-1 - i], pa.int64()),
                               "amount": pa.array([1.0])})
            offset = put(client, marker)
            started = time.perf_counter()
            cur.execute("SELECT n FROM by_grp WHERE grp = ?", (-1 - i,))
            table = cur.fetch_arrow_table()
            read_seconds.append(time.perf_counter() - started)
            seen = int(table.schema.metadata[b"ivm.offset"])
            lags.append(0 if seen >= offset and table.column("n").to_pylist() == [1] else 1)
    client.close()
    return {"writes": writes, "not_visible": sum(lags), "read": quantiles(read_seconds)}


def run(rows: int, rate: float, batch: int, seconds: float, durable: bool, writers: int = 1,
        ingest_nice: int = 0, doors_only: bool = False) -> dict:
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ivm-bench-") as directory:
        server_args = ("--data", f"{directory}/db") if durable else ()
        if ingest_nice:
            server_args += ("--ingest-nice", str(ingest_nice))
        result = measure(rows, rate, batch, seconds, server_args, writers, doors_only)
    result["load_average"] = [load_before, os.getloadavg()[0]]  # 1-minute, before and after: the sharing
    return result


def measure(rows: int, rate: float, batch: int, seconds: float, server_args: tuple[str, ...], writers: int = 1,
            doors_only: bool = False) -> dict:
    with ServerProcess(*server_args, "--pg-port", "0") as server:
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.executescript(
                "CREATE TABLE items (id BIGINT PRIMARY KEY, grp BIGINT, amount DOUBLE);"
                "CREATE MATERIALIZED VIEW by_grp AS SELECT grp, COUNT(*) AS n, SUM(amount) AS s FROM items GROUP BY grp;"
                "CREATE MATERIALIZED VIEW all_items AS SELECT id, grp, amount FROM items WHERE amount >= 0"
            )
            cur.adbc_ingest("items", items(np.arange(rows), np.random.default_rng(0)), mode="append")
            result: dict = {"rows": rows, "target_rate": rate, "batch": batch, "seconds": seconds, "writers": writers,
                            "server": " ".join(["durable (--data)" if "--data" in server_args else "in memory",
                                                *(a for a in server_args if a.startswith("--ingest") or a.isdigit())])}
            lookup = "SELECT * FROM by_grp WHERE grp = ?"
            recompute = "SELECT grp, COUNT(*) AS n, SUM(amount) AS s FROM items WHERE grp = ? GROUP BY grp"
            result["doors"] = doors(server, cur, rows, min(10.0, seconds / 2))
            if doors_only:
                result["postgres"] = postgres_reference(rows, min(10.0, seconds / 2))
                return result
            result["idle_lookup"] = quantiles(time_lookups(cur, lookup, min(5.0, seconds / 2)))
            with Ingest(server.uri, rows, rate, batch, seconds * 2.5, writers) as ingest:
                pids = {"server": server.process.pid, "readers (ADBC client)": os.getpid(),
                        **{("writer" if writers == 1 else f"writer {k + 1}"): p.pid
                           for k, p in enumerate(ingest.processes)}}
                before, started = {k: process_cpu(pid) for k, pid in pids.items()}, time.perf_counter()
                result["lookup"] = quantiles(time_lookups(cur, lookup, seconds))
                # Who used the 2 cores during the timed lookups: CPU seconds per second of wall.
                wall = time.perf_counter() - started
                result["cores_used"] = {k: (process_cpu(pid) - before[k]) / wall for k, pid in pids.items()}
                result["cpu_ms_per_lookup"] = {k: 1000 * v * wall / result["lookup"]["n"]
                                               for k, v in result["cores_used"].items()}
                result["recompute_lookup"] = quantiles(time_lookups(cur, recompute, seconds / 2))
                with fl.connect(server.uri) as client:
                    result["full_read"] = quantiles(time_full_reads(client, rows, seconds))
            result["achieved_rate"] = ingest.achieved
            result["commit"] = quantiles(ingest.commit_seconds)
            result["ingest_errors"] = ingest.errors
        result["visibility"] = visibility(server.uri, 200)
    return result


def doors_report(r: dict) -> list[str]:
    d = r["doors"]

    def row(name: str, q: dict) -> str:
        return f"| {name} | {q['n']} | {q['median_ms']:.2f} | {q['p99_ms']:.2f} |"

    lookup_ratio = d["pg_lookup"]["median_ms"] / d["flight_lookup"]["median_ms"]
    flight_rate = r["rows"] / d["flight_full_read"]["median_ms"] * 1000

    def of_flight(key: str) -> float:
        return r["rows"] / d[key]["median_ms"] * 1000 / flight_rate

    stream_rate = r["rows"] / d["pg_full_stream"]["median_ms"] * 1000
    lines = [
        "## PostgreSQL door beside Flight SQL (same server, no ingest)",
        "",
        "| read | samples | median ms | p99 ms |",
        "| --- | --- | --- | --- |",
        row("1-row lookup, Flight SQL (ADBC, prepared)", d["flight_lookup"]),
        row("1-row lookup, pgwire (psycopg, prepared, binary)", d["pg_lookup"]),
        row(f"{r['rows']:,} rows, Flight (pyarrow.flight read_all)", d["flight_full_read"]),
        row(f"{r['rows']:,} rows, pgwire stream (asyncpg, binary COPY)", d["pg_full_stream"]),
        row(f"{r['rows']:,} rows, pgwire into Arrow (ADBC PostgreSQL, binary COPY)", d["pg_full_adbc"]),
        row(f"{r['rows']:,} rows, pgwire (psycopg binary fetchall)", d["pg_full_read"]),
        row(f"{r['rows']:,} rows, pgwire, received by libpq (no fetchall)", d["pg_full_receive"]),
        row(f"{r['rows']:,} rows, pgwire, raw socket (the server's delivery)", d["pg_full_raw"]),
    ]
    postgres = r.get("postgres")
    if postgres:
        lines += [
            row(f"{r['rows']:,} rows from PostgreSQL {postgres['version']} itself, asyncpg binary COPY",
                postgres["copy_stream"]),
            row(f"{r['rows']:,} rows from PostgreSQL {postgres['version']} itself, ADBC PostgreSQL into Arrow",
                postgres["adbc"]),
        ]
    lines += [
        "",
        f"Lookup: pgwire/Flight = {lookup_ratio:.2f}x (target: within 2x). Full read: Flight "
        f"{flight_rate:,.0f} rows/s; the pgwire stream (asyncpg, binary COPY) {stream_rate:,.0f} rows/s = "
        f"{stream_rate / flight_rate:.2f} of Flight (target: at least 0.5). Into Arrow through ADBC PostgreSQL "
        f"{of_flight('pg_full_adbc'):.2f} of Flight, psycopg fetchall {of_flight('pg_full_read'):.2f} (Python "
        f"objects), received by libpq without making Python rows {of_flight('pg_full_receive'):.2f}, as the server "
        f"delivers them (raw socket) {of_flight('pg_full_raw'):.2f}.",
    ]
    if postgres:
        lines[-1] += (f" PostgreSQL {postgres['version']} serving the same rows to the same clients: asyncpg's stream "
                      f"{postgres['copy_stream']['median_ms']:.1f} ms, ADBC into Arrow {postgres['adbc']['median_ms']:.1f} ms "
                      "(the client's row-by-row decoding, not the server, bounds ADBC).")
    return lines + [""]


def report(r: dict, command: str) -> str:
    def row(name: str, q: dict) -> str:
        return f"| {name} | {q['n']} | {q['median_ms']:.2f} | {q['p99_ms']:.2f} | {q['max_ms']:.2f} |"

    if "lookup" not in r:  # --doors-only
        return "\n".join(["# Flight SQL and pgwire reads", "", f"Command: `{command}`", ""] + doors_report(r))

    shortfall = "" if r["achieved_rate"] >= 0.95 * r["target_rate"] else (
        " — **below the target**: the writer could not keep up on this machine")
    lines = [
        "# Flight read latency while ingesting",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        "shared with other jobs while measured (numbers are upper bounds): 1-minute load average "
        f"{r['load_average'][0]:.1f} before, {r['load_average'][1]:.1f} after.",
        "",
        f"Server: {r['server']}. View size: {r['rows']:,} rows; ingest: {r.get('writers', 1)} writer(s) upserting "
        f"batches of {r['batch']:,} rows, "
        f"target {r['target_rate']:,.0f} rows/s, **achieved {r['achieved_rate']:,.0f} rows/s**{shortfall}; "
        f"batch commit (DoPut to acknowledgement) median {r['commit']['median_ms']:.1f} ms, "
        f"p99 {r['commit']['p99_ms']:.1f} ms.",
        "",
        "| read | samples | median ms | p99 ms | max ms |",
        "| --- | --- | --- | --- | --- |",
        row("1-row lookup in `by_grp`, no ingest", r["idle_lookup"]),
        row("1-row lookup in `by_grp`, while ingesting", r["lookup"]),
        row("same row recomputed from `items`, while ingesting", r["recompute_lookup"]),
        row(f"full read of `all_items` ({r['rows']:,} rows), while ingesting", r["full_read"]),
        row("read right after an acknowledged write", r["visibility"]["read"]),
        "",
        *doors_report(r),
        f"Lookup vs recompute (median): {r['recompute_lookup']['median_ms'] / r['lookup']['median_ms']:.1f}x faster.",
        "",
        "CPU during the lookups while ingesting (cores used; CPU ms per lookup): "
        + "; ".join(f"{k} {v:.2f} ({r['cpu_ms_per_lookup'][k]:.2f} ms)" for k, v in r["cores_used"].items())
        + ". The machine has 2 cores; the writer's and the server's ingest share are the cost of 50k rows/s, "
        "the readers' is the client's own work per lookup (ADBC), which competes with the server.",
        "",
        f"Acknowledged-to-visible: {r['visibility']['writes']} writes each read back at once; "
        f"{r['visibility']['not_visible']} were not visible (lag zero by construction: a read sees every "
        "acknowledged write, so the time to visible is the read itself).",
        "",
        "Target: 1-row lookup p99 under 10 ms at 50,000 ingested rows/s: "
        + ("met." if r["lookup"]["p99_ms"] < 10 and r["achieved_rate"] >= 0.95 * 50_000 else
           f"p99 {r['lookup']['p99_ms']:.1f} ms at {r['achieved_rate']:,.0f} rows/s (see above)."),
    ]
    if r["ingest_errors"]:
        lines += ["", f"Ingest errors: {r['ingest_errors'][:3]}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=50_000, help="target ingested rows per second")
    parser.add_argument("--batch", type=int, default=5_000, help="rows per ingested batch")
    parser.add_argument("--seconds", type=float, default=20, help="per measurement")
    parser.add_argument("--durable", action="store_true", help="serve --data in a temporary directory")
    parser.add_argument("--writers", type=int, default=1, help="writer processes, each at rate / writers")
    parser.add_argument("--ingest-nice", type=int, default=0, help="ivm serve --ingest-nice (in memory)")
    parser.add_argument("--doors-only", action="store_true",
                        help="measure only Flight SQL beside pgwire (no ingest)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    command = (f"python -m bench.flight --rows {args.rows} --rate {args.rate:.0f} --batch {args.batch} "
               f"--seconds {args.seconds:g}" + (" --durable" if args.durable else "")
               + (f" --writers {args.writers}" if args.writers != 1 else "")
               + (f" --ingest-nice {args.ingest_nice}" if args.ingest_nice else "")
               + (" --doors-only" if args.doors_only else ""))
    result = run(args.rows, args.rate, args.batch, args.seconds, args.durable, args.writers, args.ingest_nice,
                 args.doors_only)
    text = report(result, command)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "flight_doors" if args.doors_only else "flight_durable" if args.durable else "flight"
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2))
    print(text)


if __name__ == "__main__":
    main()
