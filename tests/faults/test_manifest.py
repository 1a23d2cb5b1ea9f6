"""Issue 23, item 5: a missing or damaged checkpoint.json stops the open; nothing is deleted.

Before: a database whose manifest was gone opened as an empty database, and
its next checkpoint deleted every relation directory. Now a directory that
holds relations or log records but no manifest is refused, naming what is
missing, and a manifest that is not valid JSON of the known format is refused
naming the file; in both cases every file stays as it was. A directory the
database was only starting to create (empty ``relations/`` and ``log/``, a
log segment with no records, a manifest temp file never renamed) is fresh.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest

import ivm
from storage.checkpoint import StorageError


def tree(path: Path) -> dict[str, str]:
    """Every file under ``path`` (but the lock) with a hash of its bytes."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file() and p.name != "LOCK"}


def with_data(path: Path) -> None:
    db = ivm.connect(path, checkpoint_seconds=3600, log_retention_seconds=None)
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR)")
    db.execute("CREATE MATERIALIZED VIEW c AS SELECT v, COUNT(*) AS n FROM t GROUP BY v")
    db.apply_changes("t", pa.table({"id": [1, 2, 3], "v": ["a", "b", "b"]}))
    db.close()


def test_a_missing_manifest_stops_the_open_and_deletes_nothing(tmp_path):
    with_data(tmp_path)
    (tmp_path / "checkpoint.json").unlink()
    files = tree(tmp_path)
    assert any(name.startswith("relations/") for name in files)
    for _ in range(2):  # and again: the first refusal changed nothing
        with pytest.raises(StorageError, match=r"checkpoint\.json is missing, but the directory holds stored "
                                               r"data \(relations/r[0-9]+.*\).*does not open"):
            ivm.connect(tmp_path)
        assert tree(tmp_path) == files


def test_a_missing_manifest_with_only_log_records_stops_the_open(tmp_path):
    with_data(tmp_path)
    db = ivm.connect(tmp_path, checkpoint_seconds=3600, log_retention_seconds=None)
    db.apply_changes("t", pa.table({"id": [9], "v": ["z"]}))
    db.close()
    for child in (tmp_path / "relations").iterdir():  # the log alone shows data was there
        for f in sorted(child.rglob("*"), reverse=True):
            f.rmdir() if f.is_dir() else f.unlink()
        child.rmdir()
    (tmp_path / "checkpoint.json").unlink()
    assert any(p.stat().st_size for p in (tmp_path / "log").iterdir())
    files = tree(tmp_path)
    with pytest.raises(StorageError, match=r"checkpoint\.json is missing.*\(log/[0-9]+\.log"):
        ivm.connect(tmp_path)
    assert tree(tmp_path) == files


def _without_relations(doc: dict) -> bytes:
    del doc["relations"]
    return json.dumps(doc).encode()


def _dir_outside(doc: dict) -> bytes:
    doc["relations"]["t"]["dir"] = "../../elsewhere"
    return json.dumps(doc).encode()


@pytest.mark.parametrize("damage, problem", [
    (lambda doc: json.dumps(doc).encode()[:-40], "not valid JSON"),  # cut short
    (lambda doc: b"\xff\xfe garbage", "not valid JSON"),
    (lambda doc: b"[1, 2]", "holds a JSON list"),
    (lambda doc: b'{"format": 99}', "unknown checkpoint format 99"),
    (_without_relations, "'relations' is missing"),
    (_dir_outside, "names no directory"),
], ids=["truncated", "binary", "list", "format", "no relations", "dir outside"])
def test_a_damaged_manifest_stops_the_open_naming_it(tmp_path, damage, problem):
    with_data(tmp_path)
    manifest = tmp_path / "checkpoint.json"
    manifest.write_bytes(damage(json.loads(manifest.read_text())))
    files = tree(tmp_path)
    with pytest.raises(StorageError, match=rf"manifest {manifest} is damaged: .*{problem}.*nothing was changed"):
        ivm.connect(tmp_path)
    assert tree(tmp_path) == files


def test_a_manifest_naming_a_missing_relation_directory_stops_the_open(tmp_path):
    with_data(tmp_path)
    entry = json.loads((tmp_path / "checkpoint.json").read_text())["relations"]["t"]
    (tmp_path / "relations" / entry["dir"]).rename(tmp_path / "moved")
    files = tree(tmp_path)
    with pytest.raises(StorageError, match=rf"relation t is stored in .*relations/{entry['dir']}.*missing"):
        ivm.connect(tmp_path)
    assert tree(tmp_path) == files


def test_a_fresh_directory_opens_and_has_a_manifest_at_once(tmp_path):
    db = ivm.connect(tmp_path / "new")
    assert (tmp_path / "new" / "checkpoint.json").exists()  # before any DDL: every later state has one
    assert db.objects() == []
    db.close()
    db = ivm.connect(tmp_path / "new")
    assert db.objects() == []
    db.close()


@pytest.mark.parametrize("shape", ["nothing", "empty dirs", "empty log segment", "manifest temp file"])
def test_crash_before_the_first_manifest_opens_as_fresh(tmp_path, shape):
    """What a crash while the database directory was being created can leave."""
    path = tmp_path / "db"
    path.mkdir()
    if shape != "nothing":
        (path / "relations").mkdir()
        (path / "log").mkdir()
        (path / "LOCK").touch()
    if shape == "empty log segment":
        (path / "log" / f"{1:020d}.log").touch()
    if shape == "manifest temp file":
        (path / "checkpoint.json.tmp").write_text('{"format": 1, "offs')
    db = ivm.connect(path)
    assert db.objects() == []
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    db.apply_changes("t", pa.table({"id": [1, 2]}))
    db.close()
    db = ivm.connect(path)
    assert db.sql("SELECT COUNT(*) AS n FROM t").to_pylist() == [{"n": 2}]
    db.close()
    assert not (path / "checkpoint.json.tmp").exists()


def test_checkpoints_delete_only_what_the_manifest_they_wrote_does_not_name(tmp_path):
    """Dropped relations' directories and leftovers go; what the manifest names, and files, stay."""
    db = ivm.connect(tmp_path, checkpoint_seconds=3600)
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY)")
    db.execute("CREATE TABLE gone (id BIGINT PRIMARY KEY)")
    (tmp_path / "relations" / "r999").mkdir()  # a leftover of a crashed checkpoint
    (tmp_path / "relations" / "notes.txt").write_text("not a relation")
    db.apply_changes("t", pa.table({"id": [1]}))
    db.execute("DROP TABLE gone")
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    named = sorted(e["dir"] for e in doc["relations"].values())
    assert sorted(p.name for p in (tmp_path / "relations").iterdir()) == sorted(named + ["notes.txt"])
    db.close()
    db = ivm.connect(tmp_path)
    assert db.sql("SELECT * FROM t").to_pylist() == [{"id": 1}]
    db.close()
