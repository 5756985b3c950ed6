"""Beam wrappers of the resampling accumulators (:mod:`streameval.accumulators.bootstrap`):
confidence intervals by Poisson bootstrap and paired comparisons of two systems, inside the batch
and streaming jobs. No statistic is defined here.

* :class:`BootstrapMeanCombineFn` - inputs ``(query_key, [value per metric])``; output per metric
  the metric_result fields ``value, num_queries, stderr, ci_low, ci_high, ci_level, ci_method``.
* :class:`PairedCombineFn` - inputs ``(query_key, a_values, b_values)``; output per metric the
  comparison (means, difference, intervals, paired t-test, randomization test).
* :class:`PairScores` - per-query scores keyed by ``(window_start, window_end, slice, system)``
  -> ``(query_key, a_values, b_values)`` keyed by ``(window_start, window_end, slice, A, B)``.
* :class:`CompareSystems` - :class:`PairScores` then :class:`PairedCombineFn`, as comparison rows.

The query key is what seeds a query's bootstrap weights and random signs: use the query id (not a
request id), so a query weighs the same in every system, slice, window and job.
"""

from __future__ import annotations

import math

import apache_beam as beam
from apache_beam.coders import FastPrimitivesCoder

from ..accumulators.bootstrap import (
    DEFAULT_EXACT_MAX,
    DEFAULT_FLIPS,
    DEFAULT_REPLICATES,
    BootstrapState,
    PoissonBootstrap,
)
from ..accumulators.paired import PairedComparison
from ..accumulators.moments import MomentsState, partials_value
from ..metrics.stats import DEFAULT_LEVEL

__all__ = [
    "BootstrapMeanCombineFn",
    "PairedCombineFn",
    "PairScores",
    "CompareSystems",
    "comparison_row",
    "COMPARISON_FIELDS",
]


def _none_if_nan(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


class BootstrapMeanCombineFn(beam.CombineFn):
    """Exact mean, standard error and Poisson bootstrap percentile interval of per-query metric
    vectors (:class:`~streameval.accumulators.bootstrap.PoissonBootstrap`).

    Inputs: ``(query_key, values)`` with one float per metric (NaN skips a metric). Output: one
    dict per metric with the metric_result fields ``value, num_queries, stderr, ci_low, ci_high,
    ci_level, ci_method`` (``"bootstrap"``), ready for ``metric_row(..., **fields)``; NaN ends are
    None. For metrics flagged in ``totals`` (num_ret, num_rel, num_rel_ret) the value is the total
    and there is no interval. Empty: value NaN, count 0.
    """

    def __init__(self, n_metrics: int, replicates: int = DEFAULT_REPLICATES, level: float = DEFAULT_LEVEL,
                 seed: int = 0, totals=None):
        self.n_metrics = int(n_metrics)
        self.level = float(level)
        self.totals = [bool(t) for t in totals] if totals is not None else [False] * self.n_metrics
        if len(self.totals) != self.n_metrics:
            raise ValueError("totals needs one flag per metric")
        self._boot = PoissonBootstrap(self.n_metrics, replicates, seed)

    def create_accumulator(self):
        return self._boot.create()

    def add_input(self, acc, element):
        key, values = element
        return self._boot.add(acc, key, values)

    def merge_accumulators(self, accumulators):
        return self._boot.merge(list(accumulators))

    def compact(self, acc):
        return self._boot.compact(acc)

    def extract_output(self, acc):
        out = []
        sums = MomentsState._make(BootstrapState._make(acc).moments).sums
        for m, res in enumerate(self._boot.extract(acc, self.level)):
            if self.totals[m]:
                n = res["num_queries"]
                res = {"value": partials_value(sums[m]) if n else math.nan, "num_queries": n,
                       "stderr": None, "ci_low": None, "ci_high": None, "ci_level": None, "ci_method": None}
            else:
                res = dict(res, stderr=_none_if_nan(res["stderr"]), ci_low=_none_if_nan(res["ci_low"]),
                           ci_high=_none_if_nan(res["ci_high"]))
                if res["ci_low"] is None:
                    res.update(ci_level=None, ci_method=None)
            out.append(res)
        return out

    def get_accumulator_coder(self):
        return FastPrimitivesCoder()


class PairedCombineFn(beam.CombineFn):
    """Paired comparison of two systems (:class:`~streameval.accumulators.paired.PairedComparison`).

    Inputs: ``(query_key, a_values, b_values)``. Output: one dict per metric with ``num_queries,
    mean_a, mean_b, diff`` (``b - a``)``, stderr, ci_level, t_low, t_high, boot_low, boot_high, t,
    p_t, p_perm, perm_method, perm_samples``.
    """

    def __init__(self, n_metrics: int, replicates: int = DEFAULT_REPLICATES, flips: int = DEFAULT_FLIPS,
                 exact_max: int = DEFAULT_EXACT_MAX, level: float = DEFAULT_LEVEL, seed: int = 0):
        self.n_metrics = int(n_metrics)
        self.level = float(level)
        self._pc = PairedComparison(self.n_metrics, replicates, flips, exact_max, seed)

    def create_accumulator(self):
        return self._pc.create()

    def add_input(self, acc, element):
        key, a, b = element
        return self._pc.add(acc, key, a, b)

    def merge_accumulators(self, accumulators):
        return self._pc.merge(list(accumulators))

    def compact(self, acc):
        return self._pc.compact(acc)

    def extract_output(self, acc):
        return self._pc.extract(acc, self.level)

    def get_accumulator_coder(self):
        return FastPrimitivesCoder()


def _system_means(items):
    """{system: [mean per metric]} over a query's requests (several requests of one system for
    the same query in a window are averaged: exact sum / count per metric, NaN skipped)."""
    by_system: dict = {}
    for system, values in items:
        by_system.setdefault(system, []).append([float(v) for v in values])
    out = {}
    for system, rows in by_system.items():
        cols = list(zip(*rows))
        means = []
        for col in cols:
            ok = [v for v in col if not math.isnan(v)]
            means.append(math.fsum(ok) / len(ok) if ok else math.nan)
        out[system] = means
    return out


def _pair_up(element, pairs, baseline):
    (ws, we, label, query_key), items = element
    means = _system_means(items)
    wanted = list(pairs)
    if baseline is not None and baseline in means:
        wanted += [(baseline, s) for s in sorted(means) if s != baseline and (baseline, s) not in wanted]
    for a, b in wanted:
        if a in means and b in means:
            yield ((ws, we, label, a, b), (query_key, means[a], means[b]))


class PairScores(beam.PTransform):
    """Pairs per-query scores of two systems on the same queries, in the same window and slice.

    Input: ``((window_start, window_end, slice, system), (query_key, [value per metric]))``, one
    element per scored request. Output: ``((window_start, window_end, slice, A, B), (query_key,
    a_values, b_values))`` for every query that both A and B scored in that window and slice
    (queries scored by one side only are left out). ``pairs``: ``(A, B)`` tuples; ``baseline``: a
    system compared with every other system present (``(baseline, other)``). The difference taken
    downstream is ``B - A``.
    """

    def __init__(self, pairs=(), baseline=None, label=None):
        super().__init__(label)
        self.pairs = [tuple(p) for p in pairs]
        if any(len(p) != 2 for p in self.pairs):
            raise ValueError("pairs must be (A, B) tuples")
        self.baseline = baseline
        if not self.pairs and baseline is None:
            raise ValueError("give pairs or a baseline")

    def expand(self, scores):
        return (
            scores
            | "KeyByQuery" >> beam.Map(lambda kv: ((kv[0][0], kv[0][1], kv[0][2], kv[1][0]), (kv[0][3], kv[1][1])))
            | "GroupQueries" >> beam.GroupByKey()
            | "Pair" >> beam.FlatMap(_pair_up, self.pairs, self.baseline)
        )


COMPARISON_FIELDS = ("window_start", "window_end", "slice", "system_a", "system_b", "metric", "num_queries",
                     "mean_a", "mean_b", "diff", "stderr", "ci_level", "t_low", "t_high", "boot_low", "boot_high",
                     "t", "p_t", "p_perm", "perm_method", "perm_samples")


def comparison_row(window_start, window_end, slice_label, system_a, system_b, metric, result: dict) -> dict:
    """One comparison record (fields :data:`COMPARISON_FIELDS`; NaN floats become None)."""
    row = {"window_start": window_start, "window_end": window_end, "slice": slice_label,
           "system_a": system_a, "system_b": system_b, "metric": metric}
    for k in COMPARISON_FIELDS[6:]:
        row[k] = _none_if_nan(result.get(k))
    return row


def _comparison_rows(element, names):
    (ws, we, label, a, b), results = element
    for name, res in zip(names, results):
        yield comparison_row(ws, we, label, a, b, name, res)


class CompareSystems(beam.PTransform):
    """``scores | CompareSystems(metric_names, pairs=[("bm25", "bert")])`` -> comparison rows
    (:func:`comparison_row`), one per (window, slice, pair, metric). Input as :class:`PairScores`
    (the values in the order of ``metric_names``); options as :class:`PairedCombineFn`."""

    def __init__(self, metric_names, pairs=(), baseline=None, replicates: int = DEFAULT_REPLICATES,
                 flips: int = DEFAULT_FLIPS, exact_max: int = DEFAULT_EXACT_MAX, level: float = DEFAULT_LEVEL,
                 seed: int = 0, label=None):
        super().__init__(label)
        self.names = list(metric_names)
        self.pair = PairScores(pairs, baseline)
        self.combine = PairedCombineFn(len(self.names), replicates, flips, exact_max, level, seed)

    def expand(self, scores):
        return (
            scores
            | "PairScores" >> self.pair
            | "Compare" >> beam.CombinePerKey(self.combine)
            | "ComparisonRows" >> beam.FlatMap(_comparison_rows, self.names)
        )
