"""The project's Avro schemas (``schemas/*.avsc``) mapped to the column types of the formats people
load into a warehouse or a spreadsheet: an Arrow schema (Parquet), a BigQuery table schema, and CSV
text; plus the conversion of one output record (a dict as the jobs write it to Avro) to each.

One mapping, from the Avro schema, so a field added there appears in every format:

=========================  =====================================  ===========  ==========================
Avro type                  Arrow (Parquet)                        BigQuery     CSV cell
=========================  =====================================  ===========  ==========================
string                     string                                 STRING       the text
int / long                 int32 / int64                          INT64        decimal
double / float             float64 / float32                      FLOAT64      ``repr`` of the float
boolean                    bool                                   BOOL         ``true`` / ``false``
long timestamp-micros      timestamp[us, tz=UTC]                  TIMESTAMP    ISO 8601, ``...Z``
map<string>                map<string, string>                    REPEATED     JSON object text
                                                                  RECORD
                                                                  (key, value)
=========================  =====================================  ===========  ==========================

A field is nullable (Arrow ``nullable``, BigQuery mode ``NULLABLE``, an empty CSV cell) where its
Avro type is a union with ``null``, and also every double / float field: JSON has no NaN, and the
jobs' JSON lines write a NaN (a metric row's ``value`` for an empty set) as null; Parquet, BigQuery
and CSV do the same, so every format holds the same rows. Other fields are required (``REQUIRED``).
Readers turn a null ``value`` back into NaN (:func:`streameval.io.results.parse_float_fields`).

Layer 4 (I/O): imports the standard library and :mod:`.avro`; pyarrow only in :func:`arrow_schema`.
"""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import datetime, timedelta, timezone
from typing import Any, Union

from . import avro

__all__ = ["fields", "arrow_schema", "bigquery_schema", "timestamp_fields", "arrow_record", "bigquery_record",
           "csv_header", "csv_line", "iso_micros", "micros_from_iso"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_BQ_TYPES = {"string": "STRING", "int": "INT64", "long": "INT64", "double": "FLOAT64", "float": "FLOAT64",
             "boolean": "BOOL"}


_CACHE: dict = {}


class _Field:
    """One record field: name, base Avro type (``"string"``, ``"timestamp-micros"``, ``"map"``...),
    whether the union has null, the doc."""

    def __init__(self, spec: dict):
        t = spec["type"]
        self.name = spec["name"]
        self.doc = spec.get("doc", "")
        self.union_null = isinstance(t, list) and "null" in t
        if isinstance(t, list):
            rest = [x for x in t if x != "null"]
            if len(rest) != 1:
                raise ValueError(f"field {self.name}: union {t} has more than one non-null branch")
            t = rest[0]
        if isinstance(t, dict):
            if t.get("logicalType") == "timestamp-micros" and t.get("type") == "long":
                t = "timestamp-micros"
            elif t.get("type") == "map" and t.get("values") == "string":
                t = "map"
            elif t.get("type") in _BQ_TYPES:
                t = t["type"]
            else:
                raise ValueError(f"field {self.name}: Avro type {t} has no column mapping")
        if t not in _BQ_TYPES and t not in ("timestamp-micros", "map"):
            raise ValueError(f"field {self.name}: Avro type {t!r} has no column mapping")
        self.type = t
        #: written as null when null, and (a float) when NaN or infinite
        self.nullable = self.union_null or t in ("double", "float")


def fields(schema: Union[str, dict, list]) -> list[_Field]:
    """The fields of ``schema`` (a name in ``schemas/``, e.g. ``"metric_result"``, or its parsed JSON)
    in order; a list (the fields this function gave, which the other functions here then take
    without parsing the schema again) as it is. Raises ``ValueError`` for a type without a column
    mapping (a nested record, an enum)."""
    if isinstance(schema, list):
        return schema
    if isinstance(schema, str):
        if schema not in _CACHE:
            _CACHE[schema] = [_Field(f) for f in avro.load_schema_json(schema)["fields"]]
        return _CACHE[schema]
    return [_Field(f) for f in schema["fields"]]


def timestamp_fields(schema: Union[str, dict, list]) -> list[str]:
    """Names of the ``timestamp-micros`` fields of ``schema``."""
    return [f.name for f in fields(schema) if f.type == "timestamp-micros"]


def arrow_schema(schema: Union[str, dict, list]):
    """The ``pyarrow.Schema`` of ``schema`` (see the module's table): same field names in the same
    order, timestamps as ``timestamp[us, tz=UTC]``, each field's Avro doc as its metadata
    ``doc``. Raises ``ValueError`` for a type without a mapping; ``ImportError`` without pyarrow."""
    import pyarrow as pa

    types = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64(),
             "float": pa.float32(), "boolean": pa.bool_(), "timestamp-micros": pa.timestamp("us", tz="UTC"),
             "map": pa.map_(pa.string(), pa.string())}
    return pa.schema([pa.field(f.name, types[f.type], nullable=f.nullable, metadata={"doc": f.doc})
                      for f in fields(schema)])


def bigquery_schema(schema: Union[str, dict, list]) -> dict:
    """The BigQuery table schema of ``schema`` as the dict Beam's ``WriteToBigQuery`` takes
    (``{"fields": [{"name", "type", "mode", "description"}, ...]}``; see the module's table).
    BigQuery limits descriptions to 1024 characters: longer docs are cut."""
    out = []
    for f in fields(schema):
        mode = "NULLABLE" if f.nullable else "REQUIRED"
        if f.type == "map":
            out.append({"name": f.name, "type": "RECORD", "mode": "REPEATED", "description": f.doc[:1024],
                        "fields": [{"name": "key", "type": "STRING", "mode": "REQUIRED"},
                                   {"name": "value", "type": "STRING", "mode": "NULLABLE"}]})
            continue
        bq = "TIMESTAMP" if f.type == "timestamp-micros" else _BQ_TYPES[f.type]
        out.append({"name": f.name, "type": bq, "mode": mode, "description": f.doc[:1024]})
    return {"fields": out}


def _finite_or_none(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def iso_micros(micros) -> str:
    """Microseconds since the Unix epoch as ISO 8601 UTC text, ``2019-04-01T00:00:00.000000Z``."""
    return (_EPOCH + timedelta(microseconds=int(micros))).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def micros_from_iso(text: str) -> int:
    """The inverse of :func:`iso_micros` (any ISO 8601 text with an offset or ``Z``)."""
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    d = dt - _EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


def arrow_record(rec: dict, schema: Union[str, dict, list]) -> dict:
    """``rec`` as Beam's ``WriteToParquet`` takes it for :func:`arrow_schema`: a non-finite float as
    None; timestamps stay int microseconds (Arrow takes them as they are); a map as a list of
    (key, value) pairs."""
    out = {}
    for f in fields(schema):
        v = rec.get(f.name)
        if f.type == "map" and v is not None:
            v = sorted(v.items())
        out[f.name] = _finite_or_none(v)
    return out


def bigquery_record(rec: dict, schema: Union[str, dict, list]) -> dict:
    """``rec`` as a BigQuery row of :func:`bigquery_schema`: a non-finite float as None, timestamps as
    ISO 8601 text, a map as a list of ``{"key", "value"}`` records."""
    out = {}
    for f in fields(schema):
        v = _finite_or_none(rec.get(f.name))
        if v is not None and f.type == "timestamp-micros":
            v = iso_micros(v)
        elif v is not None and f.type == "map":
            v = [{"key": k, "value": x} for k, x in sorted(v.items())]
        out[f.name] = v
    return out


def _cell(v: Any, kind: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    if kind == "timestamp-micros":
        return iso_micros(v)
    if kind == "boolean":
        return "true" if v else "false"
    if kind == "map":
        return json.dumps(v, sort_keys=True, ensure_ascii=False)
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _csv_text(cells) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(cells)
    return buf.getvalue()


def csv_header(schema: Union[str, dict, list]) -> str:
    """The CSV header line of ``schema`` (its field names, comma-separated, no newline)."""
    return _csv_text([f.name for f in fields(schema)])


def csv_line(rec: dict, schema: Union[str, dict, list]) -> str:
    """``rec`` as one CSV line (RFC 4180 quoting, no newline) in the order of :func:`csv_header`:
    null and NaN as an empty cell, timestamps as ISO 8601 UTC text (:func:`iso_micros`), booleans
    ``true`` / ``false``, floats as Python's shortest round-tripping text."""
    return _csv_text([_cell(rec.get(f.name), f.type) for f in fields(schema)])
