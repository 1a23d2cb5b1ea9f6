"""Issue 23 item 1: a full disk refuses batches and loses none that were acknowledged.

The database lives on a real small tmpfs (mounted here; the tests skip with a
message where mounting is not allowed). The disk is filled with a filler
file, batches are ingested until the log refuses them (ENOSPC: the kernel
writes part of a record first), then space is freed and writes go on
without a reopen. After a reopen every acknowledged batch is there exactly
once and no refused one is.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

import ivm
from storage.log import DiskFullError

ROOT = Path(__file__).resolve().parents[2]
ROWS = 200  # per batch: ~45 KB of log record
QUIET = dict(checkpoint_seconds=3600, checkpoint_rows=10**12)  # no background checkpoint takes space


@pytest.fixture
def disk(tmp_path):
    yield from _mounted(tmp_path / "disk", "size=16m")


@pytest.fixture
def few_inodes(tmp_path):
    yield from _mounted(tmp_path / "disk", "size=16m,nr_inodes=400")


def _mounted(path: Path, options: str):
    path.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {result.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def _fill(disk: Path, leave: int = 0) -> Path:
    """Take all space but ``leave`` bytes (about: tmpfs counts pages) with a filler file."""
    filler = disk / "filler"
    with open(filler, "ab") as f:
        try:
            while True:
                f.write(b"\0" * (64 << 10))
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    size = filler.stat().st_size
    os.truncate(filler, max(0, size - leave))
    return filler


def _batch(n: int, rows: int = ROWS) -> pa.Table:
    return pa.table({"batch": [n] * rows, "i": list(range(rows)), "pad": [f"{n:08d}" * 25] * rows})


def _counts(db) -> dict[int, int]:
    return {r["batch"]: r["n"] for r in db.sql("SELECT batch, COUNT(*) AS n FROM events GROUP BY batch").to_pylist()}


def test_ingest_until_the_disk_is_full_then_free_space_and_go_on(disk):
    db = ivm.connect(disk / "db", **QUIET)
    db.execute("CREATE TABLE events (batch BIGINT, i BIGINT, pad VARCHAR)")  # a bag: a copy would count twice
    filler = _fill(disk, leave=400 << 10)
    acknowledged: dict[int, int] = {}
    refused: list[int] = []
    n = 0
    while len(refused) < 3:  # every write is refused while space lacks
        n += 1
        try:
            acknowledged[n] = db.apply_changes("events", _batch(n))
        except DiskFullError as e:
            assert "the disk is full (ENOSPC" in str(e) and "the batch was not accepted" in str(e)
            refused.append(n)
    assert len(acknowledged) >= 3 and refused == [n - 2, n - 1, n]
    assert list(acknowledged.values()) == list(range(1, len(acknowledged) + 1))  # no offset used by a refusal
    assert _counts(db) == {b: ROWS for b in acknowledged}

    filler.unlink()  # space is back: writes go on, no reopen, offsets contiguous
    for m in (n + 1, n + 2):
        acknowledged[m] = db.apply_changes("events", _batch(m))
    assert list(acknowledged.values()) == list(range(1, len(acknowledged) + 1))
    db.close()

    db = ivm.connect(disk / "db")
    try:
        assert _counts(db) == {b: ROWS for b in acknowledged}  # each exactly once, the refused ones absent
        assert db.status()["log_truncations"] == []  # a refused write left nothing to cut
    finally:
        db.close()


def test_acknowledged_batches_survive_a_reopen_while_the_disk_is_still_full(disk):
    db = ivm.connect(disk / "db", **QUIET)
    db.execute("CREATE TABLE events (batch BIGINT, i BIGINT, pad VARCHAR)")
    filler = _fill(disk, leave=200 << 10)
    acknowledged = []
    for n in range(1, 20):
        try:
            db.apply_changes("events", _batch(n))
            acknowledged.append(n)
        except DiskFullError:
            break
    else:
        pytest.fail("the disk never filled")
    os.rename(filler, disk / "filler-1")
    _fill(disk)  # the rest too: the final checkpoint cannot be written
    _close_on_a_full_disk(db)
    db = ivm.connect(disk / "db", **QUIET)  # nothing to write on open
    assert db.status()["recovered_records"] == len(acknowledged)
    assert _counts(db) == {b: ROWS for b in acknowledged}
    with pytest.raises(DiskFullError):
        db.apply_changes("events", _batch(99))
    _close_on_a_full_disk(db)
    db = ivm.connect(disk / "db", **QUIET)
    assert _counts(db) == {b: ROWS for b in acknowledged}
    _close_on_a_full_disk(db)


def _close_on_a_full_disk(db) -> None:
    with pytest.raises(ivm.IvmError, match="closed without its final checkpoint .*replayed when it is opened again"):
        db.close()
    with pytest.raises(ivm.IvmError, match="the database is closed"):
        db.sql("SELECT 1")


def test_a_unit_of_batches_is_accepted_whole_or_not_at_all(disk):
    """Two producers' batches converted together as one unit; the first would fit, not both.

    Both fail and their conversion is undone: sent again once space is back, the inserts of
    the same keys are accepted (they would fail as duplicates if the table's head kept them)."""
    db = ivm.connect(disk / "db", **QUIET)
    db.execute("CREATE TABLE keyed (batch BIGINT, i BIGINT, pad VARCHAR, PRIMARY KEY (batch, i))")
    assert db.apply_changes("keyed", _batch(1)) == 1
    filler = _fill(disk, leave=70 << 10)  # one ~45 KB record fits, two do not
    outcomes: dict[int, object] = {}

    def send(n: int) -> None:
        try:
            outcomes[n] = db.apply_changes("keyed", _batch(n))
        except Exception as e:  # noqa: BLE001 (the outcome is checked below)
            outcomes[n] = e

    engine = db._engine
    with engine.write_lock:  # both producers queue up; whoever gets the lock converts both as one unit
        threads = [threading.Thread(target=send, args=(n,)) for n in (2, 3)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
    for thread in threads:
        thread.join()
    assert all(isinstance(outcomes[n], DiskFullError) for n in (2, 3)), outcomes
    assert sorted(db.sql("SELECT DISTINCT batch FROM keyed").column("batch").to_pylist()) == [1]

    filler.unlink()
    assert db.apply_changes("keyed", _batch(2)) == 2  # the offsets the refused unit did not use
    assert db.apply_changes("keyed", _batch(3)) == 3
    db.close()
    db = ivm.connect(disk / "db")
    try:
        rows = db.sql("SELECT batch, COUNT(*) AS n FROM keyed GROUP BY batch").to_pylist()
        assert {r["batch"]: r["n"] for r in rows} == {1: ROWS, 2: ROWS, 3: ROWS}
    finally:
        db.close()


def test_a_segment_that_cannot_be_created_refuses_the_batch_and_writes_go_on(few_inodes):
    db = ivm.connect(few_inodes / "db", segment_bytes=1, **QUIET)  # every record starts a segment
    db.execute("CREATE TABLE events (batch BIGINT, i BIGINT, pad VARCHAR)")
    assert db.apply_changes("events", _batch(1, rows=2)) == 1
    fillers = []
    try:
        while True:
            fillers.append(few_inodes / f"inode{len(fillers)}")
            fillers[-1].touch()
    except OSError as e:
        assert e.errno == errno.ENOSPC
        fillers.pop()
    for _ in range(2):
        with pytest.raises(DiskFullError, match="creating change log segment 00000000000000000002.log failed: "
                                                "the disk is full"):
            db.apply_changes("events", _batch(2, rows=2))
    fillers.pop().unlink()
    assert db.apply_changes("events", _batch(2, rows=2)) == 2
    fillers.pop().unlink()
    assert db.apply_changes("events", _batch(3, rows=2)) == 3
    for filler in fillers:
        filler.unlink()
    db.close()
    db = ivm.connect(few_inodes / "db")
    try:
        assert _counts(db) == {1: 2, 2: 2, 3: 2}
    finally:
        db.close()


def test_a_checkpoint_on_a_full_disk_fails_and_is_retried_with_the_log_intact(disk):
    db = ivm.connect(disk / "db", checkpoint_seconds=3600, checkpoint_rows=1)  # checkpoints are due at once
    db.execute("CREATE TABLE events (batch BIGINT, i BIGINT, pad VARCHAR)")
    filler = _fill(disk, leave=300 << 10)
    acknowledged = []
    for n in range(1, 4):
        db.apply_changes("events", _batch(n))
        acknowledged.append(n)
    _fill(disk)  # what the log left: the background checkpoint cannot write its files
    deadline = time.time() + 10
    while db.status()["checkpoint_error"] is None and time.time() < deadline:
        time.sleep(0.05)
    assert db.status()["checkpoint_error"] is not None
    stored = db.status()["relations"][0]["stored_offset"]
    assert stored < 3
    with pytest.raises(Exception):  # noqa: B017 (whatever the file system says)
        db.checkpoint()
    filler.unlink()
    (disk / "filler").unlink(missing_ok=True)
    deadline = time.time() + 10  # the background checkpointer retries
    while db.status()["relations"][0]["stored_offset"] < 3 and time.time() < deadline:
        time.sleep(0.1)
    assert db.status()["relations"][0]["stored_offset"] == 3 and db.status()["checkpoint_error"] is None
    db.close()
    db = ivm.connect(disk / "db")
    try:
        assert _counts(db) == {b: ROWS for b in acknowledged}
    finally:
        db.close()


def test_ddl_on_a_full_disk_fails_and_loses_nothing_acknowledged(disk):
    db = ivm.connect(disk / "db", **QUIET)
    db.execute("CREATE TABLE events (batch BIGINT, i BIGINT, pad VARCHAR)")
    db.apply_changes("events", _batch(1))
    _fill(disk)
    with pytest.raises(Exception):  # noqa: B017 (its checkpoint cannot be written)
        db.execute("CREATE MATERIALIZED VIEW per_batch AS SELECT batch, COUNT(*) AS n FROM events GROUP BY batch")
    (disk / "filler").unlink()
    db.apply_changes("events", _batch(2))
    db.close()
    db = ivm.connect(disk / "db")
    try:
        assert _counts(db) == {1: ROWS, 2: ROWS}
    finally:
        db.close()


def test_a_short_write_is_undone_without_a_small_disk(tmp_path):
    """The file size limit (RLIMIT_FSIZE) makes the kernel write part of a record, then fail with
    EFBIG: the partial record is cut, the batch fails, the log is not poisoned and goes on."""
    script = textwrap.dedent("""
        import resource, signal, sys
        import pyarrow as pa
        from storage.log import ChangeLog, LogError, Record
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal
        log = ChangeLog(sys.argv[1])
        log.open(after=0)
        log.append(Record(1, "t", pa.table({"a": list(range(100))})))
        log.wait_durable(1)
        size = log.stats()["bytes"]
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 500, resource.RLIM_INFINITY))
        try:
            log.append(Record(2, "t", pa.table({"a": list(range(1000))})))
        except LogError as e:
            print("refused:", e)
        assert log.stats()["bytes"] == size, "the partial record was not cut"
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        log.append(Record(2, "t", pa.table({"a": [2]})))
        log.wait_durable(2)
        log.close()
        print([r.offset for r in ChangeLog(sys.argv[1]).open(after=0)])
    """)
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "log")], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert result.returncode == 0, result.stderr
    refused, offsets = result.stdout.splitlines()
    assert "File too large" in refused and "the batch was not accepted" in refused
    assert offsets == "[1, 2]"
