"""PTransforms users compose: validation, ranking metrics against judgments, click metrics.

* :class:`ValidateImpressions` / :class:`ValidateJudgments` split records into valid ones and dead
  letters (``{"source", "raw", "reason"}``, the dead_letter schema).
* :class:`ScoreRankings`: ``impressions | ScoreRankings(judgments, metrics, ...)`` gives metric rows
  (metric_result dicts), one per (window, slice, system, metric).
* :class:`ClickMetrics`: ``impressions | ClickMetrics(...)`` gives CTR rows.

All metric values come from :func:`streameval.metrics.kernel.compute` through the layer-2
accumulators (:mod:`streameval.beam.combiners`); nothing here defines a metric.

Counters (Beam metrics, namespace :data:`NAMESPACE`): ``impressions_valid``, ``judgments_valid``,
``rejected:<kind>:<reason>`` (one per reason category), ``requests_scored``, ``requests_unjudged``,
``requests_completed`` (judged queries filled with zeros under ``complete``),
``impressions_unscorable`` (no score under ``order="score"``), ``click_impressions``.
"""

from __future__ import annotations

import logging

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from ..accumulators.ranking import RankingOps, RankingState, ranking_setup
from ..io import cleaning, records
from ..io import counters as cn
from ..io.counters import NAMESPACE  # noqa: F401 (re-exported: its former home)
from ..metrics.kernel import MetricOptions, compute, usable_grade_limit
from ..metrics import stats
from ..metrics.prepare import DEFAULT_SCORE_PRECISION
from .combiners import CtrByPositionCombineFn, MeanCombineFn, RankingStateCombineFn, RequestAccumulator
from .keys import (  # noqa: F401 (re-exported: the window and slice keys' former home)
    MAX_WINDOWS_PER_RECORD,
    ALL, MISSING, SLICE_MISSING, keep_slice_row, label_has_missing, parse_lateness, parse_slices,
    parse_window, reason_key, slice_labels, slice_part, slide_keys, sliding_windows, window_bounds)
from .stats import BootstrapMeanCombineFn
from ..io.dead_letters import dead_letter

__all__ = [
    "NAMESPACE",
    "MISSING",
    "ValidateImpressions",
    "ValidateJudgments",
    "CleanImpressions",
    "ResolveJudgments",
    "ScoreRankings",
    "ClickMetrics",
    "JudgmentsCombineFn",
    "parse_window",
    "parse_lateness",
    "parse_slices",
    "slice_labels",
    "label_has_missing",
    "keep_slice_row",
    "SLICE_MISSING",
    "slice_part",
    "window_bounds",
    "sliding_windows",
    "slide_keys",
    "reason_key",
]

#: the dead-letter ``source`` of a request that cannot be ranked (its impressions are accepted, so the
#: accounting counts it apart from rejected records): the same on both engines and in the stream
SOURCE_UNRANKABLE = "ScoreRankings"


# --------------------------------------------------------------------------------------------
# small helpers

def judgment_grade_range(declared, specs, options: MetricOptions):
    """The grade range a job's judgment checks enforce (:func:`streameval.io.records.grade_range_for`):
    the ``declared`` one (``--grades``, or None) narrowed to the grades the metric ``specs`` can
    score under ``options`` (ERR's ``err_max_grade``; 1023 with the exponential gain), so that a
    judgment they cannot use is a dead letter with its reason, the same on every engine."""
    return records.grade_range_for(declared, usable_grade_limit(specs, options))


# the rows' shape and constructor live in the metrics layer (the library's evaluate_log uses them too)
from ..metrics.rows import ROW_FIELDS, metric_row  # noqa: E402,F401  (re-exported: their former home)
from ..metrics.rows import click_rows as _click_rows  # noqa: E402,F401
from ..metrics.rows import nan_to_none as _nan_to_none  # noqa: E402,F401


# --------------------------------------------------------------------------------------------
# validation

class _ValidateFn(beam.DoFn):
    def __init__(self, kind: str, source: str, grade_range=None, time_range=None):
        self.kind = kind
        self.time_range = time_range
        self.source = source
        self.grade_range = records.as_grade_range(grade_range)
        self.valid = Metrics.counter(NAMESPACE, cn.valid(kind))

    def process(self, element):
        source = self.source
        if isinstance(element, tuple):  # (path, record) from ReadAvro(with_file=True): name the file
            source, rec = element
        else:
            rec = element
        if self.kind == "impression":
            reason = records.check_impression(rec, self.time_range)
        else:
            reason = records.check_judgment(rec, self.grade_range)
        if reason is None:
            self.valid.inc()
            yield rec
            return
        Metrics.counter(NAMESPACE, cn.rejected(self.kind, reason_key(reason))).inc()
        yield pvalue.TaggedOutput("dead_letters", dead_letter(source, rec, reason))


class _Validate(beam.PTransform):
    kind = ""

    def __init__(self, source: str, label: str | None = None, grade_range=None, time_range=None):
        super().__init__(label)
        self.source = str(source)
        self.grade_range = grade_range
        self.time_range = time_range

    def expand(self, pcoll):
        return pcoll | "Check" >> beam.ParDo(_ValidateFn(self.kind, self.source, self.grade_range,
                                                         self.time_range)).with_outputs(
            "dead_letters", main="valid")


class ValidateImpressions(_Validate):
    """``valid, dead = records | ValidateImpressions(source)``: impressions passing
    :func:`streameval.io.records.check_impression`, and dead letters ``{source, raw, reason}``
    (also ``result.valid`` / ``result.dead_letters``). An element may be a record or a
    ``(path, record)`` pair (:class:`~streameval.beam.sources.ReadAvro` with ``with_file``): then the
    dead letter's ``source`` is that path and the valid output holds the record alone. ``time_range=(lo, hi)`` (inclusive micros,
    :func:`streameval.io.records.parse_time_range`): timestamps outside are dead letters too."""

    kind = "impression"


class ValidateJudgments(_Validate):
    """As :class:`ValidateImpressions` for judgments (:func:`~streameval.io.records.check_judgment`;
    ``grade_range=(lowest, highest)`` rejects grades outside the declared range)."""

    kind = "judgment"


# --------------------------------------------------------------------------------------------
# repeated and conflicting records (rules: streameval.io.cleaning)

def _category(reason: str) -> str:
    """The counter category of a cleaning reason: the constant before its parenthesised details."""
    return reason.split(" (", 1)[0]


class _CleanRequestFn(beam.DoFn):
    def __init__(self, source: str, window_micros=None, lateness_micros: int | None = None):
        self.source = source
        self.window_micros = window_micros
        self.lateness_micros = None if lateness_micros is None else int(lateness_micros)  # None: no limit
        self.accepted = Metrics.counter(NAMESPACE, cn.IMPRESSIONS_ACCEPTED)
        self.duplicates = Metrics.counter(NAMESPACE, cn.DUPLICATE_IMPRESSION)
        self.late = Metrics.counter(NAMESPACE, cn.LATE_IMPRESSION)

    def process(self, element):
        _, recs = element
        w, lat = self.window_micros, self.lateness_micros
        kept, late = cleaning.split_after_close(
            list(recs), None if w is None or lat is None else (lambda t0: cleaning.request_close(t0, w, lat)))
        kept, n_dup, rejected = cleaning.clean_request(kept)
        self.duplicates.inc(n_dup)
        self.accepted.inc(len(kept))
        self.late.inc(len(late))
        for rec, reason in rejected:
            Metrics.counter(NAMESPACE, cn.rejected("impression", _category(reason))).inc()
            yield pvalue.TaggedOutput("dead_letters", dead_letter(self.source, rec, reason))
        for rec, reason in late:  # as the streaming job's late data (docs/metrics.md, "Windows")
            yield pvalue.TaggedOutput("dead_letters", dead_letter(cn.LATE_IMPRESSION, rec, reason))
        yield from kept


class CleanImpressions(beam.PTransform):
    """``clean, dead = impressions | CleanImpressions(source)``: replayed events removed, conflicting
    ones and items served twice in a request rejected (rules of :func:`streameval.io.cleaning.clean_request`).

    Groups the (valid) impressions by ``(system_id, request_id)``. Counters ``impressions_accepted``,
    ``duplicate:impression``, ``rejected:impression:<reason>``; ``dead`` holds dead letters
    ``{source, raw, reason}``. Apply it before :class:`ScoreRankings`, :class:`ClickMetrics` and the
    online metrics so that a replayed impression changes no metric.

    With ``window`` (fixed windows, as the scoring transforms'): a request belongs to the window of
    its earliest impression. By default (``allowed_lateness`` None or ``"unlimited"``) every record
    is on time, as a batch job's whole input is: all of a request's impressions count in that window.
    With ``allowed_lateness`` (seconds or text such as ``"45m"``, or 0) its impressions at or after
    that window's end plus the lateness are late data, as in the streaming job with that lateness: dead letters with source ``late:impression`` and the reason, counted
    ``late:impression`` (:func:`streameval.io.cleaning.split_after_close`). With ``every`` (sliding
    windows, :func:`sliding_windows`) the window is the sub-window of the period: the end of the first
    sliding window holding the request, as in the streaming job.
    """

    def __init__(self, source: str = "CleanImpressions", label: str | None = None, window=None,
                 allowed_lateness=None, every=None, max_windows_per_record=MAX_WINDOWS_PER_RECORD):
        super().__init__(label)
        self.source = str(source)
        self.window_micros = sliding_windows(window, every, max_windows_per_record)[0]
        self.lateness_micros = parse_lateness(allowed_lateness)

    def expand(self, impressions):
        return (impressions
                | "KeyByRequest" >> beam.Map(lambda r: ((r["system_id"], r["request_id"]), r))
                | "GroupRequests" >> beam.GroupByKey()
                | "Clean" >> beam.ParDo(_CleanRequestFn(self.source, self.window_micros, self.lateness_micros))
                .with_outputs("dead_letters", main="clean"))


class _ResolveJudgmentFn(beam.DoFn):
    def __init__(self, policy: str, source: str):
        self.policy = policy
        self.source = source
        self.accepted = Metrics.counter(NAMESPACE, cn.JUDGMENTS_ACCEPTED)
        self.duplicates = Metrics.counter(NAMESPACE, cn.DUPLICATE_JUDGMENT)
        self.superseded = Metrics.counter(NAMESPACE, cn.SUPERSEDED_JUDGMENT)
        self.rejected = Metrics.counter(NAMESPACE, cn.rejected("judgment", cleaning.REASON_JUDGMENT_CONFLICT))

    def process(self, element):
        qid, recs = element
        by_item: dict = {}
        for j in recs:  # a judgment with a subtopic is one of (query, subtopic, item): its own key
            key = (int(j.get("timestamp") or 0), int(j["grade"]))
            entries, first = by_item.setdefault((j["item_id"], j.get("subtopic")), ({}, {}))
            entries[key] = entries.get(key, 0) + 1
            first.setdefault(key, j)
        n_dup = n_sup = n_acc = 0
        for (item, subtopic), (entries, first) in by_item.items():
            if len(entries) == 1:
                (key, count), = entries.items()
                n_dup += count - 1
                n_acc += 1
                yield first[key]
                continue
            grade, dup, superseded, rejected = cleaning.resolve_judgment(entries, self.policy)
            n_dup += dup
            n_sup += len(superseded)
            grades = sorted({g for _, g in entries})
            for key in rejected:
                self.rejected.inc()
                yield pvalue.TaggedOutput("dead_letters", dead_letter(
                    self.source, first[key],
                    f"{cleaning.REASON_JUDGMENT_CONFLICT} ({conflict_key(qid, subtopic, item)}: grades "
                    f"{grades}; policy reject)"))
            if grade is not None:
                n_acc += 1
                yield first[next(k for k in entries if k not in superseded)]
        self.duplicates.inc(n_dup)
        self.superseded.inc(n_sup)
        self.accepted.inc(n_acc)


def conflict_key(qid, subtopic, item) -> str:
    """The key of a judgment conflict as its dead letter's reason names it (both engines)."""
    if subtopic is None:
        return f"query {qid!r}, item {item!r}"
    return f"query {qid!r}, subtopic {subtopic!r}, item {item!r}"


class ResolveJudgments(beam.PTransform):
    """``judgments, dead = judgments | ResolveJudgments(policy)``: one judgment per (query, item),
    or per (query, subtopic, item) for a judgment with a ``subtopic`` (judgment schema version 2):
    judgments of different subtopics are not conflicts.

    ``policy``: ``"latest"`` (default), ``"max"`` or ``"reject"``
    (:func:`streameval.io.cleaning.resolve_judgment`). Counters ``judgments_accepted``,
    ``duplicate:judgment``, ``superseded:judgment``, ``rejected:judgment:<reason>``; rejected
    judgments are dead letters ``{source, raw, reason}``.
    """

    def __init__(self, policy: str = "latest", source: str = "ResolveJudgments", label: str | None = None):
        super().__init__(label)
        cleaning.check_judgment_policy(policy)
        self.policy = policy
        self.source = str(source)

    def expand(self, judgments):
        return (judgments
                | "KeyByQuery" >> beam.Map(lambda j: (j["query_id"], j))
                | "GroupQueries" >> beam.GroupByKey()
                | "Resolve" >> beam.ParDo(_ResolveJudgmentFn(self.policy, self.source)).with_outputs(
                    "dead_letters", main="judgments"))


# --------------------------------------------------------------------------------------------
# judgments per query

class JudgmentsCombineFn(beam.CombineFn):
    """The judged dict of one query from its judgment dicts.

    Accumulator ``{item_id: [timestamp, grade]}``; of two judgments of the same item the later
    (larger ``timestamp``) supersedes the earlier (judgment.avsc), equal timestamps keep the larger
    grade, so the result does not depend on arrival order. Output: ``{item_id: float grade}``.
    """

    def create_accumulator(self):
        return {}

    @staticmethod
    def _put(acc, item, ts, grade):
        old = acc.get(item)
        if old is None or (ts, grade) > (old[0], old[1]):
            acc[item] = [ts, grade]

    def add_input(self, acc, j):
        self._put(acc, j["item_id"], int(j.get("timestamp") or 0), float(j["grade"]))
        return acc

    def merge_accumulators(self, accumulators):
        accs = iter(accumulators)
        out = next(accs, None)
        if out is None:
            return {}
        out = dict(out)
        for a in accs:
            for item, (ts, g) in a.items():
                self._put(out, item, ts, g)
        return out

    def extract_output(self, acc):
        return {item: g for item, (ts, g) in acc.items()}

    def get_accumulator_coder(self):
        from apache_beam.coders import FastPrimitivesCoder

        return FastPrimitivesCoder()


class QueryJudgmentsCombineFn(JudgmentsCombineFn):
    """As :class:`JudgmentsCombineFn`, with subtopic judgments: the accumulator's key is the item
    (ad hoc judgment) or ``(item, subtopic)``. Output ``(judged, subtopics)``: ``judged`` =
    ``{item_id: grade}``, the ad hoc grade of an item being the largest of its judgments (ad hoc and
    of every subtopic; docs/metrics.md, "Diversity measures in the batch job"); ``subtopics`` = the
    sorted list of ``(subtopic, item_id, grade)``."""

    def add_input(self, acc, j):
        sub = j.get("subtopic")
        self._put(acc, j["item_id"] if sub is None else (j["item_id"], sub), int(j.get("timestamp") or 0),
                  float(j["grade"]))
        return acc

    def extract_output(self, acc):
        judged: dict = {}
        subs = []
        for key, (ts, g) in acc.items():
            item = key
            if isinstance(key, tuple):
                item = key[0]
                subs.append((key[1], key[0], g))
            old = judged.get(item)
            judged[item] = g if old is None else max(old, g)
        return judged, sorted(subs)


# --------------------------------------------------------------------------------------------
# ranking metrics

class _ScoreQueries(beam.DoFn):
    """One query at a time: all its requests (all systems, windows) scored in one kernel call."""

    def __init__(self, ops: RankingOps, specs, options: MetricOptions, slice_specs, window_micros,
                 complete: bool):
        self.ops = ops
        self.specs = specs
        self.options = options
        self.slice_specs = slice_specs
        self.window_micros = window_micros
        self.complete = complete and window_micros is None
        self.scored = Metrics.counter(NAMESPACE, cn.REQUESTS_SCORED)
        self.unjudged = Metrics.counter(NAMESPACE, cn.REQUESTS_UNJUDGED)
        self.completed = Metrics.counter(NAMESPACE, cn.REQUESTS_COMPLETED)
        self.queries = Metrics.counter(NAMESPACE, cn.QUERIES_SCORED)
        self.unscorable = Metrics.counter(NAMESPACE, cn.IMPRESSIONS_UNSCORABLE)
        self.imp_ranked = Metrics.counter(NAMESPACE, cn.IMPRESSIONS_RANKED)
        self.imp_unjudged = Metrics.counter(NAMESPACE, cn.IMPRESSIONS_UNJUDGED)
        self.imp_unrankable = Metrics.counter(NAMESPACE, cn.IMPRESSIONS_UNRANKABLE)

    def process(self, element, systems=()):
        qid, groups = element
        reqs = list(groups["requests"])
        judged_parts = list(groups["judged"])
        if not judged_parts:
            for system, request_id, acc in reqs:
                a = RequestAccumulator._make(acc)
                self.unjudged.inc()
                self.imp_unjudged.inc(a.records)
                ws, we = window_bounds(RankingState._make(a.ranking_state).min_timestamp, self.window_micros)
                yield pvalue.TaggedOutput("unjudged", {"query_id": qid, "system": system, "request_id": request_id,
                                                       "window_start": ws, "impressions": a.records})
            return
        if len(judged_parts) == 1:
            judged, subtopics = judged_parts[0]
        else:  # not expected after CombinePerKey, but harmless
            judged, subtopics = {}, []
            for part, subs in judged_parts:
                judged.update(part)
                subtopics.extend(subs)
        states, keys = [], []
        present = set()
        n_scored = 0
        for system, request_id, acc in reqs:
            a = RequestAccumulator._make(acc)
            st = RankingState._make(a.ranking_state)
            missing = self.ops.unrankable(a.ranking_state)
            if missing:
                # only requests that would be scored need scores; unjudged ones went out above
                self.unscorable.inc(missing)
                self.imp_unrankable.inc(a.records)
                yield pvalue.TaggedOutput("rejected", dead_letter(
                    SOURCE_UNRANKABLE,
                    {"query_id": qid, "system_id": system, "request_id": request_id,
                     "impressions": len(st.served), "without_score": missing},
                    f"{missing} of the request's {len(st.served)} impressions have no score: "
                    "order='score' needs a finite score to rank them (use order='position')"))
                continue
            states.append(list(st._replace(judged=judged)))
            ws, we = window_bounds(st.min_timestamp, self.window_micros)
            keys.append((ws, we, system, slice_labels(a.attributes, self.slice_specs)))
            present.add(system)
            n_scored += 1
            self.imp_ranked.inc(a.records)
        self.scored.inc(n_scored)
        if self.complete:
            for system in sorted(set(systems) - present):
                states.append(list(RankingState._make(self.ops.create())._replace(judged=judged)))
                keys.append((None, None, system, [ALL]))
                self.completed.inc()
        if not states:
            return
        self.queries.inc()
        values = self._values(qid, states, subtopics)
        cols = values.T.tolist()
        for (ws, we, system, labels), col in zip(keys, cols):
            for label in labels:
                yield ((ws, we, label, system), (qid, col))


    def _values(self, qid, states, subtopics) -> np.ndarray:
        """(n_metrics, n_states) values: the kernel's for the ad hoc specs, diversity's
        :func:`~streameval.metrics.diversity.request_values` for the diversity specs (the items of
        each state in rank order against the query's subtopic judgments)."""
        return score_values(self.specs, self.options, lambda specs: compute(self.ops.to_lists(states), specs,
                                                                            self.options),
                            lambda: _ranked_items(self.ops, states, qid), subtopic_columns(qid, subtopics))


def _by_query(kv):
    """``((system, request_id), accumulator)`` -> ``(query_id, (system, request_id, accumulator))``."""
    (system, request_id), acc = kv
    return RequestAccumulator._make(acc).query_id, (system, request_id, acc)


def _ranked_items(ops, states, qid):
    ranked = [ops.ranked(st)[0] if RankingState._make(st).served else [] for st in states]
    offsets = np.zeros(len(ranked) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in ranked], out=offsets[1:])
    return [qid] * len(ranked), offsets, [it for r in ranked for it in r]


def subtopic_columns(qid, subtopics):
    """(query, subtopic, item, grade) columns of one query's ``(subtopic, item, grade)`` list."""
    n = len(subtopics)
    return ([qid] * n, [s for s, _, _ in subtopics], [d for _, d, _ in subtopics],
            np.fromiter((g for _, _, g in subtopics), dtype=np.float64, count=n))


def score_values(specs, options: MetricOptions, adhoc, rankings, judgments) -> np.ndarray:
    """(len(specs), n) values of a batch of rankings, in ``specs`` order: ``adhoc(specs)`` gives the
    kernel's values of the ad hoc specs; the diversity specs are scored by
    :func:`~streameval.metrics.diversity.request_values` on ``rankings()`` = (query per ranking,
    offsets, items in rank order) and ``judgments`` = (query, subtopic, item, grade) columns of the
    subtopic judgments (``relevance_level`` of ``options`` unless the name sets ``rel``). Both
    engines score through this function."""
    from ..metrics import diversity
    from ..metrics.names import is_diversity

    div = [i for i, s in enumerate(specs) if is_diversity(s)]
    if not div:
        return adhoc(specs)
    rest = [i for i in range(len(specs)) if i not in set(div)]
    rq, offsets, items = rankings()
    out = np.zeros((len(specs), len(offsets) - 1), dtype=np.float64)
    if rest:
        out[rest] = adhoc([specs[i] for i in rest])
    out[div] = diversity.request_values([diversity.spec_of(specs[i]) for i in div], rq, offsets, items, *judgments,
                                        relevance_level=options.relevance_level)
    return out


def empty_ranking_values(specs, options: MetricOptions, lists, n: int) -> np.ndarray:
    """(len(specs), n) values of ``n`` empty rankings (``complete``: a query with judgments that a
    system did not serve): the kernel's on ``lists`` (``RankedLists`` without served items);
    diversity measures 0. The columnar engine's completion and its hot queries' use it."""
    return score_values(specs, options, lambda sp: compute(lists, sp, options),
                        lambda: ([""] * n, np.zeros(n + 1, dtype=np.int64), []), ([], [], [], np.zeros(0)))


def _rows(element, names, level, bounded="logit"):
    (ws, we, label, system), results = element
    for name, (value, n, se) in zip(names, results):
        yield metric_row(ws, we, label, system, name, value, n, se,
                         **stats.row_interval(name, value, n, se, level, bounded=bounded))


def _bootstrap_rows(element, names):
    (ws, we, label, system), results = element
    for name, fields in zip(names, results):
        yield metric_row(ws, we, label, system, name, **fields)


class ScoreRankings(beam.PTransform):
    """``impressions | ScoreRankings(judgments, metrics, ...)`` -> metric rows (metric_result dicts).

    One row per (window, slice, system, metric): ``value`` is the mean over the requests (for
    num_ret / num_rel / num_rel_ret the total, as trec_eval prints them), ``num_queries`` the number
    of requests averaged, ``stderr`` the standard error of the mean (None for totals or one request).

    A request is the set of impressions sharing (system_id, request_id); its query, attributes and
    earliest timestamp come from its impressions; it belongs to the fixed, epoch-aligned window of
    ``window`` seconds (or text such as ``"1h"``) holding its earliest impression, or to the global
    window (``window_start``/``window_end`` None) when ``window`` is None. With ``every`` (sliding
    windows of ``window`` starting every ``every``, :func:`sliding_windows`) a request counts in each
    window holding its earliest impression: its values are summed per sub-window of the period and
    the sub-windows' sums merged (:func:`slide_keys`); ``self.unjudged``'s ``window_start`` is then
    its sub-window's start. A record counts in at most ``max_windows_per_record`` windows (default
    1,000; more is a ValueError naming the count: :func:`~streameval.beam.keys.check_windows_per_record`),
    here and in :class:`CleanImpressions` and :class:`ClickMetrics`.

    ``slices``: attribute names or comma-joined combinations; each request is counted in slice
    ``"all"`` and in one slice per specification (``"campaign=men"``, ``"campaign=men,device=pc"``,
    ``"(missing)"`` for an absent attribute).

    Metric options are those of :func:`streameval.api.evaluate` (``relevance_level``, ``gain``,
    ``ideal``, ``err_max_grade``, ``depth``; ``order`` / ``tie_break`` / ``score_precision`` of
    :class:`RankingOps`).
    ``complete=True`` (trec_eval ``-c``) applies to the global window only (ignored with
    ``window``): every judged query without a request from a system (systems seen in the
    impressions) scores 0 on every metric but num_rel for that system, in slice ``"all"``.

    Requests whose query has no judgment are not scored (counter ``requests_unjudged``);
    impressions without a score under ``order="score"`` are dropped (counter
    ``impressions_unscorable``). After the transform is applied, ``self.unjudged`` holds those
    requests (``{query_id, system, request_id, window_start}``) and ``self.rejected`` the dropped
    impressions as dead letters.
    """

    def __init__(self, judgments, metrics, window=None, slices=(), relevance_level=1, gain="linear",
                 ideal="judgments", err_max_grade=4, order="score", tie_break="docno", depth=None,
                 complete=False, score_precision=DEFAULT_SCORE_PRECISION, ci="t", ci_level=stats.DEFAULT_LEVEL,
                 replicates=200, ci_seed=0, every=None, max_windows_per_record=MAX_WINDOWS_PER_RECORD, label=None,
                 ci_bounded="logit"):
        super().__init__(label)
        if ci not in ("t", "bootstrap"):
            raise ValueError("ci must be 't' or 'bootstrap'")
        stats.check_bounded(ci_bounded)
        self.ci = ci
        self.ci_bounded = ci_bounded
        self.ci_level = float(ci_level)
        self.replicates = int(replicates)
        self.ci_seed = int(ci_seed)
        self.scores = None
        self.judgments = judgments
        setup = ranking_setup(metrics, relevance_level=relevance_level, gain=gain, ideal=ideal,
                              err_max_grade=err_max_grade, order=order, tie_break=tie_break, depth=depth,
                              score_precision=score_precision)
        self.specs, self.options, self.ops = list(setup.specs), setup.options, setup.ops
        self.order = order
        self.window_micros, self.slide = sliding_windows(window, every, max_windows_per_record)
        self.slice_specs = parse_slices(slices)
        self.complete = bool(complete)
        if self.complete and self.window_micros is not None:
            logging.getLogger(__name__).warning(
                "ScoreRankings: complete=True applies to the global window only; ignored with window=%r", window)
        self.unjudged = None
        self.rejected = None

    def expand(self, impressions):
        attr_keys = sorted({n for names in self.slice_specs for n in names})
        requests = (
            impressions
            | "KeyByRequest" >> beam.Map(lambda r: ((r["system_id"], r["request_id"]), r))
            | "CombineRequests" >> beam.CombinePerKey(RankingStateCombineFn(self.ops, attr_keys))
        )
        by_query = requests | "KeyByQuery" >> beam.Map(_by_query)
        judged = (
            self.judgments
            | "KeyJudgments" >> beam.Map(lambda j: (j["query_id"], j))
            | "CombineJudgments" >> beam.CombinePerKey(QueryJudgmentsCombineFn())
        )
        grouped = {"requests": by_query, "judged": judged} | "JoinJudgments" >> beam.CoGroupByKey()
        extra = {}
        if self.complete and self.window_micros is None:
            systems = (requests | "Systems" >> beam.Map(lambda kv: kv[0][0])
                       | "DistinctSystems" >> beam.Distinct())
            extra["systems"] = beam.pvalue.AsList(systems)
        scored = grouped | "ScoreQueries" >> beam.ParDo(
            _ScoreQueries(self.ops, self.specs, self.options, self.slice_specs, self.window_micros,
                          self.complete), **extra).with_outputs("unjudged", "rejected", main="scores")
        self.unjudged = scored.unjudged
        self.rejected = scored.rejected
        # per-query scores ((window_start, window_end, slice, system), (query_id, [value per metric])),
        # e.g. for streameval.beam.stats.CompareSystems
        self.scores = scored.scores
        if self.slide is not None:  # a sub-window's scores in each sliding window holding it
            self.scores = scored.scores | "SlidingWindows" >> beam.FlatMap(slide_keys, self.slide)
        names = [s.name for s in self.specs]
        totals = [s.is_count for s in self.specs]
        if self.ci == "bootstrap":
            return (
                self.scores
                | "Means" >> beam.CombinePerKey(BootstrapMeanCombineFn(len(self.specs), self.replicates,
                                                                       self.ci_level, self.ci_seed, totals))
                | "Rows" >> beam.FlatMap(_bootstrap_rows, names)
            )
        return (
            self.scores
            | "DropQueryIds" >> beam.Map(lambda kv: (kv[0], kv[1][1]))
            | "Means" >> beam.CombinePerKey(MeanCombineFn(len(self.specs), totals))
            | "Rows" >> beam.FlatMap(_rows, names, self.ci_level, self.ci_bounded)
        )


# --------------------------------------------------------------------------------------------
# click metrics

def _click_keys(rec, window_micros, slice_specs):
    ws, we = window_bounds(rec["timestamp"], window_micros)
    value = (rec["position"], bool(rec["clicked"]))
    system = rec["system_id"]
    return [((ws, we, label, system), value) for label in slice_labels(rec.get("attributes"), slice_specs)]


class ClickMetrics(beam.PTransform):
    """``impressions | ClickMetrics(window=None, slices=())`` -> rows for ``"ctr"`` and
    ``"ctr@pos{p}"`` per (window, slice, system). Each impression counts in the window of its own
    timestamp; impressions whose ``clicked`` is null (clicks not logged) are skipped and counted
    (``click_impressions_not_logged``); ``num_queries`` holds the number of impressions, ``stderr`` the binomial standard
    error. ``window``, ``every`` (sliding windows: an impression counts in each window holding its
    timestamp) and ``slices`` as in :class:`ScoreRankings`."""

    def __init__(self, window=None, slices=(), ci_level=stats.DEFAULT_LEVEL, every=None,
                 max_windows_per_record=MAX_WINDOWS_PER_RECORD, label=None):
        super().__init__(label)
        self.ci_level = float(ci_level)
        self.window_micros, self.slide = sliding_windows(window, every, max_windows_per_record)
        self.slice_specs = parse_slices(slices)

    def expand(self, impressions):
        counted = Metrics.counter(NAMESPACE, cn.CLICK_IMPRESSIONS)

        no_clicks = Metrics.counter(NAMESPACE, cn.CLICK_IMPRESSIONS_NOT_LOGGED)

        def keys(rec, window_micros, slice_specs):
            if rec.get("clicked") is None:  # clicks not logged (e.g. a TREC run): not an impression for CTR
                no_clicks.inc()
                return []
            counted.inc()
            return _click_keys(rec, window_micros, slice_specs)

        keyed = impressions | "KeyClicks" >> beam.FlatMap(keys, self.window_micros, self.slice_specs)
        if self.slide is not None:  # an impression in each sliding window holding its timestamp
            keyed = keyed | "SlidingWindows" >> beam.FlatMap(slide_keys, self.slide)
        return (
            keyed
            | "CombineClicks" >> beam.CombinePerKey(CtrByPositionCombineFn(overall=True))
            | "ClickRows" >> beam.FlatMap(_click_rows, self.ci_level)
        )
