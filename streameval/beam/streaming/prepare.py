"""Stage 1, input preparation (stateless): validation of raw events and coarse grouping.

Elements are records (dicts) or lists of records. Each valid record is counted
(``<kind>s_read``, ``<kind>s_valid``), grouped by request id (impressions, clicks) or query id
(judgments) and sent on as *pieces*: ``(tag, request_id, entries)`` with ``tag`` ``"imp"``
(entries: the impression dicts) or ``"click"`` (entries: click entries, below), and
``("judg", query_id, [[item, ts, grade, raw json], ...])``; invalid records become dead letters
(``("side", dead_letter)``; counted ``rejected:<kind>:<reason>``). With a gate (fixed and sliding
windows) every piece goes to the gate shard of its request id (judgments: of their query id), and
each new sub-window with data is announced to every gate shard (``("seen", [sub-windows])``);
without one (sessions) impressions and clicks go to their request's key (its shard, or its id with
``request_shards=0``) as ``(key, [None, pieces])`` and judgments to their query as ``(query_id,
[("judg", entries)])``.

A click entry (:class:`_Click`) travels as the list ``[item, ts (micros), system or None, raw
json, fate, event key]``; its fate is ``_PENDING`` until the requests stage decides it when the
click's window closes: ``_ACCEPTED`` (it matched an impression) or ``_DEAD`` (a dead letter).
"""

from __future__ import annotations

from dataclasses import dataclass

import apache_beam as beam
from apache_beam import pvalue

from ...io import counters as cn
from ...io import records
from .common import _SEP, _SIDE_KEY, _shard, _tally
from ...io.dead_letters import dead_letter

# the fate of a click event (_Click.fate)
_PENDING, _ACCEPTED, _DEAD = 0, 1, 2

GATE_SHARDS = 16  # the gate's keys when the requests stage is keyed by request id (request_shards=0)


@dataclass(slots=True)
class _Click:
    """A valid click event as the stages keep it: the clicked ``item``, its time ``ts`` (micros),
    the ``system`` it names (None: any), its ``raw`` record (JSON text, for dead letters), its
    ``fate`` (``_PENDING``, ``_ACCEPTED``, ``_DEAD``) and its identity ``key``
    (:func:`click_event_key`). In messages and in Beam state it is the list :meth:`to_state`."""

    item: str
    ts: int
    system: str | None
    raw: str
    fate: int
    key: str

    @classmethod
    def from_state(cls, value) -> "_Click":
        return cls(*value)

    def to_state(self) -> list:
        return [self.item, self.ts, self.system, self.raw, self.fate, self.key]


# --------------------------------------------------------------------------------------------
# input preparation (stateless): validation, coarse grouping

def file_records(element, default: str) -> tuple[str, list]:
    """``(source, records)`` of a source's element: a ``(path, [records])`` pair from a file source
    (its dead letters name that file), else a record or a list of records (named ``default``)."""
    if isinstance(element, tuple) and len(element) == 2 and isinstance(element[0], str):
        return element[0], list(element[1])
    if isinstance(element, (list, tuple)):
        return default, element
    return default, [element]


class _PrepareEvents(beam.DoFn):
    """Validates events (a dict or a list of dicts per element) with ``check``, groups them by
    request id and sends the pieces (``(tag, request_id, entries)``) to their request shard: through
    the gate (keyed by the same shard) or, without a gate, straight to the requests stage; invalid ones go on as dead letters. Subclasses set ``kind`` (the
    counters' ``<kind>s_read`` / ``<kind>s_valid`` / ``rejected:<kind>:...``), ``tag``, ``check`` and
    ``entry`` (what the requests stage keeps of a valid record)."""

    kind = tag = ""

    def __init__(self, source, gate, shards: int, run: str = "", gate_shards: int | None = None, time_range=None):
        self.source = source
        self.time_range = time_range  # (lo, hi) inclusive micros, or None (the years 1 to 9999 only)
        self.gate = gate  # the WindowSpec of the gate's sub-windows, or None / False: no gate
        self.shards = shards  # the requests stage's (0: keyed by request id)
        self.gate_shards = gate_shards or shards or GATE_SHARDS
        self.run = run
        self._noticed: set = set()  # sub-windows already announced to every gate shard (by committed bundles)

    def start_bundle(self):
        self._bundle_notices: set = set()

    def finish_bundle(self):
        self._noticed |= self._bundle_notices
        if len(self._noticed) > 100_000:  # a cache only: forgetting re-announces, which changes nothing
            self._noticed = set(self._bundle_notices)

    def check(self, rec):
        raise NotImplementedError

    def entry(self, rec):
        raise NotImplementedError

    def process(self, element):
        by_req: dict = {}
        dead = []
        subs: set = set()
        source, recs = file_records(element, self.source)
        _tally(self.run, cn.read(self.kind), len(recs))
        for rec in recs:
            reason = self.check(rec)
            if reason is not None:
                _tally(self.run, cn.rejected(self.kind, _reason_key(reason)))
                dead.append(dead_letter(source, rec, reason))
                continue
            by_req.setdefault(rec["request_id"], []).append(self.entry(rec))
            if self.gate:
                subs.add(self.gate.sub(int(rec["timestamp"])))
        _tally(self.run, cn.valid(self.kind), len(recs) - len(dead))
        msgs = [(self.tag, rid, entries) for rid, entries in by_req.items()]
        side = [("side", d) for d in dead]
        route = self.gate_shards if self.gate else self.shards
        parts = dict(_by_shard(msgs, route))
        if side:
            parts.setdefault(0 if self.gate else side_key(self.shards), []).extend(side)
        if self.gate:
            # every gate shard learns each sub-window that has data anywhere, so each one knows the
            # windows closed as a single gate would (see .gate); announced once per worker
            new = subs - self._noticed - self._bundle_notices
            if new:
                self._bundle_notices |= new
                notice = ("seen", sorted(new))
                for shard in range(self.gate_shards):
                    parts.setdefault(shard, []).append(notice)
        for shard, ms in parts.items():
            yield (shard, ms) if self.gate else (shard, [None, ms])


class _PrepareImpressions(_PrepareEvents):
    kind, tag = "impression", "imp"

    def check(self, rec):
        return records.check_impression(rec, self.time_range)

    def entry(self, rec):
        return dict(rec)


def _by_shard(msgs, shards):
    """``[(key, messages)]`` of messages ``(tag, id, ...)``: the key is the shard of the id among
    ``shards``, or with ``shards == 0`` the id itself (one key per request)."""
    out: dict = {}
    for m in msgs:
        out.setdefault(m[1] if shards == 0 else _shard(m[1], shards), []).append(m)
    return list(out.items())


def side_key(shards: int):
    """The requests-stage key that carries records set aside: shard 0, or "" when keyed by request
    id (``shards == 0``; request ids are never empty)."""
    return 0 if shards else ""


def _reason_key(reason):
    from ..transforms import reason_key

    return reason_key(reason)


def check_click(rec, time_range=None) -> str | None:
    """Reason why ``rec`` is not a usable click event (``request_id``, ``item_id``, ``timestamp``
    as an impression's (:func:`streameval.io.records.check_timestamp`, ``time_range`` included),
    optional ``system_id`` and ``event_id``), or None."""
    if not isinstance(rec, dict):
        return f"record is not a mapping but {type(rec).__name__}"
    for f in ("request_id", "item_id"):
        v = rec.get(f)
        if not isinstance(v, str) or not v:
            return f"{f} must be a non-empty string"
    ts = rec.get("timestamp")
    if ts is None:
        return "timestamp must be integer microseconds since the epoch"
    reason = records.check_timestamp(ts, time_range)
    if reason is not None:
        return reason
    s = rec.get("system_id")
    if s is not None and not isinstance(s, str):
        return "system_id must be a string or null"
    e = rec.get("event_id")
    if e is not None and (not isinstance(e, str) or not e):
        return "event_id must be a non-empty string or null"
    return None


def click_event_key(rec) -> str:
    """The identity of a click event for de-duplication: its ``event_id``, or without one its
    ``(request_id, item_id, timestamp)``."""
    e = rec.get("event_id")
    if e:
        return "e" + _SEP + e
    return "k" + _SEP + rec["request_id"] + _SEP + rec["item_id"] + _SEP + str(int(rec["timestamp"]))


class _PrepareClicks(_PrepareEvents):
    kind, tag = "click", "click"

    def check(self, rec):
        return check_click(rec, self.time_range)

    def entry(self, rec):
        return _Click(rec["item_id"], int(rec["timestamp"]), rec.get("system_id"), records.to_json_text(rec),
                      _PENDING, click_event_key(rec)).to_state()


class _PrepareJudgments(beam.DoFn):
    """Validates judgments (grades within ``grade_range`` when given) and groups them by query: to
    the gate shard of the query id (which stamps them with the windows it knows closed) or, without
    a gate, straight to their query."""

    def __init__(self, source, gate: bool, run: str = "", grade_range=None, shards: int = 1):
        self.source = source
        self.gate = gate
        self.run = run
        self.shards = shards
        self.grade_range = records.as_grade_range(grade_range)

    def process(self, element):
        by_q: dict = {}
        dead = []
        source, recs = file_records(element, self.source)
        _tally(self.run, cn.JUDGMENTS_READ, len(recs))
        for rec in recs:
            reason = records.check_judgment(rec, self.grade_range)
            if reason is not None:
                _tally(self.run, cn.rejected("judgment", _reason_key(reason)))
                dead.append(dead_letter(source, rec, reason))
                continue
            by_q.setdefault(rec["query_id"], []).append(
                [rec["item_id"], int(rec.get("timestamp") or 0), int(rec["grade"]), records.to_json_text(rec)])
        _tally(self.run, cn.JUDGMENTS_VALID, len(recs) - len(dead))
        if self.gate:  # a query's judgments to the gate shard of the query id
            parts = dict(_by_shard([("judg", q, js) for q, js in by_q.items()], self.shards))
            if dead:
                parts.setdefault(0, []).extend(("side", d) for d in dead)
            for shard, msgs in parts.items():
                yield pvalue.TaggedOutput("gate", (shard, msgs))
            return
        if dead:
            yield (_SIDE_KEY, [("side", d) for d in dead])
        for q, js in by_q.items():
            yield (q, [("judg", js)])
