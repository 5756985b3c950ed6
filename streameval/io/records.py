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
  (``query_id`` may be empty: click logs without queries); no id contains NUL (:data:`ID_FIELDS`);
* ``position`` an integer >= 1 (and < 2**31, an Avro int);
* ``timestamp`` an integer (microseconds since the epoch) within the event times every job can
  window and write, years 1 to 9999 (:data:`EVENT_TIME_MIN`, :data:`EVENT_TIME_MAX`; Python's
  datetime and ISO 8601 stop there, Beam's timestamps a little further), and within ``time_range``
  when one is given (the jobs' ``--event-time-range``, for example 1970..2200);
* ``score`` ``None`` or a finite number (within the double range);
* ``propensity`` ``None`` or a number in (0, 1];
* ``clicked`` absent or ``None`` (clicks not logged: the impression is left out
  of click metrics, unless clicks come as separate events: :func:`impression_clicked`) or
  bool-like: ``True``/``False``, numpy bool, or the integers 0/1 (strings such as ``"false"`` are
  rejected because ``bool("false")`` is true);
* ``dwell_ms`` absent or ``None``, or an integer >= 0 (milliseconds, within an Avro long) on a
  clicked impression (``clicked`` true): a negative dwell, or a dwell on an impression not clicked,
  is refused;
* ``user_id`` ``None`` or a string; ``attributes`` absent or a
  ``{str: str}`` mapping;
* judgments: ``query_id``/``item_id`` non-empty strings without NUL, ``grade`` an integer
  (not a float, not a bool), ``timestamp`` (optional) as an impression's (without
  ``time_range``: a judgment's time only orders its versions), ``source
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

__all__ = ["check_impression", "check_judgment", "check_timestamp", "impression_clicked", "parse_time_range", "format_time_range",
           "to_json_text", "grade_range_for", "as_grade_range", "IMPRESSION_REQUIRED", "JUDGMENT_REQUIRED", "ID_FIELDS", "NONEMPTY_FIELDS", "EVENT_TIME_MIN", "EVENT_TIME_MAX"]

#: the id fields of each kind that may not contain NUL: ids are joined, grouped and ordered as text,
#: and numpy's string arrays (the library's and the per-record engine's) drop trailing NULs, which
#: would make "d1\x00" the item "d1"; no TREC file can hold one either (C strings)
ID_FIELDS = {"impression": ("event_id", "request_id", "query_id", "system_id", "item_id"),
             "judgment": ("query_id", "item_id")}
IMPRESSION_REQUIRED = ("event_id", "request_id", "query_id", "system_id", "item_id", "position", "timestamp")
#: the id fields of each kind that may not be empty (an impression's ``query_id`` may: click logs
#: without queries): the record checks and the vectorised screens read them here
NONEMPTY_FIELDS = {"impression": ("event_id", "request_id", "system_id", "item_id"),
                   "judgment": ("query_id", "item_id")}
JUDGMENT_REQUIRED = ("query_id", "item_id", "grade")

#: the ranges of Avro's int and long: what the vectorised screens of the columnar engine check too
AVRO_INT_MIN, AVRO_INT_MAX = -(2**31), 2**31 - 1
AVRO_LONG_MIN, AVRO_LONG_MAX = -(2**63), 2**63 - 1
#: event times (microseconds since the epoch) a job can window and write: 0001-01-01T00:00:00Z to
#: 9999-12-31T23:59:59.999999Z. Windows and lateness fit after them in Beam's timestamps (int64).
EVENT_TIME_MIN, EVENT_TIME_MAX = -62_135_596_800_000_000, 253_402_300_799_999_999


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


def check_impression(rec: Any, time_range=None) -> str | None:
    """Reason why ``rec`` is not a usable impression, or ``None`` if it is.

    See the module docstring for the rules; ``time_range``: ``(lo, hi)`` inclusive micros the
    timestamp must lie in (:func:`parse_time_range`), besides the years 1 to 9999.
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
    for field in NONEMPTY_FIELDS["impression"]:
        if not rec[field]:
            return f"empty {field}"
    for field in ID_FIELDS["impression"]:
        if "\x00" in rec[field]:
            return f"{field} contains a NUL character: {_short(rec[field])}"

    position = rec["position"]
    if not _is_int(position):
        return f"position must be an integer, got {_type_name(position)} {_short(position)}"
    if position < 1:
        return f"position must be >= 1 (1-based), got {int(position)}"
    if position > AVRO_INT_MAX:
        return f"position {int(position)} does not fit an Avro int"

    reason = check_timestamp(rec["timestamp"], time_range)
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

    dwell = rec.get("dwell_ms")
    if dwell is not None:
        if not _is_int(dwell):
            return f"dwell_ms must be an integer (milliseconds) or null, got {_type_name(dwell)} {_short(dwell)}"
        if dwell < 0:
            return f"dwell_ms must be >= 0 milliseconds, got {int(dwell)}"
        if dwell > AVRO_LONG_MAX:
            return f"dwell_ms {int(dwell)} does not fit an Avro long"
        if not rec.get("clicked"):
            return f"dwell_ms {int(dwell)} on an impression that was not clicked (clicked {rec.get('clicked')!r})"

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


def impression_clicked(clicked: Any, click_events: bool = False) -> bool | None:
    """What an impression's ``clicked`` (a value :func:`check_impression` accepted) says for click
    metrics before any click event is joined to it: True or False; or None, "clicks not logged"
    (the impression is left out of CTR and counted ``click_impressions_not_logged``).

    A null ``clicked`` is None only without click events. When clicks come as separate events
    (``click_events``: the streaming job's ``--clicks``, ``StreamMetrics(clicks=...)``), the click
    log is the record of the clicks, so an impression with ``clicked`` null is **not clicked unless
    a click event matches it** (False here; the join makes it True): it counts in CTR's
    denominator as one with ``clicked`` false does. The one rule for every engine that joins click
    events."""
    if clicked is None:
        return False if click_events else None
    return bool(clicked)


def grade_range_for(declared: tuple[int, int] | None, usable: tuple[int, str] | None) -> tuple | None:
    """The grade range the record checks enforce: the ``declared`` one (``--grades``), narrowed to
    the highest grade the requested measures can score (``usable``: ``(highest, why)`` from
    :func:`streameval.metrics.kernel.usable_grade_limit`); ``(lo, hi)``, ``(lo, hi, why)`` or None."""
    if usable is None or (declared is not None and declared[1] <= usable[0]):
        return None if declared is None else (int(declared[0]), int(declared[1]))
    lo = AVRO_INT_MIN if declared is None else int(declared[0])
    return (lo, min(int(usable[0]), AVRO_INT_MAX), usable[1])


def as_grade_range(grade_range) -> tuple | None:
    """``grade_range`` (None, ``(lo, hi)`` or ``(lo, hi, why)``) with integer bounds, as the record
    checks take it."""
    if grade_range is None:
        return None
    return (int(grade_range[0]), int(grade_range[1]), *([str(grade_range[2])] if len(grade_range) > 2 else []))


def check_judgment(rec: Any, grade_range: tuple[int, int] | None = None) -> str | None:
    """Reason why ``rec`` is not a usable judgment, or ``None`` if it is.

    ``grade_range``: ``(lowest, highest)`` grade the judgments declare (inclusive); a grade outside
    it is rejected ("grade outside the declared range"). A third element says why else the range
    holds (:func:`grade_range_for`: the grades the requested measures can score). None: any Avro int."""
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
        if "\x00" in value:
            return f"{field} contains a NUL character: {_short(value)}"
    grade = rec["grade"]
    if not _is_int(grade):
        return f"grade must be an integer, got {_type_name(grade)} {_short(grade)}"
    if not AVRO_INT_MIN <= grade <= AVRO_INT_MAX:
        return f"grade {int(grade)} does not fit an Avro int"
    if grade_range is not None and not grade_range[0] <= grade <= grade_range[1]:
        if len(grade_range) > 2 and grade_range[2] and grade > grade_range[1]:
            return f"grade {int(grade)} is above {grade_range[1]}, {grade_range[2]}"
        return f"grade outside the declared range {grade_range[0]}..{grade_range[1]}, got {int(grade)}"
    if rec.get("timestamp") is not None:
        reason = check_timestamp(rec["timestamp"])
        if reason:
            return reason
    source = rec.get("source")
    if source is not None and not isinstance(source, str):
        return f"source must be a string, got {_type_name(source)} {_short(source)}"
    if source is not None and _not_unicode(source):
        return f"source is not valid Unicode (lone surrogate): {_short(source)}"
    subtopic = rec.get("subtopic")
    if subtopic is not None and not isinstance(subtopic, str):
        return f"subtopic must be a string or null, got {_type_name(subtopic)} {_short(subtopic)}"
    if subtopic is not None and _not_unicode(subtopic):
        return f"subtopic is not valid Unicode (lone surrogate): {_short(subtopic)}"
    return None


def check_timestamp(ts, time_range=None) -> str | None:
    """Reason why ``ts`` is not a usable event time (integer microseconds since the epoch within
    :data:`EVENT_TIME_MIN` .. :data:`EVENT_TIME_MAX`, and within ``time_range`` = ``(lo, hi)``
    inclusive micros when given), or None."""
    if not _is_int(ts):
        return f"timestamp must be integer microseconds since the epoch, got {_type_name(ts)} {_short(ts)}"
    if not EVENT_TIME_MIN <= ts <= EVENT_TIME_MAX:
        return f"timestamp {int(ts)} is outside the event times a job can window (years 1 to 9999)"
    if time_range is not None and not time_range[0] <= ts <= time_range[1]:
        return f"timestamp {int(ts)} is outside the accepted event times {format_time_range(time_range)}"
    return None


def format_time_range(time_range) -> str:
    """``"1970-01-01T00:00:00Z..2200-01-01T00:00:00Z"`` of ``(lo, hi)`` micros."""
    from datetime import timedelta, timezone

    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    return "..".join((epoch + timedelta(microseconds=int(t))).isoformat().replace("+00:00", "Z") for t in time_range)


def parse_time_range(text) -> tuple[int, int] | None:
    """``(lo, hi)``, inclusive micros, of ``"FROM..TO"`` (or ``FROM:TO`` with two years), each end a
    year (its first instant: ``1970..2200`` is 1970-01-01T00:00:00Z to 2200-01-01T00:00:00Z) or an
    ISO 8601 date or time (UTC unless it names a zone); None for None or ``""``. Raises
    ``ValueError``."""
    if text is None or str(text).strip() == "":
        return None
    from datetime import timezone

    raw = str(text).strip()
    parts = raw.split("..") if ".." in raw else raw.split(":", 1) if raw.count(":") == 1 else None
    if not parts or len(parts) != 2:
        raise ValueError(f"event time range {text!r}: write FROM..TO, each a year or an ISO 8601 date or time")
    ends = []
    for p in parts:
        p = p.strip()
        try:
            d = datetime(int(p), 1, 1) if p.isdigit() else datetime.fromisoformat(p.replace("Z", "+00:00"))
        except ValueError as e:
            raise ValueError(f"event time range {text!r}: cannot read {p!r} as a year or an ISO 8601 time") from e
        if d.tzinfo is None:
            d = d.replace(tzinfo=timezone.utc)
        delta = d - datetime(1970, 1, 1, tzinfo=timezone.utc)
        ends.append((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)
    if ends[0] > ends[1]:
        raise ValueError(f"event time range {text!r} ends before it starts")
    return ends[0], ends[1]


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
    A judgment's null ``subtopic`` (the optional field of judgment schema version 2) is left out,
    so an ad hoc judgment's text is the same whichever schema version or engine read it.
    """
    if isinstance(rec, Mapping) and "grade" in rec and "subtopic" in rec and rec["subtopic"] is None:
        rec = {k: v for k, v in rec.items() if k != "subtopic"}
    return json.dumps(_jsonable(rec), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
