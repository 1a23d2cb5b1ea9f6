"""Converting a batch of a table without a primary key (a bag), in Arrow and numpy.

Contract: the rows of ``ChangeApplier._bag`` (ivm/ingest/changes.py), DuckDB's
statement for it. Equal rows (IS NOT DISTINCT FROM on every column) are one
distinct row whose stored weight is its number of copies. Per distinct row
of the batch: change = its 'c'/'r' rows minus its 'd' rows (rows whose
change is 0 do nothing); old = its stored weight (0 if not stored); new =
old + change. A negative new is an error under the 'error' policy, and
under 'ignore' the change becomes -old (every copy goes). The stored row
(if any) is deleted and, when new > 0, inserted again with weight new.

Rows are grouped by key code (storage/keys.py) and re-checked column by
column; the batch is handed back to DuckDB (None) when two different rows
of it share a code, or when a DOUBLE column holds -0.0 (it groups with 0.0,
and which of the two zeros DuckDB's GROUP BY keeps is not ours to guess).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.zset import POS, RUN, WEIGHT
from ivm.ingest.keyed_once import OP, SEQ, match_rows, same_rows
from storage.keys import KeyCoder


@dataclass
class BagChange:
    rows: pa.Table  # distinct changed rows: the table's columns, WEIGHT (the change), RUN, POS, __new
    negative: pa.Table  # distinct rows a 'd' would take below zero copies (the 'error' policy's error)


def convert(names: tuple[str, ...], batch: pa.Table, codes: np.ndarray, existing: pa.Table, policy: str,
            coder: KeyCoder) -> BagChange | None:
    """The bag's change (see the module's contract); None: DuckDB converts this batch."""
    names = list(names)
    for name in names:
        column = batch.column(name)
        if pa.types.is_floating(column.type):
            values = column.to_numpy(zero_copy_only=False)
            if ((values == 0) & np.signbit(values)).any():
                return None
    exact = len(names) == 1 and pa.types.is_integer(batch.schema.field(names[0]).type)
    order = np.lexsort((batch.column(SEQ).to_numpy(), codes))
    ordered = codes[order]
    n = len(order)
    starts = np.ones(n, dtype=bool)
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    group = np.cumsum(starts) - 1
    firsts = order[starts]
    if not exact and not same_rows(names, batch, order, batch, firsts[group]).all():
        return None  # a collision inside the batch
    sign = np.where(pc.equal(batch.column(OP), "d").to_numpy(zero_copy_only=False), -1, 1).astype(np.int64)
    change = np.add.reduceat(sign[order], np.flatnonzero(starts)) if n else np.empty(0, np.int64)
    moving = change != 0
    firsts, change = firsts[moving], change[moving]
    found = match_rows(batch.take(firsts), codes[firsts], existing, coder.codes(existing, names), tuple(names),
                       exact)
    stored = found >= 0
    old = np.zeros(len(firsts), dtype=np.int64)
    weights = existing.column(WEIGHT).to_numpy()
    old[stored] = weights[found[stored]]
    new = old + change
    below = new < 0
    negative = batch.select(names).take(firsts[below])
    if below.any() and policy != "error":
        change = np.where(below, -old, change)
        new = old + change
    keep = change != 0
    firsts, change, new, found, stored = firsts[keep], change[keep], new[keep], found[keep], stored[keep]
    rows = batch.select(names).take(firsts)
    runs = existing.column(RUN).to_numpy(zero_copy_only=False)
    positions = existing.column(POS).to_numpy(zero_copy_only=False)
    at = np.where(stored, found, 0)
    rows = (rows.append_column(WEIGHT, pa.array(change))
            .append_column(RUN, pa.array(runs[at] if len(runs) else np.zeros(len(at), np.int32), pa.int32(),
                                         mask=~stored))
            .append_column(POS, pa.array(positions[at] if len(positions) else np.zeros(len(at), np.int64),
                                         pa.int64(), mask=~stored))
            .append_column("__new", pa.array(new)))
    return BagChange(rows, negative)
