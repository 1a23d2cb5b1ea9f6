"""decimal128 values read as int64 straight from Arrow's buffer, without a cast kernel.

A decimal128 is a 16-byte two's complement integer (the unscaled value),
little-endian in Arrow's buffers on the machines we run on. Its low 8 bytes
are the whole value exactly when the high 8 bytes are their sign extension,
which holds for every DECIMAL(18) or narrower and for wider ones whose
values happen to fit. Shared by storage (narrowing DECIMAL(38,0) state
counts to BIGINT) and the compiled operators (decimals held as scaled int64).
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
