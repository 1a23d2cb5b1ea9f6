"""What the maintainer's queue holds: accepted batches waiting to be folded into the views."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from storage.relation import Relation


@dataclass
class Entry:
    """Accepted batches up to ``offset`` (one, or a unit converted together)."""

    offset: int
    deltas: dict[str, list[pa.Table]]  # per table: Z-set deltas (table columns + weight)
    versions: dict[str, Relation]  # per table: the table after these batches
    timestamp: float
    counts: dict[str, int] = field(default_factory=dict)  # added to the snapshot's counters (late events)
    # per table: accepted batches not converted yet, (normalized batch, policy) in
    # order (ivm/durable/deferred.py); their deltas and the table's version come at the fold
    batches: dict[str, list[tuple[pa.Table, str]]] = field(default_factory=dict)
    replayed: bool = False  # replayed from the log at open: acknowledged by an earlier process

    @property
    def rows(self) -> int:
        return (sum(t.num_rows for tables in self.deltas.values() for t in tables)
                + sum(b.num_rows for items in self.batches.values() for b, _ in items))
