"""A reference model of the tables, and random change batches against it.

The model applies CDC operations one row at a time in plain Python: it is
the slow, obviously-correct twin of ivm's ingest. Batches are generated from
the model's current state so they are valid (no duplicate inserts, no deletes
of missing keys) and aim at the hard cases: NULLs everywhere, duplicates,
deletes of a group's current MIN/MAX, groups emptied and refilled, updates
that move rows across groups and join partners.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa

Row = dict[str, Any]


@dataclass
class TableSpec:
    name: str
    columns: list[str]
    key: list[str]  # empty for a bag
    arrow: pa.Schema
    gen: Callable[[random.Random], Row]  # a random full row
    group: str | None = None  # column whose groups we like to empty and refill
    extreme: str | None = None  # numeric column whose MIN/MAX we like to delete


def _maybe(rng: random.Random, value: Any, p_null: float = 0.15) -> Any:
    return None if rng.random() < p_null else value


def _amount(rng: random.Random) -> float | None:
    r = rng.random()
    if r < 0.12:
        return None
    if r < 0.14:
        return rng.choice([math.inf, -math.inf, math.nan])
    # Multiples of 1/4: every sum of them is exact, so SUM can be compared exactly.
    return rng.randint(-10, 48) / 4


def schema_specs() -> dict[str, TableSpec]:
    customers = TableSpec(
        name="customers",
        columns=["id", "region", "tier", "name"],
        key=["id"],
        arrow=pa.schema([("id", pa.int64()), ("region", pa.string()), ("tier", pa.int32()), ("name", pa.string())]),
        gen=lambda rng: {
            "id": rng.randint(1, 12),
            "region": _maybe(rng, rng.choice(["north", "south", "east", "west"])),
            "tier": _maybe(rng, rng.randint(0, 3)),
            "name": _maybe(rng, rng.choice(["ann", "bob", "cy", "dee", "ed"])),
        },
        group="region",
    )
    orders = TableSpec(
        name="orders",
        columns=["id", "cust", "amount", "qty", "status", "price"],
        key=["id"],
        arrow=pa.schema(
            [("id", pa.int64()), ("cust", pa.int64()), ("amount", pa.float64()), ("qty", pa.int32()),
             ("status", pa.string()), ("price", pa.float64())]
        ),
        gen=lambda rng: {
            "id": rng.randint(1, 60),
            "cust": _maybe(rng, rng.randint(1, 14)),
            "amount": _amount(rng),
            "qty": _maybe(rng, rng.randint(-1, 5)),
            "status": _maybe(rng, rng.choice(["open", "closed", "cancelled"])),
            "price": _maybe(rng, rng.randint(0, 2000) / 100),
        },
        group="cust",
        extreme="amount",
    )
    items = TableSpec(
        name="items",
        columns=["order_id", "sku", "qty"],
        key=["order_id", "sku"],
        arrow=pa.schema([("order_id", pa.int64()), ("sku", pa.string()), ("qty", pa.int32())]),
        gen=lambda rng: {
            "order_id": rng.randint(1, 60),
            "sku": rng.choice(["a", "b", "c", "d"]),
            "qty": _maybe(rng, rng.randint(0, 4)),
        },
        group="order_id",
        extreme="qty",
    )
    events = TableSpec(
        name="events",
        columns=["kind", "val", "tag"],
        key=[],
        arrow=pa.schema([("kind", pa.string()), ("val", pa.int32()), ("tag", pa.string())]),
        gen=lambda rng: {
            "kind": _maybe(rng, rng.choice(["x", "y", "z"])),
            "val": _maybe(rng, rng.randint(0, 4)),
            "tag": _maybe(rng, rng.choice(["p", "q"])),
        },
        group="kind",
        extreme="val",
    )
    # A graph for recursive views: few nodes, so cycles, shared paths and
    # NULL endpoints are common; updates move edges.
    links = TableSpec(
        name="links",
        columns=["id", "src", "dst"],
        key=["id"],
        arrow=pa.schema([("id", pa.int64()), ("src", pa.int32()), ("dst", pa.int32())]),
        gen=lambda rng: {
            "id": rng.randint(1, 30),
            "src": _maybe(rng, rng.randint(1, 8), 0.08),
            "dst": _maybe(rng, rng.randint(1, 8), 0.08),
        },
        group="src",
        extreme="dst",
    )
    return {t.name: t for t in (customers, orders, items, events, links)}


def _row_key(spec: TableSpec, row: Row) -> tuple:
    return tuple(row[c] for c in spec.key)


def _bag_key(spec: TableSpec, row: Row) -> tuple:
    return tuple(("nan" if isinstance(row[c], float) and math.isnan(row[c]) else row[c]) for c in spec.columns)


@dataclass
class Model:
    specs: dict[str, TableSpec] = field(default_factory=schema_specs)
    keyed: dict[str, dict[tuple, Row]] = field(default_factory=dict)
    bags: dict[str, Counter] = field(default_factory=dict)
    bag_rows: dict[str, dict[tuple, Row]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for spec in self.specs.values():
            if spec.key:
                self.keyed[spec.name] = {}
            else:
                self.bags[spec.name] = Counter()
                self.bag_rows[spec.name] = {}

    def copy(self) -> "Model":
        other = Model(self.specs)
        other.keyed = {k: dict(v) for k, v in self.keyed.items()}
        other.bags = {k: Counter(v) for k, v in self.bags.items()}
        other.bag_rows = {k: dict(v) for k, v in self.bag_rows.items()}
        return other

    def apply(self, table: str, ops: list[tuple[str, Row]]) -> None:
        """Apply CDC operations in order with ivm's documented semantics."""
        spec = self.specs[table]
        for op, row in ops:
            if spec.key:
                rows = self.keyed[table]
                key = _row_key(spec, row)
                if op == "c":
                    assert key not in rows, f"generator made a duplicate insert {key}"
                    rows[key] = dict(row)
                elif op in ("r", "u"):
                    rows[key] = dict(row)
                else:
                    assert key in rows, f"generator deleted a missing key {key}"
                    del rows[key]
            else:
                k = _bag_key(spec, row)
                if op == "d":
                    assert self.bags[table][k] > 0, "generator deleted a missing bag row"
                    self.bags[table][k] -= 1
                    if not self.bags[table][k]:
                        del self.bags[table][k]
                else:
                    self.bags[table][k] += 1
                    self.bag_rows[table][k] = dict(row)

    def rows(self, table: str) -> list[Row]:
        spec = self.specs[table]
        if spec.key:
            return list(self.keyed[table].values())
        out = []
        for k, n in self.bags[table].items():
            out.extend([self.bag_rows[table][k]] * n)
        return out

    def arrow(self, table: str) -> pa.Table:
        spec = self.specs[table]
        rows = self.rows(table)
        return pa.table({c: [r[c] for r in rows] for c in spec.columns}, schema=spec.arrow)


def ops_to_arrow(spec: TableSpec, ops: list[tuple[str, Row]]) -> pa.Table:
    data = {c: [row.get(c) for _, row in ops] for c in spec.columns}
    data["__op"] = [op for op, _ in ops]
    schema = spec.arrow.append(pa.field("__op", pa.string()))
    return pa.table(data, schema=schema)


def generate_batch(rng: random.Random, model: Model, table: str, size: int) -> list[tuple[str, Row]]:
    """``size`` valid operations on ``table``, applied to a scratch copy as they are made."""
    spec = model.specs[table]
    scratch = model.copy()
    ops: list[tuple[str, Row]] = []

    def emit(op: str, row: Row) -> None:
        scratch.apply(table, [(op, row)])
        ops.append((op, row))

    attempts = 0
    while len(ops) < size and attempts < size * 20:
        attempts += 1
        if spec.key:
            _keyed_op(rng, spec, scratch, emit)
        else:
            _bag_op(rng, spec, scratch, emit)
    return ops


def _keyed_op(rng: random.Random, spec: TableSpec, scratch: Model, emit: Callable[[str, Row], None]) -> None:
    rows = scratch.keyed[spec.name]
    choice = rng.random()
    existing = list(rows.values())
    if choice < 0.35 or not existing:
        row = spec.gen(rng)
        key = _row_key(spec, row)
        if key in rows:
            emit(rng.choice(["u", "r"]), row)  # upsert over an existing key
        else:
            emit(rng.choice(["c", "c", "r", "u"]), row)
    elif choice < 0.55:
        # An update that moves the row: new values, maybe a new group / join partner.
        old = rng.choice(existing)
        new = spec.gen(rng)
        for k in spec.key:
            new[k] = old[k]
        if rng.random() < 0.3:
            new = dict(old)  # an update that changes nothing
        emit("u", new)
    elif choice < 0.75:
        old = rng.choice(existing)
        emit("d", _delete_row(rng, spec, old))
    elif choice < 0.88 and spec.extreme:
        # Delete the current MIN or MAX of some group.
        group_col = spec.group
        target = rng.choice(existing)[group_col] if group_col else None
        members = [r for r in existing if r.get(group_col) == target and r.get(spec.extreme) is not None]
        if rng.random() < 0.3:  # the table's own MIN/MAX: the top row of an ORDER BY … LIMIT
            members = [r for r in existing if r.get(spec.extreme) is not None]
        finite = [r for r in members if not (isinstance(r[spec.extreme], float) and math.isnan(r[spec.extreme]))]
        if finite:
            pick = min if rng.random() < 0.5 else max
            victim = pick(finite, key=lambda r: r[spec.extreme])
            emit("d", _delete_row(rng, spec, victim))
    elif spec.group:
        # Empty a whole group (it may come back later).
        target = rng.choice(existing)[spec.group]
        for r in [r for r in existing if r[spec.group] == target][:25]:
            emit("d", _delete_row(rng, spec, r))


def _delete_row(rng: random.Random, spec: TableSpec, row: Row) -> Row:
    if rng.random() < 0.5:
        return {c: (row[c] if c in spec.key else None) for c in spec.columns}  # key only
    return dict(row)


def _bag_op(rng: random.Random, spec: TableSpec, scratch: Model, emit: Callable[[str, Row], None]) -> None:
    existing = scratch.rows(spec.name)
    choice = rng.random()
    if choice < 0.45 or not existing:
        emit(rng.choice(["c", "r"]), spec.gen(rng))
    elif choice < 0.6:
        emit("c", dict(rng.choice(existing)))  # a duplicate
    elif choice < 0.85:
        emit("d", dict(rng.choice(existing)))
    else:
        target = rng.choice(existing)[spec.group]
        for r in [r for r in existing if r[spec.group] == target][:15]:
            emit("d", dict(r))
