"""A validated batch: what the log stores and what it does to its table (the ingest stage's output)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from ivm.ingest.changes import ZsetChange
from ivm.streams.event_time import late_counter
from ivm.streams.interval_join import expired_counter
from storage.relation import Relation


@dataclass
class Prepared:
    """A validated batch: what the log stores and what it does to its table."""

    batch: pa.Table  # normalized: table columns, __op, __seq
    policy: str
    change: ZsetChange
    updated: Relation  # the table after the batch
    event_max: int | None = None  # watermarked tables: the batch's largest event time (microseconds)
    # ... and the batch's effect on the table's hidden twins: its on-time rows and
    # its one-row watermark (ivm/streams/event_time.py)
    hidden: list["Prepared"] = field(default_factory=list)
    late: int = 0  # ... and how many of its events arrived below the watermark
    expired: int = 0  # ... and how many on-time rows interval joins let go (ivm/streams/interval_join.py)
    change_table: str = ""  # the table the batch changed

    def counts(self) -> dict[str, int]:
        """What the batch adds to the snapshot's counters: its late events, the on-time rows that went."""
        counts = {late_counter(self.change_table): self.late} if self.late else {}
        if self.expired:
            counts[expired_counter(self.change_table)] = self.expired
        return counts

    def versions(self) -> dict[str, Relation]:
        """New versions of the table (and of its hidden twins)."""
        return {p.change_table: p.updated for p in [self, *self.hidden]}

    def deltas(self) -> dict[str, pa.Table]:
        """Non-empty deltas of the table (and of its hidden twins)."""
        return {p.change_table: p.change.delta for p in [self, *self.hidden] if p.change.delta.num_rows}
