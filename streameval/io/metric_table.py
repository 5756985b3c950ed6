"""The typed metric table: the columns of the jobs' Parquet and CSV files of metric rows and of the
frames :func:`streameval.read_metrics` (``as_frame=True``) and :func:`streameval.evaluate_log` give.

The rows (``schemas/metric_result.avsc``, Avro and JSON lines) keep one count, ``num_queries``,
whatever it counts, and ``n_unit`` naming it. The table spells both out:

=====================  ==============================================================================
column                 content
=====================  ==============================================================================
window_start/_end      the window (``timestamp[us, UTC]``; null: the global window)
slice                  the slice label (``all``, ``campaign=men``, ``campaign=men,device=pc``)
slice_<attr>           one text column per slice attribute: the row's value of it, null where the row's
                       slice does not fix it (``all``; ``(missing)`` where the records lacked it)
system, metric         as in the rows
value                  the value (null for NaN)
n                      the count behind the value (the rows' ``num_queries``), in any unit
n_unit                 its unit (:func:`streameval.metrics.units.count_unit`: ``queries``,
                       ``impressions``, ``requests``, ``groups``, ``clusters``, ``slates``, ``units``)
num_queries            ``n`` where ``n_unit`` is ``queries`` (ranking measures), else null
num_impressions        ``n`` where ``n_unit`` is ``impressions`` (CTR, AUC, calibration...), else null
num_requests           ``n`` where ``n_unit`` is ``requests`` (click metrics per request...), else null
stderr ...             the remaining fields of the rows, in their order (interval, pane, metric_canonical)
=====================  ==============================================================================

The integer counts are ``int64`` (pandas ``Int64``), nullable but ``n``. A file's slice columns are
the attributes of the job's options (:func:`slice_columns`: ``--slices``, and the keys of GAUC
groups or sessions that slice labels carry), the same in every file of a job, so that the streaming
job's Parquet files (one per pane) read as one dataset; a frame's are those of its rows' labels.

Layer 3 (I/O): imports the standard library, :mod:`.warehouse` and the metric names of
:mod:`streameval.metrics`; pyarrow only in :meth:`MetricTable.arrow_schema`, pandas only in
:func:`rows_frame`.
"""

from __future__ import annotations

import json

from ..metrics.units import count_unit
from . import avro, warehouse

__all__ = ["SLICE_PREFIX", "UNIT_COLUMNS", "COUNT_COLUMNS", "label_parts", "slice_attributes", "slice_columns",
           "MetricTable", "plain_row", "rows_frame"]

#: the prefix of the columns of slice attributes (``slice_campaign`` for ``campaign=men``)
SLICE_PREFIX = "slice_"
#: unit -> the column holding the count of the rows of that unit (null in the others)
UNIT_COLUMNS = {"queries": "num_queries", "impressions": "num_impressions", "requests": "num_requests"}
#: the count's columns, in order, where the rows have ``num_queries`` and ``n_unit``
COUNT_COLUMNS = ("n", "n_unit", *UNIT_COLUMNS.values())
_COUNT_DOCS = {
    "n": "Number of units behind the value (the rows' num_queries), whatever they are: n_unit names them.",
    "n_unit": "What n counts (streameval.metrics.units.count_unit): queries, impressions, requests, groups, "
              "clusters, slates, or units for a metric name it does not know.",
    "num_queries": "n where n_unit is queries (ranking measures), else null.",
    "num_impressions": "n where n_unit is impressions (CTR, AUC, calibration, off-policy estimates...), else null.",
    "num_requests": "n where n_unit is requests (click metrics per request, interleaving, SRM), else null.",
}


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            i += 1
        out.append(text[i])
        i += 1
    return "".join(out)


def label_parts(label: str) -> list[tuple[str, str]]:
    """The (attribute, value) text pairs of a slice label (``"campaign=men,device=pc"``), split at its
    unescaped ``,`` and ``=`` (``streameval.beam.keys.slice_part`` escapes them with a backslash), still
    escaped; ``"all"`` has none."""
    out, i, n, start, eq = [], 0, len(label), 0, None
    while i <= n:
        c = label[i] if i < n else ","
        if c == "\\":
            i += 2
            continue
        if c == "=" and eq is None:
            eq = i
        elif c == ",":
            if eq is not None:
                out.append((label[start:eq], label[eq + 1:i]))
            start, eq = i + 1, None
        i += 1
    return out


def slice_attributes(label) -> dict:
    """``{attribute: value}`` of a slice label: ``"campaign=men,device=pc"`` gives both, ``"all"`` and
    ``"campaign=all"`` (a slice of every value) none of that attribute; a session's ``user=...`` or
    ``request=...`` key and a GAUC group's counts as an attribute; an absent attribute's value is
    ``"(missing)"``. Backslash escapes of ``,``, ``=`` and ``\\`` are undone."""
    out: dict[str, str] = {}
    if not label or label == "all":
        return out
    for key, value in label_parts(str(label)):
        if value != "all":
            out[_unescape(key)] = _unescape(value)
    return out


def slice_columns(slice_specs=(), keys=()) -> tuple[str, ...]:
    """The slice attributes a job's table has a column for, in order, each once: ``keys`` (a
    session's key, ``user`` / ``request``, first in its labels) then the attributes of
    ``slice_specs`` (each a name, a comma-joined combination ``"campaign,device"`` or a tuple of
    names, as ``--slices`` gives them) and nothing else."""
    names = list(keys)
    for spec in slice_specs:
        names.extend(n.strip() for n in (spec.split(",") if isinstance(spec, str) else spec))
    return tuple(dict.fromkeys(n for n in names if n))


def _field(name: str, avro_type, doc: str) -> dict:
    nullable = isinstance(avro_type, list)
    return {"name": name, "type": avro_type, "doc": doc, **({"default": None} if nullable else {})}


def _schema_json(attributes: tuple[str, ...]) -> dict:
    """The table as an Avro record schema (parsed JSON), for :mod:`.warehouse`'s column mappings."""
    fields = []
    for f in avro.load_schema_json("metric_result")["fields"]:
        name = f["name"]
        if name == "num_queries":
            fields.append(_field("n", "long", _COUNT_DOCS["n"]))
            fields.append(_field("n_unit", ["null", "string"], _COUNT_DOCS["n_unit"]))
            fields.extend(_field(c, ["null", "long"], _COUNT_DOCS[c]) for c in UNIT_COLUMNS.values())
        elif name != "n_unit":
            fields.append(f)
        if name == "slice":
            fields.extend(_field(SLICE_PREFIX + a, ["null", "string"],
                                 f"The slice's value of the attribute {a} (null where the slice does not fix it).")
                          for a in attributes)
    return {"type": "record", "name": "MetricTable", "namespace": "streameval", "fields": fields}


def _typed(row: dict, attributes) -> dict:
    """``row`` (a metric_result dict) with the table's columns (:func:`MetricTable.record`)."""
    out = dict(row)
    n = row.get("n", row.get("num_queries"))
    unit = row.get("n_unit") or count_unit(row["metric"])
    out.update(n=n, n_unit=unit)
    for u, column in UNIT_COLUMNS.items():
        out[column] = n if unit == u else None
    got = slice_attributes(row.get("slice"))
    for a in attributes:
        out[SLICE_PREFIX + a] = got.get(a)
    return out


class MetricTable:
    """The typed table of metric rows with a column per slice attribute of ``attributes`` (names, as
    :func:`slice_columns` gives them; an attribute a label has outside them stays in ``slice`` only).
    Picklable: the jobs' writers carry it."""

    def __init__(self, attributes=()):
        self.attributes = tuple(attributes)
        self.schema = _schema_json(self.attributes)
        self.fields = warehouse.fields(self.schema)

    @property
    def columns(self) -> list[str]:
        """The column names, in order."""
        return [f.name for f in self.fields]

    def record(self, row: dict) -> dict:
        """``row`` (a metric_result dict: ``num_queries``, ``n_unit``, which is filled in from the
        metric when None) as a dict of the table's columns: ``n`` the count, ``num_queries`` /
        ``num_impressions`` / ``num_requests`` it or None by ``n_unit``, a ``slice_<attr>`` per
        attribute; other values as they are."""
        typed = _typed(row, self.attributes)
        return {c: typed.get(c) for c in self.columns}

    def arrow_schema(self):
        """The ``pyarrow.Schema`` of the table (:func:`streameval.io.warehouse.arrow_schema`'s mapping),
        with pandas metadata naming the nullable dtypes of the counts (``Int64``) and ``is_final``
        (``boolean``), so that ``pandas.read_parquet`` gives the frame's dtypes (Spark and DuckDB
        ignore it). Raises ImportError without pyarrow."""
        nullable = {**dict.fromkeys(("n", *UNIT_COLUMNS.values(), "pane_index"), ("int64", "Int64")),
                    "is_final": ("bool", "boolean")}
        pandas = {"index_columns": [], "column_indexes": [],
                  "columns": [{"name": c, "field_name": c, "pandas_type": t, "numpy_type": d, "metadata": None}
                              for c, (t, d) in nullable.items()]}
        return warehouse.arrow_schema(self.schema).with_metadata({b"pandas": json.dumps(pandas).encode("utf-8")})

    def arrow_record(self, row: dict) -> dict:
        """``row`` as :meth:`arrow_schema` takes it (a non-finite float as None, windows int micros)."""
        return warehouse.arrow_record(self.record(row), self.fields)

    def csv_header(self) -> str:
        """The CSV header line (the column names), no newline."""
        return warehouse.csv_header(self.fields)

    def csv_line(self, row: dict) -> str:
        """``row`` as one CSV line of :meth:`csv_header`'s columns (:func:`streameval.io.warehouse.csv_line`)."""
        return warehouse.csv_line(self.record(row), self.fields)


def plain_row(rec: dict) -> dict:
    """A row of the table (read back from a Parquet or CSV file) in the metric_result shape:
    ``num_queries`` the count ``n`` (in whatever unit), the ``slice_<attr>`` and unit columns
    dropped. A row without ``n`` (a file of schema version 2, where ``num_queries`` was the count)
    is returned as it is."""
    if "n" not in rec:
        return rec
    out = {k: v for k, v in rec.items() if k not in COUNT_COLUMNS and not k.startswith(SLICE_PREFIX)}
    out["num_queries"] = rec["n"]
    out["n_unit"] = rec.get("n_unit")
    return out


def rows_frame(rows):
    """Metric rows (dicts) as a pandas DataFrame of the table's columns (the slice attributes of
    the rows' labels, in order of first appearance), then any other key of the rows. Windows as
    ``datetime64[us, UTC]`` (NaT: the global window), ``n``, the unit columns and ``pane_index`` as
    ``Int64``, ``is_final`` as ``boolean``, the floats as ``float64``, the slice columns as
    ``string``. Raises ImportError without pandas."""
    import pandas as pd

    attrs = tuple(dict.fromkeys(a for r in rows for a in slice_attributes(r.get("slice"))))
    table = MetricTable(attrs)
    known = set(table.columns) | set(_avro_fields())
    extra = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in known]
    records = [dict(table.record(r), **{k: r.get(k) for k in extra}) for r in rows]
    df = pd.DataFrame.from_records(records, columns=[*table.columns, *extra])
    for k in ("n", *UNIT_COLUMNS.values(), "pane_index"):
        df[k] = df[k].astype("Int64")
    for k in ("window_start", "window_end"):  # UTC timestamps (NaT: the global window), as in Parquet
        df[k] = pd.to_datetime(df[k].astype("float64"), unit="us", utc=True).astype("datetime64[us, UTC]")
    df["is_final"] = df["is_final"].astype("boolean")
    for k in ("value", "stderr", "ci_low", "ci_high", "ci_level"):
        df[k] = df[k].astype("float64")
    for a in attrs:
        df[SLICE_PREFIX + a] = df[SLICE_PREFIX + a].astype("string")
    return df


def _avro_fields() -> tuple[str, ...]:
    """The fields of ``schemas/metric_result.avsc``, in order (the rows' keys)."""
    return tuple(f["name"] for f in avro.load_schema_json("metric_result")["fields"])
