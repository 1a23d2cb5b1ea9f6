"""The crash harness's workload: schema, views, and the side files of a writer.

The writer appends every batch it is about to send to ``intents.jsonl``
(before sending) and every acknowledged offset to ``acks.jsonl`` (after the
acknowledgement returned). Both live next to the database directory, not in
it. Batches are sent with source ``writer`` and seq = the intent's number,
so a restarted writer re-sends its last intent and the database applies it
at most once.

With ``--ddl-every`` the writer also runs ``DDL_STEPS`` in a cycle between
batches: CREATE and DROP of a table and views with names a path cannot hold
(quotes, ``/``, ``+``, non-ASCII, an emoji, longer than a file name), and one
batch into that table. ``ddl.jsonl`` records each step before it runs
(``intend``) and after it returned (``done``); every step is idempotent, so a
restarted writer runs its in-flight step again. ``ddl_state`` says what the
catalog holds after a number of steps, for the harness to check the reopened
database against the state before and after the step in flight.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa

from tests.oracle.fixtures import oracle_schema, oracle_views
from tests.oracle.model import Model

SOURCE = "writer"
TABLES = ["customers", "orders", "items", "events"]
VIEWS = ["join_region", "agg_minmax", "agg_count_distinct", "distinct_bag", "union_distinct", "region_sales",
         "view_over_aggregate_view", "agg_bag"]


def views():
    wanted = {v.name: v for v in oracle_views()}
    return [wanted[name] for name in VIEWS]


def ddl() -> list[str]:
    """Idempotent DDL: a writer killed while creating the schema finishes it next time."""
    statements = [s.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1) for s in oracle_schema()]
    statements += [f"CREATE MATERIALIZED VIEW IF NOT EXISTS {v.name} AS {v.sql}" for v in views()]
    return statements


# --- DDL while writing -------------------------------------------------------------------------------

DDL_SOURCE = "ddl"
ODD_TABLE = 'odd t "é" 表 🙂'
ODD_VIEW = "odd/v+ " + "表" * 90  # 277 bytes in UTF-8: longer than any file name may be
MAIN_VIEW = "a b"  # over the main workload's orders, so folds of ordinary batches change it
DDL_OBJECTS = (ODD_TABLE, ODD_VIEW, MAIN_VIEW)
ODD_ROWS = {"id": [1, 2, 3], "v": ["x", "y", "y"]}  # the table has no key: applied twice, it shows 6 rows


MAIN_VIEW_SQL = "SELECT status, COUNT(*) AS n, SUM(qty) AS q FROM orders GROUP BY status"


def qi(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


DDL_STEPS = (
    f"CREATE TABLE IF NOT EXISTS {qi(ODD_TABLE)} (id BIGINT, v VARCHAR)",
    None,  # ODD_ROWS into it, as (DDL_SOURCE, seq = the step's number)
    f"CREATE MATERIALIZED VIEW IF NOT EXISTS {qi(ODD_VIEW)} AS SELECT COUNT(*) AS n, SUM(id) AS s "
    f"FROM {qi(ODD_TABLE)}",
    f"CREATE MATERIALIZED VIEW IF NOT EXISTS {qi(MAIN_VIEW)} AS {MAIN_VIEW_SQL}",
    f"DROP MATERIALIZED VIEW IF EXISTS {qi(MAIN_VIEW)}",
    f"DROP TABLE IF EXISTS {qi(ODD_TABLE)} CASCADE",
)


def run_ddl_step(db, step: int) -> None:
    statement = DDL_STEPS[step % len(DDL_STEPS)]
    if statement is None:
        db.apply_changes(ODD_TABLE, pa.table(ODD_ROWS), source=DDL_SOURCE, seq=step)
    else:
        db.execute(statement)


def ddl_state(steps: int) -> tuple[frozenset[str], bool]:
    """The DDL objects after the first ``steps`` steps, and whether the odd table holds ODD_ROWS."""
    names: set[str] = set()
    rows = False
    for step in range(steps):
        kind = step % len(DDL_STEPS)
        if kind == 0:
            names.add(ODD_TABLE)
        elif kind == 1:
            rows = True
        elif kind in (2, 3):
            names.add(ODD_VIEW if kind == 2 else MAIN_VIEW)
        elif kind == 4:
            names.discard(MAIN_VIEW)
        else:
            names -= {ODD_TABLE, ODD_VIEW}
            rows = False
    return frozenset(names), rows


def _parses(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except json.JSONDecodeError:
        return False


def _encode(value):
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return {"float": repr(value)}
    return value


def _decode(value):
    if isinstance(value, dict):
        return float(value["float"])
    return value


class SideFiles:
    def __init__(self, directory: Path):
        self.intents = Path(directory) / "intents.jsonl"
        self.acks = Path(directory) / "acks.jsonl"
        self.marks = Path(directory) / "marks.txt"
        self.ddl = Path(directory) / "ddl.jsonl"

    def repair(self) -> None:
        """Drop a line torn by a kill, so new lines are not glued to it."""
        for path in (self.intents, self.acks, self.ddl):
            if path.exists():
                lines = path.read_text().split("\n")
                whole = [line for line in lines[:-1] if _parses(line)]  # the last piece has no newline
                if len(whole) != len(lines) - 1 or lines[-1]:
                    path.write_text("".join(line + "\n" for line in whole))

    def read_intents(self) -> list[dict]:
        if not self.intents.exists():
            return []
        out = []
        for line in self.intents.read_text().splitlines():
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                break  # a line torn by the kill: that batch was never sent
            doc["ops"] = [(op, {k: _decode(v) for k, v in row.items()}) for op, row in doc["ops"]]
            out.append(doc)
        return out

    def read_acks(self) -> dict[int, int]:
        if not self.acks.exists():
            return {}
        acks = {}
        for line in self.acks.read_text().splitlines():
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                break
            acks[doc["seq"]] = doc["offset"]
        return acks

    def intend(self, seq: int, table: str, ops: list) -> None:
        line = json.dumps({"seq": seq, "table": table,
                           "ops": [(op, {k: _encode(v) for k, v in row.items()}) for op, row in ops]})
        with open(self.intents, "a") as f:
            f.write(line + "\n")

    def ack(self, seq: int, offset: int) -> None:
        with open(self.acks, "a") as f:
            f.write(json.dumps({"seq": seq, "offset": offset}) + "\n")

    def read_ddl(self) -> tuple[int, int]:
        """(steps intended, steps done): equal, or one more intended (the step in flight)."""
        intended = done = 0
        if self.ddl.exists():
            for line in self.ddl.read_text().splitlines():
                if not _parses(line):
                    break
                doc = json.loads(line)
                if doc["event"] == "intend":
                    intended = doc["step"] + 1
                else:
                    done = doc["step"] + 1
        return intended, done

    def ddl_event(self, event: str, step: int) -> None:
        with open(self.ddl, "a") as f:
            f.write(json.dumps({"event": event, "step": step}) + "\n")

    def mark(self, text: str) -> None:
        with open(self.marks, "a") as f:
            f.write(text + "\n")


def model_of(intents: list[dict]) -> Model:
    model = Model()
    for intent in intents:
        model.apply(intent["table"], intent["ops"])
    return model
