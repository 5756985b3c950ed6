"""The batch job's list of unjudged requests (``unjudged.jsonl``): only what a judge can act on.

A request whose query has no judgment is counted (``requests_unjudged``) and, when its system has at
least one judged request, listed: a gap in the judgments of a system that is evaluated with ranking
measures. The requests of a system none of whose requests is judged (CTR-only traffic, such as the
bundled sample's Open Bandit logs beside its LETOR run: 60,000 requests, 6.1 MB of lines) are
counted as ``requests_unjudged_unlisted`` and not listed.
"""

from __future__ import annotations

import apache_beam as beam

from ..io import counters as cn
from ..io.counters import NAMESPACE
from .counts_as_data import COUNTS, counts_tags
from .threads import ThreadedDoFn, counter

__all__ = ["listed_unjudged"]


class _ListUnjudged(ThreadedDoFn):
    """The unjudged requests worth listing: those of systems with at least one judged request (a
    ranking metric row); a system none of whose requests is judged (CTR-only traffic, which no
    judgment file covers) is counted (``requests_unjudged_unlisted``), not listed. Takes a request
    (the per-record engine) or a list of them (the columnar engine's, one per shard) and the judged
    systems as a side input; yields the same shape."""

    def __init__(self):
        self.unlisted = counter(NAMESPACE, cn.REQUESTS_UNJUDGED_UNLISTED)
        self._seen = None

    def process(self, requests, judged, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        yield from self._submit((requests, judged), window, timestamp)

    def work(self, requests, judged):
        if self._seen is None or self._seen[0] is not judged:
            self._seen = (judged, frozenset(judged))
        systems = self._seen[1]
        if isinstance(requests, dict):
            if requests["system"] in systems:
                yield requests
            else:
                self.unlisted.inc()
            return
        listed = [r for r in requests if r["system"] in systems]
        if len(listed) < len(requests):
            self.unlisted.inc(len(requests) - len(listed))
        if listed:
            yield listed


def _systems_with_rows(row, names):
    return [row["system"]] if row["metric"] in names else []


def listed_unjudged(unjudged, rows, names, counts=None):
    """``unjudged`` (requests, or lists of them) without the requests of systems that have no row of
    a ranking measure (``names``: the measures' row names, ``all_trec`` expanded) among ``rows`` (no
    judged request): :class:`_ListUnjudged`. ``counts``: None, or a list to which the stage's counts
    are added (it then counts as data: :mod:`streameval.beam.counts_as_data`)."""
    names = frozenset(names)
    judged = (rows | "JudgedSystems" >> beam.FlatMap(_systems_with_rows, names)
              | "DistinctJudgedSystems" >> beam.Distinct())
    fn = _ListUnjudged()
    fn.counts_as_data = counts is not None
    listed = unjudged | "ListUnjudged" >> beam.ParDo(fn, beam.pvalue.AsList(judged)).with_outputs(
        *counts_tags(counts is not None), main="listed")
    if counts is not None:
        counts.append(listed[COUNTS])
    return listed.listed
