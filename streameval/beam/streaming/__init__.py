"""Streaming evaluation: event-time windowed ranking and click metrics with early, on-time and late
panes, late judgments, click events joined within an attribution delay, and a late-data output.

``impressions | StreamMetrics(judgments, metrics, window="1h", ...)`` reads unbounded impression
events (and judgment and click events) and emits metric rows (metric_result dicts with ``pane``,
``pane_index`` and ``is_final``) per event-time window, slice, system and metric. The final pane of
every window equals what :class:`~streameval.beam.transforms.ScoreRankings` and
:class:`~streameval.beam.transforms.ClickMetrics` compute for that window in batch, bit for bit.

Design (see docs/metrics.md, "Streaming"):

* Every stage runs in the global window with explicit window keys and keyed state; windows,
  triggers and lateness are implemented here, not by Beam's windowing, because (1) a request belongs
  to the window of its *earliest* impression (as in batch), which no WindowFn can assign before the
  request is complete; (2) late data must be written out, while Beam drops it silently; (3) the
  local streaming runner does not hold the watermark for timer output, so data computed in a timer
  would be late downstream. Hence data flows only through ``process`` (whose pending output holds
  the downstream watermark on every runner) and timers only fire panes, expire state, and track
  which windows closed.
* ``Gate`` (one key): drops nothing; events whose own window already closed go to the late output.
* ``Requests`` (key: a shard of the request id): the request's records, cleaned as in batch
  (:func:`streameval.io.cleaning.clean_request`: replays are duplicates, reused event ids and items
  served twice are rejected, whatever the arrival order), the kept ones' served items (the batch
  job's :class:`RankingStateCombineFn` accumulator), its impressions for CTR, its click events
  (de-duplicated by event id). Each change sends a new *version* of the request downstream; a
  replay changes nothing and sends nothing.
* ``Queries`` (key: query id): the query's judgments under the conflict policy (``latest``, ``max``,
  ``reject``, as in batch) and its open requests; scores a request
  version (all versions of a bundle in one kernel call), and rescores every open request of the
  query when a judgment changes it.
* ``Aggregate`` (key: system): keeps the latest contribution of each request (ranking vector,
  click counts) and exact per-window sums (Shewchuk partials, so subtracting a request's old
  contribution and adding the new one leaves exactly the sums of a fresh pass), fires early panes
  (every N seconds of processing time or every M updates), the on-time pane at the watermark,
  late panes when late data changes the window and the final pane when the allowed lateness has
  passed. Each pane carries the window's whole value (accumulating), so a consumer overwrites by
  window, and an update of a request replaces its old contribution: never a double count.

Windows: fixed (epoch aligned), sliding (pre-aggregated in fixed sub-windows of the period, merged
into each sliding window) and sessions (per user or per request, with a gap).

Record accounting (:mod:`streameval.beam.accounting`): every record is counted where its fate is
final (:meth:`StreamMetrics.counts`, :meth:`StreamMetrics.accounting`).
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
import zlib
from collections import defaultdict
from dataclasses import dataclass

import apache_beam as beam
from apache_beam import pvalue, typehints
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.transforms.window import GlobalWindow, TimestampedValue
from apache_beam.utils.timestamp import MAX_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from ...accumulators.moments import MeanMoments, partials_add
from ...io import cleaning, records
from ...metrics.kernel import compute
from ..combiners import CtrByPositionCombineFn, MeanCombineFn, RankingStateCombineFn
from ..transforms import (
    NAMESPACE,
    ScoreRankings,
    metric_row,
    parse_slices,
    parse_window,
    slice_labels,
)

__all__ = [
    "WindowSpec",
    "StreamMetrics",
    "Replay",
    "replay_clock",
    "parse_duration",
    "check_click",
    "click_event_key",
    "stream_counts",
    "PANES",
    "REASON_CLICK_UNMATCHED",
]

_LOG = logging.getLogger(__name__)

#: pane names of the ``pane`` field
PANES = ("early", "on_time", "late")

_SEP = "\x1f"  # joins system and request id in a request key
_SIDE_KEY = "\x00side"  # the key under which late data and dead letters travel to the output

#: reason category of a click event that matched no impression (a rejection after validation)
REASON_CLICK_UNMATCHED = "click matched no impression within the attribution delay"


# --------------------------------------------------------------------------------------------
# record accounting
#
# Every count of the record accounting (streameval.beam.accounting) is taken where the record's
# fate is final, which for impressions (duplicates, conflicts: clean_request decides on the whole
# request) and clicks (matched or not) is when their request closes, in a timer. Beam's local
# streaming runner reports counters of the first bundle of a step only, and none incremented in
# timers, so each count goes both to a Beam counter (runners that report them) and to this
# process's tally of the transform (exact on runners that run the pipeline in this process, the
# local runners): StreamMetrics.counts().

_TALLY_LOCK = threading.Lock()
_TALLIES: dict = {}  # run id -> {counter name: n}


def _tally(run: str, name: str, n: int = 1) -> None:
    if not n:
        return
    Metrics.counter(NAMESPACE, name).inc(n)
    with _TALLY_LOCK:
        d = _TALLIES.setdefault(run, {})
        d[name] = d.get(name, 0) + n


def stream_counts(run: str) -> dict:
    """The counts a :class:`StreamMetrics` (``cfg.run``) took in this process so far."""
    with _TALLY_LOCK:
        return dict(_TALLIES.get(run, {}))


def _category(reason: str) -> str:
    """Counter category of a cleaning reason: the constant before its parenthesised details."""
    return reason.split(" (", 1)[0]


# --------------------------------------------------------------------------------------------
# durations and window specifications

def parse_duration(value, name="duration", allow_zero=False) -> int:
    """Microseconds from a number of seconds or text such as ``"90s"``, ``"30m"``, ``"1h"``,
    ``"1d"`` (see :func:`~streameval.beam.transforms.parse_window`); ``0``/``"0"`` only when
    ``allow_zero``."""
    if value is None:
        if allow_zero:
            return 0
        raise ValueError(f"{name} is required")
    if allow_zero and (value == 0 or str(value).strip().lower() in ("0", "0s", "none", "")):
        return 0
    size = parse_window(value)
    if size is None:
        raise ValueError(f"{name} must be a positive duration, got {value!r}")
    micros = int(round(size * 1_000_000))
    if micros < 1:
        raise ValueError(f"{name} {value!r} is shorter than a microsecond")
    return micros


@dataclass(frozen=True)
class WindowSpec:
    """An event-time window specification.

    * ``WindowSpec.fixed("1h")``: epoch-aligned windows of one hour (the batch job's windows).
    * ``WindowSpec.sliding("1h", every="10m")``: windows of one hour starting every ten minutes;
      the size must be a multiple of the period. Requests are pre-aggregated in fixed sub-windows
      of the period and merged into each sliding window.
    * ``WindowSpec.sessions("30m", by="user")``: per-key sessions of activity: a request is active
      from its first to its last impression; the requests of one user (or each request alone,
      ``by="request"``) whose activity is separated by less than the gap form a session
      ``[first impression, last impression + gap)``. A request without a user is a session key of
      its own. Rows of a session carry its key in the slice label (``"user=u1"``,
      ``"user=u1,campaign=men"``), so two sessions never share a row.

    ``WindowSpec.parse`` reads ``"1h"``, ``"1h/10m"`` (sliding) and ``"session:30m"`` /
    ``"session:30m/request"``.
    """

    kind: str
    size: int  # micros: the window size (fixed, sliding) or the gap (sessions)
    period: int  # micros: the sub-window (fixed: size; sliding: the period); 0 for sessions
    by: str = "user"

    @classmethod
    def fixed(cls, size) -> "WindowSpec":
        s = parse_duration(size, "window size")
        return cls("fixed", s, s)

    @classmethod
    def sliding(cls, size, every) -> "WindowSpec":
        s, p = parse_duration(size, "window size"), parse_duration(every, "window period")
        if s % p or s < p:
            raise ValueError(f"a sliding window's size ({size}) must be a multiple of its period ({every})")
        return cls("fixed" if s == p else "sliding", s, p)

    @classmethod
    def sessions(cls, gap, by="user") -> "WindowSpec":
        if by not in ("user", "request"):
            raise ValueError(f"sessions are per 'user' or per 'request', got {by!r}")
        return cls("sessions", parse_duration(gap, "session gap"), 0, by)

    @classmethod
    def parse(cls, value) -> "WindowSpec":
        if isinstance(value, WindowSpec):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return cls.fixed(value)
        text = str(value).strip().lower()
        if text.startswith(("session:", "sessions:")):
            rest = text.split(":", 1)[1]
            gap, _, by = rest.partition("/")
            return cls.sessions(gap, by or "user")
        if "/" in text:
            size, every = text.split("/", 1)
            return cls.sliding(size, every)
        return cls.fixed(text)

    # -- fixed / sliding geometry ----------------------------------------------------------
    @property
    def windowed(self) -> bool:
        return self.kind != "sessions"

    @property
    def per_window(self) -> int:
        """Sub-windows per window (1 for fixed windows)."""
        return self.size // self.period if self.windowed else 0

    def sub(self, ts: int) -> int:
        """Index of the sub-window (of ``period``) holding ``ts``."""
        return ts // self.period

    def windows_of(self, k: int) -> range:
        """Indices of the windows containing sub-window ``k`` (window j starts at j * period)."""
        return range(k - self.per_window + 1, k + 1)

    def bounds(self, j: int) -> tuple[int, int]:
        return j * self.period, j * self.period + self.size

    def describe(self) -> str:
        def d(us):
            for unit, n in (("d", 86_400_000_000), ("h", 3_600_000_000), ("m", 60_000_000), ("s", 1_000_000)):
                if us % n == 0:
                    return f"{us // n}{unit}"
            return f"{us}us"

        if self.kind == "fixed":
            return f"fixed {d(self.size)}"
        if self.kind == "sliding":
            return f"sliding {d(self.size)} every {d(self.period)}"
        return f"sessions per {self.by}, gap {d(self.size)}"


# --------------------------------------------------------------------------------------------
# small helpers

_SPLIT = 134217729.0  # Veltkamp's splitter, as MeanMoments uses


def _mm_sub(state: list, values) -> None:
    """Remove one observation per metric from a :class:`MeanMoments` state, exactly: the negated
    value and the negated exact pieces of its square are added to the Shewchuk partials, so the
    partials' exact sums equal those of a state that never saw the observation, and extraction
    (which depends only on the exact sums and the count) gives the same result to the last bit."""
    for m, x in enumerate(values):
        x = float(x)
        if math.isnan(x):
            continue
        state[0][m] -= 1
        if x == 0.0:
            continue
        partials_add(state[1][m], -x)
        c = _SPLIT * x
        hi = c - (c - x)
        lo = x - hi
        partials_add(state[2][m], -(hi * hi))
        partials_add(state[2][m], -(2.0 * hi * lo))
        partials_add(state[2][m], -(lo * lo))


_PRIM = FastPrimitivesCoder()


def _encode(value) -> bytes:
    """One entry of a keyed map kept encoded in state, so that reading the map decodes only the
    entries an element touches (plain primitives, FastPrimitivesCoder: no pickled objects)."""
    return _PRIM.encode(value)


def _decode(blob):
    return _PRIM.decode(blob)


def _micros(ts) -> int:
    return ts.micros if isinstance(ts, Timestamp) else int(round(float(ts) * 1_000_000))


def _when(micros) -> Timestamp:
    return Timestamp(micros=int(micros))


def _shard(request_id: str, shards: int) -> int:
    return zlib.crc32(request_id.encode("utf-8")) % shards


def _late_record(source: str, raw, reason: str) -> dict:
    return {"source": source, "raw": raw if isinstance(raw, str) else records.to_json_text(raw), "reason": reason}


def _fmt_us(us) -> str:
    from datetime import datetime, timezone

    try:
        text = datetime.fromtimestamp(us / 1e6, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return text.replace(".000000Z", "Z")
    except (OverflowError, OSError, ValueError):
        return str(us)


class _Clock:
    """Processing time for early firings: ``time.time`` or a callable (tests, replays)."""

    def __init__(self, fn=None):
        self.fn = fn

    def __call__(self) -> float:
        if self.fn is None:
            import time

            return time.time()
        return float(self.fn())


# The replay's processing time. Replay sets it as it plays each step (the local runner's test
# clock advances by the same amounts), so processing-time timers set from it fire in step with
# the replay. Only meaningful when the replay and the pipeline run in one process (local runner).
_REPLAY_NOW = [0.0]


def replay_clock() -> float:
    """The processing time of the running :class:`Replay` (seconds from the replay's start); pass
    ``clock=replay_clock`` to :class:`StreamMetrics` when replaying on the local runner."""
    return _REPLAY_NOW[0]


# --------------------------------------------------------------------------------------------
# input preparation (stateless): validation, coarse grouping

def _as_list(element):
    if isinstance(element, (list, tuple)):
        return element
    return [element]


class _PrepareEvents(beam.DoFn):
    """Validates events (a dict or a list of dicts per element) with ``check``, groups them by
    request id and sends the pieces (``(tag, request_id, entries)``) to the gate (key 0) or, without a
    gate, to their request shard; invalid ones go on as dead letters. Subclasses set ``kind`` (the
    counters' ``<kind>s_read`` / ``<kind>s_valid`` / ``rejected:<kind>:...``), ``tag``, ``check`` and
    ``entry`` (what the requests stage keeps of a valid record)."""

    kind = tag = ""

    def __init__(self, source, gate: bool, shards: int, run: str = ""):
        self.source = source
        self.gate = gate
        self.shards = shards
        self.run = run

    def check(self, rec):
        raise NotImplementedError

    def entry(self, rec):
        raise NotImplementedError

    def process(self, element):
        by_req: dict = {}
        dead = []
        recs = _as_list(element)
        _tally(self.run, f"{self.kind}s_read", len(recs))
        for rec in recs:
            reason = self.check(rec)
            if reason is not None:
                _tally(self.run, f"rejected:{self.kind}:{_reason_key(reason)}")
                dead.append({"source": self.source, "raw": records.to_json_text(rec), "reason": reason})
                continue
            by_req.setdefault(rec["request_id"], []).append(self.entry(rec))
        _tally(self.run, f"{self.kind}s_valid", len(recs) - len(dead))
        msgs = [(self.tag, rid, entries) for rid, entries in by_req.items()]
        side = [("side", d) for d in dead]
        if self.gate:
            if msgs or side:
                yield (0, msgs + side)
        else:
            parts = dict(_by_shard(msgs, self.shards))
            if side:
                parts.setdefault(0, []).extend(side)
            for shard, ms in parts.items():
                yield shard, [None, ms]


class _PrepareImpressions(_PrepareEvents):
    kind, tag = "impression", "imp"

    def check(self, rec):
        return records.check_impression(rec)

    def entry(self, rec):
        return dict(rec)


def _by_shard(msgs, shards):
    out: dict = {}
    for m in msgs:
        out.setdefault(_shard(m[1], shards), []).append(m)
    return list(out.items())


def _reason_key(reason):
    from ..transforms import reason_key

    return reason_key(reason)


def check_click(rec) -> str | None:
    """Reason why ``rec`` is not a usable click event (``request_id``, ``item_id``, ``timestamp``,
    optional ``system_id`` and ``event_id``), or None."""
    if not isinstance(rec, dict):
        return f"record is not a mapping but {type(rec).__name__}"
    for f in ("request_id", "item_id"):
        v = rec.get(f)
        if not isinstance(v, str) or not v:
            return f"{f} must be a non-empty string"
    ts = rec.get("timestamp")
    if not isinstance(ts, int) or isinstance(ts, bool):
        return "timestamp must be integer microseconds since the epoch"
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
        return check_click(rec)

    def entry(self, rec):
        # a click: [item, ts, system or None, raw json, fate, event key]
        return [rec["item_id"], int(rec["timestamp"]), rec.get("system_id"), records.to_json_text(rec), _PENDING,
                click_event_key(rec)]


class _PrepareJudgments(beam.DoFn):
    """Validates judgments (grades within ``grade_range`` when given) and groups them by query: to
    the gate (which stamps them with the windows closed so far) or, without a gate, straight to
    their query."""

    def __init__(self, source, gate: bool, run: str = "", grade_range=None):
        self.source = source
        self.gate = gate
        self.run = run
        self.grade_range = None if grade_range is None else (int(grade_range[0]), int(grade_range[1]))

    def process(self, element):
        by_q: dict = {}
        dead = []
        recs = _as_list(element)
        _tally(self.run, "judgments_read", len(recs))
        for rec in recs:
            reason = records.check_judgment(rec, self.grade_range)
            if reason is not None:
                _tally(self.run, f"rejected:judgment:{_reason_key(reason)}")
                dead.append({"source": self.source, "raw": records.to_json_text(rec), "reason": reason})
                continue
            by_q.setdefault(rec["query_id"], []).append(
                [rec["item_id"], int(rec.get("timestamp") or 0), int(rec["grade"]), records.to_json_text(rec)])
        _tally(self.run, "judgments_valid", len(recs) - len(dead))
        if self.gate:
            msgs = [("judg", q, js) for q, js in by_q.items()] + [("side", d) for d in dead]
            if msgs:
                yield pvalue.TaggedOutput("gate", (0, msgs))
            return
        if dead:
            yield (_SIDE_KEY, [("side", d) for d in dead])
        for q, js in by_q.items():
            yield (q, [("judg", js)])


def _tally_late(run, late_records):
    """Counts late records by kind (``late:impression``, ``late:click``)."""
    by: dict = {}
    for r in late_records:
        by[r["source"]] = by.get(r["source"], 0) + 1
    for source, n in by.items():
        _tally(run, source, n)


# --------------------------------------------------------------------------------------------
# the gate: lateness of raw events against the windows that already closed

class _GateFn(beam.DoFn):
    """One key. Remembers the sub-windows it has seen data for and sets an event-time timer at
    each one's expiry (end + allowed lateness), in order; when the timer fires the watermark has
    passed that expiry, so every sub-window up to it is closed. An impression or click whose own
    sub-window is closed is late data: counted and sent to the late output. (A sub-window in which
    no event was ever seen and which closed before its first event arrives cannot be told apart
    from an open one: its data is accepted and reported in an immediately final pane.)"""

    STATE = ReadModifyWriteStateSpec("gate", FastPrimitivesCoder())  # [fired sub or None, pending subs]
    TICK = TimerSpec("tick", TimeDomain.WATERMARK)

    def __init__(self, spec: WindowSpec, lateness: int, shards: int, run: str = ""):
        self.spec = spec
        self.lateness = lateness
        self.shards = shards
        self.run = run

    def _expiry(self, k):
        return (k + 1) * self.spec.period + self.lateness

    def process(self, kv, state=beam.DoFn.StateParam(STATE), tick=beam.DoFn.TimerParam(TICK)):
        _, msgs = kv
        st = state.read() or [None, []]
        fired, pending = st
        pending_set = set(pending)
        before = pending[0] if pending else None
        keep_msgs = []
        late = []
        side = []
        judgments = []
        for m in msgs:
            if m[0] == "side":
                side.append(m)
                continue
            if m[0] == "judg":
                judgments.append(m)
                continue
            kind, rid, items = m
            keep = []
            for it in items:
                ts = it["timestamp"] if kind == "imp" else it[1]
                k = self.spec.sub(ts)
                if fired is not None and k <= fired:
                    late.append(_late_record(
                        f"late:{'impression' if kind == 'imp' else 'click'}",
                        it if kind == "imp" else it[3],
                        f"event time {_fmt_us(ts)} is in a window that closed at {_fmt_us(self._expiry(k))} "
                        f"(window end + allowed lateness)"))
                    continue
                keep.append(it)
                pending_set.add(k)
            if keep:
                keep_msgs.append((kind, rid, keep))
        if late:
            _tally_late(self.run, late)
            side.extend(("side", r) for r in late)
        pending = sorted(pending_set)
        if pending and pending[0] != before:
            tick.set(_when(self._expiry(pending[0])))
        state.write([fired, pending])
        closed_upto = None if fired is None else self._expiry(fired)
        for _, query, js in judgments:
            yield pvalue.TaggedOutput("queries", (query, [("upto", closed_upto), ("judg", js)]))
        parts = dict(_by_shard(keep_msgs, self.shards))
        if side:
            parts.setdefault(0, []).extend(side)
        for shard, ms in parts.items():
            yield shard, [closed_upto, ms]

    @on_timer(TICK)
    def on_tick(self, state=beam.DoFn.StateParam(STATE), tick=beam.DoFn.TimerParam(TICK),
                ts=beam.DoFn.TimestampParam):
        fired, pending = state.read() or [None, []]
        now = _micros(ts)
        while pending and self._expiry(pending[0]) <= now:
            fired = pending.pop(0) if fired is None else max(fired, pending.pop(0))
        if pending:
            tick.set(_when(self._expiry(pending[0])))
        state.write([fired, pending])


# --------------------------------------------------------------------------------------------
# requests

# per request id: [systems {system: SysEntry}, click events, tombstone [closed_at, forget_at] or None]
_SYS, _CLICKS, _TOMB = 0, 1, 2
# per (request, system): [acc, imps, version, emitted query, ctr emitted, rank_close, last impression ts,
#  records {event_id: [[content key or None, record, copies], ...]}, kept [[event_id, variant], ...]]
_ACC, _IMPS, _VER, _EQ, _CV, _RCLOSE, _TLAST, _RECS, _KEPT = range(9)
# an impression kept for CTR: [ts, position, clicked, item, labels]
# a click event: [item, ts, system or None, raw json, fate, event key]; its fate is decided when its
# window closes: accepted (it matched an impression) or dead (a dead letter)
_PENDING, _ACCEPTED, _DEAD = 0, 1, 2


class _Requests:
    """Key: a shard of request ids. Each request's records (per system), cleaned as the batch job
    cleans them (:func:`streameval.io.cleaning.clean_request`: replays are duplicates, conflicting
    event ids and items served twice rejected; decided on all the records seen, so the order of
    arrival does not matter), the kept impressions' served items (RankingStateCombineFn
    accumulator), its impressions for CTR and its click events; every change of the kept records
    or of the clicks sends a new version of the request to its query (ranking) and to its system
    (clicks). A replay changes nothing and sends nothing. The fates of the request's records
    (accepted, duplicate, rejected) are final, and counted, when the request closes."""

    STATE = ReadModifyWriteStateSpec("requests", FastPrimitivesCoder())
    META = ReadModifyWriteStateSpec("meta", FastPrimitivesCoder())  # [armed, closed_upto]
    DUE = TimerSpec("due", TimeDomain.WATERMARK)

    def __init__(self, cfg: "_Config"):
        self.cfg = cfg
        self.combine = RankingStateCombineFn(cfg.ops, cfg.attr_keys)

    # -- windows and deadlines ---------------------------------------------------------------
    def _rank_place(self, rid, ent):
        cfg = self.cfg
        t0 = ent[_ACC][0][3]
        if cfg.spec.windowed:
            return cfg.spec.sub(t0)
        return [self._session_key(rid, ent), t0, ent[_TLAST]]

    def _session_key(self, rid, ent):
        if self.cfg.spec.by == "user":
            user = ent[_ACC][2].get("\x00user")
            if user is not None:
                return f"user={user}"
        return f"request={rid}"

    def _closes(self, ent):
        """(rank_close, last deadline) of a system entry."""
        cfg = self.cfg
        if cfg.spec.windowed:
            rc = cfg.expiry(cfg.spec.sub(ent[_ACC][0][3]))
            return rc, max(rc, cfg.expiry(cfg.spec.sub(ent[_TLAST])))
        rc = ent[_TLAST] + cfg.spec.size + cfg.lateness
        return rc, rc

    def _click_deadline(self, c):
        cfg = self.cfg
        if cfg.spec.windowed:
            return cfg.expiry(cfg.spec.sub(c[1]))
        return c[1] + cfg.spec.size + cfg.lateness

    # -- element processing ------------------------------------------------------------------
    def process(self, kv, state, meta,
                due):
        _, (gate_closed, msgs) = kv
        reqs = state.read() or {}
        armed, closed_upto = meta.read() or [None, None]
        if gate_closed is not None and (closed_upto is None or gate_closed > closed_upto):
            closed_upto = gate_closed
        closed = (lambda t: closed_upto is not None and t <= closed_upto)
        self._closed_upto = closed_upto
        nxt = armed
        out_q: dict = defaultdict(list)
        out_s: dict = defaultdict(list)
        late = []
        touched: dict = {}
        side = []
        for m in msgs:
            if m[0] == "side":
                side.append(m)
                continue
            kind, rid, items = m
            entry = touched.get(rid)
            if entry is None:
                cell = reqs.get(rid)
                entry = touched[rid] = [{}, [], None] if cell is None else _decode(cell[1])
            if entry[_TOMB] is not None:
                for it in items:
                    late.append(_late_record(
                        f"late:{'impression' if kind == 'imp' else 'click'}", it if kind == "imp" else it[3],
                        f"request {rid} is final: its windows closed at {_fmt_us(entry[_TOMB][0])}"))
                continue
            changed = set()
            if kind == "imp":
                self._add_impressions(rid, entry, items, changed, late, closed)
            else:
                self._add_clicks(rid, entry, items, changed, late, closed)
            for system in sorted(changed):
                self._emit(rid, system, entry[_SYS][system], out_q, out_s)
        for rid, entry in touched.items():
            d = self._next_deadline(entry, closed_upto)
            reqs[rid] = [d, _encode(entry)]
            if d is not None and (nxt is None or d < nxt):
                nxt = d
        if late:
            _tally_late(self.cfg.run, late)
            side.extend(("side", r) for r in late)
        if side:
            yield _SIDE_KEY, side
        if nxt is not None and nxt != armed:
            due.set(_when(nxt))
        meta.write([nxt, closed_upto])
        state.write(reqs)
        for q, ms in out_q.items():
            yield pvalue.TaggedOutput("queries", (q, ms))
        yield from out_s.items()

    def _add_impressions(self, rid, entry, recs, changed, late, closed):
        touched = set()
        for rec in recs:
            system = rec["system_id"]
            ent = entry[_SYS].get(system)
            if ent is not None and ent[_RCLOSE] is not None and closed(ent[_RCLOSE]):
                late.append(_late_record("late:impression", rec,
                                         f"request {rid} of {system} is final: its window closed at "
                                         f"{_fmt_us(ent[_RCLOSE])}"))
                continue
            if ent is None:
                ent = entry[_SYS][system] = [self.combine.create_accumulator(), [], 0, None, False, None, None, {},
                                             None]
            variants = ent[_RECS].setdefault(rec["event_id"], [])
            if not variants:
                variants.append([None, rec, 1])
                touched.add(system)
                continue
            key = cleaning.content_key(rec)
            for v in variants:
                if v[0] is None:
                    v[0] = cleaning.content_key(v[1])
            for v in variants:
                if v[0] == key:
                    v[2] += 1  # a replay: the request's records are unchanged
                    break
            else:
                variants.append([key, rec, 1])
                touched.add(system)
        for system in touched:
            if self._rebuild(entry, system):
                changed.add(system)

    @staticmethod
    def _clean(ent):
        """``clean_request`` over the records of a system entry: (kept, duplicates, rejected,
        {id(record): [event_id, variant]})."""
        flat, where = [], {}
        for eid, variants in ent[_RECS].items():
            for i, v in enumerate(variants):
                where[id(v[1])] = [eid, i]
                flat.extend([v[1]] * v[2])
        kept, n_dup, rejected = cleaning.clean_request(flat)
        return kept, n_dup, rejected, where

    def _rebuild(self, entry, system) -> bool:
        """Recompute the request's kept impressions (and from them its ranking state, CTR
        impressions and last impression time); False when the kept set did not change."""
        cfg = self.cfg
        ent = entry[_SYS][system]
        kept, _, _, where = self._clean(ent)
        sig = [where[id(r)] for r in kept]
        if sig == ent[_KEPT]:
            return False
        ent[_KEPT] = sig
        acc = self.combine.create_accumulator()
        imps = []
        tlast = None
        for rec in kept:
            ts = int(rec["timestamp"])
            if cfg.ranking:
                self.combine.add_input(acc, rec)
            else:  # click metrics only: the request's time, query and attributes, not its items
                if acc[0][3] is None or ts < acc[0][3]:
                    acc[0][3] = ts
                q = rec.get("query_id")
                if q is not None and (acc[1] is None or q < acc[1]):
                    acc[1] = q
            user = rec.get("user_id")
            if user is not None and ("\x00user" not in acc[2] or user < acc[2]["\x00user"]):
                acc[2]["\x00user"] = user
            tlast = ts if tlast is None else max(tlast, ts)
            if cfg.ctr:
                clicked = rec.get("clicked")
                imp = [ts, int(rec["position"]), None if clicked is None else bool(clicked), rec["item_id"],
                       slice_labels(rec.get("attributes"), cfg.slice_specs)]
                for c in entry[_CLICKS]:
                    if c[4] != _DEAD and (c[2] is None or c[2] == system) and c[0] == imp[3] and \
                            ts <= c[1] <= ts + cfg.delay:
                        imp[2] = True
                imps.append(imp)
        ent[_ACC], ent[_IMPS], ent[_TLAST] = acc, imps, tlast
        ent[_RCLOSE] = self._closes(ent)[0]
        return True

    def _add_clicks(self, rid, entry, clicks, changed, late, closed):
        cfg = self.cfg
        seen = {c[5] for c in entry[_CLICKS]}
        dup = 0
        for c in clicks:
            item, cts, csys, raw = c[:4]
            if c[5] in seen:  # a replayed click event: no effect
                dup += 1
                continue
            matched = False
            too_late = False
            for system, ent in entry[_SYS].items():
                if csys is not None and csys != system:
                    continue
                for imp in ent[_IMPS]:
                    if imp[3] == item and imp[0] <= cts <= imp[0] + cfg.delay:
                        if closed(cfg.expiry(cfg.spec.sub(imp[0])) if cfg.spec.windowed else ent[_RCLOSE]):
                            too_late = True
                            continue
                        matched = True
                        if imp[2] is not True:
                            imp[2] = True
                            changed.add(system)
            if too_late and not matched:
                late.append(_late_record("late:click", raw,
                                         f"the clicked impression's window (request {rid}) already closed"))
                continue
            seen.add(c[5])
            entry[_CLICKS].append(list(c))
        _tally(cfg.run, "duplicate:click", dup)

    def _emit(self, rid, system, ent, out_q, out_s):
        cfg = self.cfg
        ent[_VER] += 1
        rkey = system + _SEP + rid
        acc = ent[_ACC]
        place = self._rank_place(rid, ent)
        ctr_msg = None
        if cfg.ctr:
            counts: dict = {}
            for ts, pos, clicked, _item, labels in ent[_IMPS]:
                if clicked is None:
                    continue
                if cfg.spec.windowed:
                    by_label = counts.setdefault(cfg.spec.sub(ts), {})
                else:
                    by_label = counts
                for label in labels:
                    c = by_label.setdefault(label, {}).setdefault(pos, [0, 0])
                    c[0] += 1
                    c[1] += clicked
            if counts or ent[_CV]:
                ctr_msg = ("ctr", rkey, ent[_VER], None if cfg.spec.windowed else place, counts)
                ent[_CV] = bool(counts)
        if cfg.ranking:
            # the click counts of this version travel with its ranking state, so that both reach
            # the aggregate in one element and are accepted (or found late) together
            qid = acc[1]
            attrs = {k: v for k, v in acc[2].items() if k != "\x00user"}
            labels = slice_labels(attrs, cfg.slice_specs)
            out_q[qid].append(("req", rkey, system, ent[_VER], place, labels, acc[0], ent[_RCLOSE],
                               self._closed_upto, ctr_msg, len(ent[_KEPT])))
            if ent[_EQ] is not None and ent[_EQ] != qid:
                out_q[ent[_EQ]].append(("drop", rkey, system, ent[_VER]))
            ent[_EQ] = qid
        elif ctr_msg is not None:
            out_s[system].append(ctr_msg)

    def _arm(self, reqs, meta, due, closed_upto):
        nxt = None
        for d, _ in reqs.values():
            if d is not None and (nxt is None or d < nxt):
                nxt = d
        if nxt is not None:
            due.set(_when(nxt))
        meta.write([nxt, closed_upto])

    def _next_deadline(self, entry, closed_upto):
        """When the entry needs attention: its tombstone expires, all its windows closed (it becomes
        a tombstone), or a pending click's window closed; rounded up to the cleanup step, so one
        timer firing per shard serves many windows (which windows closed is known from the gate)."""
        if entry[_TOMB] is not None:
            return self.cfg.round_up(entry[_TOMB][1])
        last = max((self._closes(ent)[1] for ent in entry[_SYS].values()), default=None)
        ds = [self._click_deadline(c) for c in entry[_CLICKS] if c[4] == _PENDING]
        if last is not None and (not ds or closed_upto is None or last > closed_upto):
            ds.append(last)  # (with clicks pending, a closed request waits for them, not for itself)
        return self.cfg.round_up(min(ds)) if ds else None

    def _click_matches(self, entry, c) -> bool:
        for system, ent in entry[_SYS].items():
            if c[2] is not None and c[2] != system:
                continue
            for imp in ent[_IMPS]:
                if imp[3] == c[0] and imp[0] <= c[1] <= imp[0] + self.cfg.delay:
                    return True
        return False

    def _final_fates(self, rid, entry) -> list:
        """Counts the fates of a closing request's impressions (accepted, duplicates, rejected by
        reason; for CTR counted or clicks not logged); the dead letters of the rejected ones."""
        cfg = self.cfg
        run = cfg.run
        dead = []
        for system in sorted(entry[_SYS]):
            ent = entry[_SYS][system]
            kept, n_dup, rejected, _ = self._clean(ent)
            _tally(run, "impressions_accepted", len(kept))
            _tally(run, "duplicate:impression", n_dup)
            for rec, reason in rejected:
                _tally(run, f"rejected:impression:{_category(reason)}")
                dead.append({"source": cfg.source, "raw": records.to_json_text(rec), "reason": reason})
            if cfg.ctr:
                not_logged = sum(imp[2] is None for imp in ent[_IMPS])
                _tally(run, "click_impressions", len(ent[_IMPS]) - not_logged)
                _tally(run, "click_impressions_not_logged", not_logged)
        return dead

    def on_due(self, state, meta,
               due, ts):
        cfg = self.cfg
        now = _micros(ts)
        reqs = state.read() or {}
        armed, closed_upto = meta.read() or [None, None]
        closed_upto = now if closed_upto is None else max(closed_upto, now)
        self._closed_upto = closed_upto
        side = []
        for rid in list(reqs):
            d, blob = reqs[rid]
            if d is None or d > now:
                continue
            entry = _decode(blob)
            if entry[_TOMB] is not None:
                if entry[_TOMB][1] <= now:
                    del reqs[rid]
                continue
            pending = False
            for c in entry[_CLICKS]:
                if c[4] != _PENDING:
                    continue
                if self._click_deadline(c) > now:
                    pending = True
                elif self._click_matches(entry, c):
                    c[4] = _ACCEPTED
                    _tally(cfg.run, "clicks_accepted")
                else:
                    c[4] = _DEAD
                    _tally(cfg.run, f"rejected:click:{REASON_CLICK_UNMATCHED}")
                    side.append(_late_record(
                        "unmatched:click", c[3],
                        f"{REASON_CLICK_UNMATCHED} (no impression of item {c[0]!r} in request {rid!r} served at "
                        f"most {cfg.delay / 1e6:g} s before the click)"))
            last = max((self._closes(ent)[1] for ent in entry[_SYS].values()), default=None)
            if (last is None or last <= now) and not pending:
                side.extend(self._final_fates(rid, entry))
                if last is None:
                    del reqs[rid]
                    continue
                entry = [{}, [], [last, last + cfg.retention]]
            reqs[rid] = [self._next_deadline(entry, closed_upto), _encode(entry)]
        if side:
            yield _SIDE_KEY, [("side", r) for r in side]
        self._arm(reqs, meta, due, closed_upto)
        state.write(reqs)


class _RequestsFn(beam.DoFn):
    """Keyed state of request shards (logic in :class:`_Requests`; a DoFn with few methods keeps
    the runner's per-bundle introspection cheap)."""

    STATE, META, DUE = _Requests.STATE, _Requests.META, _Requests.DUE

    def __init__(self, cfg):
        self.logic = _Requests(cfg)

    def process(self, kv, state=beam.DoFn.StateParam(STATE), meta=beam.DoFn.StateParam(META),
                due=beam.DoFn.TimerParam(DUE)):
        return self.logic.process(kv, state, meta, due)

    @on_timer(DUE)
    def on_due(self, state=beam.DoFn.StateParam(STATE), meta=beam.DoFn.StateParam(META),
               due=beam.DoFn.TimerParam(DUE), ts=beam.DoFn.TimestampParam):
        return self.logic.on_due(state, meta, due, ts)


# --------------------------------------------------------------------------------------------
# queries: judgments and scoring

# a request in a query's log: [rkey, system, version, place, labels, served state, close, dropped,
#  impressions, fate ("ranked", "unjudged", "unrankable"), fate generation]
_LK, _LSYS, _LVER, _LPLACE, _LLAB, _LSERVED, _LCLOSE, _LDROP, _LN, _LFATE, _LFGEN = range(11)


class _Queries:
    """Key: query id. The query's judgments under the conflict policy (``latest``, ``max`` or
    ``reject``, :func:`streameval.io.cleaning.resolve_judgment`, as the batch job) and a log of its
    open requests' latest versions. Scores each request version against the table (all the
    bundle's versions in one kernel call, in finish_bundle), and rescores every open request of the
    query when a judgment changes the table. Judgments that arrive after some of the query's
    requests became final are applied to the open and later windows and written to the late
    output as a notice (the closed windows keep their final value). The fate of each request
    (ranked, unjudged, unrankable) is counted when it closes."""

    JUDGED = ReadModifyWriteStateSpec("judged", FastPrimitivesCoder())
    PAIRS = ReadModifyWriteStateSpec("pairs", FastPrimitivesCoder())
    LOG = BagStateSpec("log", FastPrimitivesCoder())
    META = ReadModifyWriteStateSpec("meta", FastPrimitivesCoder())  # [jgen, armed, closed, last closed]
    EXPIRE = TimerSpec("expire", TimeDomain.WATERMARK)

    def __init__(self, cfg: "_Config"):
        self.cfg = cfg

    def start_bundle(self):
        self._jobs = []  # (ts, query, rkey, system, version, jgen, place, labels, served, judged)

    def _fate(self, judged, served) -> str:
        if not judged:
            return "unjudged"
        return "unrankable" if self.cfg.ops.unrankable(served) else "ranked"

    def _judge(self, query, judged, pairs, js, dead) -> list:
        """Applies judgments ``[item, ts, grade, raw]`` under the conflict policy; counts their
        fates (as the difference of the pair's resolution before and after, so that the counts
        always describe the judgments seen so far) and returns the raw records of those that
        changed the table."""
        cfg, run = self.cfg, self.cfg.run
        policy = cfg.policy
        changed = []
        for item, jts, grade, raw in js:
            entries = pairs.setdefault(item, [])
            before = _resolve(entries, policy)
            for e in entries:
                if e[0] == jts and e[1] == grade:
                    e[2] += 1
                    break
            else:
                entries.append([jts, grade, 1, raw if policy == "reject" else None])
            after = _resolve(entries, policy)
            _tally(run, "judgments_accepted", (after[0] is not None) - (before[0] is not None))
            _tally(run, "duplicate:judgment", after[1] - before[1])
            _tally(run, "superseded:judgment", len(after[2]) - len(before[2]))
            new_rejected = set(after[3]) - set(before[3])
            if new_rejected:
                grades = sorted({e[1] for e in entries})
                by_key = {(e[0], e[1]): e for e in entries}
                for key in sorted(new_rejected):
                    _tally(run, f"rejected:judgment:{cleaning.REASON_JUDGMENT_CONFLICT}")
                    dead.append({"source": cfg.source, "raw": by_key[key][3] or raw,
                                 "reason": f"{cleaning.REASON_JUDGMENT_CONFLICT} (query {query!r}, item {item!r}: "
                                           f"grades {grades}; policy reject)"})
            old = judged.get(item)
            if after[0] is None:
                judged.pop(item, None)
            else:
                win = after[4]
                judged[item] = [win[0], float(win[1])]
            if judged.get(item) != old:
                changed.append(raw)
        return changed

    def process(self, kv, judged_state, pairs_state, log,
                meta, expire,
                ts):
        query, msgs = kv
        if query == _SIDE_KEY:  # records for the side output, passing through
            yield kv
            return
        cfg = self.cfg
        judged = judged_state.read() or {}
        jgen, armed, n_closed, last_closed, known = meta.read() or [0, None, 0, None, None]
        changed_judgments = []
        new_entries = []
        retract = []
        ctr_msgs = []
        dead = []
        pairs = None
        for m in msgs:
            if m[0] == "upto":
                if m[1] is not None and (known is None or m[1] > known):
                    known = m[1]
            elif m[0] == "judg":
                if pairs is None:
                    pairs = pairs_state.read() or {}
                changed_judgments.extend(self._judge(query, judged, pairs, m[1], dead))
            elif m[0] == "req":
                _, rkey, system, version, place, labels, served, close, upto, ctr_msg, n_imps = m
                if upto is not None and (known is None or upto > known):
                    known = upto
                new_entries.append([rkey, system, version, place, labels, served, close, False, n_imps,
                                    self._fate(judged, served), jgen])
                if ctr_msg is not None:
                    ctr_msgs.append((system, ctr_msg))
            else:  # drop: the request's query changed; retract what it contributed from here
                _, rkey, system, version = m
                new_entries.append([rkey, system, version, None, None, None, None, True, 0, None, jgen])
                retract.append((rkey, system, version))
        if pairs is not None:
            pairs_state.write(pairs)
        if dead:
            yield _SIDE_KEY, [("side", d) for d in dead]
        if changed_judgments:
            # (requests of this bundle were given their fate before the judgments: refresh it)
            for e in new_entries:
                if not e[_LDROP]:
                    e[_LFATE] = self._fate(judged, e[_LSERVED])
        for e in new_entries:
            log.add(e)
        jobs = {}
        if changed_judgments:
            jgen += 1
            judged_state.write(judged)
            latest = _latest(log.read())
            for e in latest.values():  # final already (their windows closed), not yet expired here
                if not e[_LDROP] and known is not None and e[_LCLOSE] <= known:
                    n_closed += 1
                    last_closed = e[_LCLOSE] if last_closed is None else max(last_closed, e[_LCLOSE])
                    e[_LDROP] = True
                    log.add(e)
            if n_closed:
                _tally(cfg.run, "judgment_late_notices", len(changed_judgments))
                yield _SIDE_KEY, [("side", _late_record(
                    "late:judgment", raw,
                    f"{n_closed} request(s) of query {query!r} were already final (latest window closed at "
                    f"{_fmt_us(last_closed)}); their windows keep their final values, open and later "
                    "windows use this judgment")) for raw in changed_judgments]
            for e in latest.values():
                if not e[_LDROP]:
                    fate = self._fate(judged, e[_LSERVED])
                    if fate != e[_LFATE]:
                        e[_LFATE], e[_LFGEN] = fate, jgen
                        log.add(e)
                    jobs[e[_LK]] = e
        else:
            for e in new_entries:
                if not e[_LDROP]:
                    jobs[e[_LK]] = e if e[_LK] not in jobs or jobs[e[_LK]][_LVER] < e[_LVER] else jobs[e[_LK]]
        grades = {item: g for item, (_, g) in judged.items()}
        fresh = {(e[_LK], e[_LVER]) for e in new_entries}
        for e in jobs.values():
            self._jobs.append((ts, query, e[_LK], e[_LSYS], e[_LVER], jgen, e[_LPLACE], e[_LLAB], e[_LSERVED],
                               grades, "new" if (e[_LK], e[_LVER]) in fresh else None))
        for rkey, system, version in retract:
            self._jobs.append((ts, query, rkey, system, version, jgen, None, None, None, None, "drop"))
        for system, cm in ctr_msgs:
            self._jobs.append((ts, query, cm[1], system, cm[2], jgen, None, None, cm, None, "ctr"))
        closes = [cfg.round_up(e[_LCLOSE]) for e in new_entries if e[_LCLOSE] is not None]
        if closes and (armed is None or min(closes) < armed):
            armed = min(closes)
            expire.set(_when(armed))
        meta.write([jgen, armed, n_closed, last_closed, known])

    def finish_bundle(self):
        cfg = self.cfg
        jobs, self._jobs = self._jobs, []
        if not jobs:
            return
        out: dict = defaultdict(list)
        stamps: dict = {}
        to_score, where = [], []
        for i, (ts, query, rkey, system, version, jgen, place, labels, served, grades, how) in enumerate(jobs):
            if how == "drop":
                out[system].append(("rank", rkey, query, [version, jgen], None, None, None))
            elif how == "ctr":
                out[system].append(served)  # the version's click counts, passed on
            elif not grades:
                if how is None:  # rescored after the table lost its last judgment (policy reject)
                    out[system].append(("rank", rkey, query, [version, jgen], place, labels, None))
                # (a new version of an unjudged query: it never contributed from here)
            elif cfg.ops.unrankable(served):  # a dead letter when the request closes
                out[system].append(("rank", rkey, query, [version, jgen], place, labels, None))
            else:
                to_score.append([served[0], grades, served[2], served[3]])
                where.append(i)
            s = jobs[i][3]
            stamps[s] = ts if s not in stamps else min(stamps[s], ts)
        if to_score:
            values = compute(cfg.ops.to_lists(to_score), cfg.specs, cfg.options)
            for col, i in zip(values.T.tolist(), where):
                ts, query, rkey, system, version, jgen, place, labels, *_ = jobs[i]
                out[system].append(("rank", rkey, query, [version, jgen], place, labels, col))
        for system, msgs in out.items():
            yield WindowedValue((system, msgs), stamps[system], [GlobalWindow()])

    def on_expire(self, log, meta,
                  judged_state, expire,
                  ts, query=None):
        cfg = self.cfg
        now = _micros(ts)
        jgen, armed, n_closed, last_closed, known = meta.read() or [0, None, 0, None, None]
        known = now if known is None else max(known, now)
        latest = _latest(log.read())
        keep = []
        nxt = None
        dead = []
        for e in latest.values():
            if e[_LCLOSE] is None:  # a drop
                continue
            if e[_LCLOSE] <= now:
                if not e[_LDROP]:
                    n_closed += 1
                    last_closed = e[_LCLOSE] if last_closed is None else max(last_closed, e[_LCLOSE])
                fate = e[_LFATE]
                _tally(cfg.run, "requests_scored" if fate == "ranked" else f"requests_{fate}")
                _tally(cfg.run, f"impressions_{fate}", e[_LN])
                if fate == "unrankable":
                    served = e[_LSERVED]
                    missing = cfg.ops.unrankable(served)
                    _tally(cfg.run, "impressions_unscorable", missing)
                    dead.append({"source": "StreamMetrics", "reason":
                                 f"{missing} of the request's {len(served[0])} impressions have no score: "
                                 "order='score' needs a finite score to rank them (use order='position')",
                                 "raw": records.to_json_text({"query_id": query, "system_id": e[_LSYS],
                                                              "request_id": e[_LK].split(_SEP, 1)[1],
                                                              "impressions": e[_LN], "without_score": missing})})
            else:
                keep.append(e)
                d = cfg.round_up(e[_LCLOSE])
                nxt = d if nxt is None else min(nxt, d)
        log.clear()
        for e in keep:
            log.add(e)
        if nxt is not None:
            expire.set(_when(nxt))
        meta.write([jgen, nxt, n_closed, last_closed, known])
        if dead:
            yield _SIDE_KEY, [("side", d) for d in dead]


def _resolve(entries, policy):
    """:func:`cleaning.resolve_judgment` of a pair's ``[[ts, grade, count, raw], ...]``, plus
    the winning ``(ts, grade)``."""
    if not entries:
        return None, 0, [], [], None
    counts = {(e[0], e[1]): e[2] for e in entries}
    grade, n_dup, superseded, rejected = cleaning.resolve_judgment(counts, policy)
    win = None
    if grade is not None:
        sup = set(superseded)
        win = next(k for k in counts if k not in sup)
    return grade, n_dup, superseded, rejected, win


class _QueriesFn(beam.DoFn):
    """Keyed state of queries (logic in :class:`_Queries`)."""

    JUDGED, PAIRS, LOG, META, EXPIRE = _Queries.JUDGED, _Queries.PAIRS, _Queries.LOG, _Queries.META, _Queries.EXPIRE

    def __init__(self, cfg):
        self.logic = _Queries(cfg)

    def start_bundle(self):
        self.logic.start_bundle()

    def process(self, kv, judged_state=beam.DoFn.StateParam(JUDGED), pairs_state=beam.DoFn.StateParam(PAIRS),
                log=beam.DoFn.StateParam(LOG), meta=beam.DoFn.StateParam(META), expire=beam.DoFn.TimerParam(EXPIRE),
                ts=beam.DoFn.TimestampParam):
        return self.logic.process(kv, judged_state, pairs_state, log, meta, expire, ts)

    def finish_bundle(self):
        return self.logic.finish_bundle()

    @on_timer(EXPIRE)
    def on_expire(self, log=beam.DoFn.StateParam(LOG), meta=beam.DoFn.StateParam(META),
                  judged_state=beam.DoFn.StateParam(JUDGED), expire=beam.DoFn.TimerParam(EXPIRE),
                  ts=beam.DoFn.TimestampParam, key=beam.DoFn.KeyParam):
        return self.logic.on_expire(log, meta, judged_state, expire, ts, key)


def _latest(entries) -> dict:
    """The latest version of each request in a query's log (a drop counts as a version; of one
    version, a closed mark, then the latest fate, wins)."""
    out: dict = {}
    for e in entries:
        old = out.get(e[_LK])
        if old is None or (e[_LVER], e[_LDROP], e[_LFGEN]) > (old[_LVER], old[_LDROP], old[_LFGEN]):
            out[e[_LK]] = e
    return out


# --------------------------------------------------------------------------------------------
# the aggregate: panes

def _version_of(m):
    """(request key, request version) of an aggregate message."""
    return (m[1], m[3][0]) if m[0] == "rank" else (m[1], m[2])


class _PaneState:
    """Book-keeping of one output window: next pane index, whether the on-time pane fired, the
    (label, metric) rows emitted so far (to retract them if they empty), and whether it changed."""

    NEXT, ONTIME, EMITTED, DIRTY = range(4)

    @staticmethod
    def new():
        return [0, False, {}, False]


class _AggregateBase:
    INBOX = BagStateSpec("inbox", FastPrimitivesCoder())
    CORE = ReadModifyWriteStateSpec("core", FastPrimitivesCoder())
    SCHED = ReadModifyWriteStateSpec("sched", FastPrimitivesCoder())  # [armed event, armed proc, proc now, count]
    EVENT = TimerSpec("event", TimeDomain.WATERMARK)
    PROC = TimerSpec("proc", TimeDomain.REAL_TIME)

    def __init__(self, cfg: "_Config"):
        self.cfg = cfg
        self.names = [s.name for s in cfg.specs]
        self.totals = [s.is_count for s in cfg.specs]
        self.mean = MeanCombineFn(len(cfg.specs), self.totals)
        self.mm = MeanMoments(len(cfg.specs))
        self.ctr_fn = CtrByPositionCombineFn(overall=True)
        self.clock = _Clock(cfg.clock)

    # -- shared plumbing -----------------------------------------------------------------------
    def process(self, kv, inbox, core,
                sched, event,
                proc, ts):
        system, msgs = kv
        if system == _SIDE_KEY:
            for m in msgs:
                yield pvalue.TaggedOutput("side", m[1])
            return
        inbox.add(msgs)
        armed, parmed, pnow, count = sched.read() or [None, None, 0.0, 0]
        count += len(msgs)
        cand = self.candidate(msgs)
        if cand is not None and (armed is None or cand < armed):
            armed = cand
            event.set(_when(armed))
        cfg = self.cfg
        if cfg.early_seconds and parmed is None:
            parmed = max(self.clock(), pnow) + cfg.early_seconds
            proc.set(Timestamp.of(parmed))
        if cfg.early_count and count >= cfg.early_count:
            count = 0
            c = self._fold(system, inbox, core)
            yield from self._emit_dirty(system, c, ts)
            armed = self._rearm(c, event, armed)
            core.write(c)
        sched.write([armed, parmed, pnow, count])

    def _fold(self, system, inbox, core):
        c = core.read() or self.new_core()
        batches = list(inbox.read())
        inbox.clear()
        self._rejects = []
        msgs = [m for batch in batches for m in batch]
        # a request version whose update is late anywhere is late everywhere (ranking and clicks
        # alike): decided on the state before the fold, so the order of the messages is irrelevant
        late = {_version_of(m) for m in msgs if self.apply(system, c, m, dry=True) == "late"}
        for m in msgs:
            if _version_of(m) in late:
                self.reject(system, c, m)
            else:
                self.apply(system, c, m)
        return c

    def _late_out(self, ts):
        rej, self._rejects = self._rejects, []
        if rej:
            _tally(self.cfg.run, "late:update", len(rej))
            for r in rej:
                yield pvalue.TaggedOutput("side", TimestampedValue(r, ts))

    def _emit_dirty(self, system, c, ts):
        yield from self._late_out(ts)
        for wid in self.pane_ids(c):
            p = self.panes(c)[wid]
            if p[_PaneState.DIRTY]:
                pane = "late" if p[_PaneState.ONTIME] else "early"
                yield from self._pane(system, c, wid, pane, False, ts)

    def on_proc(self, inbox, core,
                sched, event,
                key, ts):
        armed, parmed, pnow, count = sched.read() or [None, None, 0.0, 0]
        pnow = max(pnow, float(ts))
        c = self._fold(key, inbox, core)
        out = list(self._emit_dirty(key, c, _when(self.last_event(c))))
        armed = self._rearm(c, event, armed)
        core.write(c)
        sched.write([armed, None, pnow, 0])
        yield from out

    def on_event(self, inbox, core,
                 sched, event,
                 key, ts):
        now = _micros(ts)
        armed, parmed, pnow, count = sched.read() or [None, None, 0.0, 0]
        c = self._fold(key, inbox, core)
        out = list(self._late_out(ts))
        out.extend(self.fire_deadlines(key, c, now, ts))
        armed = self._rearm(c, event, None)
        core.write(c)
        sched.write([armed, parmed, pnow, count])
        yield from out

    def _rearm(self, c, event, armed):
        nxt = self.next_deadline(c)
        if nxt is not None and nxt != armed:
            event.set(_when(nxt))
        return nxt

    # -- rows ----------------------------------------------------------------------------------
    def _pane(self, system, c, wid, pane, final, ts):
        p = self.panes(c)[wid]
        start, end, prefix = self.window_of(c, wid)
        current = self.window_rows(c, wid)  # {label: [(metric, value, n, se), ...]}
        idx = p[_PaneState.NEXT]
        extra = dict(pane=pane, pane_index=idx, is_final=bool(final))
        rows = []
        emitted = p[_PaneState.EMITTED]
        for label in sorted(current):
            out_label = label if prefix is None else (prefix if label == "all" else f"{prefix},{label}")
            for metric, value, n, se in current[label]:
                rows.append(metric_row(start, end, out_label, system, metric, value, n, se, **extra))
        for label, metrics in sorted(emitted.items()):  # emptied since: an empty row replaces it
            have = {m for m, *_ in current.get(label, [])}
            out_label = label if prefix is None else (prefix if label == "all" else f"{prefix},{label}")
            for metric in metrics:
                if metric not in have:
                    rows.append(metric_row(start, end, out_label, system, metric, math.nan, 0, None, **extra))
        for label, rs in current.items():  # every row ever emitted stays in the window's panes
            have = emitted.setdefault(label, [])
            have.extend(m for m, *_ in rs if m not in have)
        p[_PaneState.DIRTY] = False
        if pane == "on_time":
            p[_PaneState.ONTIME] = True
        if not rows:
            return
        p[_PaneState.NEXT] = idx + 1
        _tally(self.cfg.run, f"panes_{pane}")
        yield pvalue.TaggedOutput("panes", TimestampedValue(rows, ts))
        for r in rows:
            yield TimestampedValue(r, ts)

    def _rank_rows(self, merged_rank):
        """{label: [nreq, mm state]} -> rows of the ranking metrics."""
        out = {}
        for label, (nreq, st) in merged_rank.items():
            if nreq <= 0:
                continue
            res = self.mean.extract_output(st)
            out[label] = [(name, v, n, se) for name, (v, n, se) in zip(self.names, res)]
        return out

    def _ctr_rows(self, merged_ctr, out):
        for label, by_pos in merged_ctr.items():
            by_pos = {p: v for p, v in by_pos.items() if v[0] > 0}
            if not by_pos:
                continue
            (ctr, n, se), per_pos = self.ctr_fn.extract_output(by_pos)
            rows = out.setdefault(label, [])
            rows.append(("ctr", ctr, n, se))
            for pos, (v, n2, se2) in per_pos.items():
                rows.append((f"ctr@pos{pos}", v, n2, se2))
        return out


# core of the windowed aggregate:
# [reqs {key: entry}, rank sums {sub: {label: [nreq, mm]}}, ctr sums {sub: {label: {pos: [i, c]}}},
#  panes {window: PaneState}, closed_upto]
_CREQ, _CRANK, _CCTR, _CPANES, _CCLOSED = range(5)


class _WindowAggregate(_AggregateBase):
    """Key: system. Fixed and sliding windows (sub-windows of the period, merged per window)."""

    def new_core(self):
        return [{}, {}, {}, {}, None]

    def panes(self, c):
        return c[_CPANES]

    def pane_ids(self, c):
        return sorted(c[_CPANES])

    def last_event(self, c):
        return c[_CCLOSED] or 0

    def window_of(self, c, j):
        start, end = self.cfg.spec.bounds(j)
        return start, end, None

    def candidate(self, msgs):
        """Earliest window end among the windows the messages touch: the on-time pane's time, or
        (already past) a late pane as soon as the watermark moves."""
        spec = self.cfg.spec
        best = None
        for m in msgs:
            if m[0] == "rank":
                subs = [m[4]] if m[4] is not None else []
            else:
                subs = list(m[4])
            for k in subs:
                end = spec.bounds(k - spec.per_window + 1)[1]
                if best is None or end < best:
                    best = end
        return best

    def _frozen(self, c, k):
        closed = c[_CCLOSED]
        return closed is not None and self.cfg.expiry(k) <= closed

    def _touch(self, c, k):
        for j in self.cfg.spec.windows_of(k):
            p = c[_CPANES].get(j)
            if p is None:
                p = c[_CPANES][j] = _PaneState.new()
            p[_PaneState.DIRTY] = True

    def _subs(self, c, m):
        """(key, old entry, sub-windows the message changes) or None when it is stale."""
        reqs = c[_CREQ]  # {key: [last sub-window, encoded entry]}
        if m[0] == "rank":
            _, rkey, query, order, k, labels, vector = m
            key = "r" + _SEP + rkey + _SEP + query
        else:
            _, rkey, version, _place, counts = m
            key, order = "c" + _SEP + rkey, [version]
        cell = reqs.get(key)
        old = None if cell is None else _decode(cell[1])
        if old is not None and old[0] >= order:
            return None
        if m[0] == "rank":
            subs = {k} if vector is not None else set()
            if old is not None:
                subs.add(old[1])
        else:
            subs = {int(x) for x in counts}
            if old is not None:
                subs |= {int(x) for x in old[1]}
        return key, old, subs

    def apply(self, system, c, m, dry=False):
        found = self._subs(c, m)
        if found is None:
            return "stale"
        key, old, subs = found
        if any(self._frozen(c, x) for x in subs):
            if not dry:
                self._reject(system, m, m[1], sorted(subs))
            return "late"
        if dry:
            return "ok"
        reqs = c[_CREQ]
        if m[0] == "rank":
            _, rkey, query, order, k, labels, vector = m
            if old is not None:
                self._rank_sub(c, old[1], old[2], old[3], -1)
            if vector is not None:
                self._rank_sub(c, k, labels, vector, +1)
                reqs[key] = [k, _encode([order, k, labels, vector])]
            elif old is not None:
                reqs[key] = [old[1], _encode([order, old[1], [], None])]  # a tombstone keeps the order
        else:
            _, rkey, version, _place, counts = m
            if old is not None:
                self._ctr_add(c, old[1], -1)
            self._ctr_add(c, counts, +1)
            reqs[key] = [max(subs, default=None), _encode([[version], counts])]
        for x in subs:
            self._touch(c, x)
        return "ok"

    def reject(self, system, c, m):
        found = self._subs(c, m)
        if found is not None:
            self._reject(system, m, m[1], sorted(found[2]))

    def _reject(self, system, m, rkey, subs):
        spec = self.cfg.spec
        self._rejects.append(_late_record(
            "late:update", {"kind": m[0], "system_id": system, "request_id": rkey.split(_SEP, 1)[1],
                            "windows": [[_fmt_us(a), _fmt_us(b)] for a, b in (spec.bounds(s) for s in subs)]},
            "an update of this request arrived after a window it changes closed"))

    def _rank_sub(self, c, k, labels, vector, sign):
        if vector is None:
            return
        by_label = c[_CRANK].setdefault(k, {})
        for label in labels:
            cell = by_label.get(label)
            if cell is None:
                cell = by_label[label] = [0, self.mm.create()]
            cell[0] += sign
            if sign > 0:
                self.mm.add(cell[1], vector)
            else:
                _mm_sub(cell[1], vector)
            if cell[0] == 0:
                del by_label[label]
        if not by_label:
            del c[_CRANK][k]

    def _ctr_add(self, c, counts, sign):
        for k, by_label in counts.items():
            k = int(k)
            dst = c[_CCTR].setdefault(k, {})
            for label, by_pos in by_label.items():
                dl = dst.setdefault(label, {})
                for pos, (i, n) in by_pos.items():
                    cell = dl.setdefault(pos, [0, 0])
                    cell[0] += sign * i
                    cell[1] += sign * n
                    if cell[0] == 0:
                        del dl[pos]
                if not dl:
                    del dst[label]
            if not dst:
                del c[_CCTR][k]

    def window_rows(self, c, j):
        spec = self.cfg.spec
        subs = range(j, j + spec.per_window)
        rank: dict = {}
        for k in subs:
            for label, (nreq, st) in c[_CRANK].get(k, {}).items():
                cur = rank.get(label)
                rank[label] = [nreq, st] if cur is None else [cur[0] + nreq, self.mm.merge([cur[1], st])]
        out = self._rank_rows(rank)
        ctr: dict = {}
        for k in subs:
            for label, by_pos in c[_CCTR].get(k, {}).items():
                dl = ctr.setdefault(label, {})
                for pos, (i, n) in by_pos.items():
                    cell = dl.setdefault(pos, [0, 0])
                    cell[0] += i
                    cell[1] += n
        return self._ctr_rows(ctr, out)

    def next_deadline(self, c):
        spec, cfg = self.cfg.spec, self.cfg
        best = None
        for j, p in c[_CPANES].items():
            start, end = spec.bounds(j)
            d = end + cfg.lateness
            if not p[_PaneState.ONTIME] or p[_PaneState.DIRTY]:
                d = min(d, end)
            best = d if best is None else min(best, d)
        return best

    def fire_deadlines(self, system, c, now, ts):
        spec, cfg = self.cfg.spec, self.cfg
        c[_CCLOSED] = now if c[_CCLOSED] is None else max(c[_CCLOSED], now)
        for j in sorted(c[_CPANES]):
            p = c[_CPANES][j]
            start, end = spec.bounds(j)
            if end > now:
                continue
            final = end + cfg.lateness <= now
            if not p[_PaneState.ONTIME]:
                yield from self._pane(system, c, j, "on_time", final, ts)
            elif p[_PaneState.DIRTY] or final:
                yield from self._pane(system, c, j, "late", final, ts)
            if final:
                del c[_CPANES][j]
        # drop the sub-windows whose last window (window k) closed, and the requests living only there
        done = (lambda k: spec.bounds(k)[1] + cfg.lateness <= now)
        for k in [k for k in set(c[_CRANK]) | set(c[_CCTR]) if done(k)]:
            c[_CRANK].pop(k, None)
            c[_CCTR].pop(k, None)
        for key, (last, _) in list(c[_CREQ].items()):
            if last is None or done(last):
                del c[_CREQ][key]


# core of the session aggregate:
# [reqs {key: entry}, dirty session keys, panes {"skey\x1fstart": PaneState + [end]}, closed
#  {skey: [[start, end], ...]}, closed_upto]
_SREQ, _SDIRTY, _SPANES, _SCLOSED, _SUPTO = range(5)


class _SessionAggregate(_AggregateBase):
    """Key: system. Session windows: the latest contribution of every open request, grouped by
    session key; the sessions (requests less than the gap apart) of the keys that changed are
    recomputed at each firing. A session is identified by its key and start; one that disappears
    (merged into another by a request bridging the gap) gets a final pane of empty rows."""

    def new_core(self):
        return [{}, [], {}, {}, None]

    def panes(self, c):
        return c[_SPANES]

    def pane_ids(self, c):
        return sorted(c[_SPANES])

    def last_event(self, c):
        return c[_SUPTO] or 0

    def window_of(self, c, wid):
        skey, start = wid.rsplit(_SEP, 1)
        return int(start), c[_SPANES][wid][4], skey

    def candidate(self, msgs):
        best = None
        for m in msgs:
            place = m[4] if m[0] == "rank" else m[3]
            if place is None:
                continue
            end = place[2] + self.cfg.spec.size
            best = end if best is None else min(best, end)
        return best

    def _reject(self, system, m, rkey, detail, reason):
        self._rejects.append(_late_record(
            "late:update", dict({"kind": m[0], "system_id": system, "request_id": rkey.split(_SEP, 1)[1]}, **detail),
            reason))

    def _check(self, c, m):
        """(key, order, place, None) when the message applies, (key, order, place, (detail,
        reason)) when it is late, None when it is stale."""
        reqs = c[_SREQ]
        gap = self.cfg.spec.size
        if m[0] == "rank":
            _, rkey, query, order, place, labels, vector = m
            key = "r" + _SEP + rkey + _SEP + query
        else:
            _, rkey, version, place, counts = m
            key = "c" + _SEP + rkey
            order = [version]
        old = reqs.get(key)
        if old is not None and old[0] >= order:
            return None
        places = [q for q in ([old[1]] if old is not None else []) + [place] if q is not None]
        for skey, first, last in places:
            for a, b in c[_SCLOSED].get(skey, []):
                if first < b and last + gap > a:  # it is in, or would join, a closed session
                    return key, order, places, ({"session": skey, "session_window": [_fmt_us(a), _fmt_us(b)]},
                                                "an update of this request arrived after its session closed")
        upto = c[_SUPTO]
        if place is not None and old is None and upto is not None and place[2] + gap + self.cfg.lateness <= upto:
            return key, order, places, ({"session": place[0], "time": _fmt_us(place[1])},
                                        "the request's session closed before the request arrived")
        return key, order, places, None

    def apply(self, system, c, m, dry=False):
        found = self._check(c, m)
        if found is None:
            return "stale"
        key, order, places, late = found
        if late is not None:
            if not dry:
                self._reject(system, m, m[1], *late)
            return "late"
        if dry:
            return "ok"
        if m[0] == "rank":
            place, labels, vector = m[4], m[5], m[6]
            c[_SREQ][key] = [order, place if vector is not None else None, labels, vector]
        else:
            c[_SREQ][key] = [order, m[3], m[4]]
        for skey, _, _ in places:
            if skey not in c[_SDIRTY]:
                c[_SDIRTY].append(skey)
        return "ok"

    def reject(self, system, c, m):
        found = self._check(c, m)
        if found is not None:
            late = found[3] or ({}, "another part of this update of the request arrived after its session closed")
            self._reject(system, m, m[1], *late)

    def _sessions(self, c, skey):
        """[[start, end, entries]] of a session key, from its open requests' contributions."""
        gap = self.cfg.spec.size
        items = sorted(((e[1][1], k, e) for k, e in c[_SREQ].items() if e[1] is not None and e[1][0] == skey),
                       key=lambda x: (x[0], x[1]))
        out = []
        for t, _, e in items:
            end = e[1][2] + gap
            if out and t < out[-1][1]:
                out[-1][1] = max(out[-1][1], end)
                out[-1][2].append(e)
            else:
                out.append([t, end, [e]])
        return out

    def _refresh(self, c) -> list:
        """Recompute the sessions of the changed keys; returns the identities that disappeared and
        had emitted rows (they need a final empty pane)."""
        gone = []
        for skey in c[_SDIRTY]:
            now = {f"{skey}{_SEP}{start}": end for start, end, _ in self._sessions(c, skey)}
            for wid in [w for w in c[_SPANES] if w.rsplit(_SEP, 1)[0] == skey and w not in now]:
                if c[_SPANES][wid][_PaneState.EMITTED]:
                    gone.append(wid)
                else:
                    del c[_SPANES][wid]
            for wid, end in now.items():
                p = c[_SPANES].get(wid)
                if p is None:
                    p = c[_SPANES][wid] = _PaneState.new() + [end]
                p[4] = end
                p[_PaneState.DIRTY] = True
        c[_SDIRTY] = []
        return gone

    def _close_gone(self, system, c, gone, ts):
        for wid in gone:
            p = c[_SPANES][wid]
            yield from self._pane(system, c, wid, "late" if p[_PaneState.ONTIME] else "early", True, ts)
            del c[_SPANES][wid]

    def _emit_dirty(self, system, c, ts):
        gone = self._refresh(c)
        yield from self._late_out(ts)
        yield from self._close_gone(system, c, gone, ts)
        for wid in sorted(c[_SPANES]):
            p = c[_SPANES][wid]
            if p[_PaneState.DIRTY]:
                yield from self._pane(system, c, wid, "late" if p[_PaneState.ONTIME] else "early", False, ts)

    def window_rows(self, c, wid):
        skey, start = wid.rsplit(_SEP, 1)
        start = int(start)
        rank: dict = {}
        ctr: dict = {}
        for a, b, entries in self._sessions(c, skey):
            if a != start:
                continue
            for e in entries:
                if len(e) == 4:  # ranking
                    for label in e[2]:
                        cell = rank.setdefault(label, [0, self.mm.create()])
                        cell[0] += 1
                        self.mm.add(cell[1], e[3])
                else:
                    for label, by_pos in e[2].items():
                        dl = ctr.setdefault(label, {})
                        for pos, (i, n) in by_pos.items():
                            cell = dl.setdefault(pos, [0, 0])
                            cell[0] += i
                            cell[1] += n
        return self._ctr_rows(ctr, self._rank_rows(rank))

    def next_deadline(self, c):
        best = None
        for p in c[_SPANES].values():
            end = p[4]
            d = end + self.cfg.lateness
            if not p[_PaneState.ONTIME] or p[_PaneState.DIRTY]:
                d = min(d, end)
            best = d if best is None else min(best, d)
        if c[_SDIRTY]:  # changes not yet grouped into sessions: look again now
            best = c[_SUPTO] if best is None or (c[_SUPTO] is not None and c[_SUPTO] < best) else best
        return best

    def fire_deadlines(self, system, c, now, ts):
        L = self.cfg.lateness
        gone = self._refresh(c)
        c[_SUPTO] = now if c[_SUPTO] is None else max(c[_SUPTO], now)
        yield from self._close_gone(system, c, gone, ts)
        for wid in sorted(c[_SPANES]):
            p = c[_SPANES][wid]
            end = p[4]
            if end > now:
                continue
            final = end + L <= now
            if not p[_PaneState.ONTIME]:
                yield from self._pane(system, c, wid, "on_time", final, ts)
            elif p[_PaneState.DIRTY] or final:
                yield from self._pane(system, c, wid, "late", final, ts)
            if final:
                skey, start = wid.rsplit(_SEP, 1)
                start = int(start)
                c[_SCLOSED].setdefault(skey, []).append([start, end])
                for k, e in list(c[_SREQ].items()):
                    if e[1] is not None and e[1][0] == skey and start <= e[1][1] < end:
                        del c[_SREQ][k]
                del c[_SPANES][wid]
        keep_after = now - self.cfg.retention  # forget closed sessions after the retention
        for skey in list(c[_SCLOSED]):
            c[_SCLOSED][skey] = [w for w in c[_SCLOSED][skey] if w[1] + L > keep_after]
            if not c[_SCLOSED][skey]:
                del c[_SCLOSED][skey]


class _AggregateFn(beam.DoFn):
    """Keyed state of systems: panes (logic in :class:`_WindowAggregate` / :class:`_SessionAggregate`)."""

    INBOX, CORE, SCHED = _AggregateBase.INBOX, _AggregateBase.CORE, _AggregateBase.SCHED
    EVENT, PROC = _AggregateBase.EVENT, _AggregateBase.PROC

    def __init__(self, logic):
        self.logic = logic

    def process(self, kv, inbox=beam.DoFn.StateParam(INBOX), core=beam.DoFn.StateParam(CORE),
                sched=beam.DoFn.StateParam(SCHED), event=beam.DoFn.TimerParam(EVENT),
                proc=beam.DoFn.TimerParam(PROC), ts=beam.DoFn.TimestampParam):
        return self.logic.process(kv, inbox, core, sched, event, proc, ts)

    @on_timer(PROC)
    def on_proc(self, inbox=beam.DoFn.StateParam(INBOX), core=beam.DoFn.StateParam(CORE),
                sched=beam.DoFn.StateParam(SCHED), event=beam.DoFn.TimerParam(EVENT),
                key=beam.DoFn.KeyParam, ts=beam.DoFn.TimestampParam):
        return self.logic.on_proc(inbox, core, sched, event, key, ts)

    @on_timer(EVENT)
    def on_event(self, inbox=beam.DoFn.StateParam(INBOX), core=beam.DoFn.StateParam(CORE),
                 sched=beam.DoFn.StateParam(SCHED), event=beam.DoFn.TimerParam(EVENT),
                 key=beam.DoFn.KeyParam, ts=beam.DoFn.TimestampParam):
        return self.logic.on_event(inbox, core, sched, event, key, ts)


# --------------------------------------------------------------------------------------------
# configuration and the public transform

@dataclass
class _Config:
    spec: WindowSpec
    lateness: int
    delay: int
    retention: int
    early_seconds: float | None
    early_count: int | None
    ranking: bool
    ctr: bool
    specs: list
    options: object
    ops: object
    slice_specs: list
    attr_keys: list
    shards: int
    clock: object
    cleanup: int = 1
    run: str = ""
    source: str = "stream"
    policy: str = "latest"

    def round_up(self, t: int) -> int:
        """``t`` rounded up to the cleanup step (state is freed in steps, not at every window)."""
        g = self.cleanup
        return -((-t) // g) * g

    def expiry(self, k: int) -> int:
        """When sub-window k stops accepting data: the end of the first window holding it plus the
        allowed lateness (= the sub-window's end + lateness: after that a window containing it is
        final and must not change)."""
        return (k + 1) * self.spec.period + self.lateness


class StreamMetrics(beam.PTransform):
    """``impressions | StreamMetrics(judgments, metrics, window="1h", ...)`` -> metric rows with
    panes (metric_result dicts; ``pane`` is ``"early"``, ``"on_time"`` or ``"late"``, ``pane_index``
    counts the window's panes from 0, ``is_final`` marks the last one).

    Inputs are unbounded PCollections (bounded ones work too) whose elements are records or lists
    of records (coarse elements are faster: send a page view's impressions together), timestamped
    with their event time: ``impressions`` (impression schema), ``judgments`` (judgment schema;
    optional: without it only click metrics are computed) and ``clicks`` (optional click events
    ``{request_id, item_id, timestamp, system_id?}``).

    * ``window``: a :class:`WindowSpec` or text (``"1h"``, ``"1h/10m"`` sliding,
      ``"session:30m"``, ``"session:30m/request"``).
    * ``early_every`` (a duration of processing time) and ``early_count`` (request updates):
      early panes before the watermark passes the window's end; also used for late panes.
      Without them, late data fires a late pane as soon as the watermark moves.
    * ``allowed_lateness``: how long after a window's end data still updates it; the final pane
      fires then. Later data is counted and written to ``self.late`` (dead_letter records), never
      dropped silently.
    * ``attribution_delay``: a click event joins the impressions of its request and item served at
      most this long before it (keep ``allowed_lateness`` >= the delay, or clicks on impressions at
      a window's end arrive after it closed and go to the late output).
    * metric options, ``slices``: as :class:`~streameval.beam.transforms.ScoreRankings`;
      ``ctr=False`` skips click metrics.
    * ``request_shards``: requests are kept in this many keyed states (a bounded key space: the
      local runner keeps a record per key ever seen; raise it on distributed runners).
    * ``retention``: how long a final request is remembered (its later pieces are late data);
      default the window size or the allowed lateness, whichever is longer.
    * ``clock``: processing-time source for ``early_every`` (default wall time; pass
      :func:`replay_clock` when replaying on the local runner).
    * ``judgment_conflicts``: ``"latest"`` (default), ``"max"`` or ``"reject"``: how judgments of one
      (query, item) that disagree are resolved (:func:`streameval.io.cleaning.resolve_judgment`, as
      in batch); ``grade_range=(lo, hi)``: judgments with a grade outside are dead letters.

    Repeated input (as in batch, :func:`streameval.io.cleaning.clean_request`): impressions of one
    ``(system_id, request_id)`` replayed with the same ``event_id`` and content are duplicates and
    change nothing; the same ``event_id`` with other content and an item served twice are dead
    letters, decided on all the request's records whatever their order (a better copy arriving
    later replaces the kept one in the request's next version). Click events are de-duplicated by
    ``event_id`` (without one, by ``(request_id, item_id, timestamp)``).

    Record accounting: :meth:`counts` (the counters of
    :mod:`streameval.beam.accounting`, taken where each record's fate is final) and
    :meth:`accounting` (the summary and the identities that do not hold).

    After the transform is applied: ``self.panes`` (one element per pane: its rows),
    ``self.side`` (all records the stream set aside), ``self.late`` (the late data among them) and
    ``self.dead_letters`` (the rest: invalid records, requests that cannot be scored, click events
    that matched no impression); ``late`` and ``dead_letters`` are filters of ``side`` added on
    first use.
    """

    def __init__(self, judgments=None, metrics=None, window="1h", slices=(), clicks=None,
                 early_every=None, early_count=None, allowed_lateness=0, attribution_delay="30m",
                 relevance_level=1, gain="linear", ideal="judgments", err_max_grade=4, order="score",
                 tie_break="docno", depth=None, score_precision="float32", ctr=True, request_shards=16,
                 retention=None, clock=None, source="stream", judgment_conflicts="latest", grade_range=None,
                 label=None):
        super().__init__(label)
        if judgment_conflicts not in cleaning.JUDGMENT_POLICIES:
            raise ValueError(f"judgment_conflicts must be one of {cleaning.JUDGMENT_POLICIES}, "
                             f"got {judgment_conflicts!r}")
        if grade_range is not None:
            lo, hi = (int(g) for g in grade_range)
            if lo > hi:
                raise ValueError(f"grade_range: lowest grade {lo} above highest {hi}")
            grade_range = (lo, hi)
        self.grade_range = grade_range
        self.judgments = judgments
        self.clicks = clicks
        spec = WindowSpec.parse(window)
        ranking = judgments is not None
        if ranking and not metrics:
            raise ValueError("metrics are required with judgments")
        if not ranking and not ctr:
            raise ValueError("nothing to compute: no judgments and ctr=False")
        sr = ScoreRankings(None, metrics or ["P@1"], slices=slices, relevance_level=relevance_level, gain=gain,
                           ideal=ideal, err_max_grade=err_max_grade, order=order, tie_break=tie_break,
                           depth=depth, score_precision=score_precision)
        lateness = parse_duration(allowed_lateness, "allowed_lateness", allow_zero=True)
        early_seconds = None if early_every in (None, 0, "0", "none") else \
            parse_duration(early_every, "early_every") / 1e6
        if early_count is not None and int(early_count) < 1:
            raise ValueError("early_count must be positive")
        if request_shards < 1:
            raise ValueError("request_shards must be positive")
        window_us = spec.size
        self.cfg = _Config(
            spec=spec, lateness=lateness,
            delay=parse_duration(attribution_delay, "attribution_delay", allow_zero=True),
            retention=parse_duration(retention, "retention") if retention else max(window_us, lateness, 1),
            early_seconds=early_seconds, early_count=int(early_count) if early_count else None,
            ranking=ranking, ctr=bool(ctr), specs=sr.specs if ranking else [], options=sr.options, ops=sr.ops,
            slice_specs=parse_slices(slices), attr_keys=sorted({n for s in parse_slices(slices) for n in s}),
            shards=int(request_shards), clock=clock,
            cleanup=spec.period if spec.windowed else spec.size,
            run=uuid.uuid4().hex, source=str(source), policy=judgment_conflicts)
        self.source = str(source)
        self.panes = None
        self.side = None

    def expand(self, impressions):
        cfg = self.cfg
        gate = cfg.spec.windowed

        def keyed(pc, key_type):
            # the key coder of a stateful stage comes from its input's element type
            pc.element_type = typehints.Tuple[key_type, typehints.Any]
            return pc

        pieces = [impressions | "PrepareImpressions" >> beam.ParDo(
            _PrepareImpressions(self.source, gate, cfg.shards, cfg.run))]
        if self.clicks is not None:
            pieces.append(self.clicks | "PrepareClicks" >> beam.ParDo(
                _PrepareClicks(self.source, gate, cfg.shards, cfg.run)))
        to_queries = []
        if cfg.ranking:
            jud = self.judgments | "PrepareJudgments" >> beam.ParDo(
                _PrepareJudgments(self.source, gate, cfg.run, self.grade_range)).with_outputs("gate", main="queries")
            to_queries.append(jud.queries)
            if gate:
                pieces.append(jud.gate)
        merged = tuple(pieces) | "AllPieces" >> beam.Flatten() if len(pieces) > 1 else pieces[0]
        if gate:
            gated = keyed(merged, int) | "Gate" >> beam.ParDo(
                _GateFn(cfg.spec, cfg.lateness, cfg.shards, cfg.run)).with_outputs("queries", main="shards")
            merged = gated.shards
            to_queries.append(gated.queries)
        reqs = keyed(merged, int) | "Requests" >> beam.ParDo(_RequestsFn(cfg)).with_outputs("queries", main="systems")
        to_systems = [reqs.systems]
        if cfg.ranking:
            q_in = tuple(to_queries + [reqs.queries]) | "ToQueries" >> beam.Flatten()
            to_systems.append(keyed(q_in, str) | "Queries" >> beam.ParDo(_QueriesFn(cfg)))
        agg_fn = _AggregateFn(_WindowAggregate(cfg) if gate else _SessionAggregate(cfg))
        agg_in = tuple(to_systems) | "ToSystems" >> beam.Flatten() if len(to_systems) > 1 else to_systems[0]
        agg = keyed(agg_in, str) | "Aggregate" >> beam.ParDo(agg_fn).with_outputs("panes", "side", main="rows")
        self.panes = agg.panes
        self.side = agg.side
        return agg.rows

    def counts(self) -> dict:
        """The record counts (``impressions_read``, ``impressions_accepted``,
        ``duplicate:impression``, ``rejected:impression:<reason>``, ``late:impression``, ... and
        the same for judgments and clicks; see :mod:`streameval.beam.accounting`) taken by this
        transform in this process: complete after the pipeline ran on a runner in this process
        (the local runners). The same counts go to Beam counters for other runners."""
        return stream_counts(self.cfg.run)

    def accounting(self, unreadable=None, counts=None):
        """``(summary, problems)`` of :func:`streameval.beam.accounting.account` on
        :meth:`counts` (or ``counts``)."""
        from ..accounting import account

        return account(self.counts() if counts is None else counts, ranking=self.cfg.ranking, ctr=self.cfg.ctr,
                       unreadable=unreadable)

    @property
    def late(self):
        """Late data (dead_letter records whose source starts with ``late:``); available after the
        transform is applied."""
        return self._side_part("late")

    @property
    def dead_letters(self):
        """Invalid records, requests that cannot be scored and click events that matched no
        impression (dead_letter records)."""
        return self._side_part("dead")

    def _side_part(self, which):
        if self.side is None:
            return None
        cache = self.__dict__.setdefault("_parts", {})
        if which not in cache:
            is_late = (lambda r: r["source"].startswith("late:"))
            keep = is_late if which == "late" else (lambda r: not is_late(r))
            cache[which] = self.side | f"{self.label}/{which.capitalize()}Records" >> beam.Filter(keep)
        return cache[which]


# --------------------------------------------------------------------------------------------
# the replay source (TestStream)

class _ReplayFanout(beam.DoFn):
    def __init__(self, loader=None):
        self.loader = loader

    def process(self, element):
        kind, payload, ptime = element
        _REPLAY_NOW[0] = float(ptime)
        if kind == "chunk":
            for k, recs in self.loader(payload):
                if recs:
                    yield pvalue.TaggedOutput(k, recs)
            return
        yield pvalue.TaggedOutput(kind, payload)


class Replay(beam.PTransform):
    """Plays recorded events in event-time order with a watermark, as a TestStream (run it on the
    local streaming runner, ``BundleBasedDirectRunner``, with ``streaming=True``).

    ``p | Replay(steps)`` returns ``{"impressions", "judgments", "clicks"}``: PCollections whose
    elements are lists of records, timestamped with the earliest event time of the list. ``steps``
    is a list of

    * ``("impressions" | "judgments" | "clicks", [records])``: events delivered together;
    * ``("watermark", micros)``: the watermark advances (events behind it are late);
    * ``("advance", seconds)``: processing time advances (early panes by processing time fire);
    * ``("chunk", descriptor)``: ``loader(descriptor)`` yields ``(kind, records)`` when the chunk
      plays (keeps the TestStream small: a generator or a file block instead of the records).

    :meth:`from_records` builds the steps of an in-order replay of logs.
    """

    KINDS = ("impressions", "judgments", "clicks")

    def __init__(self, steps, loader=None, label=None):
        super().__init__(label)
        self.steps = list(steps)
        self.loader = loader

    @classmethod
    def from_records(cls, impressions=(), judgments=(), clicks=(), step="1h", pace=1.0, label=None):
        """Steps replaying the records in event-time order: the events of each ``step`` of event
        time are delivered together, then the watermark moves to the step's end and processing
        time advances by ``pace`` seconds. Judgments without a timestamp play at time 0."""
        step_us = parse_duration(step, "step")
        groups: dict = defaultdict(lambda: {k: [] for k in cls.KINDS})
        for kind, recs in (("impressions", impressions), ("judgments", judgments), ("clicks", clicks)):
            for r in recs:
                ts = int(r.get("timestamp") or 0)
                groups[ts // step_us][kind].append(r)
        steps = []
        for s in sorted(groups):
            for kind in ("judgments", "impressions", "clicks"):
                recs = groups[s][kind]
                if recs:
                    recs.sort(key=lambda r: int(r.get("timestamp") or 0))
                    steps.append((kind, recs))
            steps.append(("watermark", (s + 1) * step_us))
            if pace:
                steps.append(("advance", float(pace)))
        return cls(steps, label=label)

    def expand(self, pbegin):
        from apache_beam.testing.test_stream import TestStream

        ts = TestStream(coder=FastPrimitivesCoder())
        ptime = 0.0
        for step in self.steps:
            kind, arg = step
            if kind == "watermark":  # a TestStream keeps milliseconds: round down (never ahead)
                ts = ts.advance_watermark_to(_when(int(arg) - int(arg) % 1000))
            elif kind == "advance":
                ptime += float(arg)
                ts = ts.advance_processing_time(float(arg))
            elif kind == "chunk":
                ts = ts.add_elements([TimestampedValue(("chunk", arg, ptime), _when(arg[0] if isinstance(
                    arg, (list, tuple)) else 0))])
            elif kind in self.KINDS:
                if not arg:
                    continue
                t0 = min(int(r.get("timestamp") or 0) if isinstance(r, dict) else 0 for r in arg)
                ts = ts.add_elements([TimestampedValue((kind, list(arg), ptime), _when(t0))])
            else:
                raise ValueError(f"unknown replay step {kind!r}")
        # close every window while the watermark is still finite (windows expire at +inf: what
        # fires then would be late for a downstream GroupByKey, e.g. the file writers'), then end
        end = MAX_TIMESTAMP.micros - MAX_TIMESTAMP.micros % 1000 - 86_400_000_000_000
        ts = ts.advance_watermark_to(_when(end)).advance_watermark_to_infinity()
        out = (pbegin | "TestStream" >> ts
               | "Fanout" >> beam.ParDo(_ReplayFanout(self.loader)).with_outputs(*self.KINDS))
        return {k: out[k] for k in self.KINDS}
