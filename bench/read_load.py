"""Reads under write load (issue 25): a durable server, many readers, writers as fast as they go.

    python -m bench.read_load [--seconds 60] [--readers 16] [--writers 2] [--rows 100000] [--batch 1000]

Starts a real ``ivm serve --data <temporary directory>`` (every batch on disk
before it is acknowledged, the maintainer folding batches into the views in
the background), creates

    items(id PK, grp, amount)      --rows rows
    by_grp = SELECT grp, COUNT(*) AS n, SUM(amount) AS s FROM items GROUP BY grp   (1,000 groups)

and runs, all at once for ``--seconds``, each in a process of its own:

* ``--readers`` readers over ADBC Flight SQL, half of them point reads
  (``SELECT * FROM by_grp WHERE grp = ?``, prepared), half scans of the
  whole view (``SELECT * FROM by_grp``);
* ``--writers`` writers, each upserting ``--batch`` rows of its own ids
  (writer w owns the ids equal to w modulo the writers) through plain Flight
  DoPut, one batch after another with no pause;
* one checker of read-your-writes: it upserts one row (ids no writer owns)
  and, once that is acknowledged, reads it back over Flight SQL; the read
  must report an offset (``ivm.offset``) at least the write's and hold the
  value written.

Reports read latency (median, p99, max) per kind, the rows/s written and the
acknowledgement latency, the read-your-writes checks, and every error. Exits
1 when any read or write failed or a check did not hold; the timings are for
reading, not for passing (speed lives in the report, not in an assertion).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import tempfile
import time
from pathlib import Path

import adbc_driver_flightsql.dbapi as flight_sql
import numpy as np
import pyarrow.flight as fl

from bench.flight import GROUPS, items, put, quantiles
from flight_server.process import ServerProcess

POINT = "SELECT * FROM by_grp WHERE grp = ?"
SCAN = "SELECT * FROM by_grp"


def _reader(uri: str, kind: str, seconds: float, go, out, seed: int) -> None:
    """One reader process: ``kind`` "point" or "scan" reads until ``seconds`` after ``go``."""
    rng = random.Random(seed)
    samples: list[float] = []
    errors: list[str] = []
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        go.wait()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                if kind == "point":
                    grp = rng.randrange(GROUPS)
                    cur.execute(POINT, (grp,))
                    rows = cur.fetchall()
                    if len(rows) != 1 or rows[0][0] != grp:
                        errors.append(f"point read of group {grp} returned {rows!r}")
                else:
                    cur.execute(SCAN)
                    table = cur.fetch_arrow_table()
                    if table.num_rows != GROUPS:
                        errors.append(f"scan returned {table.num_rows} rows, not {GROUPS}")
            except Exception as e:  # noqa: BLE001  (every failure is reported, and fails the run)
                errors.append(f"{kind} read: {type(e).__name__}: {e}")
            samples.append(time.perf_counter() - started)
    out.put({"kind": kind, "samples": samples, "errors": errors})


def _writer(uri: str, w: int, writers: int, rows: int, batch: int, seconds: float, go, out, seed: int) -> None:
    """One writer process: upserts of its own ids, one batch after another with no pause."""
    rng = np.random.default_rng(seed)
    owned = np.arange(w, rows, writers)
    batches = [items(np.sort(rng.choice(owned, batch, replace=False)), rng) for _ in range(50)]
    acks: list[float] = []
    errors: list[str] = []
    written = 0
    client = fl.connect(uri)
    go.wait()
    started = time.perf_counter()
    deadline = started + seconds
    for i in range(1 << 62):
        if time.perf_counter() >= deadline:
            break
        table = batches[i % len(batches)]
        sent = time.perf_counter()
        try:
            put(client, table)
        except Exception as e:  # noqa: BLE001  (every failure is reported, and fails the run)
            errors.append(f"write: {type(e).__name__}: {e}")
            continue
        acks.append(time.perf_counter() - sent)
        written += table.num_rows
    elapsed = time.perf_counter() - started
    client.close()
    out.put({"kind": "writer", "acks": acks, "rows": written, "seconds": elapsed, "checks": 0, "errors": errors})


def _checker(uri: str, rows: int, seconds: float, go, out) -> None:
    """Read-your-writes, checked in a loop: upsert one row of ids no writer owns (``rows`` and up, in
    the same groups), and once acknowledged read it back over Flight SQL; the read must report an
    offset at least the write's (``ivm.offset``) and hold the value written."""
    rng = np.random.default_rng(7)
    errors: list[str] = []
    checks = 0
    client = fl.connect(uri)
    with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
        go.wait()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            row = items(np.array([rows + checks % GROUPS]), rng)
            row_id, amount = row.column("id")[0].as_py(), row.column("amount")[0].as_py()
            try:
                offset = put(client, row)
                cur.execute("SELECT amount FROM items WHERE id = ?", (row_id,))
                read = cur.fetch_arrow_table()
                seen = int(read.schema.metadata[b"ivm.offset"])
                if seen < offset or read.num_rows != 1 or read.column(0)[0].as_py() != amount:
                    errors.append(f"read-your-writes: the write of id {row_id} = {amount} was acknowledged at "
                                  f"offset {offset}; the read after it saw offset {seen} and {read.to_pylist()}")
            except Exception as e:  # noqa: BLE001
                errors.append(f"read-your-writes: {type(e).__name__}: {e}")
            checks += 1
    client.close()
    out.put({"kind": "checker", "checks": checks, "errors": errors})


def run(seconds: float, readers: int, writers: int, rows: int, batch: int) -> dict:
    """Load a durable server, run the readers and writers together, and collect what they saw."""
    context = multiprocessing.get_context("spawn")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ivm-read-load-") as directory, \
            ServerProcess("--data", f"{directory}/db") as server:
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.executescript(
                "CREATE TABLE items (id BIGINT PRIMARY KEY, grp BIGINT, amount DOUBLE);"
                "CREATE MATERIALIZED VIEW by_grp AS SELECT grp, COUNT(*) AS n, SUM(amount) AS s FROM items GROUP BY grp"
            )
            cur.adbc_ingest("items", items(np.arange(rows), np.random.default_rng(0)), mode="append")
        go, out = context.Event(), context.Queue()
        processes = [context.Process(target=_reader, args=(server.uri, "point" if k % 2 == 0 else "scan", seconds,
                                                            go, out, k), daemon=True) for k in range(readers)]
        processes += [context.Process(target=_writer, args=(server.uri, w, writers, rows, batch, seconds, go, out,
                                                             100 + w), daemon=True) for w in range(writers)]
        processes.append(context.Process(target=_checker, args=(server.uri, rows, seconds, go, out), daemon=True))
        for process in processes:
            process.start()
        time.sleep(min(5.0, 0.5 + 0.25 * len(processes)))  # connections open before the clock starts
        go.set()
        results, errors = [], []
        deadline = time.monotonic() + seconds + 120
        while len(results) < len(processes) and time.monotonic() < deadline:
            try:
                results.append(out.get(timeout=1))
            except Exception:  # noqa: BLE001  (queue.Empty: keep waiting while processes live)
                if not any(p.is_alive() for p in processes):
                    break
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                errors.append("a load process did not stop within 10 s of its end")
            elif process.exitcode:
                errors.append(f"a load process failed (exit code {process.exitcode}; see its stderr)")
        if len(results) < len(processes):
            errors.append(f"only {len(results)} of {len(processes)} load processes reported")
    writes = [r for r in results if r["kind"] == "writer"]
    result = {
        "seconds": seconds, "readers": readers, "writers": writers, "rows": rows, "batch": batch,
        "load_average": [load_before, os.getloadavg()[0]],
        "errors": errors + [e for r in results for e in r["errors"]],
        "checks": sum(r["checks"] for r in results if r["kind"] == "checker"),
        "written_rows": sum(r["rows"] for r in writes),
        "write_rate": sum(r["rows"] / r["seconds"] for r in writes if r["seconds"]),
        "ack": quantiles([a for r in writes for a in r["acks"]]) if any(r["acks"] for r in writes) else None,
    }
    for kind in ("point", "scan"):
        samples = [s for r in results if r["kind"] == kind for s in r["samples"]]
        result[kind] = quantiles(samples) if samples else None
    return result


def report(r: dict, command: str) -> str:
    def row(name: str, q: dict | None) -> str:
        if q is None:
            return f"| {name} | 0 | | | |"
        return f"| {name} | {q['n']} | {q['median_ms']:.1f} | {q['p99_ms']:.1f} | {q['max_ms']:.1f} |"

    lines = [
        "# Reads under write load (durable server)",
        "",
        f"Command: `{command}`",
        "",
        f"{r['readers']} readers (half point reads, half scans of the 1,000-row view) and {r['writers']} writers of "
        f"{r['batch']:,}-row upserts into {r['rows']:,} rows, together for {r['seconds']:g} s; 1-minute load "
        f"average {r['load_average'][0]:.1f} before, {r['load_average'][1]:.1f} after.",
        "",
        "| | count | median ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: |",
        row("point read (`SELECT * FROM by_grp WHERE grp = ?`)", r["point"]),
        row("scan (`SELECT * FROM by_grp`)", r["scan"]),
        row("write acknowledged (on disk)", r["ack"]),
        "",
        f"Written by the writers: {r['written_rows']:,} rows, {r['write_rate']:,.0f} rows/s. Read-your-writes: "
        f"{r['checks']:,} checks (a 1-row write, then a read of it). Errors: {len(r['errors'])}.",
        "",
    ]
    lines += [f"- {e}" for e in r["errors"][:20]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--readers", type=int, default=16)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    command = (f"python -m bench.read_load --seconds {args.seconds:g} --readers {args.readers} "
               f"--writers {args.writers} --rows {args.rows} --batch {args.batch}")
    result = run(args.seconds, args.readers, args.writers, args.rows, args.batch)
    text = report(result, command)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "read_load.md").write_text(text)
    (out / "read_load.json").write_text(json.dumps(result, indent=2))
    print(text)
    raise SystemExit(1 if result["errors"] else 0)


if __name__ == "__main__":
    main()
