"""DataRow messages for a whole result at once, assembled with numpy.

A DataRow is ``'D' Int32(length) Int16(columns)`` then, per column,
``Int32(value length, -1 for NULL)`` and the value's bytes. Encoding row by
row in Python costs microseconds per value; a 100k-row result would take
most of a second. Instead every column is encoded once (types.py gives its
bytes, per-row starts and lengths), the message offsets of every row come
from one cumulative sum, and the bytes are scattered into one buffer with
fancy indexing: the cost is a few numpy passes over the output bytes.

A binary COPY tuple (``Int16(columns)`` then each field's ``Int32(length)``
and bytes) is a DataRow's body, and PostgreSQL sends one tuple per CopyData
message (``'d' Int32(length)`` then the tuple), so ``COPY ... TO STDOUT
(FORMAT binary)`` is these same bytes with ``kind`` ``b"d"`` (copy_binary.py).

>>> import pyarrow as pa
>>> from flight_server.pgwire import messages
>>> table = pa.table({"a": pa.array([1, None], pa.int32()), "b": ["x", "yz"]})
>>> data_rows(table, [0, 0]) == (messages.data_row([b"1", b"x"]) + messages.data_row([None, b"yz"]))
True
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa

from flight_server.pgwire.types import Cells, encode_column, fixed_values, oid_of

CHUNK_ROWS = 8192  # rows per buffer: bounds the temporary arrays; the client parses one while the next is built


def _packed(columns: list[tuple[np.ndarray, np.dtype]], n: int, kind: bytes) -> np.ndarray:
    """The messages of ``n`` rows whose every value has one width: an (n, row size) byte matrix,
    the constant bytes (type, length, count, value lengths) tiled from one template row, then
    each column's values written into its slot of every row at once. ``columns``: per column its
    ``n`` values and the (big-endian) dtype they are sent as; numpy converts while it copies, so
    native values need no byte-swapped array in between.

    (Measured on 100k rows of three BIGINT/DOUBLE columns: a structured array repeated from a
    template row took 1.8 ms; the tiled template 0.4 ms; each value copied as one 8-byte integer
    0.05 ms per column, where a (rows, 8) byte slice takes 0.75.)"""
    widths = [np.dtype(wire).itemsize for _, wire in columns]
    size = 7 + sum(4 + w for w in widths)
    template = bytearray(kind + (size - 1).to_bytes(4, "big") + len(columns).to_bytes(2, "big"))
    slots = []
    for width in widths:
        template += width.to_bytes(4, "big")
        slots.append(len(template))
        template += bytes(width)
    out = np.tile(np.frombuffer(bytes(template), np.uint8), n).reshape(n, size)
    for (values, wire), width, at in zip(columns, widths, slots):
        # A slot viewed as one value per row (unaligned is fine): numpy writes each value as one.
        out[:, at:at + width].view(wire)[:, 0] = values
    return out.reshape(-1)


def _fixed_rows(columns: list[Cells], n: int, kind: bytes) -> np.ndarray | None:
    """The messages of ``n`` rows when every value has one width (binary numbers, dates,
    timestamps without NULLs); None when some column varies."""
    values = []
    for cells in columns:
        if not len(cells.lengths):
            return None
        width = int(cells.lengths[0])
        if width <= 0 or len(cells.data) != width * n or (cells.lengths != width).any():
            return None
        wire = np.dtype(f">u{width}" if width in (1, 2, 4, 8) else f"V{width}")  # bytes already as sent
        values.append((cells.data.view(wire), wire))
    return _packed(values, n, kind)


def _assemble(columns: list[Cells], n: int, kind: bytes) -> memoryview:
    """The messages of ``n`` rows: a view of the array built (sent as it is, not copied into a ``bytes``
    first, which cost as much as building it; a view, for ``bytearray += array`` would add numbers)."""
    fixed = _fixed_rows(columns, n, kind)
    return memoryview(fixed if fixed is not None else _gathered(columns, n, kind))


def _gathered(columns: list[Cells], n: int, kind: bytes) -> np.ndarray:
    # Every row is 1 + 2 * columns segments: its header, then each column's length field and bytes.
    # All of them are copied by one gather from one source buffer holding the headers, the length
    # fields and every column's bytes.
    present = [np.maximum(c.lengths, 0).astype(np.int64) for c in columns]
    body = 4 + 2 + 4 * len(columns) + (np.sum(present, axis=0) if columns else np.zeros(n, np.int64))
    header = np.empty((n, 7), np.uint8)
    header[:, 0] = kind[0]
    header[:, 1:5] = body.astype(">i4").view(np.uint8).reshape(n, 4)
    header[:, 5:7] = np.frombuffer(np.array(len(columns), ">i2").tobytes(), np.uint8)
    sources = [header.reshape(-1)]
    starts = [np.arange(n, dtype=np.int64) * 7]
    lengths = [np.full(n, 7, np.int64)]
    base = 7 * n
    for cells, size in zip(columns, present):
        sources.append(cells.lengths.astype(">i4").view(np.uint8))
        starts.append(base + np.arange(n, dtype=np.int64) * 4)
        lengths.append(np.full(n, 4, np.int64))
        base += 4 * n
        sources.append(cells.data)
        starts.append(base + cells.starts)
        lengths.append(size)
        base += len(cells.data)
    source = np.concatenate(sources)
    segment_start = np.stack(starts, axis=1).reshape(-1)  # row-major: row 0's segments, then row 1's
    segment_length = np.stack(lengths, axis=1).reshape(-1)
    out_start = np.cumsum(segment_length) - segment_length
    shift = np.repeat(segment_start - out_start, segment_length)
    return source[np.arange(len(shift), dtype=np.int64) + shift]


def chunks(table: pa.Table | pa.RecordBatch, formats: list[int], kind: bytes = b"D") -> Iterator[memoryview]:
    """The DataRow messages of ``table`` in pieces of CHUNK_ROWS rows (sent while the next is encoded).

    ``kind`` is the messages' type byte: ``b"d"`` makes each row a CopyData
    message holding its binary COPY tuple (with every format 1).
    """
    whole = _fixed_columns(table, formats)
    for start in range(0, table.num_rows, CHUNK_ROWS):
        if whole is not None:
            n = min(CHUNK_ROWS, table.num_rows - start)
            yield memoryview(_packed([(values[start:start + n], wire) for values, wire in whole], n, kind))
            continue
        chunk = table.slice(start, CHUNK_ROWS)
        columns = [encode_column(chunk.column(i), fmt) for i, fmt in enumerate(formats)]
        yield _assemble(columns, chunk.num_rows, kind)


def _fixed_columns(table: pa.Table | pa.RecordBatch, formats: list[int]) -> list[tuple[np.ndarray, np.dtype]] | None:
    """Each column's values (native order, typed as sent) when all columns are binary fixed-width
    values without NULLs, the large numeric results: then a chunk's rows are packed straight from
    them, where encoding chunk by chunk cost ~40 numpy calls and a copy of each column per chunk.
    None otherwise (each chunk is encoded on its own)."""
    if table.num_columns == 0 or any(fmt != 1 for fmt in formats):
        return None
    columns = []
    for column in table.columns:
        if column.null_count:
            return None
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        fixed = fixed_values(column, oid_of(column.type))
        if fixed is None:
            return None
        values, wire = fixed
        columns.append((values, np.dtype(wire)))
    return columns


def data_rows(table: pa.Table | pa.RecordBatch, formats: list[int]) -> bytes:
    """The DataRow messages of every row of ``table``, columns in ``formats`` (0 text, 1 binary)."""
    return b"".join(chunks(table, formats))
