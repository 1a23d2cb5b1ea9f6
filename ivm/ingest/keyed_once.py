"""Converting a batch that names each key once, in Arrow and numpy.

Contract: the same rows as ``ChangeApplier._keyed_once`` (ivm/ingest/changes.py),
which does this in one DuckDB statement, for tables whose columns Arrow
compares as DuckDB does (``comparable``), with a key of any such columns:
for each batch row with key k, operation op, and the stored row o with key
k (if any):

    bad      op = 'c' and o exists, or op = 'd' and o does not (unless the
             policy ignores missing deletes): reported with __error = op and
             __seq, and nothing else is produced for that row
    -o       o exists, not bad, and (op = 'd' or the new row differs from o):
             o's columns, o's run and position
    +new     op <> 'd', not bad, and (o does not exist or the row differs)

"Differs" is DuckDB's IS DISTINCT FROM on every column (NULL equals NULL,
NaN equals NaN, -0.0 equals 0.0). Stored rows are matched by key code
(storage/keys.py) with a binary search over their codes; one integer key
is its own code, any other key is re-checked column by column, so a hash
collision never pairs two different keys. ``existing`` may hold extra rows
(lookups return supersets) and they match nothing.

Why: the statement was ~15% of durable ingest CPU (1.6 ms per 1,000-row
batch), mostly DuckDB's fixed cost of planning a join over two Arrow
inputs; and every table with a key of several columns (TPC-H's lineitem,
partsupp) paid it on each batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.zset import POS, RUN, WEIGHT, arrow_not_distinct, number_values, numpy_not_distinct
from storage.buffers import one_array
from storage.keys import KeyCoder
from storage.schemas import SchemaMap

OP = "__op"
SEQ = "__seq"
ERROR = "__error"


def applies(key: tuple[str, ...], schema: pa.Schema) -> bool:
    """True when the Arrow path handles this table (a key, and columns Arrow compares as DuckDB)."""
    by_schema = _applies.get(key)
    if by_schema is None:
        if len(_applies) >= 1024:
            _applies.clear()
        by_schema = _applies[key] = SchemaMap(limit=16)
    known = by_schema.get(schema)
    if known is None:
        known = bool(key) and all(k in schema.names for k in key) and comparable(schema, schema.names)
        by_schema[schema] = known
    return known


# key -> batch schema -> applies(): asked for every batch, the answer depends on the types alone
# (by schema in a SchemaMap: hashing the schema cost more than the answer).
_applies: dict[tuple[str, ...], SchemaMap[bool]] = {}


def comparable(schema: pa.Schema, names) -> bool:  # noqa: ANN001
    """True when Arrow compares these columns as DuckDB does (IS NOT DISTINCT FROM)."""
    return all(_comparable(schema.field(name).type) for name in names)


def _comparable(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t)
            or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t))


@dataclass
class Conversion:
    """What a batch does to its table, before weights are attached."""

    olds: pa.Table  # stored rows it removes: the table's columns, RUN, POS
    news: pa.Table  # rows it inserts: the table's columns
    errors: pa.Table  # offending batch rows (none when it is good): the table's columns, __error, __seq
    # (rows of olds, rows of news): the updates, a stored row and the batch's row of one key, the only
    # rows of that key in the change (None: not known). What pruning pairs up (delta_operators/prune.py).
    pairs: tuple[np.ndarray, np.ndarray] | None = None


def changes(names: tuple[str, ...], key: tuple[str, ...], batch: pa.Table, batch_codes: np.ndarray,
            existing: pa.Table, policy: str, coder: KeyCoder) -> Conversion:
    """The batch's removed, inserted and offending rows (see the module's contract)."""
    names = list(names)
    exact = len(key) == 1 and pa.types.is_integer(batch.schema.field(key[0]).type)
    found = match_rows(batch, batch_codes, existing, coder.codes(existing, key), key, exact)
    existed = found >= 0
    letters = op_letters(batch.column(OP))
    is_d = letters == ord("d")
    bad = (letters == ord("c")) & existed
    if policy != "ignore":
        bad |= is_d & ~existed
    same = np.zeros(batch.num_rows, dtype=bool)
    compared = np.flatnonzero(existed & ~is_d & ~bad)  # upserts of stored keys: did the row change?
    if len(compared):
        # Only the other columns: a row matched its stored row on the key (its code, re-checked).
        others = [n for n in names if n not in key]
        if others:
            same[compared] = same_rows(others, batch, compared, existing, found[compared])
        else:
            same[compared] = True
    removes = existed & ~bad & ~same
    adds = ~is_d & ~bad & ~same
    deleted = np.flatnonzero(removes)
    inserted = np.flatnonzero(adds)
    olds = existing.select(names + [RUN, POS])
    old_rows = found  # batch row -> its stored row's row in olds
    if len(deleted) < existing.num_rows:
        # (Every stored row found is removed, the usual upsert batch: their order is free, no copy.
        # Batch keys are distinct here, so ``found[deleted]`` names each stored row once.)
        olds = olds.take(found[deleted])
        old_rows = np.cumsum(removes) - 1
    updated = np.flatnonzero(removes & adds)  # each key once in the batch: its two rows are alone
    new_rows = updated if len(inserted) == batch.num_rows else (np.cumsum(adds) - 1)[updated]
    pairs = (old_rows[updated], new_rows)
    wanted = batch.schema
    if any(olds.schema.field(n).type != wanted.field(n).type for n in names):
        olds = olds.cast(pa.schema([wanted.field(n) for n in names] + [olds.schema.field(RUN), olds.schema.field(POS)]))
    news = batch.select(names)
    if len(inserted) < batch.num_rows:  # (all of them, in order: the usual upsert batch, no copy)
        news = news.take(inserted)
    wrong = np.flatnonzero(bad)
    errors = batch.select(names + [OP, SEQ])
    errors = (errors.take(wrong) if len(wrong) else errors.slice(0, 0)).rename_columns(names + [ERROR, SEQ])
    return Conversion(olds, news, errors, pairs)


def repeated(names: tuple[str, ...], key: tuple[str, ...], batch: pa.Table, batch_codes: np.ndarray,
             existing: pa.Table, policy: str, coder: KeyCoder) -> Conversion | None:
    """``changes`` for a batch that may name a key several times: ``ChangeApplier._keyed``'s rows.

    Its operations apply in ``__seq`` order: a row's key existed before it
    if an earlier row of the key left a row (its operation was not 'd'), or,
    for the key's first row, if a stored row has the key. 'c' of an existing
    key and 'd' of a missing one (unless ignored) are errors. Per key, with
    l its last row and o its stored row: -o when o exists and (l deletes or
    differs from o), +l when l does not delete and (no o, or l differs).
    Rows are grouped by key code; None when two different keys of the batch
    share a code (the caller converts that batch on DuckDB).
    """
    names = list(names)
    n = batch.num_rows
    exact = len(key) == 1 and pa.types.is_integer(batch.schema.field(key[0]).type)
    order = np.lexsort((batch.column(SEQ).to_numpy(), batch_codes))
    ordered = batch_codes[order]
    starts = np.ones(n, dtype=bool)
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    group = np.cumsum(starts) - 1  # per sorted position
    firsts = order[starts]  # each key's first row
    lasts = order[np.append(starts[1:], True)]  # each key's last row
    if not exact and not same_rows(list(key), batch, order, batch, firsts[group]).all():
        return None  # a collision inside the batch
    found = match_rows(batch.take(firsts), batch_codes[firsts], existing, coder.codes(existing, key), key, exact)
    letters = op_letters(batch.column(OP))
    is_d = letters == ord("d")
    is_c = letters == ord("c")
    # Did the key exist just before each row (in sorted order)?
    existed = np.empty(n, dtype=bool)
    existed[starts] = found >= 0
    later = np.flatnonzero(~starts)
    existed[later] = ~is_d[order[later - 1]]
    bad = is_c[order] & existed
    if policy != "ignore":
        bad |= is_d[order] & ~existed
    wrong = np.sort(order[bad])
    errors = batch.select(names + [OP, SEQ]).take(wrong).rename_columns(names + [ERROR, SEQ])
    stored = found >= 0
    deleting = is_d[lasts]
    same = np.zeros(len(firsts), dtype=bool)
    compared = np.flatnonzero(stored & ~deleting)
    if len(compared):
        same[compared] = same_rows(names, batch, lasts[compared], existing, found[compared])
    olds = existing.select(names + [RUN, POS]).take(found[stored & (deleting | ~same)])
    wanted = batch.schema
    if any(olds.schema.field(n).type != wanted.field(n).type for n in names):
        olds = olds.cast(pa.schema([wanted.field(n) for n in names] + [olds.schema.field(RUN), olds.schema.field(POS)]))
    news = batch.select(names).take(np.sort(lasts[~deleting & ~same]))
    return Conversion(olds, news, errors)


def convert(names: tuple[str, ...], key: str | tuple[str, ...], batch: pa.Table, batch_codes: np.ndarray,
            existing: pa.Table, policy: str, coder: KeyCoder) -> pa.Table:
    """Rows as ``_keyed_once`` returns them: names, weight, run, pos, __new, __error, __seq (for comparisons)."""
    key = (key,) if isinstance(key, str) else tuple(key)
    done = changes(names, key, batch, batch_codes, existing, policy, coder)
    schema = pa.schema([batch.schema.field(n) for n in names] + [
        pa.field(WEIGHT, pa.int64()), pa.field(RUN, pa.int32()), pa.field(POS, pa.int64()),
        pa.field("__new", pa.int64()), pa.field(ERROR, pa.string()), pa.field(SEQ, pa.int64())])
    parts = [(done.olds, -1, 0), (done.news, 1, 1), (done.errors, 0, 0)]
    tables = []
    for rows, weight, new in parts:
        n = rows.num_rows
        columns = [rows.column(name) for name in names] + [
            pa.array(np.full(n, weight, np.int64)),
            rows.column(RUN) if RUN in rows.column_names else pa.nulls(n, pa.int32()),
            rows.column(POS) if POS in rows.column_names else pa.nulls(n, pa.int64()),
            pa.array(np.full(n, new, np.int64)),
            rows.column(ERROR) if ERROR in rows.column_names else pa.nulls(n, pa.string()),
            rows.column(SEQ) if SEQ in rows.column_names else pa.nulls(n, pa.int64())]
        tables.append(pa.Table.from_arrays(columns, schema=schema))
    return pa.concat_tables(tables)


def op_letters(ops: pa.ChunkedArray) -> np.ndarray:
    """Each row's operation as its letter's byte (``ord("c")``...), read from the string buffers.

    A normalized batch's ``__op`` holds one of c, r, u, d per row (ChangeNormalizer checks it):
    the byte at each value's offset is the op. Two numpy reads per chunk instead of an Arrow
    comparison per kind of op (~11 us each for 1,000 rows). Anything else (other types,
    values that are not one byte, NULLs) is compared by Arrow, with the same answer."""
    parts = []
    for chunk in ops.chunks:
        n = len(chunk)
        if not n:
            continue
        buffers = chunk.buffers()
        if (not pa.types.is_string(chunk.type) or chunk.null_count or buffers[2] is None):
            return _arrow_letters(ops)
        offsets = np.frombuffer(buffers[1], dtype=np.int32, count=n + 1, offset=4 * chunk.offset)
        if offsets[-1] - offsets[0] != n or not (np.diff(offsets) == 1).all():
            return _arrow_letters(ops)
        parts.append(np.frombuffer(buffers[2], dtype=np.uint8)[offsets[:-1]])
    if not parts:
        return np.zeros(0, dtype=np.uint8)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _arrow_letters(ops: pa.ChunkedArray) -> np.ndarray:
    letters = np.zeros(len(ops), dtype=np.uint8)
    for op in ("c", "r", "u", "d"):
        letters[pc.equal(ops, op).to_numpy(zero_copy_only=False).astype(bool)] = ord(op)
    return letters


def match_rows(batch: pa.Table, batch_codes: np.ndarray, existing: pa.Table, stored_codes: np.ndarray,
           key: tuple[str, ...], exact: bool) -> np.ndarray:
    """For each batch row, the row of ``existing`` with its key, or -1.

    ``exact``: codes are the keys. Otherwise every pair of equal codes is
    re-checked on the key columns (a collision pairs nothing); a batch key
    names one stored row at most (the table is keyed).
    """
    found = np.full(len(batch_codes), -1, dtype=np.int64)
    if not len(stored_codes) or not len(batch_codes):
        return found
    order = np.argsort(stored_codes, kind="stable")
    ordered = stored_codes[order]
    if exact:
        at = np.minimum(np.searchsorted(ordered, batch_codes), len(ordered) - 1)
        hit = ordered[at] == batch_codes
        found[hit] = order[at[hit]]
        return found
    start = np.searchsorted(ordered, batch_codes, "left")
    count = np.searchsorted(ordered, batch_codes, "right") - start
    total = int(count.sum())
    if not total:
        return found
    mine = np.repeat(np.arange(len(batch_codes)), count)
    theirs = order[np.repeat(start, count) + np.arange(total) - np.repeat(np.cumsum(count) - count, count)]
    equal = same_rows(list(key), batch, mine, existing, theirs)
    found[mine[equal]] = theirs[equal]
    return found


def same_rows(names: list[str], batch: pa.Table, mine: np.ndarray, existing: pa.Table,
               theirs: np.ndarray) -> np.ndarray:
    """Per pair, whether every column is not distinct (NULL = NULL, NaN = NaN, -0.0 = 0.0).

    Columns of numbers without NULLs are compared first, where they are (a numpy gather of each
    side's pairs); the others are taken into new arrays and compared by Arrow, for the pairs still
    equal only: an update usually changes a number, and its strings then need no take (taking
    both tables whole was most of the comparison: ~0.1 ms of an ingested 1,000-row batch's ~0.25)."""
    same = np.ones(len(mine), dtype=bool)
    later = []
    for name in names:
        a, b = batch.column(name), existing.column(name)
        x, y = number_values(a), number_values(b)
        if x is not None and y is not None and a.type == b.type:
            x, y = x[mine], y[theirs]
            equal = x == y
            if pa.types.is_floating(a.type):
                equal |= np.isnan(x) & np.isnan(y)
            same &= equal
        else:
            later.append(name)
    left = np.flatnonzero(same) if later else None
    for name in later:
        if not len(left):
            break
        equal = not_distinct(one_array(batch.column(name)).take(mine[left]),
                             one_array(existing.column(name)).take(theirs[left]))
        same[left[~equal]] = False
        left = left[equal]
    return same


def not_distinct(a: pa.ChunkedArray, b: pa.ChunkedArray) -> np.ndarray:
    """IS NOT DISTINCT FROM per row, as numpy booleans; numbers without NULLs compare in numpy."""
    equal = numpy_not_distinct(a, b)
    if equal is not None:
        return equal
    if not a.null_count and not b.null_count and not pa.types.is_floating(a.type) \
            and not pa.types.is_floating(b.type):
        # No NULLs and no NaNs: not distinct is equal (one Arrow call instead of six).
        return pc.equal(a, b).to_numpy(zero_copy_only=False).astype(bool, copy=False)
    return arrow_not_distinct(a, b).to_numpy(zero_copy_only=False).astype(bool, copy=False)
