"""Arrow string columns as numpy ``str`` arrays, without a Python object per row.

pandas 3 keeps a DataFrame's text columns as Arrow strings (``ArrowStringArray``); ``to_numpy()``
makes a Python ``str`` per row and ``astype(str)`` copies them again (about 2 s for 3 million ids).
:func:`text_array` pads every row to the longest with NUL bytes in Arrow (``utf8_rpad``) and hands the
bytes to numpy as one fixed-width matrix: numpy's own layout for ``bytes`` and, widened to 32 bits,
for ``str``. That is exact for ASCII ids only (numpy's ``str`` holds code points, not UTF-8 bytes);
other ids, and columns with nulls, are left to the caller's general path (None).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["text_array", "arrow_strings"]

_STRING_TYPES = (pa.string(), pa.large_string())


def arrow_strings(column) -> pa.Array | None:
    """The Arrow string array of a pandas text column (Arrow-backed: no copy; ``object`` holding
    ``str``: one conversion in C), or None when the column is not text (numbers, mixed objects)."""
    kind = getattr(getattr(column, "dtype", None), "kind", None)
    if kind in ("i", "u", "f", "b", "M", "m"):
        return None
    try:
        a = pa.array(column)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
        return None
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    return a if a.type in _STRING_TYPES else None


def _offsets(a: pa.Array) -> np.ndarray:
    _, offsets, _ = a.buffers()
    dt = np.int32 if a.type == pa.string() else np.int64
    return np.frombuffer(offsets, dtype=dt, count=len(a) + 1, offset=a.offset * np.dtype(dt).itemsize)


def text_array(a: pa.Array, as_bytes: bool = False) -> np.ndarray | None:
    """A numpy ``str`` array (``<U{w}``, ``w`` the longest id) equal to the Arrow string array ``a``,
    or None when ``a`` has nulls or a non-ASCII id (the caller converts those row by row).
    ``as_bytes``: the ASCII ids as a numpy ``bytes`` array (``S{w}``) instead, a view of Arrow's
    padded buffer (a quarter of the ``str`` array's memory, and no widening pass).

    Raises ValueError when an id holds a NUL character: numpy's string arrays drop trailing NULs,
    so ``"d1\\x00"`` would become ``"d1"`` (as :func:`streameval.metrics.prepare.refuse_nul`)."""
    n = len(a)
    if a.null_count:
        return None
    if n == 0:
        return np.zeros(0, dtype="S1" if as_bytes else "<U1")
    offs = _offsets(a)
    lo, hi = int(offs[0]), int(offs[-1])
    data = a.buffers()[2]
    if hi > lo and not np.frombuffer(data, dtype=np.uint8, count=hi - lo, offset=lo).all():
        bad = next(x for x in a.to_pylist() if "\x00" in x)
        raise ValueError(f"ids must not contain NUL characters, got {bad!r}")
    w = int(np.diff(offs).max())
    if w == 0:
        return np.zeros(n, dtype="S1" if as_bytes else "<U1")
    padded = pc.utf8_rpad(a, width=w, padding="\x00")
    poffs = _offsets(padded)
    # ASCII exactly when every padded row is w bytes (a non-ASCII row has fewer code points than
    # bytes, so it is padded past w bytes)
    if int(poffs[-1]) - int(poffs[0]) != n * w:
        return None
    m = np.frombuffer(padded.buffers()[2], dtype=np.uint8, count=n * w, offset=int(poffs[0])).reshape(n, w)
    if as_bytes:
        return m.view(f"S{w}").reshape(n)
    return m.astype(np.uint32).view(f"<U{w}").reshape(n)
