"""The crash harness's workload: schema, views, and the side files of a writer.

The writer appends every batch it is about to send to ``intents.jsonl``
(before sending) and every acknowledged offset to ``acks.jsonl`` (after the
acknowledgement returned). Both live next to the database directory, not in
it. Batches are sent with source ``writer`` and seq = the intent's number,
so a restarted writer re-sends its last intent and the database applies it
at most once.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

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

    def repair(self) -> None:
        """Drop a line torn by a kill, so new lines are not glued to it."""
        for path in (self.intents, self.acks):
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

    def mark(self, text: str) -> None:
        with open(self.marks, "a") as f:
            f.write(text + "\n")


def model_of(intents: list[dict]) -> Model:
    model = Model()
    for intent in intents:
        model.apply(intent["table"], intent["ops"])
    return model
