"""Issue 23, item 2: relation directories are ids, and a DDL whose storage fails changes nothing.

Before: a relation's directory was its %-encoded SQL name (``relations/a%20b``),
which deltalake opened decoded; a name longer than a file name failed too. The
CREATE stayed in the catalog, its writes were acknowledged, close() failed and
the database never opened again. Now every relation lives in ``relations/r<N>``
and the manifest maps names to those ids; a DDL whose checkpoint fails (disk
full on a real tmpfs, a manifest that cannot be written) leaves the catalog,
the relations and the files as before the statement, in the live database and
after a reopen.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from urllib.parse import quote as url_quote

import pyarrow as pa
import pytest

import ivm
from storage.checkpoint import StorageError

ODD_NAMES = ["a b", 'say "hi"', "x/y", "a+b", "café", "表", "🙂 smile",
             "long " + "表" * 90]  # 275 bytes in UTF-8: longer than any file name may be


def q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def manifest(path: Path) -> dict:
    return json.loads((path / "checkpoint.json").read_text())


def dirs(path: Path) -> list[str]:
    return sorted(p.name for p in (path / "relations").iterdir())


def shape(db: ivm.Database) -> list[tuple]:
    """The catalog as users see it: every relation (views' states too), its kind, rows and status."""
    return sorted((r["name"], r["kind"], r["rows"], r["status"]) for r in db.status()["relations"])


def rows(db: ivm.Database, sql: str) -> list:
    return sorted(map(str, db.sql(sql).to_pylist()))


@pytest.mark.parametrize("name", ODD_NAMES)
def test_odd_names_store_reopen_read_back_and_drop(tmp_path, name):
    assert len(name.encode()) < 255 or len(url_quote(name, safe="").encode()) > 255
    db = ivm.connect(tmp_path, checkpoint_seconds=3600)
    db.execute(f"CREATE TABLE {q(name)} (id BIGINT PRIMARY KEY, v VARCHAR)")
    db.apply_changes(name, pa.table({"id": [1, 2, 3], "v": ["a", "b", "b"]}))
    db.execute(f"CREATE MATERIALIZED VIEW {q(name + ' agg')} AS SELECT v, COUNT(*) AS n FROM {q(name)} GROUP BY v")
    db.execute(f"CREATE MATERIALIZED VIEW {q(name + ' filtered')} AS SELECT id FROM {q(name)} WHERE id > 1")
    db.apply_changes(name, pa.table({"id": [4], "v": ["a"]}))
    want = {n: rows(db, f"SELECT * FROM {q(n)}") for n in (name, name + " agg", name + " filtered")}
    assert want[name + " agg"] == ["{'v': 'a', 'n': 2}", "{'v': 'b', 'n': 2}"]
    db.close()

    stored = manifest(tmp_path)
    named = {**stored["relations"], **stored["outputs"]}
    assert {name, name + " agg", name + " filtered"} <= named.keys()
    assert stored["outputs"], "a view computed on read has its rows stored too"
    assert all(re.fullmatch(r"r[0-9]+", entry["dir"]) for entry in named.values()), named
    assert dirs(tmp_path) == sorted(entry["dir"] for entry in named.values())

    db = ivm.connect(tmp_path, checkpoint_seconds=3600)
    assert {n: rows(db, f"SELECT * FROM {q(n)}") for n in want} == want
    for view in (name + " agg", name + " filtered"):  # what outside readers get: files under relations/r<N>
        files = db.stored_files(view)
        assert files and all(re.search(r"/relations/r[0-9]+/[^/]+\.parquet$", f) for f in files), files
    db.apply_changes(name, pa.table({"id": [5], "v": ["c"]}))
    db.execute(f"DROP MATERIALIZED VIEW {q(name + ' agg')}")
    db.close()

    db = ivm.connect(tmp_path, checkpoint_seconds=3600)
    assert rows(db, f"SELECT COUNT(*) AS n FROM {q(name)}") == ["{'n': 5}"]
    db.execute(f"DROP TABLE {q(name)} CASCADE")
    assert db.objects() == []
    db.close()
    assert dirs(tmp_path) == []  # every dropped relation's directory went with it

    db = ivm.connect(tmp_path)
    assert db.objects() == []
    db.execute(f"CREATE TABLE {q(name)} (id BIGINT PRIMARY KEY)")  # made again: empty, in a new directory
    assert rows(db, f"SELECT * FROM {q(name)}") == []
    db.close()


def test_old_manifests_with_name_directories_still_load(tmp_path):
    """Manifests written before ids name each relation's directory after the relation."""
    db = ivm.connect(tmp_path, checkpoint_seconds=3600)
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR)")
    db.execute("CREATE MATERIALIZED VIEW c AS SELECT v, COUNT(*) AS n FROM t GROUP BY v")
    db.apply_changes("t", pa.table({"id": [1, 2], "v": ["a", "b"]}))
    db.close()
    doc = manifest(tmp_path)  # rewrite it as the old code wrote it: dir = the name
    for part in ("relations", "outputs"):
        for name, entry in doc[part].items():
            os.rename(tmp_path / "relations" / entry["dir"], tmp_path / "relations" / url_quote(name, safe=""))
            entry["dir"] = url_quote(name, safe="")
    (tmp_path / "checkpoint.json").write_text(json.dumps(doc))
    old = dirs(tmp_path)
    assert "t" in old

    db = ivm.connect(tmp_path, checkpoint_seconds=3600)
    assert rows(db, "SELECT * FROM c") == ["{'v': 'a', 'n': 1}", "{'v': 'b', 'n': 1}"]
    db.apply_changes("t", pa.table({"id": [3], "v": ["a"]}))
    db.execute("CREATE TABLE u (id BIGINT PRIMARY KEY)")
    db.close()
    doc = manifest(tmp_path)
    assert doc["relations"]["t"]["dir"] == "t"  # a relation keeps its directory
    assert re.fullmatch(r"r[0-9]+", doc["relations"]["u"]["dir"])

    db = ivm.connect(tmp_path, checkpoint_seconds=3600)
    assert rows(db, "SELECT * FROM c") == ["{'v': 'a', 'n': 2}", "{'v': 'b', 'n': 1}"]
    db.execute("DROP TABLE t CASCADE")
    db.close()
    assert dirs(tmp_path) == [manifest(tmp_path)["relations"]["u"]["dir"]]


# --- a DDL whose storage step fails ----------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A real 16 MiB tmpfs (skipped where this machine cannot mount one)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up here ({done.stderr.strip() or done.returncode}): "
                    "the disk-full DDL tests need one (run as root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the file system is full; return it (delete it to free the space)."""
    filler = disk / "filler"
    chunk = b"\0" * (1 << 16)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            assert e.errno == 28, e  # ENOSPC
    with open(filler, "ab", buffering=0) as f:  # the last pages a partial chunk left
        try:
            while True:
                f.write(b"\0")
        except OSError as e:
            assert e.errno == 28, e
    return filler


def populated(path: Path) -> ivm.Database:
    db = ivm.connect(path, checkpoint_seconds=3600)
    db.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR)")
    db.execute("CREATE MATERIALIZED VIEW filtered AS SELECT id, v FROM t WHERE id > 1")
    db.execute("CREATE MATERIALIZED VIEW counted AS SELECT v, COUNT(*) AS n FROM t GROUP BY v")
    assert {r[0]: r[1] for r in shape(db)}["counted"] == "materialized view (computed on read)"
    db.apply_changes("t", pa.table({"id": [1, 2, 3], "v": ["a", "b", "b"]}))
    db.checkpoint()
    return db


FAILING_DDL = [
    "CREATE TABLE {name} (id BIGINT PRIMARY KEY, w VARCHAR)",
    "CREATE MATERIALIZED VIEW {name} AS SELECT v, SUM(id) AS s FROM t GROUP BY v",
    # reads a view computed on read, which must get stored output: undone too
    "CREATE MATERIALIZED VIEW {name} AS SELECT SUM(n) AS n FROM counted",
    "DROP MATERIALIZED VIEW counted",
    "DROP TABLE t CASCADE",
]


def _check_undone(db: ivm.Database, path: Path, before: dict) -> None:
    assert shape(db) == before["shape"]
    assert {n: rows(db, f"SELECT * FROM {n}") for n in ("t", "filtered", "counted")} == before["rows"]
    assert dirs(path) == before["dirs"]
    assert (path / "checkpoint.json").read_bytes() == before["manifest"]
    assert not (path / "checkpoint.json.tmp").exists()


def _before(db: ivm.Database, path: Path) -> dict:
    return {"shape": shape(db), "rows": {n: rows(db, f"SELECT * FROM {n}") for n in ("t", "filtered", "counted")},
            "dirs": dirs(path), "manifest": (path / "checkpoint.json").read_bytes()}


@pytest.mark.parametrize("statement", FAILING_DDL)
def test_ddl_on_a_full_disk_changes_nothing(small_disk, statement):
    path = small_disk / "db"
    db = populated(path)
    before = _before(db, path)
    filler = fill(small_disk)
    with pytest.raises(StorageError, match=r"was undone: storing it failed .*No space left on device"):
        db.execute(statement.format(name=q("new é 表")))
    _check_undone(db, path, before)
    db.close()  # nothing to store: closes on the full disk

    db = ivm.connect(path, checkpoint_seconds=3600)  # reopens as before the statement, disk still full
    _check_undone(db, path, before)
    filler.unlink()
    db.apply_changes("t", pa.table({"id": [4], "v": ["a"]}))  # and goes on once there is space
    db.execute(statement.format(name=q("new é 表")))
    after = shape(db)
    db.close()
    db = ivm.connect(path)
    assert shape(db) == after
    db.close()


def test_ddl_whose_manifest_cannot_be_written_changes_nothing(tmp_path):
    """The relations of a CREATE are committed, then the manifest write fails: the new
    directories go, the catalog is as before."""
    db = populated(tmp_path)
    before = _before(db, tmp_path)
    (tmp_path / "checkpoint.json.tmp").mkdir()  # the manifest's temporary file cannot be created
    for statement in FAILING_DDL:
        with pytest.raises(StorageError, match="was undone: storing it failed"):
            db.execute(statement.format(name="fresh"))
        assert shape(db) == before["shape"]
        assert dirs(tmp_path) == before["dirs"]
    assert (tmp_path / "checkpoint.json").read_bytes() == before["manifest"]
    (tmp_path / "checkpoint.json.tmp").rmdir()
    db.apply_changes("t", pa.table({"id": [4], "v": ["a"]}))
    assert rows(db, "SELECT * FROM counted") == ["{'v': 'a', 'n': 2}", "{'v': 'b', 'n': 2}"]
    db.execute("CREATE MATERIALIZED VIEW fresh AS SELECT SUM(n) AS n FROM counted")
    want = shape(db)
    db.close()
    db = ivm.connect(tmp_path)
    assert shape(db) == want
    assert db.sql("SELECT n::BIGINT AS n FROM fresh").to_pylist() == [{"n": 4}]
    db.close()


def test_ddl_refused_for_storage_reasons_is_undone_too(tmp_path):
    """A CREATE durable storage cannot hold (INTERVAL) is refused; the view it read on the way
    (computed on read, switched to stored output on the way) is back as it was."""
    db = populated(tmp_path)
    before = _before(db, tmp_path)
    with pytest.raises(ivm.UnsupportedError, match="cannot be stored durably"):
        db.execute("CREATE MATERIALIZED VIEW bad AS SELECT v, INTERVAL 1 DAY * n AS i FROM counted")
    _check_undone(db, tmp_path, before)
    db.close()
    db = ivm.connect(tmp_path)
    assert shape(db) == before["shape"]
    db.close()
