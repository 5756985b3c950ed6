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
* ``Gate`` (key: a shard of the request id): drops nothing; events whose own window already closed
  go to the late output.
* ``Requests`` (key: a shard of the request id, or the request id with ``request_shards=0``): the request's records, cleaned as in batch
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

Modules, one per stage (each says what its stage takes and sends):

* :mod:`.windows`: durations, :class:`WindowSpec`, the stages' configuration;
* :mod:`.common`: message keys, record counts (:func:`stream_counts`), time and state helpers;
* :mod:`.prepare`: validation and grouping of raw events (stateless), :func:`check_click`,
  :func:`click_event_key`;
* :mod:`.gate`: late raw events (fixed and sliding windows);
* :mod:`.requests`: per-request state (cleaning, versions, click joins);
* :mod:`.queries`: per-query state (judgments, scoring);
* :mod:`.aggregate`, :mod:`.window_aggregate`, :mod:`.session_aggregate`: sums and panes;
* :mod:`.transform`: :class:`StreamMetrics`;
* :mod:`.replay`: :class:`Replay`, :func:`replay_clock`.

The streaming job's pieces (``streameval/jobs/stream.py`` assembles them): :mod:`.sources` (replayed,
watched, Pub/Sub and Kafka events; :mod:`.live` for ``--watch`` on the local runner), :mod:`.sinks`
(a file set per pane, JSON-lines side records), :mod:`.console` (panes as tables, running totals,
the job's own counts).
"""

from __future__ import annotations

from . import aggregate as _aggregate
from . import common as _common
from . import window_aggregate as _window_aggregate
from .common import PANES, REASON_CLICK_UNMATCHED, stream_counts
from .prepare import check_click, click_event_key
from .replay import Replay, replay_clock
from .transform import StreamMetrics
from ...plan.windows import WindowSpec, parse_duration

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

# Private names that tests use. ``_tally`` is what every stage counts with (looked up here at each
# call, see .common): replacing it here reaches all of them.
_tally = _common.count_records
_mm_sub = _aggregate._mm_sub
_WindowAggregate = _window_aggregate._WindowAggregate
