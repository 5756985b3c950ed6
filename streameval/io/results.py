"""Reading metric tables: rows of ``schemas/metric_result.avsc`` as the batch and streaming jobs write
them, from Avro or JSON lines, given a file or a job's output directory.

Used by ``streameval reconcile`` and ``streameval report``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

__all__ = ["AVRO_MAGIC", "ResultsFormatError", "resolve", "iter_rows"]

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


def iter_rows(path) -> Iterator[tuple[dict, str]]:
    """(row, where) pairs of one table file: Avro when the file starts with Avro's magic bytes,
    JSON lines otherwise (blank lines skipped). ``where`` locates the row for error messages
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
            yield rec, f"{path}:{lineno}"
