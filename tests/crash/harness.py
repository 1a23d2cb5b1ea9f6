"""Kill a writer with SIGKILL at chosen moments, reopen, and check everything.

One cycle: start ``tests.crash.writer`` (which recovers the database and
goes on writing), wait until it is ready, then kill it either after a random
delay or as soon as it reaches a crash hook (where it sleeps, so the kill
lands inside that window), then open the database here and verify:

* the producer's last applied seq is the last intended batch or the one
  before (the batch in flight); never less than the last acknowledged one;
* every acknowledged (source, seq) is remembered with its offset: sending it
  again returns that offset and applies nothing (exactly once);
* every table equals the model of the applied batches (nothing half-applied,
  nothing lost, nothing twice), and every view equals DuckDB recomputing it;
* with DDL in the workload (``Kill.ddl_every``): the catalog's DDL objects are
  those after the last completed DDL step or after the one in flight, never
  anything else (no half-created or half-dropped object), the odd table holds
  its one batch exactly once or not at all, and its views equal recomputing them.

Checkpoints append differences to relations of any size here (the writer and
the reopen lower ``APPEND_MIN_ROWS`` to 0), so kills land around appended
commits and reopens sum them. The returned status adds ``appended_relations``
(relations the manifest named at an appended version when reopened) and
``append_commits`` (appended commits in the relations' Delta logs so far).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import duckdb

import ivm
from storage import checkpoint as checkpoint_module
from storage.checkpoint import read_manifest
from tests.crash.writer import APPEND_SETTINGS
from tests.crash.workload import (DDL_OBJECTS, MAIN_VIEW, MAIN_VIEW_SQL, ODD_ROWS, ODD_TABLE, ODD_VIEW, SOURCE,
                                  TABLES, SideFiles, ddl_state, model_of, qi, views)
from tests.oracle.compare import multiset_diff
from tests.oracle.fixtures import oracle_schema
from tests.oracle.model import ops_to_arrow

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 90.0
KILLS: Counter = Counter()  # SIGKILLs delivered in this process, by moment (hook name or "random")


@dataclass
class Kill:
    hook: str | None = None  # kill inside this hook's window; None: after ``delay``
    delay: float = 0.5
    sleep: float = 1.0  # how long the hook stalls the writer
    compact_every: int = 0
    ddl_every: int = 0  # the writer runs a DDL step after every N batches (workload.DDL_STEPS)


def _marks_after_ready(side: SideFiles) -> list[str]:
    if not side.marks.exists():
        return []
    lines = side.marks.read_text().splitlines()
    return lines[lines.index("ready") + 1:] if "ready" in lines else []


def _wait(proc: subprocess.Popen, what: str, done, errors: Path, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if proc.poll() is not None:
            raise AssertionError(f"the writer exited ({proc.returncode}) before {what}:\n{errors.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError(f"the writer did not reach {what} in {timeout:.0f}s:\n{errors.read_text()[-3000:]}")
        time.sleep(0.01)


def run_writer_and_kill(db_dir: Path, side_dir: Path, seed: int, kill: Kill) -> None:
    side = SideFiles(side_dir)
    side.marks.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "IVM_CRASH_MARKS": str(side.marks),
           "IVM_CRASH_HOOKS": f"{kill.hook}={kill.sleep}" if kill.hook else ""}
    args = [sys.executable, "-m", "tests.crash.writer", str(db_dir), str(side_dir), str(seed)]
    if kill.compact_every:
        args += ["--compact-every", str(kill.compact_every), "--retain"]
    if kill.ddl_every:
        args += ["--ddl-every", str(kill.ddl_every)]
    errors = side_dir / "writer.err"
    with open(errors, "w") as err:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
    try:
        _wait(proc, "ready", lambda: side.marks.exists() and "ready" in side.marks.read_text().split(), errors)
        if kill.hook:
            _wait(proc, f"hook {kill.hook}", lambda: kill.hook in _marks_after_ready(side), errors)
        else:
            time.sleep(kill.delay)
            if proc.poll() is not None:
                raise AssertionError(f"the writer exited ({proc.returncode}):\n{errors.read_text()[-3000:]}")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, errors.read_text()[-3000:]
    KILLS[kill.hook or "random"] += 1


def verify(db_dir: Path, side_dir: Path) -> dict:
    """Reopen and check (see the module docstring); return the database's status."""
    side = SideFiles(side_dir)
    intents = side.read_intents()
    acks = side.read_acks()
    appended = _appended_relations(db_dir)
    # Checkpoints append here too, as in the writer: the first one after a kill between a
    # relation's commit and the manifest must then overwrite, not append.
    saved = checkpoint_module.APPEND_MIN_ROWS, checkpoint_module.APPEND_SHARE
    checkpoint_module.APPEND_MIN_ROWS, checkpoint_module.APPEND_SHARE = APPEND_SETTINGS
    try:
        db = ivm.connect(db_dir)
    except BaseException:
        checkpoint_module.APPEND_MIN_ROWS, checkpoint_module.APPEND_SHARE = saved
        raise
    try:
        status = db.status()
        status["appended_relations"] = appended
        status["append_commits"] = _append_commits(db_dir)
        assert status["checkpoint_error"] is None
        failed = [r for r in status["relations"] if r["status"] != "ok"]
        assert not failed, failed
        last = status["producers"].get(SOURCE, {}).get("seq", -1)
        intended = intents[-1]["seq"] if intents else -1
        assert last in (intended, intended - 1), (last, intended)
        assert last >= max(acks, default=-1), (last, max(acks))
        offsets = [acks[s] for s in sorted(acks)]
        assert offsets == sorted(set(offsets)), "acknowledged offsets must grow with seq"
        by_seq = {i["seq"]: i for i in intents}
        model = model_of([i for i in intents if i["seq"] <= last])
        for seq in sorted(acks)[-10:]:
            intent = by_seq[seq]
            batch = ops_to_arrow(model.specs[intent["table"]], intent["ops"])
            assert db.apply_changes(intent["table"], batch, source=SOURCE, seq=seq) == acks[seq]
        ddl = _check_ddl(db, side)
        _compare(db, model, ddl)
        return status
    finally:
        try:
            db.close()
        finally:
            checkpoint_module.APPEND_MIN_ROWS, checkpoint_module.APPEND_SHARE = saved


def _appended_relations(db_dir: Path) -> int:
    """Relations the manifest names at a version with appended differences (what recovery sums)."""
    manifest = read_manifest(db_dir)
    return sum(1 for s in (manifest or {}).get("relations", {}).values() if s.get("appends", 0))


def _append_commits(db_dir: Path) -> int:
    """Appended differences committed so far to the relations' Delta tables (their logs)."""
    count = 0
    for commit in (Path(db_dir) / "relations").glob("*/_delta_log/*.json"):
        for line in commit.read_text().splitlines():
            if '"ivm.appends"' in line and not re.search(r'"ivm\.appends":\s*"0"', line):
                count += 1
    return count


def _check_ddl(db: ivm.Database, side: SideFiles) -> frozenset[str]:
    """The DDL objects present: the state before or after the DDL step in flight, whole."""
    intended, done = side.read_ddl()
    assert intended in (done, done + 1), (intended, done)
    present = frozenset(o.name for o in db.objects() if o.name in DDL_OBJECTS)
    held = []
    if ODD_TABLE in present:
        held = sorted(zip(*db.sql(f"SELECT id, v FROM {qi(ODD_TABLE)}").to_pydict().values()))
        assert held in ([], sorted(zip(*ODD_ROWS.values()))), f"the odd table's batch applied partly or twice: {held}"
    candidates = {ddl_state(done), ddl_state(intended)}
    assert (present, bool(held)) in candidates, f"DDL objects {present} (batch held: {bool(held)}) are neither " \
                                                f"of {candidates} (steps done {done}, intended {intended})"
    if ODD_VIEW in present:
        want = db.sql(f"SELECT COUNT(*) AS n, SUM(id) AS s FROM {qi(ODD_TABLE)}").to_pylist()
        assert db.sql(f"SELECT * FROM {qi(ODD_VIEW)}").to_pylist() == want
    return present


def _compare(db: ivm.Database, model, ddl: frozenset[str] = frozenset()) -> None:
    ref = duckdb.connect()
    for statement in oracle_schema():
        ref.execute(statement)
    for table in TABLES:
        data = model.arrow(table)  # noqa: F841  (read by DuckDB)
        ref.execute(f"INSERT INTO {table} SELECT * FROM data")
    problems = []
    for table in TABLES:
        diff = multiset_diff(db.sql(f"SELECT * FROM {table}"), ref.sql(f"SELECT * FROM {table}").to_arrow_table())
        if diff:
            problems.append(f"table {table}: {diff}")
    for view in views():
        ref.execute(f"CREATE VIEW {view.name} AS {view.sql}")
        diff = multiset_diff(db.sql(f"SELECT * FROM {view.name}"), ref.sql(f"SELECT * FROM {view.name}").to_arrow_table())
        if diff:
            problems.append(f"view {view.name}: {diff}")
    if MAIN_VIEW in ddl:
        ref.execute(f"CREATE VIEW {qi(MAIN_VIEW)} AS {MAIN_VIEW_SQL}")
        diff = multiset_diff(db.sql(f"SELECT * FROM {qi(MAIN_VIEW)}"),
                             ref.sql(f"SELECT * FROM {qi(MAIN_VIEW)}").to_arrow_table())
        if diff:
            problems.append(f"view {MAIN_VIEW}: {diff}")
    ref.close()
    assert not problems, "\n".join(problems)


def crash_cycles(base: Path, kills: list[Kill], seed: int) -> list[dict]:
    """Run the cycles on one database (its history grows across them); return each verified status."""
    db_dir, side_dir = base / "db", base / "side"
    side_dir.mkdir(parents=True, exist_ok=True)
    statuses = []
    for i, kill in enumerate(kills):
        run_writer_and_kill(db_dir, side_dir, seed * 1000 + i, kill)
        try:
            statuses.append(verify(db_dir, side_dir))
        except AssertionError as e:
            raise AssertionError(f"cycle {i} ({kill}): {e}") from None
    return statuses
