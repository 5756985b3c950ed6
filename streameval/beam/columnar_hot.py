"""Hot queries on the columnar engine (:class:`~streameval.beam.columnar.ColumnarMetrics`, issue 16).

A query's requests all go to one query shard for scoring (stage 3), so a query with a large share of
the traffic makes one score element many times larger than the others. Stage 2 (one request shard
per element) therefore fans such a query out:

* **hot**: a query with more than ``hot_fraction`` of the shard's requests (``--hot-query-fraction``,
  default :data:`HOT_FRACTION`) and at least :data:`HOT_MIN_REQUESTS` of them;
* **fan-out** ``F = min(ceil(share x shards), shards)`` where ``share`` is the query's fraction of
  the request shard's requests: requests are spread over request shards by a hash of their id, so
  the query holds about ``share`` of all requests, ``share x shards`` query shards' worth, and ``F``
  sub-elements hold about one shard's worth each. ``F = 1`` (a query smaller than one shard's
  worth) leaves the query in its shard;
* a hot query's requests get the key ``(query shard, crc32(request_id) % F)`` instead of the query
  shard; the score stage still reads the judgments of the query shard (the multimap side input), so
  every sub-element reads the same small list.

Requests are scored independently and their values summed exactly per (window, slice, system)
(:class:`~streameval.accumulators.moments.MeanMoments`; the Poisson bootstrap's weights are a hash of
the query id, :class:`~streameval.accumulators.bootstrap.ReplicateSums`, exact too), so the split
changes no metric row and no interval. Three things need a query's requests together; for the
queries that are hot in any request shard (a side input of the score stage: the hot set), the
score elements leave them to a small stage keyed by query id, :class:`HotQueries`:

* the ``queries_scored`` counter (distinct queries): each element sends a summary per hot query
  it scored, the hot stage counts each query once;
* ``--compare-baseline`` (per query system means): each element sends, per (window, slice, system)
  of the hot query, the exact partial sums of its requests' values (floats whose exact sum is the
  sum, :func:`~streameval.accumulators.moments.exact_sum_floats`) and the counts of non-NaN values;
  the hot stage adds them up, rounds each mean once (the correctly rounded exact sum over the count,
  as :func:`~streameval.beam.columnar_compare.system_means`' ``math.fsum``) and pairs them with the
  baseline's into :class:`~streameval.accumulators.bootstrap.PairedComparison` states (exact and
  order-free: the same comparison rows);
* ``--complete`` (trec_eval's ``-c``: which (judged query, system) pairs have a scored request):
  the plain element of the query shard completes its other queries; the hot stage completes a hot
  query for every system none of its elements scored (each hot query reaches the hot stage through a
  marker from stage 2, also when none of its requests was scored).

With ``hot_fraction=0`` no query is hot and the pipeline is the one without fan-out.
"""

from __future__ import annotations

import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam import pvalue

from ..accumulators.moments import exact_row_sums
from ..metrics.kernel import RankedLists, compute
from ..metrics.prepare import judgment_histogram
from . import columnar as col
from .threads import counter

__all__ = ["HOT_FRACTION", "HOT_MIN_REQUESTS", "fan_out", "element_key", "element_shard", "hot_summaries",
           "HotQueries"]

#: ``--hot-query-fraction``'s default: a query with more than this share of a request shard's requests
HOT_FRACTION = 0.01
#: the fewest requests of a query in one request shard that make it hot (smaller ones are cheap anyway)
HOT_MIN_REQUESTS = 100


def fan_out(query, request_id, shards: int, fraction: float, min_requests: int = HOT_MIN_REQUESTS):
    """Per request of one request shard (``query``, ``request_id``: Arrow strings, one per request):
    (sub-key int64 array, -1 for a request that stays in its query shard, else
    ``crc32(request_id) % F`` of its query's fan-out F; the hot queries' ids, a list; their F, a
    list). See the module docstring for the rule."""
    n = len(query)
    sub = np.full(n, -1, dtype=np.int64)
    if not n or fraction <= 0:
        return sub, [], []
    qcode, qvocab = col._encode(query)
    counts = np.bincount(qcode, minlength=len(qvocab))
    share = counts / n
    fan = np.minimum(np.ceil(share * shards), shards).astype(np.int64)
    hot = (share > fraction) & (counts >= min_requests) & (fan >= 2)
    if not hot.any():
        return sub, [], []
    rows = np.flatnonzero(hot[qcode])
    crc = col._shards_of(col._pick(request_id, rows), None, 1 << 32)
    sub[rows] = crc % fan[qcode[rows]]
    return sub, qvocab.filter(pa.array(hot)).to_pylist(), fan[hot].tolist()


def element_key(shard: int, sub: int):
    """The score stage's key: the query shard (an int) or, for a hot query's sub-element, the pair
    ``(query shard, sub)``."""
    return int(shard) if sub < 0 else (int(shard), int(sub))


def element_shard(key) -> int:
    """The query shard of a score stage key (:func:`element_key`)."""
    return key if isinstance(key, int) else key[0]


def _groups(min_ts, system_id, attributes, query_id, values, window_micros, slice_specs):
    """Per (window, slice specification, label, query, system) run of requests: ``(query, window key,
    spec, label, system, counts of non-NaN values per metric, exact partial sums per metric)``."""
    nreq = len(min_ts)
    scode, svals = col._factorize(system_id)
    qcode, qvals = col._encode(query_id)
    qnames = qvals.to_pylist()
    Q, S = len(qnames), len(svals)
    nan = np.isnan(values)
    filled = np.where(nan, 0.0, values)
    wcode, wkeys = col._windows(min_ts, window_micros)
    for spec, (lcode, lvals) in enumerate(col._labels(attributes, nreq, slice_specs)):
        key = ((wcode * len(lvals) + lcode) * Q + qcode) * S + scode
        order, starts, ends = col._group_bounds(key)
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            members = order[lo:hi]
            k = int(key[members[0]])
            s, k = k % S, k // S
            q, k = k % Q, k // Q
            lab, w = k % len(lvals), k // len(lvals)
            counts = (~nan[:, members]).sum(axis=1).tolist()
            sums = [_floats(f) for f in exact_row_sums(filled[:, members])]
            yield qnames[q], wkeys[w], spec, lvals[lab], svals[s], counts, sums


def _floats(r) -> list:
    """Floats whose exact sum is the Fraction ``r`` (the correctly rounded value first)."""
    from ..accumulators.moments import _floats_of

    return _floats_of(r)


def hot_summaries(r: dict, values, compare: bool, window_micros, slice_specs):
    """``(query, summary)`` per hot query of scored requests ``r`` (a request dict, all of them of hot
    queries) with their values (n_metrics, n_requests): ``{"systems": [systems with a scored request],
    "groups": [[window_start, window_end, spec, label, system, counts, partial sums], ...]}`` (groups
    only with ``compare``)."""
    qcode, qvals = col._encode(r["query_id"])
    scode, svals = col._factorize(r["system_id"])
    qnames, S = qvals.to_pylist(), len(svals)
    out: dict = {}
    for k in np.unique(qcode * S + scode).tolist():  # (query, system) pairs with a scored request
        out.setdefault(qnames[k // S], {"systems": set(), "groups": []})["systems"].add(svals[k % S])
    if compare:
        for q, wkey, spec, label, system, counts, sums in _groups(
                r["min_ts"], r["system_id"], r["attributes"], r["query_id"], values, window_micros, slice_specs):
            out[q]["groups"].append([*wkey, spec, label, system, counts, sums])
    for q, summary in out.items():
        summary["systems"] = sorted(summary["systems"])
        yield q, summary


class HotQueries(beam.DoFn):
    """Per hot query (``(query id, [summaries of :func:`hot_summaries`, None markers])``): counts it
    in ``queries_scored`` once; with ``complete`` (side inputs: the resolved judgments by query shard
    and the job's systems) scores the empty rankings of the systems none of its elements scored
    (means states, main output); with ``compare`` pairs its per (window, slice) system means with
    the baseline's (tag ``comparisons``)."""

    def __init__(self, specs, options, mm, shards: int, compare=None, bootstrap: bool = False,
                 complete: bool = False):
        self.specs, self.options, self.mm, self.shards = specs, options, mm, int(shards)
        self.compare = compare  # (baseline, replicates, seed) or None
        self.bootstrap = bootstrap
        self.complete = complete
        if compare is not None:
            from ..accumulators.bootstrap import PairedComparison

            self.pc = PairedComparison(len(specs), compare[1], seed=compare[2])
        self.queries = counter(col.NAMESPACE, "queries_scored")
        self.completed = counter(col.NAMESPACE, "requests_completed")

    def process(self, element, judgments=None, systems=None):
        """``judgments``, ``systems``: side inputs with ``complete`` only (a multimap of the resolved
        judgments by query shard, the list of the job's systems)."""
        query, parts = element
        n = len(self.specs)
        scored: set = set()
        groups: dict = {}
        for p in parts:
            if p is None:
                continue
            scored.update(p["systems"])
            for ws, we, spec, label, system, counts, sums in p["groups"]:
                g = groups.setdefault((ws, we, spec, label, system), [[0] * n, [[] for _ in range(n)]])
                g[0] = [a + b for a, b in zip(g[0], counts)]
                for m in range(n):
                    g[1][m].extend(sums[m])
        completions = {}
        if self.complete:
            missing = [s for s in sorted(systems) if s not in scored]
            if missing:
                completions = self._completions(query, judgments[col.shard_of(query, shards=self.shards)], missing)
        if scored or completions:
            self.queries.inc()
        for system, value in completions.items():
            col_values = value.reshape(n, 1)
            if self.bootstrap:
                state = self.mm.add_many(self.mm.create(), col_values, keys=[query])
            else:
                state = self.mm.add_many(self.mm.create(), col_values)
            yield ((None, None, col.ALL, system), state)
        if self.compare is not None:
            yield from self._pairs(query, groups, completions)

    def _completions(self, query, judgments, missing) -> dict:
        """{system: values (n_metrics,)} of the empty ranking of ``query`` (if judged) per missing system."""
        jparts = [col.thaw(v, keep=True) for v in judgments]  # a side input: may be read again
        if not jparts:
            return {}
        jc = col._concat(jparts)
        rows = np.flatnonzero(np.asarray(pc.equal(jc["query_id"], query).fill_null(False)))
        if not len(rows):
            return {}
        jg = np.asarray(jc["grade"], dtype=np.float64)[rows]
        qoff, hv, hc = judgment_histogram(np.zeros(len(rows), np.int64), jg, 1)
        k = len(missing)
        lists = RankedLists(offsets=np.zeros(k + 1, dtype=np.int64), grades=np.zeros(0), judged_offsets=qoff,
                            judged_values=hv, judged_counts=hc, judged_index=np.zeros(k, np.int64))
        values = compute(lists, self.specs, self.options)
        self.completed.inc(k)
        return {s: values[:, i] for i, s in enumerate(missing)}

    def _pairs(self, query, groups: dict, completions: dict):
        baseline = self.compare[0]
        n = len(self.specs)
        means: dict = {}  # (window_start, window_end, spec, label) -> {system: means}
        for (ws, we, spec, label, system), (counts, sums) in groups.items():
            m = np.array([math.fsum(s) / c if c else math.nan for c, s in zip(counts, sums)])
            means.setdefault((ws, we, spec, label), {})[system] = m
        for system, value in completions.items():  # the empty rankings count in the slice "all" only
            means.setdefault((None, None, 0, col.ALL), {})[system] = value
        for (ws, we, _, label), by_system in sorted(means.items(), key=lambda kv: repr(kv[0])):
            if baseline not in by_system:
                continue
            a = by_system[baseline].reshape(n, 1)
            for system in sorted(by_system):
                if system == baseline:
                    continue
                st = self.pc.add_many(self.pc.create(), a, by_system[system].reshape(n, 1), [query])
                yield pvalue.TaggedOutput("comparisons", ((ws, we, label, baseline, system), self.pc.compact(st)))
