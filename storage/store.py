"""The set of stored relations, published as consistent snapshots.

A snapshot maps every relation name to one immutable Relation version and
records the change-log offset it reflects. Writers build a new snapshot and
publish it in one assignment; readers take the current one and keep using it
for the whole statement, so every view they read comes from the same offset.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from storage.errors import InternalError
from storage.relation import Relation


@dataclass(frozen=True)
class Snapshot:
    relations: Mapping[str, Relation] = field(default_factory=lambda: MappingProxyType({}))
    offset: int = 0
    # Counts that belong to this offset and are stored with it (e.g. "late:bids",
    # the late events of a stream): checkpoints write them, recovery reads them.
    counters: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __getitem__(self, name: str) -> Relation:
        try:
            return self.relations[name]
        except KeyError:
            raise InternalError(f"no stored relation named {name}") from None

    def __contains__(self, name: str) -> bool:
        return name in self.relations

    def with_changes(self, changes: Mapping[str, Relation | None], offset: int | None = None) -> "Snapshot":
        relations = dict(self.relations)
        for name, relation in changes.items():
            if relation is None:
                relations.pop(name, None)
            else:
                relations[name] = relation
        return Snapshot(MappingProxyType(relations), self.offset if offset is None else offset, self.counters)

    def with_counts(self, added: Mapping[str, int]) -> "Snapshot":
        """The snapshot with ``added`` summed into its counters."""
        if not added:
            return self
        counters = dict(self.counters)
        for name, n in added.items():
            counters[name] = counters.get(name, 0) + n
        return Snapshot(self.relations, self.offset, MappingProxyType(counters))


class Store:
    """Holds the current snapshot; publishing is atomic."""

    def __init__(self) -> None:
        self._snapshot = Snapshot()
        self._lock = threading.Lock()
        self.version = 0  # counts publishes: equal versions mean identical contents

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def publish(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._snapshot = snapshot
            self.version += 1
