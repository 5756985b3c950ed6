"""Shared by every stage of :class:`~streameval.beam.streaming.StreamMetrics`: the message keys and
names, the record accounting (counts), and the small conversions of times and state entries.

* ``_SEP`` joins the parts of a key (``system + _SEP + request_id`` is a *request key*);
  ``_SIDE_KEY`` is the key under which late data and dead letters travel to the side output.
* Counts: :func:`_tally` adds ``n`` to the counter ``name`` of the run ``run`` (a Beam counter in
  the namespace ``streameval`` and this process's tally, :func:`stream_counts`). It calls
  ``streameval.beam.streaming._tally`` (by default :func:`count_records`), looked up at each call,
  so replacing the package's ``_tally`` (tests do, to simulate a broken count) reaches every stage.
* Times are integer microseconds since the epoch (``_micros`` of a Beam ``Timestamp``,
  ``_when`` back); ``_fmt_us`` renders them as ISO 8601 UTC text for dead-letter reasons.
* Event-time timers: :func:`arm` sets one timer per key, or one per deadline (Beam's dynamic timer
  tags).
* State entries are kept encoded (``_encode`` / ``_decode``: ``FastPrimitivesCoder``, plain
  primitives only, never pickled objects).
"""

from __future__ import annotations

import sys
import threading
import zlib

from apache_beam.coders import FastPrimitivesCoder
from apache_beam.metrics import Metrics
from apache_beam.utils.timestamp import Timestamp

from ...io.counters import NAMESPACE
from ...io.dead_letters import dead_letter

#: pane names of the ``pane`` field
PANES = ("early", "on_time", "late")
#: how a stage keeps its event-time timers (:func:`arm`): one per key, or one per pending deadline
TIMER_MODES = ("one", "per_deadline")

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

#: a source's flush: the element ``(None, (FLUSH, None), 0, watermark)`` that a source which moves its
#: watermark by steps sends before each move (:class:`~.coarse_replay.ReplayColumns`); the columnar
#: engine's shards then score a window once, at the flush before the watermark passes its end
FLUSH = "flush"

_TALLY_LOCK = threading.Lock()
_TALLIES: dict = {}  # run id -> {counter name: n}


def count_records(run: str, name: str, n: int = 1) -> None:
    """Adds ``n`` (records) to the counter ``name`` of the run ``run``: a Beam counter and this
    process's tally (:func:`stream_counts`); ``n == 0`` counts nothing."""
    if not n:
        return
    Metrics.counter(NAMESPACE, name).inc(n)
    with _TALLY_LOCK:
        d = _TALLIES.setdefault(run, {})
        d[name] = d.get(name, 0) + n


def _tally(run: str, name: str, n: int = 1) -> None:
    """What the stages call to count: ``streameval.beam.streaming._tally`` (:func:`count_records`
    unless replaced), looked up at each call."""
    sys.modules[__package__]._tally(run, name, n)


def stream_counts(run: str) -> dict:
    """The counts a :class:`StreamMetrics` (``cfg.run``) took in this process so far."""
    with _TALLY_LOCK:
        return dict(_TALLIES.get(run, {}))


def _category(reason: str) -> str:
    """Counter category of a cleaning reason: the constant before its parenthesised details."""
    return reason.split(" (", 1)[0]


def _tally_late(run, late_records):
    """Counts late records by kind (``late:impression``, ``late:click``: a late record's ``source``
    is its counter name, :func:`streameval.io.counters.late`)."""
    by: dict = {}
    for r in late_records:
        by[r["source"]] = by.get(r["source"], 0) + 1
    for source, n in by.items():
        _tally(run, source, n)


# --------------------------------------------------------------------------------------------
# small helpers

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


def arm(timer, armed: list, times, per_deadline: bool = False) -> list:
    """Sets the event-time timers for the deadlines ``times`` (micros) of a key whose timers are
    set for ``armed`` (its pending times, ascending); returns the new pending times.

    ``per_deadline``: a timer for each of ``times`` not pending yet, each under its own dynamic tag
    (the time as text), so that a watermark passing several deadlines at once fires every one of
    them in that step (on Flink a timer set from a timer callback behind the watermark fires only at
    a later watermark or bundle: one timer re-armed for the next deadline closed about one window
    per step). Otherwise one timer per key, set for the earliest of ``times`` and ``armed``
    (Prism 2.62 fires a key's later tagged timers before the watermark reaches them:
    apache/beam#35090, fixed in Prism 2.66). A timer whose deadline no longer applies still fires,
    and finds nothing due at its time."""
    if per_deadline:
        have = set(armed)
        new = sorted({int(t) for t in times} - have)
        for t in new:
            timer.set(_when(t), dynamic_timer_tag=str(t))
        return sorted(have.union(new)) if new else list(armed)
    nxt = min([int(t) for t in times] + list(armed), default=None)
    if nxt is None:
        return []
    if list(armed) != [nxt]:
        timer.set(_when(nxt))
    return [nxt]


def _pending(armed: list, now: int, per_deadline: bool) -> list:
    """The times of ``armed`` still pending when a timer fires at ``now`` (micros), for :func:`arm`:
    per deadline, those after ``now``; with one timer per key, none (the timer is set again: Beam's
    local runner may apply a timer set while processing an element after the firing of the same
    timer in that bundle, so the key's single timer is not known to be set for the time recorded)."""
    return [a for a in armed if a > now] if per_deadline else []


def _shard(request_id: str, shards: int) -> int:
    return zlib.crc32(request_id.encode("utf-8")) % shards


def _late_record(source: str, raw, reason: str) -> dict:
    return dead_letter(source, raw, reason)


def _fmt_us(us) -> str:
    from datetime import datetime, timezone

    try:
        text = datetime.fromtimestamp(us / 1e6, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return text.replace(".000000Z", "Z")
    except (OverflowError, OSError, ValueError):
        return str(us)
