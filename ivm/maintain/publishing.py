"""The one maintain-and-publish step as the stages that call it see it (group commit, the fold).

``Engine.maintain_and_publish`` is the only implementation: every batch, unit or fold runs the
affected views' delta programs over its deltas and publishes one snapshot through it.
"""

from __future__ import annotations

from typing import Callable, ContextManager, Protocol

import pyarrow as pa

from ivm.execute.worker import Worker
from storage.store import Snapshot, Store


class Publishing(Protocol):
    store: Store

    def maintain_and_publish(self, snapshot: Snapshot, deltas: dict[str, pa.Table], counts: dict[str, int],
                             worker: Worker, *, first: int, last: int, assign: bool, isolate: bool = False,
                             before_publish: Callable[[Snapshot], None] | None = None,
                             guard: ContextManager | None = None) -> Snapshot: ...
