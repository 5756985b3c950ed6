"""Parquet impressions and judgments read directly by the batch job's columnar engine: a file read
row group by row group with ``pyarrow.parquet`` and converted with ``streameval convert table``'s
rules (:mod:`streameval.io.convert_table`: the column mapping, the type conversions, the screen and
the record checks; one set of rules), so converting to Avro first is optional.

* :func:`is_parquet`: whether a path is read as Parquet (``--input-format``, or by its extension).
* :func:`plan_file`: the column plan of a file's Arrow schema (:class:`TableOptions`: ``--map``,
  ``--timestamp-unit``, ``--attributes``); raises
  :class:`~streameval.io.convert_table.TableConvertError` as ``convert table`` does.
* :func:`read_blocks`: the file's rows as :class:`Block` s (at most ``rows`` rows each, cut inside
  row groups): the converted columns of the rows kept, the records of the rows only the per-value
  conversion could give, and the dead letters of the rows rejected (``source`` ``path:row N``, N
  from 1, exactly as ``convert table`` names them).
* :class:`ParquetInputError`: the file's bytes are not a readable Parquet file (not Parquet,
  truncated, a corrupt page). An ``OSError`` of the file object itself (the environment did not
  deliver the bytes) is raised as it is, never turned into this error.

Layer 4 (I/O): imports pyarrow, numpy and this package's conversion rules; no Beam.
"""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import convert_table as ct
from .avro import _nullable, load_schema_json

__all__ = ["EXTENSIONS", "INPUT_FORMATS", "UNREADABLE_PARQUET", "ParquetInputError", "TableOptions", "Block",
           "is_parquet", "plan_file", "read_blocks", "count_rows"]

#: extensions read as Parquet with ``--input-format auto``
EXTENSIONS = (".parquet", ".pq")
from .choices import INPUT_FORMATS  # noqa: E402  (no pyarrow: the command lines' choices)
#: the reason prefix of the dead letter of a damaged Parquet file
UNREADABLE_PARQUET = "unreadable Parquet file"
#: rows per block at most (a row group is cut into blocks of this size)
BLOCK_ROWS = 65_536


class ParquetInputError(ValueError):
    """The bytes of ``path`` are no readable Parquet file: ``reason`` says why, ``records_read`` how
    many rows of it were given out before the damage. ``str(error)`` is ``"path: reason (after N
    records)"``."""

    def __init__(self, path: str, reason: str, records_read: int = 0):
        self.path, self.reason, self.records_read = str(path), str(reason), int(records_read)
        super().__init__(f"{self.path}: {self.reason} (after {self.records_read} records)")

    def __reduce__(self):
        return (type(self), (self.path, self.reason, self.records_read))


@dataclass(frozen=True)
class TableOptions:
    """The conversion options of one kind of table input: ``mapping`` ``{field: column}``
    (``--map``), ``timestamp_unit`` (s, ms, us, iso or None: iso for text and timestamp columns,
    an error for integers) and ``attributes`` (columns kept in the impressions' attributes map)."""

    mapping: dict = field(default_factory=dict)
    timestamp_unit: str | None = None
    attributes: tuple = ()


@dataclass
class Block:
    """Rows ``offset`` to ``offset + n`` (0-based) of a Parquet file, converted: ``table`` (the
    schema's fields as Arrow columns: ids string, position/grade/timestamp int64 (microseconds),
    score/propensity float64, clicked bool; null where the schema allows it; defaults filled) and
    ``attributes`` (``{key: string array}``, null where a row lacks the key) of the rows kept, and
    ``rows`` their 0-based row numbers in the file; ``rescued`` ``(row, record dict)`` of kept rows
    only the per-value conversion could give (every field present, as an Avro reader gives them);
    ``dead`` the dead letters of the rows rejected."""

    offset: int
    n: int
    table: pa.Table
    attributes: dict
    rows: np.ndarray
    rescued: list
    dead: list


def is_parquet(path: str, input_format: str = "auto") -> bool:
    """Whether ``path`` is read as Parquet: ``input_format`` ``parquet``, or ``auto`` and an extension
    of :data:`EXTENSIONS` (case-insensitive)."""
    if input_format not in INPUT_FORMATS:
        raise ValueError(f"--input-format must be one of {', '.join(INPUT_FORMATS)}, got {input_format!r}")
    if input_format != "auto":
        return input_format == "parquet"
    return os.path.splitext(str(path))[1].lower() in EXTENSIONS


def plan_file(schema: pa.Schema, path: str, kind: str, options: TableOptions | None = None) -> ct.TablePlan:
    """The :class:`~streameval.io.convert_table.TablePlan` of a Parquet file with Arrow ``schema``
    (``kind``: ``"impressions"`` or ``"judgments"``), its timestamp unit settled from the column's
    type as ``convert table`` settles it. Raises :class:`~streameval.io.convert_table.TableConvertError`."""
    options = options or TableOptions()
    plan = ct.plan_table(path, kind, schema.names, options.mapping, options.timestamp_unit, options.attributes)
    if "timestamp" in plan.source and plan.timestamp_unit is None:
        ct.integer_timestamps(path, plan, schema.field(plan.source["timestamp"]).type)
        plan.timestamp_unit = "iso"
    return plan


class _Watched:
    """A binary file object whose own ``OSError`` (the environment's, not the bytes') is kept, so
    that it is told apart from pyarrow's errors about the content."""

    def __init__(self, f):
        self._f = f
        self.error = None

    def _call(self, name, *args):
        try:
            return getattr(self._f, name)(*args)
        except OSError as e:
            self.error = e
            raise

    def read(self, *args):
        return self._call("read", *args)

    def readinto(self, *args):
        return self._call("readinto", *args)

    def seek(self, *args):
        return self._call("seek", *args)

    def tell(self):
        return self._call("tell")

    def seekable(self):
        return True

    def readable(self):
        return True

    def writable(self):
        return False

    @property
    def closed(self):
        return self._f.closed

    def close(self):
        pass  # the caller's


@functools.lru_cache(maxsize=None)
def _defaults(schema_name: str):
    """(the record of every field's default (None for nullable fields), {field: default} of the
    fields that cannot be null but have a default), of schema ``schema_name`` (cached: not to be
    modified)."""
    fields = load_schema_json(schema_name)["fields"]
    every = {f["name"]: f.get("default") for f in fields}
    fill = {f["name"]: f["default"] for f in fields if "default" in f and not _nullable(f["type"])
            and f["name"] != "attributes"}
    return every, fill


def _block(part: pa.Table, path: str, plan: ct.TablePlan, offset: int) -> Block:
    n = part.num_rows
    read = ct._Read(part, np.zeros(n, dtype=bool), lambda i: ct._pyrow(part, i),
                    lambda i: f"{path}:row {offset + i + 1}", [])
    conv = ct.convert_rows(read, plan)
    keep = conv.ok.copy()
    rescued_rows = sorted(conv.rescued)
    keep[rescued_rows] = False
    idx = np.flatnonzero(keep)
    every, fill = _defaults(plan.schema_name)
    take = None if len(idx) == n else pa.array(idx)
    cols = {}
    for f, c in conv.cols.items():
        c = c if take is None else c.take(take)
        if f in fill and c.null_count:
            c = c.fill_null(pa.scalar(fill[f], c.type))
        cols[f] = c
    attrs = {}
    for a in sorted(conv.attributes):
        c = conv.attributes[a] if take is None else conv.attributes[a].take(take)
        if c.null_count < len(c):  # a key no row has is no key (as in the Avro files convert table writes)
            attrs[a] = c
    rescued = []
    for i in rescued_rows:
        rec = copy.deepcopy(every)
        rec.update(conv.rescued[i])
        for f, d in fill.items():
            if rec.get(f) is None:
                rec[f] = d
        if plan.schema_name == "impression":
            rec["attributes"] = rec.get("attributes") or {}
        rescued.append((offset + i, rec))
    return Block(offset, n, pa.table(cols), attrs, offset + idx, rescued, conv.dead)


def read_blocks(f, path: str, kind: str, options: TableOptions | None = None, rows: int = BLOCK_ROWS):
    """The rows of the Parquet file open as the seekable binary file object ``f`` (named ``path`` in
    dead letters and errors) as :class:`Block` s, read row group by row group (the mapped and
    attribute columns only) and converted as ``convert table`` converts them.

    Raises :class:`~streameval.io.convert_table.TableConvertError` when the file's columns do not fit
    ``options`` (a mapped or required column missing, integer timestamps without a unit),
    :class:`ParquetInputError` when its bytes cannot be read as Parquet (after the blocks before the
    damage), and the ``OSError`` of ``f`` itself when the environment does not deliver the bytes."""
    watched = _Watched(f)
    done = 0

    def damaged(e):
        if watched.error is not None:  # the file object's own error: the environment's
            return watched.error
        return ParquetInputError(path, " ".join(str(e).split()) or type(e).__name__, done)

    try:
        pf = pq.ParquetFile(watched)
        schema = pf.schema_arrow
    except _CONTENT as e:
        raise damaged(e) from None
    plan = plan_file(schema, path, kind, options)
    for g in range(pf.num_row_groups):
        try:
            table = pf.read_row_group(g, columns=plan.needed)
        except _CONTENT as e:
            raise damaged(e) from None
        for lo in range(0, table.num_rows, rows):
            part = table.slice(lo, rows)
            block = _block(part, path, plan, done)
            done += part.num_rows
            yield block


#: what pyarrow raises for a file whose content is not readable Parquet (ArrowInvalid is a
#: ValueError; corrupt pages and thrift headers are OSError, told apart from the file object's own)
_CONTENT = (pa.ArrowException, OSError, ValueError, EOFError)


def count_rows(paths) -> int | None:
    """Rows of the local Parquet files ``paths``, from their footers; None when one cannot be read."""
    try:
        return sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
    except (pa.ArrowException, OSError, ValueError):
        return None
