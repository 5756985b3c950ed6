"""The public transform: :class:`StreamMetrics` wires the stages (:mod:`.prepare`, :mod:`.gate`,
:mod:`.requests`, :mod:`.queries`, :mod:`.aggregate`) into one pipeline and reports its record
counts (:meth:`StreamMetrics.counts`, :meth:`StreamMetrics.accounting`).

Stage graph (fixed and sliding windows; sessions have no gate: pieces go from the preparation
straight to their request shard or query)::

    impressions, clicks -> Prepare(Impressions|Clicks) -> Gate (key: shard) -> Requests (key: shard)
    judgments           -> PrepareJudgments            -> Gate (key: shard of the query id) -> Queries (key: query id)
    Requests -> Queries -> Aggregate (key: system)

Without judgments (click metrics only) there is no queries stage: the requests stage sends click
counts straight to the aggregate. ``StreamMetrics(...)`` raises ``ValueError`` on invalid
settings (see its docstring).
"""

from __future__ import annotations

import uuid

import apache_beam as beam
from apache_beam import typehints

from ...accumulators.ranking import ranking_setup
from ...io import cleaning
from ...io import counters as cn
from ...metrics import stats
from ...metrics.prepare import DEFAULT_SCORE_PRECISION
from ..keys import MAX_WINDOWS_PER_RECORD
from ..transforms import judgment_grade_range, parse_slices
from .aggregate import _AggregateFn
from .common import TIMER_MODES, stream_counts
from .gate import _GateFn
from .prepare import GATE_SHARDS, _PrepareClicks, _PrepareImpressions, _PrepareJudgments
from .queries import _QueriesFn
from .requests import _RequestsFn
from .session_aggregate import _SessionAggregate
from .window_aggregate import _WindowAggregate
from ...plan.windows import WindowSpec, parse_duration
from .windows import _Config


def _ordered_pair(pair, name: str):
    """``(lo, hi)`` as ints, or None; ValueError naming ``name`` when ``lo > hi``."""
    if pair is None:
        return None
    lo, hi = (int(v) for v in pair)
    if lo > hi:
        raise ValueError(f"{name}: {lo} above {hi}")
    return lo, hi


class StreamMetrics(beam.PTransform):
    """``impressions | StreamMetrics(judgments, metrics, window="1h", ...)`` -> metric rows with
    panes (metric_result dicts; ``pane`` is ``"early"``, ``"on_time"`` or ``"late"``, ``pane_index``
    counts the window's panes from 0, ``is_final`` marks the last one). Every pane's rows carry the
    batch job's interval of their numbers at ``ci_level`` (default 0.95;
    :func:`streameval.metrics.stats.row_interval`: Wilson for CTR, Student t from the standard
    error otherwise), so a final pane equals the batch row interval included. These are
    fixed-sample intervals: watched at every early pane they are not simultaneous.
    ``intervals="anytime"`` gives confidence sequences instead (``cs-normal-mixture`` for means,
    ``cs-beta-binomial`` for CTR), valid at every pane at once (docs/metrics.md, "Anytime-valid
    intervals").

    Inputs are unbounded PCollections (bounded ones work too) whose elements are records or lists
    of records (coarse elements are faster: send a page view's impressions together), timestamped
    with their event time: ``impressions`` (impression schema), ``judgments`` (judgment schema;
    optional: without it only click metrics are computed) and ``clicks`` (optional click events
    ``{request_id, item_id, timestamp, system_id?}``; with them an impression whose ``clicked`` is
    null counts as not clicked unless a click event matches it,
    :func:`streameval.io.records.impression_clicked`).

    * ``window``: a :class:`WindowSpec` or text (``"1h"``, ``"1h/10m"`` sliding,
      ``"session:30m"``, ``"session:30m/request"``); text for sliding windows putting each record in
      more than ``max_windows_per_record`` windows (default 1,000) is refused (ValueError naming the
      count; ``WindowSpec.sliding(..., max_windows_per_record=N)`` makes a larger one).
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
    * ``request_shards``: requests are kept in this many keyed states, each read and written whole
      by every element that touches it (a bounded key space: the local runner keeps a record per
      key ever seen and pays per key in each bundle); ``0``: one key per request id, so an element
      reads and writes only its own request's state (for distributed runners; the gate then has
      16 shards).
    * ``retention``: how long a final request is remembered (its later pieces are late data);
      default the window size or the allowed lateness, whichever is longer.
    * ``timers``: ``"one"`` (default): each key's stages keep one event-time timer, set for their
      next deadline; ``"per_deadline"``: a timer for each pending deadline (a window's end, its
      expiry), Beam's dynamic timer tags, so that a watermark step closes every due window at once.
      On Flink, where a timer set behind the watermark from a timer callback fires only at a later
      watermark, "one" closes about one window per step (1 M impressions from Kafka: 337 s against
      87 s, docs/benchmarks.md); Prism 2.62 fires a key's later tagged timers early (apache/beam#35090),
      so "one" there. The window aggregate and the columnar shards follow it; the session aggregate
      and the per-event stages keep one timer.
    * ``clock``: processing-time source for ``early_every`` (default wall time; pass
      :func:`replay_clock` when replaying on the local runner).
    * ``judgment_conflicts``: ``"latest"`` (default), ``"max"`` or ``"reject"``: how judgments of one
      (query, item) that disagree are resolved (:func:`streameval.io.cleaning.resolve_judgment`, as
      in batch); ``grade_range=(lo, hi)``: judgments with a grade outside are dead letters;
      ``time_range=(lo, hi)`` (inclusive micros): impressions and click events whose timestamp lies
      outside are dead letters (those outside the years 1 to 9999 always are).
    * ``source``: the ``source`` of the dead letters of records that do not come from a file (a
      text, or ``{"impressions" | "judgments" | "clicks": text}``); a file source's elements are
      ``(path, records)`` pairs and their dead letters name the file. Replays and conflicts are
      decided across files: their dead letters name the stage (``CleanImpressions``,
      ``ResolveJudgments``), as in batch.

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
                 tie_break="docno", depth=None, score_precision=DEFAULT_SCORE_PRECISION, ctr=True, request_shards=16,
                 retention=None, clock=None, source="stream", judgment_conflicts="latest", grade_range=None,
                 time_range=None, ci_level=stats.DEFAULT_LEVEL, intervals="fixed",
                 max_windows_per_record=MAX_WINDOWS_PER_RECORD, label=None, ci_bounded="logit",
                 timers="one"):
        super().__init__(label)
        if intervals not in stats.INTERVAL_KINDS:
            raise ValueError(f"intervals must be one of {stats.INTERVAL_KINDS}, got {intervals!r}")
        stats.check_bounded(ci_bounded)
        if timers not in TIMER_MODES:
            raise ValueError(f"timers must be one of {TIMER_MODES}, got {timers!r}")
        cleaning.check_judgment_policy(judgment_conflicts, "judgment_conflicts")
        self.grade_range = _ordered_pair(grade_range, "grade_range")
        self.time_range = _ordered_pair(time_range, "time_range")
        self.judgments = judgments
        self.clicks = clicks
        spec = WindowSpec.parse(window, max_windows_per_record)
        ranking = judgments is not None
        if ranking and not metrics:
            raise ValueError("metrics are required with judgments")
        if not ranking and not ctr:
            raise ValueError("nothing to compute: no judgments and ctr=False")
        sr = ranking_setup(metrics or ["P@1"], relevance_level=relevance_level, gain=gain, ideal=ideal,
                           err_max_grade=err_max_grade, order=order, tie_break=tie_break, depth=depth,
                           score_precision=score_precision)
        if ranking:
            self.grade_range = judgment_grade_range(self.grade_range, sr.specs, sr.options)
        lateness = parse_duration(allowed_lateness, "allowed_lateness", allow_zero=True)
        early_seconds = None if early_every in (None, 0, "0", "none") else \
            parse_duration(early_every, "early_every") / 1e6
        if early_count is not None and int(early_count) < 1:
            raise ValueError("early_count must be positive")
        if request_shards < 0:
            raise ValueError("request_shards must be 0 (one key per request) or positive")
        window_us = spec.size
        self.cfg = _Config(
            spec=spec, lateness=lateness,
            delay=parse_duration(attribution_delay, "attribution_delay", allow_zero=True),
            retention=parse_duration(retention, "retention") if retention else max(window_us, lateness, 1),
            early_seconds=early_seconds, early_count=int(early_count) if early_count else None,
            ranking=ranking, ctr=bool(ctr), specs=list(sr.specs) if ranking else [], options=sr.options, ops=sr.ops,
            slice_specs=parse_slices(slices), attr_keys=sorted({n for s in parse_slices(slices) for n in s}),
            shards=int(request_shards), clock=clock,
            cleanup=spec.period if spec.windowed else spec.size,
            run=uuid.uuid4().hex, policy=judgment_conflicts, ci_level=stats.check_level(ci_level),
            intervals=intervals, click_events=clicks is not None, bounded=ci_bounded,
            timer_per_deadline=timers == "per_deadline")
        # the dead-letter source of records that come without their file (see prepare.file_records)
        self.sources = {k: str(source.get(k, "stream") if isinstance(source, dict) else source)
                        for k in ("impressions", "judgments", "clicks")}
        self.panes = None
        self.side = None

    def expand(self, impressions):
        cfg = self.cfg
        gate = cfg.spec.windowed
        gate_shards = cfg.shards or GATE_SHARDS

        def keyed(pc, key_type):
            # the key coder of a stateful stage comes from its input's element type
            pc.element_type = typehints.Tuple[key_type, typehints.Any]
            return pc

        pieces = [impressions | "PrepareImpressions" >> beam.ParDo(
            _PrepareImpressions(self.sources["impressions"], cfg.spec if gate else None, cfg.shards, cfg.run, gate_shards,
                                self.time_range))]
        if self.clicks is not None:
            pieces.append(self.clicks | "PrepareClicks" >> beam.ParDo(
                _PrepareClicks(self.sources["clicks"], cfg.spec if gate else None, cfg.shards, cfg.run, gate_shards,
                               self.time_range)))
        to_queries = []
        if cfg.ranking:
            jud = self.judgments | "PrepareJudgments" >> beam.ParDo(
                _PrepareJudgments(self.sources["judgments"], gate, cfg.run, self.grade_range, gate_shards)).with_outputs("gate", main="queries")
            to_queries.append(jud.queries)
            if gate:
                pieces.append(jud.gate)
        def flattened(pcs, key_type, label):
            # every input typed as the output: Prism 2.62 rewrites a Flatten input's differing coder id
            # into the output's wherever it is used (Beam's shared pickled coder then became a key-value
            # coder of itself, and Prism overflowed its stack decoding it)
            if len(pcs) == 1:
                return pcs[0]
            return keyed(tuple(keyed(pc, key_type) for pc in pcs) | label >> beam.Flatten(), key_type)

        merged = flattened(pieces, int if gate else (str if cfg.shards == 0 else int), "AllPieces")
        if gate:
            gated = keyed(merged, int) | "Gate" >> beam.ParDo(
                _GateFn(cfg.spec, cfg.lateness, cfg.shards, cfg.run)).with_outputs("queries", main="shards")
            merged = gated.shards
            to_queries.append(gated.queries)
        reqs = keyed(merged, str if cfg.shards == 0 else int) | "Requests" >> beam.ParDo(_RequestsFn(cfg)).with_outputs("queries", main="systems")
        to_systems = [reqs.systems]
        if cfg.ranking:
            q_in = flattened(to_queries + [reqs.queries], str, "ToQueries")
            to_systems.append(keyed(q_in, str) | "Queries" >> beam.ParDo(_QueriesFn(cfg)))
        agg_fn = _AggregateFn(_WindowAggregate(cfg) if gate else _SessionAggregate(cfg))
        agg_in = flattened(to_systems, str, "ToSystems")
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

    def accounting(self, unreadable=None, counts=None, carried: str | None = None):
        """``(summary, problems)`` of :func:`streameval.beam.accounting.account` on
        :meth:`counts` (or ``counts``); ``carried``: whether the windows' state may cross a savepoint
        (``"stop"``, ``"resume"`` or None: see ``account``)."""
        from ..accounting import account

        return account(self.counts() if counts is None else counts, ranking=self.cfg.ranking, ctr=self.cfg.ctr,
                       unreadable=unreadable, carried=carried)

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
            is_late = (lambda r: r["source"].startswith(cn.LATE_PREFIX))
            keep = is_late if which == "late" else (lambda r: not is_late(r))
            cache[which] = self.side | f"{self.label}/{which.capitalize()}Records" >> beam.Filter(keep)
        return cache[which]
