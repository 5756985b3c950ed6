"""The impressions' ``dwell_ms`` field as a column (the columnar engine's reader).

``dwell_ms`` (impression schema version 2) is the dwell time of a click in milliseconds, null when
unknown. A column holds it as int64 with :data:`NULL` (-1) for null; the values come with the mask
of the rows the vectorised screen clears (null, or an integer >= 0 on a clicked impression): any
other row goes to :func:`streameval.io.records.check_impression`, whose reason its dead letter
carries, so a raw -1 is never read as null.

Used by the columnar engine (:mod:`streameval.beam.columnar_columns` and the read screen of
:mod:`streameval.beam.columnar_read`): :func:`dwell_columns` in ``impression_columns``,
:func:`dwell_columns_arrow` in ``impression_columns_arrow`` and the screen of Arrow tables (each
mask ANDed into the screen) and :func:`dwell_record_value` in ``columns_records``.

Layer 4 (I/O): numpy and pyarrow only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["NULL", "dwell_columns", "dwell_columns_arrow", "dwell_record_value"]

#: the column's value for a null dwell
NULL = -1


def _screen(dwell: np.ndarray, null: np.ndarray, clicked: np.ndarray) -> np.ndarray:
    return null | ((dwell >= 0) & (np.asarray(clicked) == 1))


def dwell_columns(values, clicked) -> tuple[np.ndarray, np.ndarray]:
    """``(column, ok)`` of the records' ``dwell_ms`` values (a list: ints or None, shape (n,)) and
    their ``clicked`` column (int8, -1 null; shape (n,)): the int64 column (:data:`NULL` for null)
    and the rows the screen clears. A value that is not an integer within int64 is not cleared
    (the record check names it)."""
    n = len(values)
    col = np.full(n, NULL, dtype=np.int64)
    ok = np.ones(n, dtype=bool)
    rows = [i for i, v in enumerate(values) if v is not None]
    if not rows:
        return col, ok
    good = []
    for i in rows:
        v = values[i]
        if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and -(2**63) <= v < 2**63:
            col[i] = v
            good.append(i)
        else:
            ok[i] = False
    sel = np.asarray(good, dtype=np.int64)
    ok[sel] = _screen(col[sel], np.zeros(len(sel), dtype=bool), np.asarray(clicked)[sel])
    return col, ok


def dwell_columns_arrow(column, clicked) -> tuple[np.ndarray, np.ndarray]:
    """``(column, ok)`` as :func:`dwell_columns` of an Arrow int64 column (chunked or not; nulls for
    null) of ``n`` rows and their ``clicked`` column."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    null = np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    col = np.asarray(column.fill_null(NULL).to_numpy(zero_copy_only=False), dtype=np.int64)
    return col, _screen(col, null, clicked)


def dwell_record_value(value):
    """The record's ``dwell_ms`` of a column value: None for :data:`NULL`, else the int."""
    value = int(value)
    return None if value == NULL else value
