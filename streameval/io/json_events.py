"""JSON impression events (Kafka's or Pub/Sub's values) parsed as Arrow columns at once:
:func:`impression_json_table`.

A block of values is joined into newline-delimited JSON and parsed by Arrow's JSON reader
(``pyarrow.json``, C++) with the impression schema's types. Whatever that reader would decide
differently from the record check (:func:`streameval.io.records.check_impression`, which the
per-event engine applies to ``json.loads`` of each value) makes the whole block fall back to the
record-by-record path (None): a value that is not one JSON object, a field of another JSON type
than the schema's (a number as an id, ``1`` as ``clicked``, ``1.0`` as a position), a value with
a newline or an escaped surrogate, a key twice. Rows whose attributes Arrow cannot tell apart from
valid ones (a null map, a null value, a key another row has and this one lacks) are marked for the
record check (``check``), which then decides on the value as sent.
"""

from __future__ import annotations

import io
import re
from typing import NamedTuple

import numpy as np
import pyarrow as pa

__all__ = ["JsonBlock", "impression_json_table"]

#: the impression schema's fields as Arrow parses them from JSON (attributes: inferred, a struct)
_SCHEMA = pa.schema([(f, pa.string()) for f in ("event_id", "request_id", "query_id", "user_id", "system_id",
                                                 "item_id")]
                    + [("position", pa.int64()), ("score", pa.float64()), ("clicked", pa.bool_()),
                       ("timestamp", pa.int64()), ("propensity", pa.float64()), ("dwell_ms", pa.int64())])
_REQUIRED = ("event_id", "request_id", "query_id", "system_id", "item_id", "position", "timestamp")
_SURROGATE = re.compile(rb"\\[uU][dD][89a-fA-F]")


class JsonBlock(NamedTuple):
    """A block of JSON impressions as columns: ``table`` (the schema's fields, no attributes),
    ``attributes`` (``{key: Arrow string array}``, null where a row has no such key) and ``check``
    (bool per row: the row must go to the record check, which decides on its value as sent)."""

    table: pa.Table
    attributes: dict
    check: np.ndarray


def _nulls(a) -> np.ndarray:
    return np.asarray(a.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _null_literal(check: np.ndarray, rows: np.ndarray, key: str, parts: list) -> None:
    """Mark for the record check those of ``rows`` (a null in Arrow: the key absent, or ``null``)
    whose value may hold ``"key": null``: all of them when the key is not plain ASCII (JSON may
    escape it) or whose text has an escape (``\\u``), else those whose text matches (a match elsewhere
    in the value only costs a check)."""
    idx = np.flatnonzero(rows & ~check)
    if not len(idx):
        return
    if not (key.isascii() and key.isprintable() and '"' not in key and "\\" not in key):
        check[idx] = True
        return
    pattern = re.compile(b'"' + re.escape(key.encode()) + rb'"\s*:\s*null')
    for i in idx.tolist():  # (a value with an escape may spell the key otherwise: checked)
        if b"\\u" in parts[i] or pattern.search(parts[i]):
            check[i] = True


def impression_json_table(values) -> JsonBlock | None:
    """The values (bytes or str, one JSON object each) as a :class:`JsonBlock`, or None when the
    block must be read record by record (see the module)."""
    import pyarrow.json as pj

    parts = [v if isinstance(v, (bytes, bytearray)) else str(v).encode("utf-8", "surrogatepass") for v in values]
    if not parts or any(b"\n" in v or b"\r" in v for v in parts):
        return None
    data = b"\n".join(parts)
    if _SURROGATE.search(data):
        return None
    try:
        table = pj.read_json(io.BytesIO(data), parse_options=pj.ParseOptions(
            explicit_schema=_SCHEMA, unexpected_field_behavior="infer"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != len(parts):  # a blank value: Arrow skips the empty line
        return None
    n = table.num_rows
    check = np.zeros(n, dtype=bool)
    for f in _REQUIRED:
        c = table.column(f)
        if c.null_count:
            check |= np.asarray(c.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    attributes: dict = {}
    if "attributes" in table.column_names:
        col = table.column("attributes").combine_chunks()
        if pa.types.is_null(col.type):
            _null_literal(check, np.ones(n, dtype=bool), "attributes", parts)
        elif not pa.types.is_struct(col.type):
            return None
        else:
            if col.null_count:  # no attributes (valid) or null (not)
                _null_literal(check, _nulls(col), "attributes", parts)
            for i, child in enumerate(col.flatten()):  # the children, null where the row's struct is
                field = col.type.field(i)
                if not (pa.types.is_string(field.type) or pa.types.is_null(field.type)):
                    return None
                if child.null_count:  # a key this row lacks (valid) or whose value is null (not)
                    _null_literal(check, _nulls(child), field.name, parts)
                attributes[field.name] = child if pa.types.is_string(field.type) else child.cast(pa.string())
    keep = [c for c in table.column_names if c in _SCHEMA.names]
    return JsonBlock(table.select(keep), attributes, check)
