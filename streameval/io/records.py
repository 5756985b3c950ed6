"""Validation of impression and judgment records, shared by the pipelines.

The checks return a human-readable reason when a record cannot be used (the
pipelines send it to the dead-letter output together with
:func:`to_json_text` of the record) and ``None`` when it is fine.  They
accept what the Avro readers produce (ints, floats, bools, strings, dicts)
and the numpy scalar equivalents; they do not modify the record.

Rules (impression.avsc / judgment.avsc):

* required fields present and not ``None``; strings are ``str`` that UTF-8
  can encode (no lone surrogates, which Avro and JSON files cannot hold);
* ``event_id``, ``request_id``, ``system_id``, ``item_id`` non-empty
  (``query_id`` may be empty: click logs without queries);
* ``position`` an integer >= 1 (and < 2**31, an Avro int);
* ``timestamp`` an integer (microseconds since the epoch, Avro long range);
* ``score`` ``None`` or a finite number (within the double range);
* ``propensity`` ``None`` or a number in (0, 1];
* ``clicked`` absent or ``None`` (clicks not logged: the impression is left out
  of click metrics) or bool-like: ``True``/``False``,
  numpy bool, or the integers 0/1 (strings such as ``"false"`` are rejected
  because ``bool("false")`` is true);
* ``user_id`` ``None`` or a string; ``attributes`` absent or a
  ``{str: str}`` mapping;
* judgments: ``query_id``/``item_id`` non-empty strings, ``grade`` an integer
  (not a float, not a bool), ``timestamp`` (optional) an integer, ``source``
  (optional) a string.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any

import numpy as np

__all__ = ["check_impression", "check_judgment", "to_json_text", "IMPRESSION_REQUIRED", "JUDGMENT_REQUIRED"]

IMPRESSION_REQUIRED = ("event_id", "request_id", "query_id", "system_id", "item_id", "position", "timestamp")
_IMPRESSION_NONEMPTY = ("event_id", "request_id", "system_id", "item_id")
JUDGMENT_REQUIRED = ("query_id", "item_id", "grade")

#: the ranges of Avro's int and long: what the vectorised screens of the columnar engine check too
AVRO_INT_MIN, AVRO_INT_MAX = -(2**31), 2**31 - 1
AVRO_LONG_MIN, AVRO_LONG_MAX = -(2**63), 2**63 - 1


def _is_int(x: Any) -> bool:
    return (isinstance(x, int) and not isinstance(x, bool)) or isinstance(x, np.integer)


def _is_real(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) or isinstance(x, (np.integer, np.floating))


def _type_name(x: Any) -> str:
    return type(x).__name__


def _not_unicode(value: str) -> bool:
    """True for a string UTF-8 cannot encode (lone surrogates, e.g. from JSON ``"\\ud800"``)."""
    if value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _short(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 60 else r[:57] + "..."


def check_impression(rec: Any) -> str | None:
    """Reason why ``rec`` is not a usable impression, or ``None`` if it is.

    See the module docstring for the rules.
    """
    if not isinstance(rec, Mapping):
        return f"record is not a mapping but {_type_name(rec)}"
    for field in IMPRESSION_REQUIRED:
        if rec.get(field) is None:
            return f"missing required field {field!r}"
    for field in ("event_id", "request_id", "query_id", "system_id", "item_id"):
        value = rec[field]
        if not isinstance(value, str):
            return f"{field} must be a string, got {_type_name(value)} {_short(value)}"
        if _not_unicode(value):
            return f"{field} is not valid Unicode (lone surrogate): {_short(value)}"
    for field in _IMPRESSION_NONEMPTY:
        if not rec[field]:
            return f"empty {field}"

    position = rec["position"]
    if not _is_int(position):
        return f"position must be an integer, got {_type_name(position)} {_short(position)}"
    if position < 1:
        return f"position must be >= 1 (1-based), got {int(position)}"
    if position > AVRO_INT_MAX:
        return f"position {int(position)} does not fit an Avro int"

    reason = _check_timestamp(rec["timestamp"])
    if reason:
        return reason

    score = rec.get("score")
    if score is not None:
        if not _is_real(score):
            return f"score must be a number or null, got {_type_name(score)} {_short(score)}"
        try:
            finite = math.isfinite(score)
        except OverflowError:  # an int beyond the double range
            return f"score does not fit a double: {_short(score)}"
        if not finite:
            return f"score is not finite ({float(score)!r})"

    propensity = rec.get("propensity")
    if propensity is not None:
        if not _is_real(propensity):
            return f"propensity must be a number or null, got {_type_name(propensity)} {_short(propensity)}"
        if not (0.0 < propensity <= 1.0):  # also rejects NaN
            return f"propensity must be in (0, 1], got {float(propensity)!r}"

    if rec.get("clicked") is not None:
        clicked = rec["clicked"]
        if isinstance(clicked, (bool, np.bool_)):
            pass
        elif _is_int(clicked) and clicked in (0, 1):
            pass
        else:
            return f"clicked must be a boolean (or 0/1), got {_type_name(clicked)} {_short(clicked)}"

    user_id = rec.get("user_id")
    if user_id is not None and not isinstance(user_id, str):
        return f"user_id must be a string or null, got {_type_name(user_id)} {_short(user_id)}"
    if user_id is not None and _not_unicode(user_id):
        return f"user_id is not valid Unicode (lone surrogate): {_short(user_id)}"

    if "attributes" in rec:
        attrs = rec["attributes"]
        if not isinstance(attrs, Mapping):
            return f"attributes must be a map of strings, got {_type_name(attrs)} {_short(attrs)}"
        for key, value in attrs.items():
            if not isinstance(key, str) or not isinstance(value, str):
                return f"attributes must map strings to strings, got {_short(key)}: {_short(value)}"
            if _not_unicode(key) or _not_unicode(value):
                return f"attributes are not valid Unicode (lone surrogate): {_short(key)}: {_short(value)}"
    return None


def check_judgment(rec: Any, grade_range: tuple[int, int] | None = None) -> str | None:
    """Reason why ``rec`` is not a usable judgment, or ``None`` if it is.

    ``grade_range``: ``(lowest, highest)`` grade the judgments declare (inclusive); a grade outside
    it is rejected ("grade outside the declared range"). None: any Avro int."""
    if not isinstance(rec, Mapping):
        return f"record is not a mapping but {_type_name(rec)}"
    for field in JUDGMENT_REQUIRED:
        if rec.get(field) is None:
            return f"missing required field {field!r}"
    for field in ("query_id", "item_id"):
        value = rec[field]
        if not isinstance(value, str):
            return f"{field} must be a string, got {_type_name(value)} {_short(value)}"
        if not value:
            return f"empty {field}"
        if _not_unicode(value):
            return f"{field} is not valid Unicode (lone surrogate): {_short(value)}"
    grade = rec["grade"]
    if not _is_int(grade):
        return f"grade must be an integer, got {_type_name(grade)} {_short(grade)}"
    if not AVRO_INT_MIN <= grade <= AVRO_INT_MAX:
        return f"grade {int(grade)} does not fit an Avro int"
    if grade_range is not None and not grade_range[0] <= grade <= grade_range[1]:
        return f"grade outside the declared range {grade_range[0]}..{grade_range[1]}, got {int(grade)}"
    if rec.get("timestamp") is not None:
        reason = _check_timestamp(rec["timestamp"])
        if reason:
            return reason
    source = rec.get("source")
    if source is not None and not isinstance(source, str):
        return f"source must be a string, got {_type_name(source)} {_short(source)}"
    if source is not None and _not_unicode(source):
        return f"source is not valid Unicode (lone surrogate): {_short(source)}"
    return None


def _check_timestamp(ts) -> str | None:
    if not _is_int(ts):
        return f"timestamp must be integer microseconds since the epoch, got {_type_name(ts)} {_short(ts)}"
    if not AVRO_LONG_MIN <= ts <= AVRO_LONG_MAX:
        return f"timestamp {int(ts)} does not fit an Avro long"
    return None


def _jsonable(x: Any) -> Any:
    """Convert ``x`` to plain JSON types (see :func:`to_json_text`)."""
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        if math.isnan(x):
            return "NaN"
        if math.isinf(x):
            return "Infinity" if x > 0 else "-Infinity"
        return x
    if isinstance(x, np.generic):
        return _jsonable(x.item())
    if isinstance(x, (bytes, bytearray, memoryview)):
        b = bytes(x)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return {"$base64": base64.b64encode(b).decode("ascii")}
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, np.ndarray):
        return [_jsonable(v) for v in x.tolist()]
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (set, frozenset)):
        return sorted((_jsonable(v) for v in x), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(x, (datetime, date)):
        return x.isoformat()
    return repr(x)


def to_json_text(rec: Any) -> str:
    """Stable JSON text of ``rec`` for a dead-letter record's ``raw`` field.

    Keys are sorted, separators compact, non-ASCII kept.  Values that JSON
    cannot hold are mapped: NaN/inf floats to the strings ``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``; bytes to their UTF-8 text (or
    ``{"$base64": ...}`` when not valid UTF-8); numpy scalars/arrays to Python
    values; sets to sorted lists; datetimes to ISO text; mapping keys to
    ``str``; anything else to its ``repr``.  The output is always valid JSON.
    """
    return json.dumps(_jsonable(rec), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
