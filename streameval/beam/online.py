"""Online metrics in Beam: CombineFns over :mod:`streameval.accumulators.online` and the
PTransforms users compose.

* :class:`OnlineMetrics`: ``impressions | OnlineMetrics(metrics=["auc", "gauc[user]", "ctr",
  "clicks@3", "rr_first_click", "abandonment"], window="1d", slices=["campaign"])`` gives metric
  rows (``schemas/metric_result.avsc`` dicts, built by :func:`~streameval.beam.transforms.metric_row`)
  keyed by (window, slice, system, metric).
* :class:`LabelFromJudgments`: labels impressions with ``grade >= relevance_level`` from judgments
  (for AUC on judged data such as a learning-to-rank sample).
* :class:`OffPolicyCtr`: ``impressions | OffPolicyCtr(target, "random")`` gives the IPS and SNIPS
  estimates of a target policy's CTR from the logging policy's propensities (``slates=True``: also
  the slate estimators over requests, :mod:`streameval.beam.online_slate`).

CombineFns (inputs -> output; accumulators are plain lists / dicts, FastPrimitivesCoder):
:class:`AucCombineFn` ``(score, label)`` -> ``(auc, n, stderr)``; :class:`GroupAucCombineFn`
``(score, label)`` -> ``(auc, n_pos, n_neg, stderr)``; :class:`HistAucCombineFn` ``(score, label)``
-> ``(auc, n, stderr, max_error)``; :class:`GaucCombineFn` ``(auc, n_pos, n_neg)`` ->
``([(gauc, groups, stderr) per weighting], groups_excluded)``; :class:`ClickRequestCombineFn`
impression dicts -> the request's state; :class:`OpeCombineFn` ``(reward, target_prob,
logging_prob)`` -> ``{"ips", "snips", "mean_weight", "ess"}``; :class:`CalibrationCombineFn`
``(probability, label)`` -> :meth:`~streameval.accumulators.online.CalibrationOps.extract`'s dict.

Counters (namespace ``streameval``): ``online:no_score`` (impressions without a score, left out of
score-based metrics), ``online:not_labelled`` (``clicked`` null under ``labels="clicks"``),
``online:unjudged`` (no judgment under ``labels="judgments"``), ``online:score_not_probability``
(labelled impressions whose score is outside [0, 1], left out of the calibration metrics), ``online:no_group:<field>``
(GAUC group id missing), ``online:requests`` and ``online:requests_not_logged`` (requests whose
impressions all have ``clicked`` null), ``online:clicks_no_dwell`` (clicks without ``dwell_ms``, left
out of the dwell metrics), ``ope:impressions``, ``ope:not_logged``, ``ope:slates`` and the rejections
``rejected:impression:<reason>`` of :class:`OffPolicyCtr` (also in its ``rejected`` output).
"""

from __future__ import annotations

import math
import typing

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.metrics import Metrics

from ..accumulators.online import (
    AucOps,
    CalibrationOps,
    ClickRequestOps,
    ClickRequestState,
    GaucOps,
    HistAucOps,
    InterleavingRequestOps,
    OpeOps,
    ScoreCountMetrics,
)
from ..accumulators.online_ope import DrOps
from ..io import counters as cn
from ..io.dead_letters import dead_letter
from ..metrics import interleaving as il
from ..metrics import online as om
from ..metrics import online_names
from ..metrics.names import MetricNameError, parse_metrics
from .arguments import join_parameter_lists
from .combiners import MeanCombineFn, OpsCombineFn
from .keys import _window_micros
from .online_slate import slate_input, slate_rows
from .transforms import (
    NAMESPACE,
    ClickMetrics,
    QueryJudgmentsCombineFn,
    metric_row,
    parse_slices,
    parse_window,
    reason_key,
    slice_labels,
    window_bounds,
)

__all__ = [
    "DrCombineFn",
    "tau_label",
    "AucCombineFn",
    "GroupAucCombineFn",
    "HistAucCombineFn",
    "GaucCombineFn",
    "ClickRequestCombineFn",
    "OpeCombineFn",
    "CalibrationCombineFn",
    "calibration_rows",
    "interleaving_rows",
    "InterleavingRequestCombineFn",
    "LabelFromJudgments",
    "OnlineMetrics",
    "OffPolicyCtr",
    "split_metric_names",
    "LABEL_SOURCES",
    "UNJUDGED_POLICIES",
]

from .arguments import LABEL_SOURCES, UNJUDGED_POLICIES  # noqa: E402,F401  (the command line's, Beam-free)
# the rows of the online metrics: in the metrics layer (the library's evaluate_log uses them too)
from ..metrics.rows import (INTERLEAVING_SUFFIXES, calibration_bin_name, calibration_rows,  # noqa: E402,F401
                            gauc_rows, group_slice, hist_rows, interleaving_rows, score_count_rows,
                            with_interval)


# --------------------------------------------------------------------------------------------
# CombineFns

class _CountsCombineFn(beam.CombineFn):
    ops = AucOps

    def create_accumulator(self):
        return self.ops.create()

    def add_input(self, acc, element):
        score, label = element
        return self.ops.add(acc, score, label)

    def merge_accumulators(self, accumulators):
        return self.ops.merge(accumulators)

    def compact(self, acc):
        return acc

    def get_accumulator_coder(self):
        return FastPrimitivesCoder()


class AucCombineFn(_CountsCombineFn):
    """Exact AUC (Mann-Whitney, ties one half). Inputs ``(score, label)``; output
    ``(auc, examples, DeLong stderr)``; empty: ``(NaN, 0, NaN)``."""

    def extract_output(self, acc):
        return AucOps.extract(acc)


class ScoreCountsCombineFn(_CountsCombineFn):
    """The exact AUC state's metrics (:class:`~streameval.accumulators.online.ScoreCountMetrics`:
    auc, pr_auc, precision / recall / f1 at thresholds, psi, ks). Inputs ``(score, label)``; output
    ``[(row name, value, n, stderr), ...]``."""

    def __init__(self, scores):
        self.scores = scores

    def extract_output(self, acc):
        return self.scores(*AucOps.value_counts(acc))


class GroupAucCombineFn(_CountsCombineFn):
    """One group's exact AUC. Inputs ``(score, label)``; output ``(auc, n_pos, n_neg, stderr)``
    (auc NaN for a single-class group)."""

    def extract_output(self, acc):
        return AucOps.summary(acc)


class HistAucCombineFn(_CountsCombineFn):
    """Histogram AUC over ``bins`` bins on ``[lo, hi]``. Inputs ``(score, label)``; output
    ``(auc, examples, stderr, max_error)``, ``|auc - exact AUC| <= max_error``."""

    def __init__(self, lo: float = 0.0, hi: float = 1.0, bins: int = 1000):
        self.ops = HistAucOps(lo, hi, bins)

    def extract_output(self, acc):
        return self.ops.extract(acc)


class GaucCombineFn(OpsCombineFn):
    """GAUC from group summaries. Inputs ``(auc, n_pos, n_neg)`` (one per group); output
    ``([(gauc, groups_used, stderr) per weighting], groups_excluded)``."""

    def __init__(self, weightings=("impressions",)):
        super().__init__(GaucOps(weightings))

    def add_input(self, acc, element):
        auc, n_pos, n_neg = element[:3]
        return self.ops.add_group(acc, auc, n_pos, n_neg)


class ClickRequestCombineFn(beam.CombineFn):
    """The click state of one request (:class:`ClickRequestOps`) from its impression dicts;
    ``extract_output`` returns the state itself."""

    def __init__(self, attribute_keys=None, dwell: bool = False):
        self.ops = ClickRequestOps(attribute_keys, dwell=dwell)

    def create_accumulator(self):
        return self.ops.create()

    def add_input(self, acc, imp):
        return self.ops.add_impression(acc, imp["item_id"], imp["position"], imp.get("clicked"),
                                       imp.get("timestamp"), imp.get("attributes"), imp.get("dwell_ms"))

    def merge_accumulators(self, accumulators):
        return self.ops.merge(accumulators)

    def compact(self, acc):
        return acc

    def extract_output(self, acc):
        return acc

    def get_accumulator_coder(self):
        return FastPrimitivesCoder()


class InterleavingRequestCombineFn(ClickRequestCombineFn):
    """The state of one interleaved request (:class:`InterleavingRequestOps`: clicked items and
    their teams) from its impression dicts; ``extract_output`` returns the state itself."""

    def __init__(self, attribute_keys=None):
        self.ops = InterleavingRequestOps(attribute_keys)


class OpeCombineFn(beam.CombineFn):
    """IPS / SNIPS sums. Inputs ``(reward, target_prob, logging_prob)``; output
    ``{"ips": (V, n, se), "snips": (V, n, se), "mean_weight": (w, n, None), "ess": (ess, n, None)}``."""

    def create_accumulator(self):
        return OpeOps.create()

    def add_input(self, acc, element):
        reward, target_prob, logging_prob = element
        return OpeOps.add(acc, reward, target_prob, logging_prob)

    def merge_accumulators(self, accumulators):
        return OpeOps.merge(accumulators)

    def compact(self, acc):
        return acc

    def extract_output(self, acc):
        return OpeOps.extract(acc)

    def get_accumulator_coder(self):
        return FastPrimitivesCoder()


class DrCombineFn(OpsCombineFn):
    """DM, DR, SNDR and Switch-DR sums (:class:`~streameval.accumulators.online_ope.DrOps`). Inputs
    ``(reward, target_prob, logging_prob, reward_hat, dm_value)``; output ``DrOps(taus).extract``."""

    def __init__(self, taus=(om.DEFAULT_SWITCH_TAU,)):
        super().__init__(DrOps(taus))

    def add_input(self, acc, element):
        return self.ops.add(acc, *element)


def tau_label(tau: float) -> str:
    """The switch threshold as written in a row name: ``switch_dr[TARGET,tau=<label>]`` (``repr``
    of the float without a trailing ``.0``: 1 -> ``1``, 0.5 -> ``0.5``)."""
    t = repr(float(tau))
    return t[:-2] if t.endswith(".0") else t


class CalibrationCombineFn(OpsCombineFn):
    """Log loss, Brier score, calibration ratio and ECE over each of ``bins`` fixed-width bins.
    Inputs ``(probability in [0, 1], label)``; output
    :meth:`~streameval.accumulators.online.CalibrationOps.extract`'s dict."""

    def __init__(self, bins=()):
        super().__init__(CalibrationOps(bins))

    def add_input(self, acc, element):
        p, label = element
        return self.ops.add(acc, p, label)


# --------------------------------------------------------------------------------------------
# names

def _join_parameter_lists(parts: list[str]) -> list[str]:
    """Keep trec_eval parameter lists together: ``["P.5", "10", "map"]`` -> ``["P.5,10", "map"]``."""
    return join_parameter_lists(parts)


def split_metric_names(names, diversity: bool = False) -> tuple[list[str], list[str]]:
    """Split metric names (a list, or a comma-separated text: commas inside brackets or parentheses
    (``gauc[user,clicks]``, ``SetF(rel=2, beta=0.5)``) and trec_eval
    parameter lists such as ``P.5,10`` stay together) into (ranking metrics for ScoreRankings, online metrics for
    OnlineMetrics). A name is online when :func:`~streameval.metrics.online.parse_online_metric`
    accepts it, else it must be a ranking metric (:func:`~streameval.metrics.names.parse_metrics`).
    Raises MetricNameError naming the three closest accepted names (ranking or online) for an unknown
    name. ``diversity``:
    the diversity measures are ranking metrics (the batch job scores them); else refused in one line."""
    if isinstance(names, str):
        names = _join_parameter_lists(online_names._split_names(names))
    ranking, online = [], []
    for n in names:
        if str(n).strip().lower().replace(" ", "").startswith(("ece[", "precision[", "recall[", "f1[", "psi[", "ks[")):
            om.parse_online_metric(n)  # an ECE, a threshold or drift name with bad parameters: its own message
        if om.is_online_metric(n):
            online.append(n)
            continue
        try:
            parse_metrics([n], diversity=diversity)
        except MetricNameError as e:
            if e.unknown:  # the closest names of both kinds
                raise online_names.unknown_metric_error(n, diversity) from None
            raise
        ranking.append(n)
    return ranking, online


# --------------------------------------------------------------------------------------------
# labels

def _example(rec, label):
    """The fields the score-based metrics need."""
    return {"system_id": rec["system_id"], "timestamp": rec.get("timestamp"),
            "attributes": rec.get("attributes") or {}, "user_id": rec.get("user_id"),
            "query_id": rec.get("query_id"), "request_id": rec.get("request_id"),
            "score": rec.get("score"), "label": label}


class _JoinLabels(beam.DoFn):
    def __init__(self, relevance_level, unjudged):
        self.relevance_level = relevance_level
        self.unjudged = unjudged
        self.counter = Metrics.counter(NAMESPACE, cn.ONLINE_UNJUDGED)

    def process(self, element):
        (qid, item), groups = element
        grades = [g for part in groups["judged"] for g in part.values()]
        grade = max(grades) if grades else None  # one value after CombinePerKey
        for rec in groups["imps"]:
            if grade is None or grade < 0:  # negative: pooled but unjudged (trec_eval)
                if self.unjudged == "exclude":
                    self.counter.inc()
                    continue
                label = False
            else:
                label = grade >= self.relevance_level
            out = dict(rec)
            out["label"] = bool(label)
            yield out


class LabelFromJudgments(beam.PTransform):
    """``impressions | LabelFromJudgments(judgments)``: each impression with ``"label"`` set to
    ``grade >= relevance_level`` of its (query_id, item_id) judgment (the latest judgment wins, as
    in :class:`~streameval.beam.transforms.JudgmentsCombineFn`; with subtopic judgments the largest
    grade of the item, :class:`~streameval.beam.transforms.QueryJudgmentsCombineFn`). Impressions without a judgment
    (or with a negative grade, trec_eval's "pooled, unjudged") are dropped and counted
    (``online:unjudged``) with ``unjudged="exclude"`` (default) or labelled non-relevant with
    ``unjudged="nonrelevant"`` (trec_eval's convention for ranking metrics)."""

    def __init__(self, judgments, relevance_level=1, unjudged="exclude", label=None):
        super().__init__(label)
        if unjudged not in UNJUDGED_POLICIES:
            raise ValueError(f"unjudged must be one of {UNJUDGED_POLICIES}, got {unjudged!r}")
        self.judgments = judgments
        self.relevance_level = relevance_level
        self.unjudged = unjudged

    def expand(self, impressions):
        imps = impressions | "KeyImpressions" >> beam.Map(lambda r: ((r["query_id"], r["item_id"]), r))
        judged = (self.judgments
                  | "KeyJudgments" >> beam.Map(lambda j: ((j["query_id"], j["item_id"]), j))
                  | "LatestJudgment" >> beam.CombinePerKey(QueryJudgmentsCombineFn())
                  # an item's grade: the largest of its judgments, ad hoc and per subtopic (as the columnar engine's)
                  | "AdHocGrades" >> beam.MapTuple(lambda key, judged: (key, judged[0])))
        return ({"imps": imps, "judged": judged} | "Join" >> beam.CoGroupByKey()
                | "Label" >> beam.ParDo(_JoinLabels(self.relevance_level, self.unjudged)))


# --------------------------------------------------------------------------------------------
# OnlineMetrics

def _keys(rec, window_micros, slice_specs):
    ws, we = window_bounds(rec.get("timestamp"), window_micros)
    return [(ws, we, label, rec["system_id"]) for label in slice_labels(rec.get("attributes"), slice_specs)]


class OnlineMetrics(beam.PTransform):
    """``impressions | OnlineMetrics(metrics, window=None, slices=(), ...)`` -> metric rows.

    ``metrics``: names accepted by :func:`~streameval.metrics.online.parse_online_metric`:

    * ``auc``: exact AUC of the impressions' ``score`` against their label (row ``num_queries``:
      labelled impressions; ``stderr``: DeLong);
    * ``auc_hist``: the histogram AUC over ``hist_bins`` bins on ``hist_range``, plus a row
      ``auc_hist:max_error`` holding its guaranteed error bound;
    * ``gauc[GROUP,WEIGHTING]``: AUC per group (user_id, query_id or request_id) averaged with
      weights impressions / clicks (positives) / unweighted (``num_queries``: groups used;
      ``stderr``: ratio-estimator), plus ``gauc[GROUP]:excluded_groups`` (value: single-class
      groups left out; ``num_queries``: all groups). ``group_rows=True`` also gives each group's
      AUC as metric ``auc`` in slice ``"<group>=<id>"`` (``"<slice>,<group>=<id>"``);
    * ``ctr``: :class:`~streameval.beam.transforms.ClickMetrics`' rows ``ctr`` and every
      ``ctr@pos{p}``; ``ctr@pos{p}`` alone gives that position's row;
    * ``clicks@k`` / ``clicks``, ``rr_first_click`` (``[clicked]``), ``abandonment``: means over
      requests ((system_id, request_id)) with logged clicks (``num_queries``: requests; ``stderr``:
      of the mean).
    * ``mean_dwell``, ``sat_click_rate[t=T]``, ``long_click_ctr[t=T]``, ``last_click_ctr[t=T]``:
      means over the same requests of the per-request values of
      :func:`~streameval.metrics.online.click_request_terms`, from the clicked impressions'
      ``dwell_ms``; a click without ``dwell_ms`` is excluded from them and counted
      (``online:clicks_no_dwell``), a request whose value it leaves undetermined is left out of the
      mean (``num_queries``: the requests used).
    * ``interleaving``: team-draft credit per interleaved request ((system_id, request_id); the team of
      a clicked item in ``attributes["team"]``, "A" or "B"): rows ``interleaving:preference``
      (``(wins_b + ties / 2) / n - 0.5``, positive when B is preferred; ``num_queries``: requests with a
      click), ``interleaving:wins_a``, ``:wins_b``, ``:ties``, ``:p_value`` (exact two-sided sign
      test; ``num_queries``: decisive requests) and ``:win_rate_b`` (Wilson interval); requests
      without a click are left out, requests with a click on an item without a team are left out
      and counted (``online:interleaving_no_team``) (:mod:`streameval.metrics.interleaving`).
    * ``logloss``, ``brier``, ``calibration``, ``ece[bins=B]``: calibration of the score read as the
      predicted click probability (:mod:`streameval.metrics.calibration`); impressions whose score
      is outside [0, 1] are left out and counted (``online:score_not_probability``);
      ``num_queries``: examples; ``stderr``: of the mean (log loss, Brier), of the ratio
      (calibration), none (ECE). Each ``ece[bins=B]`` also gives the rows of its reliability
      diagram, ``calibration_bin[bins=B,k=b]:predicted`` and ``:observed`` per non-empty bin.

    Labels (score-based metrics): ``labels="clicks"`` (default; ``clicked``, impressions with null
    ``clicked`` left out) or ``"judgments"`` (``grade >= relevance_level`` from ``judgments``, see
    :class:`LabelFromJudgments` and its ``unjudged`` option). Impressions without a score are left
    out of the score-based metrics and counted (``online:no_score``).

    Windows: score-based metrics and CTR put each impression in the window of its own timestamp
    (GAUC groups are formed within a window); per-request metrics put a request in the window of
    its earliest impression. ``window`` and ``slices`` as in
    :class:`~streameval.beam.transforms.ScoreRankings`.
    """

    def __init__(self, metrics, window=None, slices=(), labels="clicks", judgments=None, relevance_level=1,
                 unjudged="exclude", hist_bins=1000, hist_range=(0.0, 1.0), group_rows=False, ci_level=0.95,
                 label=None, ci_bounded="logit", reference=None):
        super().__init__(label)
        self.ci_level = ci_level
        #: the reference scores of psi[score] / ks[score] (a streameval.metrics.threshold.DriftReference)
        self.reference = reference
        self.ci_bounded = ci_bounded
        self.specs = om.parse_online_metrics(metrics)
        if not self.specs:
            raise ValueError("no metrics given")
        if labels not in LABEL_SOURCES:
            raise ValueError(f"labels must be one of {LABEL_SOURCES}, got {labels!r}")
        if labels == "judgments" and judgments is None:
            raise ValueError("labels='judgments' needs the judgments PCollection")
        if unjudged not in UNJUDGED_POLICIES:
            raise ValueError(f"unjudged must be one of {UNJUDGED_POLICIES}, got {unjudged!r}")
        self.hist = HistAucOps(hist_range[0], hist_range[1], hist_bins)  # validates
        self.labels = labels
        self.judgments = judgments
        self.relevance_level = relevance_level
        self.unjudged = unjudged
        self.group_rows = bool(group_rows)
        parse_window(window)
        self.window = window
        self.window_micros = _window_micros(window)
        self.slice_specs = parse_slices(slices)

    # -- score-based ------------------------------------------------------------------------
    def _examples(self, impressions):
        no_score = Metrics.counter(NAMESPACE, cn.ONLINE_NO_SCORE)
        not_labelled = Metrics.counter(NAMESPACE, cn.ONLINE_NOT_LABELLED)
        use_clicks = self.labels == "clicks"

        def scored(rec):
            if rec.get("score") is None:
                no_score.inc()
                return []
            if use_clicks:
                if rec.get("clicked") is None:
                    not_labelled.inc()
                    return []
                return [_example(rec, bool(rec["clicked"]))]
            return [rec]

        out = impressions | "WithScore" >> beam.FlatMap(scored)
        if use_clicks:
            return out
        labelled = out | "Labels" >> LabelFromJudgments(self.judgments, self.relevance_level, self.unjudged)
        return labelled | "Examples" >> beam.Map(lambda r: _example(r, r["label"]))

    def _score_rows(self, examples, wm, specs):
        parts = []
        families = {s.family for s in specs}
        counted = [s for s in specs if s.score_counts]
        if families & {"auc", "auc_hist"} or counted:
            keyed = examples | "KeyExamples" >> beam.FlatMap(
                lambda r, wm, ss: [(k, (r["score"], r["label"])) for k in _keys(r, wm, ss)], wm, self.slice_specs)
            if counted:  # auc among them: one exact state for all
                scores = ScoreCountMetrics(counted, "auc" in families, self.reference)
                parts.append(keyed | "ScoreCounts" >> beam.CombinePerKey(ScoreCountsCombineFn(scores))
                             | "ScoreCountRows" >> beam.FlatMap(score_count_rows))
            elif "auc" in families:
                parts.append(keyed | "Auc" >> beam.CombinePerKey(AucCombineFn())
                             | "AucRows" >> beam.Map(lambda kv: metric_row(*kv[0], "auc", *kv[1])))
            if "auc_hist" in families:
                h = self.hist
                parts.append(keyed | "HistAuc" >> beam.CombinePerKey(HistAucCombineFn(h.lo, h.hi, h.bins))
                             | "HistAucRows" >> beam.FlatMap(hist_rows))
        cal_specs = [s for s in specs if s.calibration]
        if cal_specs:
            parts.append(self._calibration(examples, wm, cal_specs))
        groups: dict = {}
        for s in specs:
            if s.family == "gauc":
                groups.setdefault(s.group, []).append(s.weighting)
        for group, weightings in groups.items():
            parts.extend(self._gauc(examples, wm, group, tuple(weightings)))
        return parts

    def _calibration(self, examples, wm, specs):
        outside = Metrics.counter(NAMESPACE, cn.ONLINE_SCORE_NOT_PROBABILITY)
        slice_specs = self.slice_specs

        def keyed(r):
            p = float(r["score"])
            if not 0.0 <= p <= 1.0:
                outside.inc()
                return []
            return [(k, (p, r["label"])) for k in _keys(r, wm, slice_specs)]

        bins = sorted({s.k for s in specs if s.family == "ece"})
        return (examples | "KeyProbabilities" >> beam.FlatMap(keyed)
                | "Calibration" >> beam.CombinePerKey(CalibrationCombineFn(bins))
                | "CalibrationRows" >> beam.FlatMap(calibration_rows, specs))

    def _gauc(self, examples, wm, group, weightings):
        field = om.GAUC_GROUPS[group]
        missing = Metrics.counter(NAMESPACE, cn.online_no_group(field))
        slice_specs = self.slice_specs

        def key(r):
            gid = r.get(field)
            if gid is None or gid == "":
                missing.inc()
                return []
            return [((*k, gid), (r["score"], r["label"])) for k in _keys(r, wm, slice_specs)]

        per_group = (examples | f"KeyGroups[{group}]" >> beam.FlatMap(key)
                     | f"GroupAuc[{group}]" >> beam.CombinePerKey(GroupAucCombineFn()))
        out = []
        if self.group_rows:
            def group_row(kv):
                (ws, we, label, system, gid), (auc, p, n, se) = kv
                return metric_row(ws, we, group_slice(label, group, gid), system, "auc", auc, p + n, se)

            out.append(per_group | f"GroupRows[{group}]" >> beam.Map(group_row))
        out.append(per_group
                   | f"Regroup[{group}]" >> beam.Map(lambda kv: (kv[0][:4], kv[1][:3]))
                   | f"Gauc[{group}]" >> beam.CombinePerKey(GaucCombineFn(weightings))
                   | f"GaucRows[{group}]" >> beam.FlatMap(gauc_rows, group, weightings))
        return out

    # -- clicks -----------------------------------------------------------------------------
    def _request_rows(self, impressions, wm, specs):
        attr_keys = sorted({n for names in self.slice_specs for n in names})
        slice_specs = self.slice_specs
        names = [s.name for s in specs]
        counted = Metrics.counter(NAMESPACE, cn.ONLINE_REQUESTS)
        not_logged = Metrics.counter(NAMESPACE, cn.ONLINE_REQUESTS_NOT_LOGGED)
        dwell = any(s.dwell for s in specs)
        no_dwell = Metrics.counter(NAMESPACE, cn.ONLINE_CLICKS_NO_DWELL)

        def terms(kv):
            (system, _), st = kv
            s = ClickRequestState._make(st)
            if not s.logged:
                not_logged.inc()
                return
            counted.inc()
            if dwell:
                no_dwell.inc(ClickRequestOps.clicks_without_dwell(st))
            (col,) = ClickRequestOps.terms([st], specs).T.tolist()
            ws, we = window_bounds(s.min_timestamp, wm)
            for label in slice_labels(s.attributes, slice_specs):
                yield ((ws, we, label, system), col)

        def rows(kv):
            (ws, we, label, system), results = kv
            for name, (value, n, se) in zip(names, results):
                yield metric_row(ws, we, label, system, name, value, n, se)

        return (impressions
                | "KeyRequests" >> beam.Map(lambda r: ((r["system_id"], r["request_id"]), r))
                | "ClickRequests" >> beam.CombinePerKey(ClickRequestCombineFn(attr_keys, dwell))
                | "RequestTerms" >> beam.FlatMap(terms)
                | "RequestMeans" >> beam.CombinePerKey(MeanCombineFn(len(specs)))
                | "RequestRows" >> beam.FlatMap(rows))

    def _interleaving_rows(self, impressions, wm):
        attr_keys = sorted({n for names in self.slice_specs for n in names})
        slice_specs = self.slice_specs
        no_team = Metrics.counter(NAMESPACE, cn.ONLINE_INTERLEAVING_NO_TEAM)
        level = self.ci_level

        def terms(kv):
            (system, _), st = kv
            s = ClickRequestState._make(st)
            if not s.logged:
                return
            ca, cb, missing = InterleavingRequestOps.credit(st)
            if missing:
                no_team.inc()
                return
            (col,) = il.request_terms([ca], [cb]).T.tolist()
            ws, we = window_bounds(s.min_timestamp, wm)
            for label in slice_labels(s.attributes, slice_specs):
                yield ((ws, we, label, system), col)

        return (impressions
                | "KeyInterleaved" >> beam.Map(lambda r: ((r["system_id"], r["request_id"]), r))
                | "InterleavedRequests" >> beam.CombinePerKey(InterleavingRequestCombineFn(attr_keys))
                | "InterleavingTerms" >> beam.FlatMap(terms)
                | "InterleavingTotals" >> beam.CombinePerKey(MeanCombineFn(3, totals=[True] * 3))
                | "InterleavingRows" >> beam.FlatMap(interleaving_rows, level))

    def expand(self, impressions):
        wm = self.window_micros
        specs = self.specs
        parts = []
        score_specs = [s for s in specs if s.needs_scores]
        if score_specs:
            examples = self._examples(impressions)
            parts.extend(self._score_rows(examples, wm, score_specs))
        ctr_specs = [s for s in specs if s.family == "ctr"]
        if ctr_specs:
            all_pos = any(s.k is None for s in ctr_specs)
            wanted = {s.name for s in ctr_specs}
            keep = (lambda r: r["metric"] in wanted or r["metric"].startswith("ctr@pos")) if all_pos else \
                (lambda r: r["metric"] in wanted)
            parts.append(impressions | "ClickMetrics" >> ClickMetrics(window=self.window, slices=self.slice_specs)
                         | "KeepCtr" >> beam.Filter(keep))
        req_specs = [s for s in specs if s.per_request]
        if req_specs:
            parts.append(self._request_rows(impressions, wm, req_specs))
        if any(s.family == "interleaving" for s in specs):
            parts.append(self._interleaving_rows(impressions, wm))
        return (tuple(parts) | "OnlineRows" >> beam.Flatten()
                | "OnlineIntervals" >> beam.Map(with_interval, self.ci_level, self.ci_bounded))


# --------------------------------------------------------------------------------------------
# off-policy CTR

@beam.typehints.with_output_types(typing.Tuple[typing.Any, typing.Any])
class _OpeKeys(beam.DoFn):
    def __init__(self, target, window_micros, slice_specs, reward_model=None, slates=False):
        self.target = target
        self.reward_model = reward_model
        self.slates = slates
        self.window_micros = window_micros
        self.slice_specs = slice_specs
        self.counted = Metrics.counter(NAMESPACE, cn.OPE_IMPRESSIONS)
        self.not_logged = Metrics.counter(NAMESPACE, cn.OPE_NOT_LOGGED)

    @staticmethod
    def _dead_letter(rec, reason):
        Metrics.counter(NAMESPACE, cn.rejected("impression", reason_key(reason))).inc()
        return dead_letter("OffPolicyCtr", rec, reason)

    def process(self, rec):
        clicked = rec.get("clicked")
        if clicked is None:  # clicks not logged: no reward
            self.not_logged.inc()
            return
        pb = rec.get("propensity")
        if pb is None or not 0.0 < pb <= 1.0:
            yield pvalue.TaggedOutput("rejected", self._dead_letter(
                rec, "off-policy estimates need the logging policy's propensity in (0, 1]"))
            return
        pe = self.target(rec)
        if pe is None or not 0.0 <= pe <= 1.0 or (isinstance(pe, float) and math.isnan(pe)):
            yield pvalue.TaggedOutput("rejected", self._dead_letter(
                rec, f"target policy gives no probability in [0, 1] for item {rec['item_id']!r} "
                     f"at position {rec['position']}"))
            return
        if not math.isfinite(float(pe) / float(pb)):
            yield pvalue.TaggedOutput("rejected", self._dead_letter(
                rec, f"importance weight {pe!r} / propensity {pb!r} is not a finite number"))
            return
        value = (1.0 if clicked else 0.0, float(pe), float(pb))
        if self.reward_model is not None:
            qd = self.reward_model(rec)
            if qd is None:
                yield pvalue.TaggedOutput("rejected", self._dead_letter(
                    rec, f"no reward model value for event {rec['event_id']!r}"))
                return
            q, d = float(qd[0]), float(qd[1])
            if not (math.isfinite(q) and math.isfinite(d)) or not math.isfinite(float(pe) / float(pb) * (value[0] - q)):
                yield pvalue.TaggedOutput("rejected", self._dead_letter(
                    rec, f"reward model values {qd[0]!r}, {qd[1]!r} give no finite estimate term"))
                return
            value = (*value, q, d)
        self.counted.inc()
        if self.slates:
            yield pvalue.TaggedOutput("slate", slate_input(rec, *value[:3]))
        for k in _keys(rec, self.window_micros, self.slice_specs):
            yield (k, value)


class OffPolicyCtr(beam.PTransform):
    """``impressions | OffPolicyCtr(target, target_name, window=None, slices=())`` -> rows
    ``ips[<target_name>]`` and ``snips[<target_name>]`` (the target policy's estimated CTR per
    impression, with standard errors; ``num_queries``: impressions), ``ope[<target_name>]:mean_weight``
    (mean importance weight, 1 in expectation) and ``ope[<target_name>]:ess`` (Kong's effective
    sample size), per (window, slice, logging system).

    ``target``: a picklable callable impression dict -> probability that the target policy shows
    the impression's item at its position (e.g. :class:`~streameval.metrics.online.UniformTarget`,
    :class:`~streameval.metrics.online.TableTarget`,
    :class:`~streameval.metrics.online.LoggedPropensityTarget`). The reward is ``clicked``;
    impressions with ``clicked`` null are skipped and counted (``ope:not_logged``). Impressions
    without a propensity in (0, 1], or for which the target gives no probability, go to
    ``self.rejected`` (dead letters with the reason) after the transform is applied.

    ``reward_model``: None, or a picklable callable impression dict -> ``(reward_hat, dm_value)``
    (q_hat(x, a) of the logged item at its position, and sum_a pi_e(a|x) q_hat(x, a) there), or
    None when it has none (a dead letter: the impression is left out of every estimate, IPS's too,
    so that all rows are of the same impressions). With it, the rows ``dm[<target_name>]``,
    ``dr[...]``, ``sndr[...]`` and ``switch_dr[<target_name>,tau=<tau>]`` per tau of
    ``switch_taus`` (:class:`DrCombineFn`).

    ``slates=True``: also the slate estimators' rows over requests (``slate_ips[...]``, ``iips[...]``,
    ``rips[...]``, ``pi[...]`` and their ``:ess``; :func:`~streameval.beam.online_slate.slate_rows`),
    of the same accepted impressions."""

    def __init__(self, target, target_name: str, window=None, slices=(), ci_level=0.95, label=None,
                 reward_model=None, switch_taus=(om.DEFAULT_SWITCH_TAU,), slates=False):
        super().__init__(label)
        self.slates = bool(slates)
        self.ci_level = ci_level
        if reward_model is not None and not callable(reward_model):
            raise TypeError("reward_model must be a callable impression -> (reward_hat, dm_value) or None")
        self.reward_model = reward_model
        self.switch_taus = DrOps(switch_taus).taus
        if not callable(target):
            raise TypeError("target must be a callable impression -> probability")
        if not target_name or any(c in str(target_name) for c in "[],"):
            raise ValueError(f"bad target name {target_name!r}")
        self.target = target
        self.name = str(target_name)
        parse_window(window)
        self.window_micros = _window_micros(window)
        self.slice_specs = parse_slices(slices)
        self.rejected = None

    def expand(self, impressions):
        name = self.name
        keys = _OpeKeys(self.target, self.window_micros, self.slice_specs, self.reward_model, self.slates)
        keyed = impressions | "OpeKeys" >> beam.ParDo(keys).with_outputs("rejected", "slate", main="keyed")
        self.rejected = keyed.rejected
        slate_parts: tuple = ()
        if self.slates:
            slates, rejected = slate_rows(keyed.slate, name, self.window_micros, self.slice_specs, self.ci_level)
            slate_parts = (slates,)
            self.rejected = (keyed.rejected, rejected) | "OpeRejected" >> beam.Flatten()

        def rows(kv):
            (ws, we, label, system), res = kv
            yield metric_row(ws, we, label, system, f"ips[{name}]", *res["ips"])
            yield metric_row(ws, we, label, system, f"snips[{name}]", *res["snips"])
            yield metric_row(ws, we, label, system, f"ope[{name}]:mean_weight", *res["mean_weight"])
            yield metric_row(ws, we, label, system, f"ope[{name}]:ess", *res["ess"])

        if self.reward_model is None:
            ips = (keyed.keyed
                   | "Ope" >> beam.CombinePerKey(OpeCombineFn())
                   | "OpeRows" >> beam.FlatMap(rows)
                   | "OpeIntervals" >> beam.Map(with_interval, self.ci_level))
            return (ips, *slate_parts) | "OpeWithSlates" >> beam.Flatten() if slate_parts else ips
        taus = self.switch_taus

        def dr_rows(kv):
            (ws, we, label, system), res = kv
            for est in ("dm", "dr", "sndr"):
                yield metric_row(ws, we, label, system, f"{est}[{name}]", *res[est])
            for t in taus:
                yield metric_row(ws, we, label, system, f"switch_dr[{name},tau={tau_label(t)}]", *res[("switch_dr", t)])

        ips_rows = (keyed.keyed | "OpeIpsInputs" >> beam.Map(lambda kv: (kv[0], kv[1][:3]))
                    | "Ope" >> beam.CombinePerKey(OpeCombineFn())
                    | "OpeRows" >> beam.FlatMap(rows))
        dr = (keyed.keyed
              | "OpeDr" >> beam.CombinePerKey(DrCombineFn(taus))
              | "OpeDrRows" >> beam.FlatMap(dr_rows))
        with_ci = ((ips_rows, dr) | "OpeAllRows" >> beam.Flatten()
                   | "OpeIntervals" >> beam.Map(with_interval, self.ci_level))
        return (with_ci, *slate_parts) | "OpeWithSlates" >> beam.Flatten() if slate_parts else with_ci
