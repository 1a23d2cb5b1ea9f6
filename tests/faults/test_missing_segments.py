"""Issue 23 item 4: a missing log segment past the checkpoint stops the open.

Change offsets above the checkpoint must continue from its offset + 1 with
no gap. Each way a segment can go missing is checked, and so is each way
the log is legitimately shorter or sparse (retention, compaction, an empty
rolled segment, a fresh database, a log retention removed entirely).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

import ivm
from storage.log import ChangeLog, LogError, Record

ROOT = Path(__file__).resolve().parents[2]


def _log(directory: Path, offsets, segment_bytes: int = 1) -> ChangeLog:
    """A closed log holding ``offsets`` (segment_bytes=1: one record per segment)."""
    log = ChangeLog(directory, segment_bytes=segment_bytes)
    log.open(after=0)
    for offset in offsets:
        log.append(Record(offset, "t", pa.table({"a": [offset]})))
    log.close()
    return log


def _segment(log: ChangeLog, first: int) -> Path:
    return dict(log.segments())[first]


def _opened(directory: Path, after: int) -> list[int]:
    return [r.offset for r in ChangeLog(directory).open(after=after)]


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


@pytest.mark.parametrize("after, deleted, missing", [
    (0, [3], "offset 3"),            # a middle segment
    (2, [3], "offset 3"),            # the first one after the checkpoint
    (0, [1], "offset 1"),            # the very first one, nothing checkpointed
    (2, [3, 4], "offsets 3 to 4"),   # several
    (3, [5], "offset 5"),            # the one before the newest
])
def test_a_missing_segment_past_the_checkpoint_stops_the_open(tmp_path, after, deleted, missing):
    log = _log(tmp_path / "log", range(1, 7))
    for first in deleted:
        _segment(log, first).unlink()
    before = _files(tmp_path / "log")
    with pytest.raises(LogError, match=f"the change log is missing {missing}: the checkpoint is at offset {after}"):
        ChangeLog(tmp_path / "log").open(after=after)
    assert _files(tmp_path / "log") == before


def test_the_error_names_the_segment_after_the_gap(tmp_path):
    log = _log(tmp_path / "log", range(1, 5))
    _segment(log, 2).unlink()
    with pytest.raises(LogError) as raised:
        ChangeLog(tmp_path / "log").open(after=0)
    assert ("holds up to offset 1 (in 00000000000000000001.log) and segment 00000000000000000003.log "
            "continues with offset 3") in str(raised.value)


def test_an_empty_newest_segment_after_a_gap_stops_the_open(tmp_path):
    log = _log(tmp_path / "log", range(1, 4))
    (tmp_path / "log" / "00000000000000000006.log").touch()  # rolled after offset 5; 4 and 5 are gone
    with pytest.raises(LogError, match="missing offsets 4 to 5: .*empty segment 00000000000000000006.log"):
        ChangeLog(tmp_path / "log").open(after=0)
    assert len(log.segments()) == 4


def test_a_gap_inside_a_segment_stops_the_open(tmp_path):
    log = ChangeLog(tmp_path / "log", segment_bytes=1 << 20)
    log.open(after=0)
    log.append([Record(1, "t", pa.table({"a": [1]})), Record(3, "t", pa.table({"a": [3]}))])
    log.close()
    with pytest.raises(LogError, match="missing offset 2"):
        ChangeLog(tmp_path / "log").open(after=0)


# --- what is legitimately absent ---------------------------------------------------------

def test_segments_covered_by_the_checkpoint_may_be_deleted(tmp_path):
    log = _log(tmp_path / "log", range(1, 7))
    for first in (1, 2, 3):
        _segment(log, first).unlink()
    assert _opened(tmp_path / "log", after=3) == [4, 5, 6]


def test_retention_after_checkpoints_leaves_an_openable_log(tmp_path):
    log = _log(tmp_path / "log", range(1, 4), segment_bytes=1 << 20)
    log = ChangeLog(tmp_path / "log", segment_bytes=1 << 20)
    log.open(after=0)
    log.roll()  # what a checkpoint at offset 3 does: roll, then delete what it covers
    assert log.delete_covered(3, retention_seconds=0) == 1
    log.append(Record(4, "t", pa.table({"a": [4]})))
    log.close()
    assert [first for first, _ in log.segments()] == [4]
    assert _opened(tmp_path / "log", after=3) == [4]


def test_a_compacted_segment_is_sparse_below_the_checkpoint(tmp_path):
    log = _log(tmp_path / "log", range(1, 7))
    log = ChangeLog(tmp_path / "log", segment_bytes=1)
    log.open(after=0)
    keep = {2, 5}  # a compaction keeps the latest change per key: offsets inside have gaps
    assert log.rewrite_covered(5, lambda records: [r for r in records if r.offset in keep]) == (5, 2)
    log.close()
    assert _opened(tmp_path / "log", after=5) == [6]
    assert _opened(tmp_path / "log", after=6) == []


def test_an_empty_rolled_segment_is_no_gap(tmp_path):
    log = _log(tmp_path / "log", range(1, 4), segment_bytes=1 << 20)
    log = ChangeLog(tmp_path / "log", segment_bytes=1 << 20)
    log.open(after=0)
    log.roll()
    log.close()
    assert [first for first, _ in log.segments()] == [1, 4]
    assert _opened(tmp_path / "log", after=0) == [1, 2, 3]
    assert _opened(tmp_path / "log", after=3) == []


def test_a_segment_named_above_its_first_record_is_no_gap(tmp_path):
    log = _log(tmp_path / "log", range(1, 4), segment_bytes=1 << 20)
    (tmp_path / "log" / "00000000000000000001.log").rename(tmp_path / "log" / "00000000000000000002.log")
    assert _opened(tmp_path / "log", after=0) == [1, 2, 3]
    assert [first for first, _ in log.segments()] == [2]


def test_a_fresh_log_and_a_log_retention_removed_entirely(tmp_path):
    fresh = ChangeLog(tmp_path / "fresh")
    assert fresh.open(after=0) == [] and fresh.written == 0
    gone = ChangeLog(tmp_path / "gone")
    assert gone.open(after=7) == [] and gone.written == 7  # the next offset comes from the checkpoint
    gone.append(Record(8, "t", pa.table({"a": [8]})))
    gone.close()
    assert [first for first, _ in gone.segments()] == [8]
    assert _opened(tmp_path / "gone", after=7) == [8]


def test_a_newest_segment_entirely_below_the_checkpoint_is_no_gap(tmp_path):
    """A crash between a checkpoint's manifest and its roll leaves the log ending at the checkpoint."""
    _log(tmp_path / "log", range(1, 4), segment_bytes=1 << 20)
    assert _opened(tmp_path / "log", after=3) == []
    assert _opened(tmp_path / "log", after=5) == []


# --- through a database ------------------------------------------------------------------

def _crashed_database(path: Path) -> None:
    """Offsets 1..3 checkpointed, 4..9 only in the log (one per segment), no close."""
    script = textwrap.dedent("""
        import os, sys, ivm, pyarrow as pa
        db = ivm.connect(sys.argv[1], checkpoint_seconds=3600, checkpoint_rows=10**9, segment_bytes=1)
        db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)")
        for i in range(1, 4):
            db.apply_changes("t", pa.table({"id": [i]}))
        db.checkpoint()
        for i in range(4, 10):
            db.apply_changes("t", pa.table({"id": [i]}))
        os._exit(0)
    """)
    result = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def crashed(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("crashed") / "db"
    _crashed_database(path)
    assert [first for first, _ in ChangeLog(path / "log").segments()] == [4, 5, 6, 7, 8, 9]  # retention took 1..3
    return path


def test_the_crashed_database_opens_with_every_batch(crashed, tmp_path):
    shutil.copytree(crashed, tmp_path / "db")
    db = ivm.connect(tmp_path / "db")
    try:
        assert sorted(db.sql("SELECT id FROM t").column("id").to_pylist()) == list(range(1, 10))
    finally:
        db.close()


@pytest.mark.parametrize("deleted, missing", [([4], "offset 4"), ([6, 7], "offsets 6 to 7")])
def test_a_database_missing_a_segment_does_not_open(crashed, tmp_path, deleted, missing):
    shutil.copytree(crashed, tmp_path / "db")
    log = ChangeLog(tmp_path / "db" / "log")
    for first in deleted:
        _segment(log, first).unlink()
    with pytest.raises(ivm.IvmError, match=f"missing {missing}: the checkpoint is at offset 3"):
        ivm.connect(tmp_path / "db")
