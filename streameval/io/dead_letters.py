"""Dead letters: the records a job sets aside, each with where it came from and why.

A dead letter is a dict with the fields of the ``dead_letter`` Avro schema
(``streameval/schemas``): ``source`` (a file and line, a stage name such as ``CleanImpressions``,
or ``late:impression``), ``raw`` (the record as JSON text, or the input's own text when it could
not be read as a record) and ``reason`` (one line). The jobs write them to ``dead_letters.jsonl``
and ``.avro`` (the stream job's late data to ``late_data-*``); docs/cli.md lists the reasons."""

from __future__ import annotations

from .records import to_json_text


def dead_letter(source: str, raw, reason: str) -> dict:
    """``{"source", "raw", "reason"}``: ``raw`` kept as it is when text (a line of the input, or a
    record already written as JSON), else the record (a dict) as JSON text
    (:func:`streameval.io.records.to_json_text`: keys sorted, non-ASCII kept)."""
    return {"source": source, "raw": raw if isinstance(raw, str) else to_json_text(raw), "reason": reason}
