"""Metric rows (the ``schemas/metric_result.avsc`` shape) from extracted accumulator outputs.

One set of functions for every engine: the batch job's per-record transforms and columnar engine
(:mod:`streameval.beam.transforms`, :mod:`streameval.beam.online`,
:mod:`streameval.beam.columnar_online`), the streaming job, and the library's
:func:`streameval.evaluate_log` (no Beam). Each takes ``((window_start, window_end, slice, system),
output)`` as the CombineFns / accumulator ``extract`` give it and returns metric_result dicts.

Layer 2 (metrics): pure Python and numpy; no Beam.
"""

from __future__ import annotations

import math

from . import interleaving as il
from . import stats
from .online_names import canonical_metric
from .units import count_unit

__all__ = ["ROW_FIELDS", "metric_row", "nan_to_none", "click_rows", "hist_rows", "gauc_rows", "group_slice",
           "calibration_bin_name", "calibration_rows", "score_count_rows", "INTERLEAVING_SUFFIXES", "interleaving_rows",
           "with_interval", "mean_rows"]

# every field of schemas/metric_result.avsc, so that all rows have one shape (None: not computed)
ROW_FIELDS = ("window_start", "window_end", "slice", "system", "metric", "value", "num_queries", "n_unit", "stderr",
              "ci_low", "ci_high", "ci_level", "ci_method", "pane", "pane_index", "is_final", "metric_canonical")


def nan_to_none(x):
    """None for None or a float NaN, else ``x``."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def metric_row(window_start, window_end, slice_label, system, metric, value, num_queries, stderr,
               **extra) -> dict:
    """A metric_result record; fields not given (intervals, panes) are None; ``n_unit`` what
    ``num_queries`` counts (:func:`~streameval.metrics.units.count_unit` of ``metric``)."""
    row = dict.fromkeys(ROW_FIELDS)
    row.update(window_start=window_start, window_end=window_end, slice=slice_label, system=system,
               metric=metric, value=float(value), num_queries=int(num_queries), n_unit=count_unit(metric),
               stderr=nan_to_none(stderr), metric_canonical=canonical_metric(metric))
    unknown = set(extra) - set(ROW_FIELDS)
    if unknown:
        raise TypeError(f"not metric_result fields: {sorted(unknown)}")
    row.update(extra)
    return row


def click_rows(element, level=stats.DEFAULT_LEVEL):
    """The rows ``ctr`` and ``ctr@pos{p}`` of one key: ``element`` = ``(key, ((ctr, n, se), {p: (ctr,
    n, se)}))`` (:func:`streameval.accumulators.clicks.ctr_extract` of the merged positions and
    :func:`~streameval.accumulators.clicks.ctr_pos_extract`), each with its Wilson interval."""
    (ws, we, label, system), (overall, by_pos) = element
    ctr, n, se = overall
    yield metric_row(ws, we, label, system, "ctr", ctr, n, se, **stats.row_interval("ctr", ctr, n, se, level))
    for pos, (ctr, n, se) in by_pos.items():
        name = f"ctr@pos{pos}"
        yield metric_row(ws, we, label, system, name, ctr, n, se, **stats.row_interval(name, ctr, n, se, level))


def mean_rows(element, names):
    """The rows of one key's means: ``element`` = ``(key, [(value, n, se) per name])``."""
    (ws, we, label, system), results = element
    for name, (value, n, se) in zip(names, results):
        yield metric_row(ws, we, label, system, name, value, n, se)


def group_slice(label, group, gid):
    """The slice of one group's AUC row (``group_rows``): ``<group>=<id>`` within ``label``."""
    return f"{group}={gid}" if label == "all" else f"{label},{group}={gid}"


def hist_rows(kv):
    """The rows of one key's histogram AUC: the value and its guaranteed error bound."""
    (ws, we, label, system), (auc, n, se, bound) = kv
    yield metric_row(ws, we, label, system, "auc_hist", auc, n, se)
    yield metric_row(ws, we, label, system, "auc_hist:max_error", bound, n, None)


def score_count_rows(kv):
    """The rows of one key's :class:`~streameval.accumulators.online.ScoreCountMetrics` output:
    ``kv`` = ``(key, [(row name, value, n, stderr), ...])`` (``auc``, ``pr_auc``, ``precision[t=T]``,
    ``recall[t=T]``, ``f1[t=T]``, ``psi[score]``, ``ks[score]``, ``ks[score]:p_value``)."""
    (ws, we, label, system), results = kv
    for name, value, n, se in results:
        yield metric_row(ws, we, label, system, name, value, n, se)


def gauc_rows(kv, group, weightings):
    """The rows of one key's GAUC (:meth:`~streameval.accumulators.online.GaucOps.extract` output):
    one per weighting, and the count of excluded (single-class) groups."""
    (ws, we, label, system), (results, excluded) = kv
    for wname, (value, n, se) in zip(weightings, results):
        yield metric_row(ws, we, label, system, f"gauc[{group},{wname}]", value, n, se)
    n_used = results[0][1] if results else 0
    yield metric_row(ws, we, label, system, f"gauc[{group}]:excluded_groups", excluded, n_used + excluded, None)


def calibration_bin_name(bins: int, b: int, what: str) -> str:
    """The row of one reliability-diagram bin: ``calibration_bin[bins=B,k=b]:predicted`` (mean
    predicted probability) or ``:observed`` (click rate); ``b`` 0-based, the bin
    ``(b / B, (b + 1) / B]``."""
    return f"calibration_bin[bins={bins},k={b}]:{what}"


def calibration_rows(kv, specs):
    """The rows of one key's :meth:`~streameval.accumulators.online.CalibrationOps.extract` output
    for the requested ``specs`` (calibration :class:`~streameval.metrics.online.OnlineSpec`); each
    ``ece[bins=B]`` also gives its reliability-diagram rows (:func:`calibration_bin_name`,
    ``num_queries``: the bin's examples; ``stderr`` of the click rate)."""
    (ws, we, label, system), res = kv
    for s in specs:
        if s.family == "ece":
            yield metric_row(ws, we, label, system, s.name, *res["ece"][s.k])
            for b, n, pred, obs, se in res["bins"][s.k]:
                yield metric_row(ws, we, label, system, calibration_bin_name(s.k, b, "predicted"), pred, n, None)
                yield metric_row(ws, we, label, system, calibration_bin_name(s.k, b, "observed"), obs, n, se)
        else:
            yield metric_row(ws, we, label, system, s.name, *res[s.family])


#: the rows of ``interleaving`` (``interleaving:<suffix>``), see :func:`interleaving_rows`
INTERLEAVING_SUFFIXES = ("preference", "wins_a", "wins_b", "ties", "p_value", "win_rate_b")


def interleaving_rows(kv, level=0.95):
    """The rows of one key's interleaving totals: ``kv`` = ``((ws, we, label, system), [(wins_a, n,
    _), (wins_b, n, _), (ties, n, _)])`` (sums of the per-request indicators,
    :func:`~streameval.metrics.interleaving.request_terms`) -> rows ``interleaving:<suffix>``
    (:data:`INTERLEAVING_SUFFIXES`, :func:`~streameval.metrics.interleaving.interleaving_results`);
    ``win_rate_b`` carries its Wilson interval."""
    (ws, we, label, system), totals = kv
    wa, wb, t = (int(round(v[0])) if v[1] else 0 for v in totals)
    res = il.interleaving_results(wa, wb, t, level)
    for suffix in INTERLEAVING_SUFFIXES:
        value, n, se, ci = res[suffix]
        extra = {} if ci is None else {"ci_low": ci[0], "ci_high": ci[1], "ci_level": float(level),
                                       "ci_method": "wilson"}
        yield metric_row(ws, we, label, system, f"interleaving:{suffix}", value, n, se, **extra)


def with_interval(row: dict, level: float, bounded: str = "logit", kind: str = "fixed") -> dict:
    """Fill a row's confidence interval from its value, count and standard error
    (:func:`streameval.metrics.stats.row_interval`: Wilson for CTR, t otherwise, ``bounded`` for a
    metric in [0, 1] whose t interval leaves it); rows without a standard error (bounds, counts of
    excluded groups) keep none. ``kind="anytime"``: the confidence sequence of the same numbers
    instead, replacing an interval the row came with (a fixed one would pass for valid at every
    look); none when the row has no standard error."""
    if kind == "anytime":
        return dict(row, **stats.row_interval(row["metric"], row["value"], row["num_queries"], row["stderr"], level,
                                              "anytime"))
    if row.get("ci_low") is None:
        row = dict(row, **stats.row_interval(row["metric"], row["value"], row["num_queries"], row["stderr"], level,
                                             bounded=bounded))
    return row
