"""Repeated and conflicting records: the rules the batch and streaming jobs share.

Pure Python on record dicts (as :mod:`streameval.io.records` checks them); the Beam transforms that
apply them are :class:`streameval.beam.transforms.CleanImpressions` and
:class:`~streameval.beam.transforms.ResolveJudgments`.

Impressions (within one request, i.e. one ``(system_id, request_id)``):

* the same ``event_id`` twice with the same content is a **duplicate** (at-least-once delivery
  replayed it): one copy is kept, the others are counted and have no effect;
* the same ``event_id`` with different content cannot be a replay: the copy with the smallest content
  (:func:`content_key`) is kept, the others are **rejected** ("event_id repeated with different
  content");
* the same ``item_id`` under different event ids (an item served twice in one ranked list, which
  trec_eval refuses in a run): the impression with the smallest ``(timestamp, position, event_id)`` is
  kept, the others are **rejected** ("item served twice in one request");
* impressions of one request that name different ``query_id`` values: the request cannot be scored
  against one query, so every impression of it is **rejected** ("request names several query ids"),
  never scored against one of them.

The choices depend only on the set of records, never on arrival order, so batch and streaming agree.

Judgments of one ``(query_id, item_id)`` under a policy (:data:`JUDGMENT_POLICIES`):

* identical ``(grade, timestamp)`` repeats are duplicates;
* ``latest`` (the jobs' default): the judgment with the largest ``timestamp`` wins (equal timestamps:
  the larger grade); the others are **superseded** (counted);
* ``max``: the largest grade wins (equal grades: the latest); the others are superseded;
* ``reject``: when the grades differ, every judgment of the pair is **rejected** ("conflicting
  judgments for one (query, item)") and the item counts as unjudged; equal grades at different times
  keep the latest, the others superseded.
"""

from __future__ import annotations

import json

__all__ = [
    "JUDGMENT_POLICIES",
    "check_judgment_policy",
    "REASON_EVENT_CONFLICT",
    "REASON_ITEM_TWICE",
    "REASON_AFTER_CLOSE",
    "request_close",
    "split_after_close",
    "after_close_reason",
    "REASON_JUDGMENT_CONFLICT",
    "REASON_QUERY_CONFLICT",
    "content_key",
    "clean_request",
    "resolve_judgment",
]

JUDGMENT_POLICIES = ("latest", "max", "reject")


def check_judgment_policy(policy, name: str = "judgment conflict policy") -> str:
    """``policy`` when it is one of :data:`JUDGMENT_POLICIES`; else ValueError (one line) naming the
    choices and the closest of them. The one check of the policy for both jobs, both engines and
    the transforms (``name``: the option or parameter as its caller knows it)."""
    if policy in JUDGMENT_POLICIES:
        return policy
    import difflib

    hint = "".join(f" (did you mean {n}?)" for n in difflib.get_close_matches(str(policy), JUDGMENT_POLICIES, n=1))
    raise ValueError(f"{name} must be one of {', '.join(JUDGMENT_POLICIES)}, got {policy!r}{hint}")
REASON_EVENT_CONFLICT = "event_id repeated with different content"
REASON_ITEM_TWICE = "item served twice in one request"
REASON_JUDGMENT_CONFLICT = "conflicting judgments for one (query, item)"
REASON_QUERY_CONFLICT = "request names several query ids"
#: the late-data reason of an impression after its request's window end plus the allowed lateness
REASON_AFTER_CLOSE = "impression after its request's window closed"


def request_close(first_ts: int, window_micros: int, lateness_micros: int = 0) -> int:
    """When (micros) a request whose earliest impression is at ``first_ts`` closes in fixed,
    epoch-aligned windows of ``window_micros``: the end of that impression's window plus the allowed
    lateness. The streaming job finalises the request then; later impressions of it are late data.
    ``first_ts`` may be a numpy int64 array (one close per request)."""
    return (first_ts // int(window_micros) + 1) * int(window_micros) + int(lateness_micros)


def split_after_close(kept: list, close_of) -> tuple[list, list]:
    """The rule for requests spanning windows (batch and stream alike): ``(kept, late)`` where ``late``
    holds ``(record, reason)`` for each impression of ``kept`` (one request's impressions that
    passed the record checks) at or after ``close_of(earliest timestamp)`` (for example
    :func:`request_close`); ``close_of`` None keeps everything (the global window).

    Late data is set aside first, and :func:`clean_request` (replays, conflicts, items served twice,
    query ids) applies to the rest: a stream cannot hold a request's records after it closed, so a
    late impression is late whatever it would have met there (a replayed copy of a late impression
    is late as well, not a duplicate)."""
    if close_of is None or not kept:
        return kept, []
    close = close_of(min(int(r["timestamp"]) for r in kept))
    if all(int(r["timestamp"]) < close for r in kept):
        return kept, []
    late = [(r, after_close_reason(int(r["timestamp"]), close)) for r in kept if int(r["timestamp"]) >= close]
    return [r for r in kept if int(r["timestamp"]) < close], late


def after_close_reason(ts: int, close: int) -> str:
    """The reason of an impression at ``ts`` set aside because its request closed at ``close``."""
    return (f"{REASON_AFTER_CLOSE} (timestamp {ts} is at or after {close}, the end of the window of the "
            "request's first impression plus the allowed lateness)")


def content_key(rec: dict) -> str:
    """A canonical text of a record (sorted keys; numpy scalars as Python values), for comparing
    copies of an event and choosing among them deterministically."""
    return json.dumps(rec, sort_keys=True, default=_plain, separators=(",", ":"))


def _plain(x):
    if hasattr(x, "item"):
        return x.item()
    return str(x)


def clean_request(impressions) -> tuple[list, int, list]:
    """``(kept, n_duplicates, rejected)`` for the impressions of one request.

    ``impressions``: dicts that passed :func:`streameval.io.records.check_impression`, all of one
    ``(system_id, request_id)``. ``kept``: one impression per item, sorted by position;
    ``rejected``: ``(record, reason)`` pairs (reasons :data:`REASON_EVENT_CONFLICT`,
    :data:`REASON_ITEM_TWICE`, with the kept record's position or event id named, and
    :data:`REASON_QUERY_CONFLICT` for every impression of a request naming several query ids).
    ``len(impressions) == len(kept) + n_duplicates + len(rejected)``.
    """
    by_event: dict = {}
    for rec in impressions:
        by_event.setdefault(rec["event_id"], []).append(rec)
    n_dup = 0
    rejected: list = []
    singles = []
    for event_id, copies in by_event.items():
        if len(copies) == 1:
            singles.append(copies[0])
            continue
        keyed = sorted(((content_key(r), r) for r in copies), key=lambda kr: kr[0])
        first_key, first = keyed[0]
        singles.append(first)
        for k, r in keyed[1:]:
            if k == first_key:
                n_dup += 1
            else:
                rejected.append((r, f"{REASON_EVENT_CONFLICT} (event_id {event_id!r})"))
    queries = sorted({rec["query_id"] for rec in singles})
    if len(queries) > 1:
        shown = ", ".join(repr(q) for q in queries[:4]) + (", ..." if len(queries) > 4 else "")
        rejected.extend((r, f"{REASON_QUERY_CONFLICT} ({shown})") for r in singles)
        return [], n_dup, rejected
    by_item: dict = {}
    for rec in singles:
        by_item.setdefault(rec["item_id"], []).append(rec)
    kept = []
    for item, recs in by_item.items():
        if len(recs) > 1:
            recs.sort(key=lambda r: (int(r["timestamp"]), int(r["position"]), r["event_id"]))
            for r in recs[1:]:
                rejected.append((r, f"{REASON_ITEM_TWICE} (item {item!r} kept at position {int(recs[0]['position'])},"
                                    f" event {recs[0]['event_id']!r})"))
        kept.append(recs[0])
    kept.sort(key=lambda r: (int(r["position"]), r["item_id"]))
    return kept, n_dup, rejected


def resolve_judgment(entries: dict, policy: str = "latest"):
    """Resolve the judgments of one ``(query, item)``.

    ``entries``: ``{(timestamp, grade): count}`` (count >= 1: how many records carried it).
    Returns ``(grade or None, n_duplicates, superseded, rejected)`` where ``superseded`` and
    ``rejected`` are lists of ``(timestamp, grade)`` (one per record) and ``grade`` is None when the
    policy rejected the pair. Raises ValueError on an unknown policy.
    """
    check_judgment_policy(policy)
    n_dup = sum(c - 1 for c in entries.values())
    keys = list(entries)
    grades = {g for _, g in keys}
    if policy == "reject" and len(grades) > 1:
        return None, n_dup, [], sorted(keys)
    if policy == "max":
        win = max(keys, key=lambda tg: (tg[1], tg[0]))
    else:
        win = max(keys)
    return win[1], n_dup, sorted(k for k in keys if k != win), []
