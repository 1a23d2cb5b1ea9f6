"""Issue 23 item 3: one damaged byte in the newest log segment is damage, not a torn tail.

A byte is flipped in every position class of a frame (its length field, its
CRC, the meta length, the meta JSON, the Arrow body) of the first, a middle
and the last record of the newest segment. Damage followed by intact records
stops the open with an error naming the segment, the byte and the offset, and
changes no file; only the last record, with nothing intact after it, is cut
(a torn write: storage/log.py says why a complete final frame with a bad CRC
is cut too).
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
from storage.log_format import scan

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 5


def _frames(path: Path) -> list[tuple[int, int]]:
    """(start, end) of each frame of a segment."""
    return [(start, end) for start, end, _ in scan(path.read_bytes())]


# where in a frame starting at s and ending at e each class of byte is
POSITIONS = {
    "length low byte": lambda s, e: s,
    "length high byte": lambda s, e: s + 3,
    "crc": lambda s, e: s + 5,
    "meta length": lambda s, e: s + 8,
    "meta json": lambda s, e: s + 12 + 3,
    "arrow body": lambda s, e: e - 40,
}


def _flip(path: Path, at: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))
    return bytes(data)


def _write_log(directory: Path) -> Path:
    """An older segment (offsets 1, 2) and the newest one (offsets 3..7)."""
    log = ChangeLog(directory, segment_bytes=1 << 20)
    log.open(after=0)
    log.append([Record(1, "t", pa.table({"a": [1]})), Record(2, "t", pa.table({"a": [2]}))])
    log.roll()
    for offset in range(3, 3 + RECORDS):
        log.append(Record(offset, "t", pa.table({"a": list(range(offset * 10, offset * 10 + 20))})))
    log.wait_durable(2 + RECORDS)
    log.close()
    assert len(log.segments()) == 2
    return log.segments()[-1][1]


@pytest.mark.parametrize("where", list(POSITIONS))
@pytest.mark.parametrize("record", [0, 2])  # the first and a middle record of the newest segment
def test_damage_before_intact_records_stops_the_open_and_changes_nothing(tmp_path, where, record):
    newest = _write_log(tmp_path / "log")
    start, end = _frames(newest)[record]
    damaged = _flip(newest, POSITIONS[where](start, end))
    before = {p.name: p.read_bytes() for p in (tmp_path / "log").iterdir()}
    offset = 3 + record
    with pytest.raises(LogError) as raised:
        ChangeLog(tmp_path / "log").open(after=0)
    message = str(raised.value)
    assert f"change log segment {newest.name} is damaged at byte {start}" in message
    assert f"record after offset {offset - 1}" in message and f"(offset {offset + 1})" in message
    assert "not a torn write" in message
    assert {p.name: p.read_bytes() for p in (tmp_path / "log").iterdir()} == before
    assert newest.read_bytes() == damaged


@pytest.mark.parametrize("where", list(POSITIONS))
def test_damage_in_the_last_record_is_cut_as_a_torn_write(tmp_path, where):
    newest = _write_log(tmp_path / "log")
    start, end = _frames(newest)[-1]
    _flip(newest, POSITIONS[where](start, end))
    log = ChangeLog(tmp_path / "log")
    records = log.open(after=0)
    assert [r.offset for r in records] == list(range(1, 2 + RECORDS))  # the last one, 2 + RECORDS, is cut
    assert len(log.truncations) == 1 and f"at byte {start}" in log.truncations[0]
    assert newest.stat().st_size == start
    log.append(Record(2 + RECORDS, "t", pa.table({"a": [0]})))  # its offset is written again
    log.close()
    assert [r.offset for r in ChangeLog(tmp_path / "log").open(after=0)] == list(range(1, 3 + RECORDS))


def test_the_only_record_damaged_in_a_newest_segment_is_cut(tmp_path):
    log = ChangeLog(tmp_path / "log", segment_bytes=1)  # one record per segment
    log.open(after=0)
    for offset in (1, 2):
        log.append(Record(offset, "t", pa.table({"a": [offset]})))
    log.close()
    newest = log.segments()[-1][1]
    _flip(newest, 20)
    assert [r.offset for r in ChangeLog(tmp_path / "log").open(after=0)] == [1]


def test_a_damaged_older_segment_stops_the_open_even_at_its_end(tmp_path):
    newest = _write_log(tmp_path / "log")
    older = ChangeLog(tmp_path / "log").segments()[0][1]
    start, end = _frames(older)[-1]
    _flip(older, end - 40)
    with pytest.raises(LogError, match=f"{older.name} is damaged at byte {start} and later segments exist"):
        ChangeLog(tmp_path / "log").open(after=0)
    assert len(_frames(newest)) == RECORDS


def test_zeros_after_a_torn_record_are_still_a_torn_tail(tmp_path):
    """A crash can leave the file longer than what was written, the rest zeros."""
    newest = _write_log(tmp_path / "log")
    start, end = _frames(newest)[-1]
    data = newest.read_bytes()
    newest.write_bytes(data[: start + 30] + bytes(end - start - 30 + 4096))
    log = ChangeLog(tmp_path / "log")
    assert [r.offset for r in log.open(after=0)] == list(range(1, 2 + RECORDS))
    assert newest.stat().st_size == start


# --- through a database -----------------------------------------------------------------

def _crashed_database(path: Path) -> None:
    """Five acknowledged batches only in the log (the process died without a checkpoint)."""
    script = textwrap.dedent("""
        import os, sys, ivm, pyarrow as pa
        db = ivm.connect(sys.argv[1], checkpoint_seconds=3600, checkpoint_rows=10**9)
        db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR)")
        for i in range(1, 6):
            print(db.apply_changes("t", pa.table({"id": [i], "v": ["x" * 200]})), flush=True)
        os._exit(0)
    """)
    result = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "2", "3", "4", "5"]


@pytest.fixture(scope="module")
def crashed(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("crashed") / "db"
    _crashed_database(path)
    return path


def _newest(path: Path) -> Path:
    return ChangeLog(path / "log").segments()[-1][1]


@pytest.mark.parametrize("record", [0, 1])
def test_a_database_with_damage_before_intact_records_does_not_open(crashed, tmp_path, record):
    path = tmp_path / "db"
    shutil.copytree(crashed, path)
    newest = _newest(path)
    start, end = _frames(newest)[record]
    damaged = _flip(newest, POSITIONS["arrow body"](start, end))
    with pytest.raises(ivm.IvmError, match=f"{newest.name} is damaged at byte {start} .*not a torn write"):
        ivm.connect(path)
    assert newest.read_bytes() == damaged


def test_a_database_whose_last_record_is_damaged_opens_without_it(crashed, tmp_path):
    path = tmp_path / "db"
    shutil.copytree(crashed, path)
    newest = _newest(path)
    start, end = _frames(newest)[-1]
    _flip(newest, POSITIONS["meta json"](start, end))
    db = ivm.connect(path)
    try:
        assert sorted(db.sql("SELECT id FROM t").column("id").to_pylist()) == [1, 2, 3, 4]
        assert len(db.status()["log_truncations"]) == 1
        assert db.apply_changes("t", pa.table({"id": [5], "v": ["y"]})) == 5
    finally:
        db.close()
