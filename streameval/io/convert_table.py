"""Generic logs in: JSON lines, CSV or Parquet tables with their own column names to impression or
judgment Avro (``streameval convert table``).

The file is read with pyarrow (``pyarrow.json``, ``pyarrow.csv``, ``pyarrow.parquet``); the
columns are renamed by a mapping ``target=source`` (targets: the fields of
``schemas/impression.avsc`` or ``schemas/judgment.avsc``; a field not mapped is read from the
column of its own name), converted to the schema's types column by column with Arrow, and screened
with vectorised range checks. A row the conversion or the screen flags is built as a record dict and
goes through :func:`streameval.io.records.check_impression` / :func:`~streameval.io.records.check_judgment`
(the batch job's record checks), which decide and give the reason: a rejected row becomes a dead
letter (``schemas/dead_letter.avsc``) whose ``source`` is ``path:line`` (JSON lines and CSV: 1-based
physical line, the CSV header is line 1) or ``path:row N`` (Parquet: 1-based row), never dropped.
A JSON line whose arrays and objects nest deeper than :data:`MAX_JSON_DEPTH` is a dead letter before
pyarrow.json (or the json module) reads the file: their parsers recurse, and a line 20,000 deep
crashed the process.
The good rows are written with :func:`streameval.io.avro.write_records`.

Conversions (docs/metrics.md, "Converting your own logs"):

* id fields (``event_id``, ``request_id``, ``query_id``, ``system_id``, ``item_id``, ``user_id``,
  ``source``): strings as they are; integer columns as their decimal text; anything else goes to the
  record check (which rejects it);
* ``position``, ``grade``, ``dwell_ms``: integer columns; CSV text of an integer (``[+-]digits``);
* ``score``, ``propensity``: integer or floating columns; CSV text of a number;
* ``clicked``: boolean columns, integers 0/1; CSV text ``1``/``true``/``True``/``TRUE`` and
  ``0``/``false``/``False``/``FALSE`` (pyarrow.csv's own true and false values);
* ``timestamp``: with ``timestamp_unit`` ``s``/``ms``/``us``, integers (CSV: integer text) in that
  unit; with ``iso``, ISO 8601 text (UTC when it names no zone); Parquet timestamp columns as they
  are (UTC when naive); converted to microseconds since the epoch;
* CSV: an empty cell of a non-string field is null (missing); an empty ``user_id`` is null;
* ``attributes`` (impressions): the columns named in ``attributes``, each as the key of its column
  name; string, integer and boolean columns (as text: ``true``/``false``), a null cell leaves the key
  out.

Layer 4 (I/O): imports pyarrow, numpy and this package's record rules and Avro writer; no Beam.
"""

from __future__ import annotations

import csv
import functools
import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import records
from .avro import load_schema_json, write_records
from .dead_letters import dead_letter

__all__ = ["FORMATS", "TIMESTAMP_UNITS", "KINDS", "MAX_JSON_DEPTH", "TableConvertError", "TableConversion", "TablePlan", "Converted",
           "parse_mapping", "detect_format", "check_options", "plan_table", "integer_timestamps", "convert_rows",
           "convert_table"]

FORMATS = ("jsonl", "csv", "parquet")
from .choices import TIMESTAMP_UNITS  # noqa: E402  (no pyarrow: the command lines' choices)
#: --kind -> schema name
KINDS = {"impressions": "impression", "judgments": "judgment"}
_EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet",
               ".pq": "parquet"}
_FACTOR = {"s": 1_000_000, "ms": 1_000, "us": 1}
_KIND_OF = {"position": "int", "grade": "int", "dwell_ms": "int", "score": "double", "propensity": "double", "clicked": "bool",
            "timestamp": "timestamp"}
_CSV_TRUE = frozenset(("1", "True", "TRUE", "true"))  # pyarrow.csv.ConvertOptions().true_values
_CSV_FALSE = frozenset(("0", "False", "FALSE", "false"))
_INT_TEXT = r"^[+-]?[0-9]{1,18}$"
_INT_RE = re.compile(r"^[+-]?[0-9]+$")  # per value: any length (the check names what does not fit)
_FLOAT_TEXT = r"^[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|[Ii]nf|[Ii]nfinity|[Nn]a[Nn])$"
_FLOAT_RE = re.compile(_FLOAT_TEXT)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_BATCH = 65_536
#: the deepest nesting of arrays and objects a JSON line may hold (the line's object is level 1); a
#: deeper line is a dead letter before pyarrow.json sees the file (its parser recurses: a line nested
#: 20,000 deep crashed the process) and before the json module would (a RecursionError near 1,000)
MAX_JSON_DEPTH = 500
_NOT_OPENER_OR_NEWLINE = bytes(b for b in range(256) if b not in b"[{\n")
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\Z)', re.DOTALL)  # an unterminated one runs to the end
_SCAN_CHUNK = 1 << 24


class TableConvertError(ValueError):
    """An option or input the command cannot start on (exit status 2): one line naming the problem."""


@dataclass
class TableConversion:
    """What :func:`convert_table` did: rows read, records written, dead letters (dicts of the
    dead_letter schema) and the columns it ignored."""

    rows: int = 0
    written: int = 0
    dead_letters: list = field(default_factory=list)
    ignored: list = field(default_factory=list)


def parse_mapping(text) -> dict:
    """``{target: source}`` of ``"target=source,target=source"`` (``None``/empty: ``{}``). Raises
    :class:`TableConvertError` for an item without ``=`` or a target given twice."""
    out: dict = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        target, eq, source = item.partition("=")
        target, source = target.strip(), source.strip()
        if not eq or not target or not source:
            raise TableConvertError(f"--map: {item!r} is not target=source (e.g. request_id=rid)")
        if target in out:
            raise TableConvertError(f"--map: field {target!r} mapped twice")
        out[target] = source
    return out


def detect_format(path: str, fmt: str = "auto") -> str:
    """``fmt``, or with ``"auto"`` the format of ``path``'s extension (.jsonl/.ndjson/.json, .csv,
    .parquet/.pq; a trailing .gz/.bz2 is not read here). Raises :class:`TableConvertError`."""
    if fmt != "auto":
        if fmt not in FORMATS:
            raise TableConvertError(f"--format must be auto or one of {', '.join(FORMATS)}, got {fmt!r}")
        return fmt
    ext = os.path.splitext(path)[1].lower()
    if ext not in _EXTENSIONS:
        raise TableConvertError(f"{path}: cannot tell the format from the extension {ext or '(none)'!r}; "
                                f"give --format {'|'.join(FORMATS)}")
    return _EXTENSIONS[ext]


# --------------------------------------------------------------------------------------------
# reading


@dataclass
class _Read:
    table: pa.Table
    flagged: np.ndarray  # rows whose raw values could not enter the typed columns
    raw: object  # row index -> the row as read (a dict of column: Python value)
    where: object  # row index -> "path:line N" text
    dead: list  # dead letters of lines that are no row (unparsable)


def _columns_of(path: str, fmt: str) -> list[str]:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    if fmt == "csv":
        with open(path, newline="", encoding="utf-8-sig") as f:  # pyarrow.csv skips a byte-order mark too
            header = next(csv.reader(f), None)
        if not header:
            raise TableConvertError(f"{path}: empty CSV file (no header line)")
        return header
    return []  # JSON lines: the columns are known after reading


def _line_numbers_jsonl(path: str, skip=()) -> list[int]:
    """1-based numbers of the lines that hold a JSON value (pyarrow.json skips blank lines), but
    the lines ``skip``."""
    with open(path, "rb") as f:
        return [i for i, line in enumerate(f, 1) if line.strip() and i not in skip]


def _json_depth(line: bytes) -> int:
    """How deep arrays and objects nest in the JSON text ``line`` (``{"a": [1]}``: 2), brackets in
    strings not counted (an unterminated string runs to the end of the line)."""
    brackets = _JSON_STRING.sub(b"", line).translate(None, _NOT_BRACKET)
    if not brackets:
        return 0
    b = np.frombuffer(brackets, dtype=np.uint8)
    return int(np.cumsum(np.where((b == 0x5B) | (b == 0x7B), 1, -1)).max())


def _too_deep_lines(path: str, limit: int = MAX_JSON_DEPTH) -> dict:
    """``{line: dead letter}`` (1-based physical lines) of the lines of ``path`` whose arrays and
    objects nest deeper than ``limit``. A line cannot nest deeper than its count of ``[`` and ``{``:
    the file is reduced to those bytes and its newlines chunk by chunk (bytes.translate, C speed;
    about a twentieth of pyarrow.json's time on a 1 M-line log), and only a line with more than
    ``limit`` of them is scanned for its depth."""
    candidates = []
    carry, line0 = b"", 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_SCAN_CHUNK)
            reduced = carry + chunk.translate(None, _NOT_OPENER_OR_NEWLINE)
            if not chunk:
                reduced += b"\n"  # the last line without its newline
            cut = reduced.rfind(b"\n") + 1
            body, carry = reduced[:cut], reduced[cut:]
            if body:
                ends = np.flatnonzero(np.frombuffer(body, dtype=np.uint8) == 0x0A)
                openers = np.diff(ends, prepend=-1) - 1
                candidates.extend((line0 + 1 + np.flatnonzero(openers > limit)).tolist())
                line0 += len(ends)
            if not chunk:
                break
    if not candidates:
        return {}
    wanted, deep = set(candidates), {}
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if n in wanted and (depth := _json_depth(line)) > limit:
                deep[n] = dead_letter(f"{path}:{n}", line.rstrip(b"\r\n").decode("utf-8", "replace"),
                                      f"JSON nested {depth} levels deep (arrays and objects), over the limit of "
                                      f"{limit}")
    return deep


def _without_lines(path: str, lines) -> bytes:
    """The bytes of ``path`` with the lines ``lines`` made blank (the others keep their numbers)."""
    with open(path, "rb") as f:
        return b"".join(b"\n" if n in lines else line for n, line in enumerate(f, 1))


def _csv_records(path: str, width: int) -> tuple[list[int], list[tuple[int, list]]]:
    """Start lines of the CSV's data records that have ``width`` fields (pyarrow's rows, in order),
    and ``(line, fields)`` of the others (rows pyarrow.csv could not read); blank lines skipped."""
    good, bad = [], []
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        next(reader, None)
        last = reader.line_num
        for row in reader:
            start, last = last + 1, reader.line_num
            if not row:
                continue
            (good.append(start) if len(row) == width else bad.append((start, row)))
    return good, bad


def _read_csv(path: str, needed: list[str], header: list[str]) -> _Read:
    import pyarrow.csv as pcsv

    invalid = [0]

    def on_invalid(row):
        invalid[0] += 1
        return "skip"

    try:
        table = pcsv.read_csv(
            path, parse_options=pcsv.ParseOptions(newlines_in_values=True, invalid_row_handler=on_invalid),
            convert_options=pcsv.ConvertOptions(column_types={c: pa.string() for c in header},
                                                include_columns=needed, strings_can_be_null=False))
    except (pa.ArrowInvalid, UnicodeDecodeError) as e:
        raise TableConvertError(f"{path}: unreadable CSV ({' '.join(str(e).split())})") from None
    lines: list = []

    def scan():
        if not lines:
            lines.append(_csv_records(path, len(header)))
        return lines[0]

    dead = []
    if invalid[0]:
        for line, row in scan()[1]:
            dead.append(dead_letter(f"{path}:{line}", records.to_json_text(row),
                                    f"expected {len(header)} CSV fields (the header's), got {len(row)}"))
    return _Read(table, np.zeros(table.num_rows, dtype=bool), lambda i: _pyrow(table, i),
                 lambda i: _line_of(path, scan()[0], i, table.num_rows), dead)


def _line_of(path: str, lines: list, i: int, rows: int) -> str:
    """``path:line`` of row ``i``; ``path:row N`` should the rescan not find pyarrow's rows."""
    return f"{path}:{lines[i]}" if len(lines) == rows else f"{path}:row {i + 1}"


def _pyrow(table: pa.Table, i: int) -> dict:
    return table.slice(i, 1).to_pylist()[0]


def _read_parquet(path: str, needed: list[str]) -> _Read:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=needed)
    except (pa.ArrowException, OSError) as e:
        raise TableConvertError(f"{path}: unreadable Parquet file ({' '.join(str(e).split())})") from None
    return _Read(table, np.zeros(table.num_rows, dtype=bool), lambda i: _pyrow(table, i),
                 lambda i: f"{path}:row {i + 1}", [])


def _read_jsonl(path: str) -> _Read:
    import pyarrow.json as pj

    deep = _too_deep_lines(path)  # {line: dead letter}
    # pyarrow.json reads the file itself, or (a line too deep) its bytes with that line blank
    kept = _without_lines(path, deep) if deep else None

    def source():
        return path if kept is None else pa.BufferReader(kept)

    try:
        table = pj.read_json(source())
        # pyarrow.json infers timestamps from text; the text is read again as text (ids that look
        # like dates stay ids; the timestamp field is converted by --timestamp-unit's rules)
        dated = [f for f in table.schema if pa.types.is_timestamp(f.type)]
        if dated:
            explicit = pa.schema([pa.field(f.name, pa.string()) for f in dated])
            table = pj.read_json(source(), parse_options=pj.ParseOptions(explicit_schema=explicit,
                                                                         unexpected_field_behavior="infer"))
    except pa.ArrowInvalid:
        # a line that is no JSON object, or a column of mixed types (or no line left: every one too deep)
        return _read_jsonl_lines(path, deep)
    if deep and not table.num_rows:  # as _read_jsonl_lines: no line left to read
        first = next(iter(deep.values()))
        raise TableConvertError(f"{path}: no line is a JSON object ({first['source']}: {first['reason']})")
    lines: list = []

    def where(i):
        if not lines:
            lines.append(_line_numbers_jsonl(path, deep))
        return _line_of(path, lines[0], i, table.num_rows)

    return _Read(table, np.zeros(table.num_rows, dtype=bool), lambda i: _pyrow(table, i), where,
                 list(deep.values()))


def _read_jsonl_lines(path: str, too_deep: dict | None = None) -> _Read:
    """JSON lines read line by line with the json module (when pyarrow.json refuses the file): a
    line that is no JSON object is a dead letter; a column whose values Arrow cannot hold in one
    type (``3`` and ``"x"``) is null in the table and its rows are flagged for the record check.
    ``too_deep``: ``{line: dead letter}`` of the lines nested too deep (not parsed)."""
    too_deep = too_deep or {}
    rows, numbers, dead = [], [], []
    try:
        with open(path, encoding="utf-8-sig") as f:
            for n, line in enumerate(f, 1):
                if n in too_deep:
                    dead.append(too_deep[n])
                    continue
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except ValueError as e:
                    dead.append(dead_letter(f"{path}:{n}", line.rstrip("\r\n"), f"not JSON ({e})"))
                    continue
                if not isinstance(value, dict):
                    dead.append(dead_letter(f"{path}:{n}", line.rstrip("\r\n"),
                                            f"not a JSON object but {type(value).__name__}"))
                    continue
                rows.append(value)
                numbers.append(n)
    except UnicodeDecodeError as e:
        raise TableConvertError(f"{path}: not UTF-8 text ({e})") from None
    if not rows and dead:
        raise TableConvertError(f"{path}: no line is a JSON object ({dead[0]['source']}: {dead[0]['reason']})")
    names: dict = {}
    for r in rows:
        for k in r:
            names.setdefault(k, None)
    flagged = np.zeros(len(rows), dtype=bool)
    cols = {}
    for name in names:
        values = [r.get(name) for r in rows]
        try:
            cols[name] = pa.array(values)
        except (pa.ArrowException, OverflowError, TypeError, ValueError):
            flagged |= np.array([v is not None for v in values])
            cols[name] = pa.nulls(len(rows))
    table = pa.table(cols) if cols else pa.table({"_": pa.nulls(len(rows))}).drop(["_"])
    return _Read(table, flagged, lambda i: rows[i], lambda i: f"{path}:{numbers[i]}", dead)


# --------------------------------------------------------------------------------------------
# column conversion (vectorised); the per-value forms below give the flagged rows the same values


def _np_bool(a) -> np.ndarray:
    a = a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
    if a.null_count:
        a = pc.fill_null(a, False)
    return np.asarray(a.to_numpy(zero_copy_only=False), dtype=bool)


def _valid(a) -> np.ndarray:
    return _np_bool(pc.is_valid(a))


def _decoded(col) -> pa.Array:
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_large_string(col.type):
        col = col.cast(pa.string())
    return col


def _where_text(col, mask: np.ndarray, target: pa.DataType) -> pa.Array:
    """``col`` (strings) cast to ``target`` where ``mask``, null elsewhere."""
    kept = pc.if_else(pa.array(mask), col, pa.scalar(None, pa.string()))
    return pc.cast(kept, target)


def _convert_column(col, kind: str, is_csv: bool, unit: str | None, optional: bool):
    """``(values, ok)``: the column as the field's Arrow type (ids string, ints and timestamps int64,
    doubles float64, bool), null where the value is null or cannot be converted; ``ok`` False where
    a non-null value was not converted (the row goes to the per-value conversion and the check)."""
    col = _decoded(col)
    t = col.type
    n = len(col)
    present = _valid(col)
    if is_csv and (kind != "string" or optional):  # an empty cell of a non-string field is null
        empty = _np_bool(pc.equal(col, ""))
        col = pc.if_else(pa.array(empty), pa.scalar(None, pa.string()), col)
        present &= ~empty
    if pa.types.is_null(t):
        return pa.nulls(n, _ARROW[kind]), np.ones(n, dtype=bool)
    out = None
    if kind == "string":
        if pa.types.is_string(t):
            out = col
        elif pa.types.is_integer(t):
            out = col.cast(pa.string())
    elif kind == "int":
        if pa.types.is_integer(t):
            try:
                out = col.cast(pa.int64())
            except pa.ArrowInvalid:  # uint64 beyond int64: per value
                out = None
        elif is_csv and pa.types.is_string(t):
            out = _where_text(col, _np_bool(pc.match_substring_regex(col, _INT_TEXT)), pa.int64())
    elif kind == "double":
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            out = col.cast(pa.float64())
        elif is_csv and pa.types.is_string(t):
            out = _where_text(col, _np_bool(pc.match_substring_regex(col, _FLOAT_TEXT)), pa.float64())
    elif kind == "bool":
        if pa.types.is_boolean(t):
            out = col
        elif pa.types.is_integer(t):
            ok01 = _np_bool(pc.is_in(col, value_set=pa.array([0, 1], t)))
            out = pc.if_else(pa.array(ok01), pc.equal(col, pa.scalar(1, t)), pa.scalar(None, pa.bool_()))
        elif is_csv and pa.types.is_string(t):
            yes = _np_bool(pc.is_in(col, value_set=pa.array(sorted(_CSV_TRUE))))
            no = _np_bool(pc.is_in(col, value_set=pa.array(sorted(_CSV_FALSE))))
            out = pc.if_else(pa.array(yes | no), pa.array(yes), pa.scalar(None, pa.bool_()))
    elif kind == "timestamp":
        out = _timestamp_column(col, is_csv, unit)
    if out is None:
        return pa.nulls(n, _ARROW[kind]), ~present
    return out, ~present | _valid(out)


_ARROW = {"string": pa.string(), "int": pa.int64(), "double": pa.float64(), "bool": pa.bool_(), "timestamp": pa.int64()}


def _timestamp_column(col, is_csv: bool, unit: str | None):
    t = col.type
    if pa.types.is_timestamp(t):
        try:
            return col.cast(pa.timestamp("us", t.tz)).cast(pa.int64())
        except pa.ArrowInvalid:
            return None
    if unit in _FACTOR:
        f = _FACTOR[unit]
        if pa.types.is_integer(t):
            ints = col
        elif is_csv and pa.types.is_string(t):
            ints = _where_text(col, _np_bool(pc.match_substring_regex(col, _INT_TEXT)), pa.int64())
        else:
            return None
        try:
            ints = ints.cast(pa.int64())
        except pa.ArrowInvalid:
            return None
        fits = _np_bool(pc.and_(pc.greater_equal(ints, records.EVENT_TIME_MIN // f),
                                pc.less_equal(ints, records.EVENT_TIME_MAX // f)))
        return pc.if_else(pa.array(fits), pc.multiply(ints, f), pa.scalar(None, pa.int64()))
    if unit == "iso" and pa.types.is_string(t):
        for target in (pa.timestamp("us", "UTC"), pa.timestamp("us")):
            try:
                return col.cast(target).cast(pa.int64())
            except pa.ArrowInvalid:
                pass
        # mixed zones or a bad value: Python's ISO reader, value by value
        return pa.array([_iso_micros(v) if v is not None else None for v in col.to_pylist()], pa.int64())
    return None


def _iso_micros(text: str):
    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00") if text.strip().endswith("Z")
                                    else text.strip())
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _convert_value(kind: str, v, is_csv: bool, unit: str | None, optional: bool):
    """``(value, reason)`` of one raw value, with the column conversion's rules; ``reason`` a text
    when the value cannot be converted (a timestamp in the wrong form), else None; values the
    conversion does not apply to are returned as they are, for the record check to judge."""
    if v is None:
        return None, None
    if is_csv and isinstance(v, str) and v == "" and (kind != "string" or optional):
        return None, None
    if kind == "string":
        return (str(v) if isinstance(v, int) and not isinstance(v, bool) else v), None
    if is_csv and isinstance(v, str):
        if kind == "int" and _INT_RE.match(v):
            return int(v), None
        if kind == "double" and _FLOAT_RE.match(v):
            return float(v), None
        if kind == "bool" and (v in _CSV_TRUE or v in _CSV_FALSE):
            return v in _CSV_TRUE, None
    if kind == "double" and isinstance(v, int) and not isinstance(v, bool):
        return float(v), None
    if kind == "bool" and isinstance(v, int) and not isinstance(v, bool) and v in (0, 1):
        return v == 1, None
    if kind == "timestamp":
        return _timestamp_value(v, is_csv, unit)
    return v, None


def _timestamp_value(v, is_csv: bool, unit: str | None):
    if isinstance(v, datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=timezone.utc)
        delta = v - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds, None
    if unit in _FACTOR:
        if is_csv and isinstance(v, str) and _INT_RE.match(v):
            v = int(v)
        if isinstance(v, int) and not isinstance(v, bool):
            return v * _FACTOR[unit], None  # the record check rejects what is out of range
        return None, f"timestamp must be an integer in {unit} (--timestamp-unit {unit}), got {type(v).__name__} " \
                     f"{records._short(v)}"
    if isinstance(v, str):
        micros = _iso_micros(v)
        if micros is not None:
            return micros, None
        return None, f"timestamp is not an ISO 8601 date-time: {records._short(v)}"
    return None, f"timestamp must be ISO 8601 text (--timestamp-unit iso), got {type(v).__name__} {records._short(v)}"


# --------------------------------------------------------------------------------------------
# the screen: rows it clears are written without the per-record check (the ranges are
# streameval.io.records', as the columnar engine's screen); the others go through the check


def _nonempty(a) -> np.ndarray:
    lengths = pc.binary_length(a)
    return _np_bool(pc.greater(pc.fill_null(lengths, 1), 0))


def _no_nul(a) -> np.ndarray:
    return ~_np_bool(pc.match_substring(a, "\x00"))


def _between(a, lo, hi) -> np.ndarray:
    return _np_bool(pc.and_(pc.greater_equal(a, lo), pc.less_equal(a, hi)))


def _screen(cols: dict, schema_name: str) -> np.ndarray:
    n = len(next(iter(cols.values())))
    ok = np.ones(n, dtype=bool)
    required = records.IMPRESSION_REQUIRED if schema_name == "impression" else records.JUDGMENT_REQUIRED
    for f in required:
        ok &= _valid(cols[f])
    if schema_name == "impression":
        for f in records.NONEMPTY_FIELDS["impression"]:
            ok &= _nonempty(cols[f])
        ok &= _between(cols["position"], 1, records.AVRO_INT_MAX)
        ok &= _between(cols["timestamp"], records.EVENT_TIME_MIN, records.EVENT_TIME_MAX)
        score = cols["score"]
        ok &= ~_valid(score) | _np_bool(pc.is_finite(score))
        prop = cols["propensity"]
        ok &= ~_valid(prop) | _np_bool(pc.and_(pc.greater(prop, 0.0), pc.less_equal(prop, 1.0)))
        dwell = cols.get("dwell_ms")
        if dwell is not None:  # >= 0 on a clicked impression (else the record check says why)
            clicked = cols.get("clicked")
            fine = _np_bool(pc.greater_equal(dwell, 0)) & (_np_bool(clicked) if clicked is not None else False)
            ok &= ~_valid(dwell) | fine
    else:
        for f in records.NONEMPTY_FIELDS["judgment"]:
            ok &= _nonempty(cols[f])
        ok &= _between(cols["grade"], records.AVRO_INT_MIN, records.AVRO_INT_MAX)
        ts = cols["timestamp"]
        ok &= ~_valid(ts) | _between(ts, records.EVENT_TIME_MIN, records.EVENT_TIME_MAX)
    for f in records.ID_FIELDS[schema_name]:
        ok &= _no_nul(cols[f])
    return ok


# --------------------------------------------------------------------------------------------
# the command


def _field_kinds(schema_name: str) -> dict:
    """field -> conversion kind, in schema order (attributes excluded)."""
    return {f["name"]: _KIND_OF.get(f["name"], "string") for f in load_schema_json(schema_name)["fields"]
            if f["name"] != "attributes"}


@dataclass
class TablePlan:
    """How a table's columns become a schema's fields (:func:`plan_table`): ``schema_name``
    (``"impression"``/``"judgment"``), ``kinds`` (field -> conversion kind, schema order),
    ``source`` (field -> the file's column, fields with a column only), ``required`` (the schema's
    required fields), ``attributes`` (columns kept in the attributes map), ``needed`` (the columns
    read, in file order), ``ignored`` (the others) and ``timestamp_unit``."""

    schema_name: str
    kinds: dict
    source: dict
    required: tuple
    attributes: list
    needed: list
    ignored: list
    timestamp_unit: str | None = None


def check_options(kind: str, mapping: dict | None, timestamp_unit: str | None, attributes=()):
    """``(schema name, {field: conversion kind}, mapping, attributes)`` of the options of a
    conversion, checked without the file: raises :class:`TableConvertError` (one line) for an unknown
    kind, timestamp unit or field, or attributes of judgments."""
    if kind not in KINDS:
        raise TableConvertError(f"--kind must be impressions or judgments, got {kind!r}")
    schema_name = KINDS[kind]
    if timestamp_unit is not None and timestamp_unit not in TIMESTAMP_UNITS:
        raise TableConvertError(f"--timestamp-unit must be one of {', '.join(TIMESTAMP_UNITS)}, got {timestamp_unit!r}")
    mapping = dict(mapping or {})
    attributes = [a for a in (attributes or ()) if a]
    kinds = _field_kinds(schema_name)
    unknown = [t for t in mapping if t not in kinds]
    if unknown:
        raise TableConvertError(f"--map: unknown field(s) {', '.join(unknown)}; the {schema_name} fields are "
                                f"{', '.join(kinds)}")
    if attributes and schema_name != "impression":
        raise TableConvertError("--attributes: judgments have no attributes map")
    return schema_name, kinds, mapping, attributes


def plan_table(path, kind: str, columns, mapping: dict | None = None, timestamp_unit: str | None = None,
               attributes=()) -> TablePlan:
    """The :class:`TablePlan` of a table file ``path`` of ``kind`` (``"impressions"``/``"judgments"``)
    with ``columns`` (its column names), for ``mapping`` ``{field: column}``, ``timestamp_unit`` (as
    given; :func:`convert_table` settles None from the data) and ``attributes``. Raises
    :class:`TableConvertError` (one line) for an unknown kind, field or unit, attributes of
    judgments, a mapped or attribute column not in ``columns``, a required field without a column."""
    path = os.fspath(path)
    schema_name, kinds, mapping, attributes = check_options(kind, mapping, timestamp_unit, attributes)
    columns = list(columns)
    source = {t: mapping.get(t, t) for t in kinds}
    missing_cols = [f"{t}={c}" for t, c in mapping.items() if c not in columns]
    missing_cols += [a for a in attributes if a not in columns]
    if missing_cols:
        raise TableConvertError(f"{path}: no column(s) {', '.join(missing_cols)} in the file (columns: "
                                f"{', '.join(columns) or 'none'})")
    required = records.IMPRESSION_REQUIRED if schema_name == "impression" else records.JUDGMENT_REQUIRED
    missing = [t for t in required if source[t] not in columns]
    if missing:
        raise TableConvertError(f"{path}: no column for the required field(s) {', '.join(missing)}; name them with "
                                f"--map FIELD=COLUMN (columns: {', '.join(columns) or 'none'})")
    source = {t: c for t, c in source.items() if c in columns}
    used = set(source.values()) | set(attributes)
    return TablePlan(schema_name, kinds, source, required, attributes, [c for c in columns if c in used],
                     [c for c in columns if c not in used], timestamp_unit)


def integer_timestamps(path, plan: TablePlan, column_type) -> None:
    """Raise :class:`TableConvertError` when the timestamp column (Arrow type ``column_type``) holds
    integers and ``plan`` has no ``timestamp_unit``."""
    if plan.timestamp_unit is None and pa.types.is_integer(column_type):
        raise TableConvertError(f"{os.fspath(path)}: the timestamp column {plan.source['timestamp']!r} holds integers; "
                                f"give --timestamp-unit s, ms or us")


@dataclass
class Converted:
    """The rows of one table converted (:func:`convert_rows`): ``cols`` (field -> Arrow array of the
    field's type, null where absent or not converted; fields without a column: all null),
    ``attributes`` (column -> Arrow string array), ``ok`` (rows to keep), ``rescued`` (row ->
    record dict, for kept rows the column conversion could not give: their values are these) and
    ``dead`` (dead letters of the rejected rows)."""

    cols: dict
    attributes: dict
    ok: np.ndarray
    rescued: dict
    dead: list


def convert_rows(read: _Read, plan: TablePlan, is_csv: bool = False) -> Converted:
    """Convert the table ``read`` holds as ``plan`` says (``plan.timestamp_unit`` settled): the
    columns with Arrow, the screen, and for the rows they flag the per-value conversion and the
    record check (no time range). Rejected rows are dead letters named ``read.where(i)``."""
    table = read.table
    n = table.num_rows
    kinds, source, required, attributes = plan.kinds, plan.source, plan.required, plan.attributes
    schema_name, timestamp_unit = plan.schema_name, plan.timestamp_unit
    ok = ~read.flagged
    cols = {}
    for target, k in kinds.items():
        optional = target not in required
        if target in source:
            values, conv_ok = _convert_column(table[source[target]], k, is_csv, timestamp_unit, optional)
            ok &= conv_ok
        else:
            values = pa.nulls(n, _ARROW[k])
        cols[target] = values
    attr_cols = {}
    for a in attributes:
        col = _decoded(table[a])
        if pa.types.is_string(col.type):
            attr_cols[a] = col
        elif pa.types.is_integer(col.type) or pa.types.is_boolean(col.type) or pa.types.is_null(col.type):
            attr_cols[a] = col.cast(pa.string())
        else:
            attr_cols[a] = pa.nulls(n, pa.string())
            ok &= ~_valid(col)
    if n:
        ok &= _screen(cols, schema_name)
    dead = []
    rescued: dict = {}
    for i in np.flatnonzero(~ok).tolist():
        raw = read.raw(i)
        rec, reason = {}, None
        for target, k in kinds.items():
            if target not in source:
                continue
            value, why = _convert_value(k, raw.get(source[target]), is_csv, timestamp_unit, target not in required)
            reason = reason or why
            if value is not None or target in required:
                rec[target] = value
        if attributes:
            rec["attributes"] = {a: _attr_text(raw.get(a)) for a in attributes if raw.get(a) is not None}
        if reason is None:
            reason = (records.check_impression(rec) if schema_name == "impression" else records.check_judgment(rec))
        if reason is None:
            rescued[i] = rec
            ok[i] = True
        else:
            dead.append(dead_letter(read.where(i), records.to_json_text(raw), reason))
    return Converted(cols, attr_cols, ok, rescued, dead)


def convert_table(path, kind: str, out, mapping: dict | None = None, fmt: str = "auto",
                  dead_letters=None, timestamp_unit: str | None = None, attributes=()) -> TableConversion:
    """Convert the table file ``path`` to the Avro file ``out`` of ``kind`` (``"impressions"`` or
    ``"judgments"``), the rejected rows to dead letters (written to ``dead_letters``, ``.jsonl`` or
    ``.avro``, when given). See the module docstring for the rules.

    ``mapping``: ``{field: column}``; ``timestamp_unit``: s, ms, us or iso (None: iso for text
    columns, an error for integer columns, which need their unit); ``attributes``: column names
    kept in the impression's ``attributes`` map.

    Raises :class:`TableConvertError` (one line) for an unknown field in ``mapping``, a mapped or
    attribute column not in the file, a required field without a column, an integer timestamp
    column without ``timestamp_unit``, an unreadable file or one without rows; ``OSError`` for a
    file that cannot be opened or written. Returns a :class:`TableConversion`.
    """
    path = os.fspath(path)
    schema_name = check_options(kind, mapping, timestamp_unit, attributes)[0]
    if not os.path.isfile(path):
        raise TableConvertError(f"{path}: no such file" if not os.path.exists(path) else f"{path}: not a file")
    fmt = detect_format(path, fmt)
    columns = _columns_of(path, fmt)
    if fmt == "jsonl":
        read = _read_jsonl(path)
        columns = list(read.table.column_names)
    plan = plan_table(path, kind, columns, mapping, timestamp_unit, attributes)
    source, ignored, needed = plan.source, plan.ignored, plan.needed
    if fmt == "csv":
        read = _read_csv(path, needed, columns)
    elif fmt == "parquet":
        read = _read_parquet(path, needed)
    table = read.table
    n = table.num_rows
    if n == 0 and not read.dead:
        raise TableConvertError(f"{path}: no rows")
    is_csv = fmt == "csv"
    if "timestamp" in source and plan.timestamp_unit is None:
        t = _decoded(table[source["timestamp"]]).type
        integer_timestamps(path, plan, t)
        if is_csv and n and _np_bool(pc.match_substring_regex(_decoded(table[source["timestamp"]]), _INT_TEXT)).any():
            integer_timestamps(path, plan, pa.int64())
        plan.timestamp_unit = "iso"
    conv = convert_rows(read, plan, is_csv)
    cols, attr_cols, ok, rescued = conv.cols, conv.attributes, conv.ok, conv.rescued
    result = TableConversion(rows=n + len(read.dead), ignored=ignored)
    dead = list(read.dead) + conv.dead
    result.dead_letters = dead
    good = np.flatnonzero(ok)

    # fields without a column are left out: the writer gives them the schema's default
    names = [f for f in cols if f in source]
    clean = pa.table({f: cols[f] for f in names})
    attr_names = list(attr_cols)
    everything = len(good) == n

    def good_records():
        for lo in range(0, len(good), _BATCH):
            rows = good[lo:lo + _BATCH]
            idx = None if everything else pa.array(rows)
            part = clean.slice(lo, len(rows)) if everything else clean.take(idx)
            columns = [part.column(f).to_pylist() for f in names]
            keys = names
            if attr_names:
                keys = [*names, "attributes"]
                values = [(attr_cols[a].slice(lo, len(rows)) if everything else attr_cols[a].take(idx)).to_pylist()
                          for a in attr_names]
                if len(attr_names) == 1:
                    a = attr_names[0]
                    columns.append([{} if v is None else {a: v} for v in values[0]])
                else:
                    columns.append([{k: v for k, v in zip(attr_names, vs) if v is not None} for vs in zip(*values)])
            recs = _dicts(tuple(keys))(columns)
            if rescued:
                for j, i in enumerate(rows.tolist()):
                    if i in rescued:
                        recs[j] = rescued[i]
            yield from recs

    result.written = write_records(out, schema_name, good_records())
    if dead_letters is not None:
        _write_dead_letters(os.fspath(dead_letters), dead)
    return result


@functools.lru_cache(maxsize=None)
def _dicts(keys: tuple):
    """A function of a list of columns (lists) to the list of row dicts with ``keys``: a dict display
    compiled for the keys (the schema's field names), about 3 times faster than ``dict(zip(...))``."""
    names = [f"v{i}" for i in range(len(keys))]
    body = ", ".join(f"{k!r}: {v}" for k, v in zip(keys, names))
    return eval(f"lambda columns: [{{{body}}} for ({', '.join(names)},) in zip(*columns)]")  # noqa: S307


def _attr_text(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return v


def _write_dead_letters(path: str, dead: list) -> None:
    if path.endswith(".avro"):
        write_records(path, "dead_letter", dead)
        return
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for d in dead:
            f.write(json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n")
