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
changes no metric row and no interval. Two things need a query's requests together; for the
queries that are hot in any request shard (a side input of the score stage: the hot set), the
score elements leave them to a small stage keyed by query id, :class:`HotQueries`:

* the ``queries_scored`` counter (distinct queries): each element sends a summary per hot query
  it scored (the systems with a scored request), the hot stage counts each query once;
* ``--complete`` (trec_eval's ``-c``: which (judged query, system) pairs have a scored request):
  the plain element of the query shard completes its other queries; the hot stage completes a hot
  query for every system none of its elements scored (each hot query reaches the hot stage through a
  marker from stage 2, also when none of its requests was scored).

``--compare-baseline`` (per query system means) turns fan-out off
(:class:`~streameval.beam.columnar.ColumnarMetrics` sets the fraction to 0): merging a hot stage's
comparison states with the score stage's (a Flatten before the comparisons' merge) lost states now
and then on the local runner with worker processes, even with no hot query, so a comparison job
keeps a query's requests in one element as before.

With ``hot_fraction=0`` no query is hot and the pipeline is the one without fan-out.
"""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..io import counters as cn
from ..metrics.kernel import RankedLists
from ..metrics.prepare import judgment_histogram
from .columnar_columns import _concat, _encode, _factorize, _pick, _shards_of, shard_of, thaw
from .threads import ThreadedDoFn, counter
from .transforms import ALL, NAMESPACE, empty_ranking_values

__all__ = ["HOT_FRACTION", "HOT_MIN_REQUESTS", "fan_out", "element_key", "element_shard", "hot_summaries",
           "HotQueries", "CompletingHotQueries"]

#: ``--hot-query-fraction``'s default: a query with more than this share of a request shard's requests
#: is hot; and the fewest requests of a query in one request shard that make it hot
from .arguments import HOT_FRACTION, HOT_MIN_REQUESTS  # noqa: E402,F401  (the command line's, Beam-free)


def fan_out(query, request_id, shards: int, fraction: float, min_requests: int = HOT_MIN_REQUESTS):
    """Per request of one request shard (``query``, ``request_id``: Arrow strings, one per request):
    (sub-key int64 array, -1 for a request that stays in its query shard, else
    ``crc32(request_id) % F`` of its query's fan-out F; the hot queries' ids, a list; their F, a
    list). See the module docstring for the rule."""
    n = len(query)
    sub = np.full(n, -1, dtype=np.int64)
    if not n or fraction <= 0:
        return sub, [], []
    qcode, qvocab = _encode(query)
    counts = np.bincount(qcode, minlength=len(qvocab))
    share = counts / n
    fan = np.minimum(np.ceil(share * shards), shards).astype(np.int64)
    hot = (share > fraction) & (counts >= min_requests) & (fan >= 2)
    if not hot.any():
        return sub, [], []
    rows = np.flatnonzero(hot[qcode])
    crc = _shards_of(_pick(request_id, rows), None, 1 << 32)
    sub[rows] = crc % fan[qcode[rows]]
    return sub, qvocab.filter(pa.array(hot)).to_pylist(), fan[hot].tolist()


def element_key(shard: int, sub: int):
    """The score stage's key: the query shard (an int) or, for a hot query's sub-element, the pair
    ``(query shard, sub)``."""
    return int(shard) if sub < 0 else (int(shard), int(sub))


def element_shard(key) -> int:
    """The query shard of a score stage key (:func:`element_key`)."""
    return key if isinstance(key, int) else key[0]


def hot_summaries(r: dict):
    """``(query, summary)`` per hot query of scored requests ``r`` (a request dict, all of them of hot
    queries): ``{"systems": [systems with a scored request]}``."""
    qcode, qvals = _encode(r["query_id"])
    scode, svals = _factorize(r["system_id"])
    qnames, S = qvals.to_pylist(), len(svals)
    out: dict = {}
    for k in np.unique(qcode * S + scode).tolist():  # (query, system) pairs with a scored request
        out.setdefault(qnames[k // S], set()).add(svals[k % S])
    for q, systems in out.items():
        yield q, {"systems": sorted(systems)}


class HotQueries(ThreadedDoFn):
    """Per hot query (``(query id, [summaries of :func:`hot_summaries`, None markers])``): counts it
    in ``queries_scored`` once and, with ``complete`` (side inputs: the resolved judgments by query
    shard and the job's systems), scores the empty rankings of the systems none of its elements
    scored: ``((None, None, "all", system), state)`` pairs, as the score stage's."""

    def __init__(self, specs, options, mm, shards: int, bootstrap: bool = False, complete: bool = False):
        self.specs, self.options, self.mm, self.shards = specs, options, mm, int(shards)
        self.bootstrap = bootstrap
        self.complete = complete
        self.queries = counter(NAMESPACE, cn.QUERIES_SCORED)
        self.completed = counter(NAMESPACE, cn.REQUESTS_COMPLETED)

    def process(self, element, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        """Without side inputs (not ``complete``: :class:`CompletingHotQueries`). The work runs here
        (``threads`` 1)."""
        yield from self._submit((element, None, None), window, timestamp)

    def work(self, element, judgments=None, systems=None):
        query, parts = element
        scored: set = set()
        for p in parts:
            if p is not None:
                scored.update(p["systems"])
        completions = {}
        if self.complete:
            missing = [s for s in sorted(systems) if s not in scored]
            if missing:
                completions = self._completions(query, judgments[shard_of(query, shards=self.shards)], missing)
        if scored or completions:
            self.queries.inc()
        n = len(self.specs)
        for system, value in completions.items():
            values = value.reshape(n, 1)
            if self.bootstrap:
                state = self.mm.add_many(self.mm.create(), values, keys=[query])
            else:
                state = self.mm.add_many(self.mm.create(), values)
            yield ((None, None, ALL, system), state)

    def _completions(self, query, judgments, missing) -> dict:
        """{system: values (n_metrics,)} of the empty ranking of ``query`` (if judged) per missing system,
        as :meth:`~streameval.beam.columnar_score._ScoreShard._completions`."""
        jparts = [thaw(v, keep=True) for v in judgments]  # a side input: may be read again
        if not jparts:
            return {}
        jc = _concat(jparts)
        rows = np.flatnonzero(np.asarray(pc.equal(jc["query_id"], query).fill_null(False)))
        if not len(rows):
            return {}
        jg = np.asarray(jc["grade"], dtype=np.float64)[rows]
        qoff, hv, hc = judgment_histogram(np.zeros(len(rows), np.int64), jg, 1)
        k = len(missing)
        lists = RankedLists(offsets=np.zeros(k + 1, dtype=np.int64), grades=np.zeros(0), judged_offsets=qoff,
                            judged_values=hv, judged_counts=hc, judged_index=np.zeros(k, np.int64))
        values = empty_ranking_values(self.specs, self.options, lists, k)
        self.completed.inc(k)
        return {s: values[:, i] for i, s in enumerate(missing)}


class CompletingHotQueries(HotQueries):
    """:class:`HotQueries` with ``complete``: side inputs ``judgments`` (a multimap of the resolved
    judgments by query shard) and ``systems`` (the list of the job's systems)."""

    def process(self, element, judgments, systems, window=beam.DoFn.WindowParam,
                timestamp=beam.DoFn.TimestampParam):
        yield from self._submit((element, judgments, systems), window, timestamp)
