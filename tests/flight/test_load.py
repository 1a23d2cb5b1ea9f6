"""Load (acceptance 3): 16 concurrent readers and 2 writers, 10 s in CI, 60 s on request.

Writers stream CDC batches (inserts, updates and deletes of their own rows)
through plain Flight DoPut, which acknowledges each batch with its offset;
each writer logs what its batch changes in both views. Readers (half ADBC,
half pyarrow.flight) run 1-row lookups and full reads of a larger view; every
result carries its offset. Afterwards every read is checked against the
writers' logs replayed up to that read's offset: zero errors, every read
consistent with its offset, and the server's resident memory bounded; once
in memory and once durable (``--data``: every batch synced before its
acknowledgement, views folded by the background maintainer).
CI (``./dev test``) runs it for 10 s as a smoke test (issue 25): every
assertion below holds for any length, and 10 s already give hundreds of
reads and batches, each read checked against its offset (read-your-writes), and ten memory
samples. ``IVM_LOAD_SECONDS=60`` runs the full acceptance length; the test
asserts it ran as long as it was told.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import threading
import time
from dataclasses import dataclass, field

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from tests.flight.server import ServerProcess

SECONDS = float(os.environ.get("IVM_LOAD_SECONDS", "10"))
READERS, WRITERS = 16, 2
PRELOAD = 10_000  # rows per writer before the clock starts
SCHEMA = pa.schema([("id", pa.int64()), ("writer", pa.int64()), ("amount", pa.int64()), ("__op", pa.string())])


@dataclass
class WriterLog:
    """Per acknowledged batch: offset and what it changed (n, sum, evens, evens' sum)."""

    offsets: list[int] = field(default_factory=list)
    totals: list[tuple[int, int, int, int]] = field(default_factory=list)  # running sums after each batch

    def record(self, offset: int, delta: tuple[int, int, int, int]) -> None:
        previous = self.totals[-1] if self.totals else (0, 0, 0, 0)
        self.offsets.append(offset)
        self.totals.append(tuple(a + b for a, b in zip(previous, delta)))

    def at(self, offset: int) -> tuple[int, int, int, int]:
        i = bisect.bisect_right(self.offsets, offset)
        return self.totals[i - 1] if i else (0, 0, 0, 0)


class Writer:
    def __init__(self, number: int, uri: str):
        self.number = number
        self.client = fl.connect(uri)
        self.rows: dict[int, int] = {}  # id -> amount, this writer's live rows
        self.next_id = number * 10**9
        self.rng = random.Random(number)
        self.log = WriterLog()

    def batch(self, inserts: int, updates: int, deletes: int) -> tuple[pa.Table, tuple[int, int, int, int]]:
        rows, delta = [], [0, 0, 0, 0]

        def account(amount: int, sign: int) -> None:
            delta[0] += sign
            delta[1] += sign * amount
            if amount % 2 == 0:
                delta[2] += sign
                delta[3] += sign * amount

        existing = self.rng.sample(sorted(self.rows), min(len(self.rows), updates + deletes))
        for key in existing[:updates]:
            amount = self.rng.randint(0, 1000)
            account(self.rows[key], -1)
            account(amount, +1)
            self.rows[key] = amount
            rows.append((key, amount, "u"))
        for key in existing[updates:]:
            account(self.rows.pop(key), -1)
            rows.append((key, 0, "d"))
        for _ in range(inserts):
            amount = self.rng.randint(0, 1000)
            self.next_id += 1
            self.rows[self.next_id] = amount
            account(amount, +1)
            rows.append((self.next_id, amount, "c"))
        table = pa.table({"id": [r[0] for r in rows], "writer": [self.number] * len(rows),
                          "amount": [r[1] for r in rows], "__op": [r[2] for r in rows]}, schema=SCHEMA)
        return table, tuple(delta)

    def put(self, table: pa.Table) -> int:
        writer, reader = self.client.do_put(fl.FlightDescriptor.for_path("events"), table.schema)
        writer.write_table(table)
        writer.done_writing()
        ack = json.loads(reader.read().to_pybytes())
        writer.close()
        return ack["offset"]

    def step(self, inserts: int = 40, updates: int = 20, deletes: int = 10) -> None:
        table, delta = self.batch(inserts, updates, deletes)
        self.log.record(self.put(table), delta)


@dataclass
class Read:
    kind: str  # "lookup" | "full"
    offset: int
    writer: int
    values: tuple


def lookup_adbc(cur, writer: int) -> Read:
    cur.execute("SELECT n, s FROM per_writer WHERE writer = ?", (writer,))
    table = cur.fetch_arrow_table()
    row = table.to_pylist()
    values = (row[0]["n"], int(row[0]["s"])) if row else (0, 0)
    return Read("lookup", int(table.schema.metadata[b"ivm.offset"]), writer, values)


def full_flight(client: fl.FlightClient) -> Read:
    info = client.get_flight_info(fl.FlightDescriptor.for_path("evens"))
    table = client.do_get(info.endpoints[0].ticket).read_all()
    offset = json.loads(info.app_metadata)["offset"]
    assert int(table.schema.metadata[b"ivm.offset"]) == offset
    per_writer = {}
    for w in range(WRITERS):
        mine = table.filter(pc.equal(table.column("writer"), w))
        per_writer[w] = (mine.num_rows, pc.sum(mine.column("amount")).as_py() or 0)
    return Read("full", offset, -1, tuple(sorted(per_writer.items())))


def reader_loop(uri: str, number: int, stop: threading.Event, reads: list[Read], errors: list[str]) -> None:
    rng = random.Random(1000 + number)
    try:
        if number % 2 == 0:
            with flight_sql.connect(uri, autocommit=True) as conn, conn.cursor() as cur:
                while not stop.is_set():
                    reads.append(lookup_adbc(cur, rng.randrange(WRITERS)))
        else:
            with fl.connect(uri) as client:
                while not stop.is_set():
                    reads.append(full_flight(client))
    except Exception as e:  # noqa: BLE001 (every error is a failure, reported below)
        errors.append(f"reader {number}: {type(e).__name__}: {e}")


def writer_loop(writer: Writer, stop: threading.Event, errors: list[str]) -> None:
    try:
        while not stop.is_set():
            writer.step()
            time.sleep(0.005)
    except Exception as e:  # noqa: BLE001
        errors.append(f"writer {writer.number}: {type(e).__name__}: {e}")


def check(read: Read, writers: list[Writer]) -> str | None:
    if read.kind == "lookup":
        n, s, _, _ = writers[read.writer].log.at(read.offset)
        return None if read.values == (n, s) else f"lookup at {read.offset}: {read.values} != {(n, s)}"
    expected = tuple((w.number, w.log.at(read.offset)[2:]) for w in writers)
    return None if read.values == expected else f"full read at {read.offset}: {read.values} != {expected}"


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["memory", "durable"])
def test_sixteen_readers_two_writers(durability, tmp_path):
    with ServerProcess(*(("--data", str(tmp_path / "db")) if durability == "durable" else ())) as server:
        with flight_sql.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
            cur.executescript(
                "CREATE TABLE events (id BIGINT PRIMARY KEY, writer BIGINT, amount BIGINT);"
                "CREATE MATERIALIZED VIEW per_writer AS "
                "SELECT writer, COUNT(*) AS n, SUM(amount) AS s FROM events GROUP BY writer;"
                "CREATE MATERIALIZED VIEW evens AS SELECT id, writer, amount FROM events WHERE amount % 2 = 0"
            )
        writers = [Writer(w, server.uri) for w in range(WRITERS)]
        for writer in writers:
            writer.step(inserts=PRELOAD, updates=0, deletes=0)
        stop = threading.Event()
        reads: list[Read] = []
        errors: list[str] = []
        # Daemon threads: a client stuck in a call cannot keep the test process alive;
        # stopping the server (the with block) ends such calls.
        threads = [threading.Thread(target=reader_loop, args=(server.uri, i, stop, reads, errors), daemon=True)
                   for i in range(READERS)]
        threads += [threading.Thread(target=writer_loop, args=(w, stop, errors), daemon=True) for w in writers]
        for thread in threads:
            thread.start()
        memory = []
        started = time.monotonic()
        while time.monotonic() - started < SECONDS and not errors:
            time.sleep(1)
            memory.append(server.rss_bytes())
        elapsed = time.monotonic() - started
        stop.set()
        for thread in threads:
            thread.join(max(1.0, started + SECONDS + 60 - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "a client thread did not finish"
        assert not errors, "\n".join(errors[:10])
        assert elapsed >= SECONDS, f"ran {elapsed:.1f} s of {SECONDS:.0f} s"
        batches = sum(len(w.log.offsets) for w in writers) - WRITERS
        lookups = sum(r.kind == "lookup" for r in reads)
        assert batches > 10 and lookups > 10 and len(reads) - lookups > 10, (batches, lookups, len(reads))
        wrong = [problem for problem in (check(r, writers) for r in reads) if problem]
        assert not wrong, f"{len(wrong)} of {len(reads)} reads inconsistent with their offset:\n" + "\n".join(wrong[:5])
        # Memory: after warming up, resident memory may grow with the data, not without bound.
        warm = memory[len(memory) // 4]
        assert max(memory) < 2 * 1024**3 and max(memory) - warm < 400 * 1024**2, [m // 2**20 for m in memory]
        print(f"\nload ({durability}): {batches} batches, {len(reads)} reads ({lookups} lookups) in {elapsed:.1f} s; "
              f"server RSS {warm // 2**20} -> {max(memory) // 2**20} MiB")
