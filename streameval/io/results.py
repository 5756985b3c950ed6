"""Reading metric tables: rows of ``schemas/metric_result.avsc`` as the batch and streaming jobs write
them, from Avro or JSON lines, given a file or a job's output directory.

Used by ``streameval reconcile`` and ``streameval report``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator

__all__ = ["AVRO_MAGIC", "ResultsFormatError", "resolve", "iter_rows", "json_line", "null_for_nonfinite", "parse_float_fields", "FLOAT_FIELDS"]

#: the metric_result fields that hold floats (``value`` is never null in Avro; NaN there)
FLOAT_FIELDS = ("value", "stderr", "ci_low", "ci_high", "ci_level")

AVRO_MAGIC = b"Obj\x01"


class ResultsFormatError(ValueError):
    """A metric table that cannot be read: the message names the file and the line or record."""


def resolve(path) -> str:
    """A job's output directory means its ``metrics.avro`` (else ``metrics.jsonl``); a file is
    itself. Raises FileNotFoundError naming what is missing."""
    path = str(path)
    if os.path.isdir(path):
        for name in ("metrics.avro", "metrics.jsonl"):
            cand = os.path.join(path, name)
            if os.path.isfile(cand):
                return cand
        raise FileNotFoundError(f"{path}: directory without metrics.avro or metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    return path


def null_for_nonfinite(x):
    """``x`` (nested dicts, lists, tuples) with each NaN or infinite float replaced by None, the
    form JSON can hold."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: null_for_nonfinite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [null_for_nonfinite(v) for v in x]
    return x


def json_line(rec: dict) -> str:
    """One output record (a metric row, a dead letter, an alert) as a line of JSON-lines output,
    without the newline. JSON has no NaN or infinity: a non-finite float is written as ``null``
    (a metric row's ``value`` null means NaN, for example an empty set; the Avro output keeps the
    float). Other values as :func:`streameval.io.records.to_json_text` writes them (keys sorted,
    non-ASCII kept). Readers (:func:`iter_rows`) turn a null ``value`` back into NaN."""
    from .records import to_json_text

    return to_json_text(null_for_nonfinite(rec))


def parse_float_fields(rec: dict) -> dict:
    """A JSON-lines row's float fields as floats: ``value`` null is NaN; text (``"NaN"``,
    ``"Infinity"``, as files written before null was used hold) is parsed."""
    for k in FLOAT_FIELDS:
        v = rec.get(k)
        if k == "value" and v is None and k in rec:
            rec[k] = math.nan
        elif isinstance(v, str):
            try:
                rec[k] = float(v)
            except ValueError:
                pass  # left for the caller's own check, which names the file and line
    return rec


def iter_rows(path) -> Iterator[tuple[dict, str]]:
    """(row, where) pairs of one table file: Avro when the file starts with Avro's magic bytes,
    JSON lines otherwise (blank lines skipped; float fields as floats, a null ``value`` as NaN: see
    :func:`json_line`). ``where`` locates the row for error messages
    (``file: record N`` or ``file:line``). Raises ResultsFormatError on a line that is not a JSON
    object."""
    path = str(path)
    with open(path, "rb") as fo:
        magic = fo.read(4)
    if magic == AVRO_MAGIC:
        from . import avro

        for i, rec in enumerate(avro.read_records(path)):
            yield rec, f"{path}: record {i + 1}"
        return
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ResultsFormatError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ResultsFormatError(f"{path}:{lineno}: not a JSON object")
            yield parse_float_fields(rec), f"{path}:{lineno}"
