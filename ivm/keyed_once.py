"""Converting a batch that names each key once, with an integer key, in Arrow and numpy.

Contract: the same rows as ``ChangeApplier._keyed_once`` (ivm/changes.py),
which does this in one DuckDB statement, for tables whose primary key is one
integer column and whose columns Arrow can compare: for each batch row with
key k, operation op, and the stored row o with key k (if any):

    bad      op = 'c' and o exists, or op = 'd' and o does not (unless the
             policy ignores missing deletes): reported with weight 0, __error
             = op, __seq, and nothing else is produced for that row
    -o       o exists, not bad, and (op = 'd' or the new row differs from o):
             o's columns, weight -1, o's run and position
    +new     op <> 'd', not bad, and (o does not exist or the row differs)

"Differs" is DuckDB's IS DISTINCT FROM on every column (NULL equals NULL,
NaN equals NaN, -0.0 equals 0.0). An integer key is its own key code, so the
stored rows are matched by a binary search over their codes; ``existing``
may hold extra rows (lookups return supersets) and they match nothing.

Why: this statement was ~15% of durable ingest CPU (1.6 ms per 1,000-row
batch), mostly DuckDB's fixed cost of planning a join over two Arrow inputs.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from delta_operators.zset import POS, RUN, WEIGHT, arrow_not_distinct
from storage.keys import KeyCoder

OP = "__op"
SEQ = "__seq"


def applies(key: tuple[str, ...], schema: pa.Schema) -> bool:
    """True when the Arrow path handles this table (one integer key, comparable columns)."""
    return len(key) == 1 and pa.types.is_integer(schema.field(key[0]).type) and comparable(schema, schema.names)


def comparable(schema: pa.Schema, names) -> bool:  # noqa: ANN001
    """True when Arrow compares these columns as DuckDB does (IS NOT DISTINCT FROM)."""
    return all(_comparable(schema.field(name).type) for name in names)


def _comparable(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t)
            or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t))


def convert(names: tuple[str, ...], key: str, batch: pa.Table, batch_codes: np.ndarray, existing: pa.Table,
            policy: str, coder: KeyCoder) -> pa.Table:
    """Rows as ``_keyed_once`` returns them: names, weight, run, pos, __new, __error, __seq."""
    found = _match(batch_codes, coder.codes(existing, (key,)))
    existed = found >= 0
    ops = batch.column(OP).to_numpy(zero_copy_only=False).astype(str)
    bad = ((ops == "c") & existed) | ((ops == "d") & ~existed if policy != "ignore" else False)
    same = np.zeros(batch.num_rows, dtype=bool)
    if existed.any():
        rows = np.flatnonzero(existed)
        same[rows] = _same_rows(names, batch, pa.array(rows), existing, pa.array(found[rows]))
    deleted = np.flatnonzero(existed & ~bad & ((ops == "d") | ~same))
    inserted = np.flatnonzero((ops != "d") & ~bad & (~existed | ~same))
    wrong = np.flatnonzero(bad)
    schema = _result_schema(names, batch.schema)
    olds = existing.take(pa.array(found[deleted]))
    parts = [
        _part(schema, olds, names, -1, olds.column(RUN), olds.column(POS), 0, None, None),
        _part(schema, batch.take(pa.array(inserted)), names, 1, None, None, 1, None, None),
    ]
    if len(wrong):
        errors = batch.take(pa.array(wrong))
        parts.append(_part(schema, errors, names, 0, None, None, 0, errors.column(OP), errors.column(SEQ)))
    return pa.concat_tables(parts)


def _match(batch_codes: np.ndarray, stored_codes: np.ndarray) -> np.ndarray:
    """For each batch key, the row of ``existing`` with that key, or -1."""
    found = np.full(len(batch_codes), -1, dtype=np.int64)
    if not len(stored_codes) or not len(batch_codes):
        return found
    order = np.argsort(stored_codes, kind="stable")
    ordered = stored_codes[order]
    at = np.minimum(np.searchsorted(ordered, batch_codes), len(ordered) - 1)
    hit = ordered[at] == batch_codes
    found[hit] = order[at[hit]]
    return found


def _same_rows(names: tuple[str, ...], batch: pa.Table, mine: pa.Array, existing: pa.Table,
               theirs: pa.Array) -> np.ndarray:
    """Per pair, whether every column is not distinct (NULL = NULL, NaN = NaN)."""
    same = None
    for name in names:
        a, b = batch.column(name).take(mine), existing.column(name).take(theirs)
        equal = arrow_not_distinct(a, b)
        same = equal if same is None else pc.and_(same, equal)
    return same.to_numpy(zero_copy_only=False).astype(bool)


def _result_schema(names: tuple[str, ...], batch: pa.Schema) -> pa.Schema:
    return pa.schema([batch.field(n) for n in names] + [
        pa.field(WEIGHT, pa.int64()), pa.field(RUN, pa.int32()), pa.field(POS, pa.int64()),
        pa.field("__new", pa.int64()), pa.field("__error", pa.string()), pa.field(SEQ, pa.int64())])


def _part(schema: pa.Schema, rows: pa.Table, names: tuple[str, ...], weight: int, run, pos, new: int,
          error, seq) -> pa.Table:
    n = rows.num_rows
    columns = [rows.column(name).cast(schema.field(name).type) for name in names]
    columns += [pa.array(np.full(n, weight, np.int64)),
                run if run is not None else pa.nulls(n, pa.int32()),
                pos if pos is not None else pa.nulls(n, pa.int64()),
                pa.array(np.full(n, new, np.int64)),
                error if error is not None else pa.nulls(n, pa.string()),
                seq if seq is not None else pa.nulls(n, pa.int64())]
    return pa.Table.from_arrays(columns, schema=schema)
