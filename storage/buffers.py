"""Arrow values read straight from their buffers, without a kernel call: shared by storage (its runs'
numpy gathers, narrowing DECIMAL(38,0) state counts to BIGINT) and the compiled operators.

``fixed_width_values``: numbers, dates, times as a numpy view. ``int64_values``:
decimal128 as int64. A decimal128 is a 16-byte two's complement integer (the unscaled value),
little-endian in Arrow's buffers on the machines we run on. Its low 8 bytes
are the whole value exactly when the high 8 bytes are their sign extension,
which holds for every DECIMAL(18) or narrower and for wider ones whose
values happen to fit.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def int64_values(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(the low 64 bits of each unscaled value, a copy; where those bits are the whole value).

    Values at NULL positions are whatever the buffer holds: callers mask them.
    """
    words = np.frombuffer(array.buffers()[1], dtype=np.int64, count=2 * (array.offset + len(array)))
    words = words[2 * array.offset:]
    low, high = words[0::2], words[1::2]
    return low.copy(), high == (low >> 63)


def fixed_width_values(array: pa.Array) -> np.ndarray:
    """A fixed-width numeric, date, time, timestamp or duration array as a numpy view of its value buffer.

    Values at NULL positions are whatever the buffer holds: callers mask them.
    """
    t = array.type
    dtype = _DTYPES.get(t)
    if dtype is None:  # memoized: asked for every column of every gather
        kind = "f" if pa.types.is_floating(t) else ("u" if pa.types.is_unsigned_integer(t) else "i")
        dtype = _DTYPES[t] = np.dtype(f"{kind}{t.bit_width // 8}")
    buffer = array.buffers()[1]
    if buffer is None:  # a zero-length array may have no buffer
        return np.empty(0, dtype)
    return np.frombuffer(buffer, dtype=dtype, count=len(array), offset=dtype.itemsize * array.offset)


_DTYPES: dict[pa.DataType, np.dtype] = {}


def one_array(column: pa.ChunkedArray) -> pa.Array:
    """A column as one array (its only chunk as it is; more chunks combined)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
