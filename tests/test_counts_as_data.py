"""Counts as data (streameval/beam/counts_as_data.py): the batch job's counter increments travel as
elements to one step, which reports them to the runner once.

Why: Prism 2.62 keeps one payload per unresolved metric short id, so of two bundles of a stage that
end before their counters' short ids are resolved, one's counts are lost (the fresh-clone CI run of
stop 55: ``requests_unjudged`` 29,867 of 60,000 on the bundled sample). A counter reported from one
bundle of one step cannot lose a part that way.

Checked here: the counts and distributions of the columnar engine with ``counts_as_data`` equal its
Beam counters without it (the pipeline's own increments, on the local runner, for every stage:
reads, cleaning, judgments, scoring, hot queries, labels from judgments, unjudged listing), every
counter of the job is reported by the one publishing step, and a distribution published from its
four numbers reads back as those four numbers.
"""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from streameval.beam.columnar import ColumnarMetrics
from streameval.beam.counts_as_data import (CountsCombineFn, PublishCounts, add_counts, decode_counts, encode_counts,
                                            publish_distribution)
from streameval.io import counters as cn

IMPS = ["data/sample/impressions/letor_feature206.avro", "data/sample/impressions/letor_feature253.avro",
        "data/sample/impressions/obd_random_men.avro"]
JUDG = ["data/sample/judgments/letor_test_labels.avro"]


def _metrics(result):
    out = {}
    for ns in (cn.NAMESPACE, cn.DECODER_NAMESPACE):
        q = result.metrics().query(MetricsFilter().with_namespace(ns))
        for c in q["counters"]:
            out.setdefault(("counter", ns, c.key.metric.name), []).append((c.key.step, c.committed))
        for d in q["distributions"]:
            v = d.committed
            out.setdefault(("distribution", ns, d.key.metric.name), []).append(
                (d.key.step, (v.count, v.sum, v.min, v.max)))
    return out


def _inputs(name, tmp_path):
    """(impression files, judgment files): the bundled sample's, or the hot-query test's messy log
    (replays, conflicting events and judgments, a bad position, a query with 30 % of the requests)."""
    if name == "sample":
        return IMPS, JUDG
    from tests.test_columnar import write_logs
    from tests.test_hot_queries import _hot_logs

    args = write_logs(tmp_path, *_hot_logs())
    return args[1:-2:2], [args[-1]]


def _run(counts_as_data: bool, threads: int, imps, judg, **kw):
    p = beam.Pipeline(runner=FnApiRunner())
    col = ColumnarMetrics(imps, judg, ["ndcg@10", "map"], online=["auc"], labels="judgments", threads=threads,
                          counts_as_data=counts_as_data, shards=8, **kw)
    rows = p | "Metrics" >> col
    _ = rows | "Rows" >> beam.Map(lambda r: r)
    if counts_as_data:
        from streameval.beam.unjudged import listed_unjudged

        listed_unjudged(col.unjudged, rows, [s.name for s in col.specs], counts=col.counts)
        assert len(col.counts) >= 7  # read x2, clean, resolve, score, hot, labels, unjudged listing
        _ = tuple(col.counts) | "Counts" >> PublishCounts()
    result = p.run()
    result.wait_until_finish()
    return _metrics(result)


def _totals(metrics):
    out = {}
    for key, parts in metrics.items():
        if key[0] == "counter":
            out[key] = sum(v for _, v in parts)
        else:
            c, s, lo, hi = zip(*(v for _, v in parts))
            out[key] = (sum(c), sum(s), min(lo), max(hi))
    return out


@pytest.mark.parametrize("data,threads,complete", [("sample", 1, False), ("hot", 2, False), ("hot", 1, True)])
def test_counts_as_data_equal_the_beam_counters_and_come_from_one_step(data, threads, complete, tmp_path, monkeypatch):
    from streameval.beam import columnar_hot

    monkeypatch.setattr(columnar_hot, "HOT_MIN_REQUESTS", 10)  # as tests/test_hot_queries.py: the hot query fans out
    imps, judg = _inputs(data, tmp_path)
    plain = _run(False, threads, imps, judg, complete=complete)
    counted = _run(True, threads, imps, judg, complete=complete)
    want, got = _totals(plain), _totals(counted)
    # the listing stage's counter exists only in the job that lists: the requests of systems without
    # a judged request (the sample's Open Bandit requests; every system of the hot log has some)
    unlisted = got.pop(("counter", cn.NAMESPACE, cn.REQUESTS_UNJUDGED_UNLISTED), 0)
    assert ("counter", cn.NAMESPACE, cn.REQUESTS_UNJUDGED_UNLISTED) not in want
    assert unlisted == (want[("counter", cn.NAMESPACE, cn.REQUESTS_UNJUDGED)] if data == "sample" else 0)
    assert got == want  # counters of 0 too (summary.json lists them)
    for name in (cn.read("impression"), cn.IMPRESSIONS_RANKED, cn.IMPRESSIONS_UNJUDGED, cn.QUERIES_SCORED,
                 cn.JUDGMENTS_ACCEPTED):
        assert got[("counter", cn.NAMESPACE, name)] > 0, name  # each stage's counts are among them
    if imps != IMPS:  # the hot-query stage ran
        assert any("HotQueries" in step for step, _ in plain[("counter", cn.NAMESPACE, cn.QUERIES_SCORED)])
        assert got[("counter", cn.NAMESPACE, cn.DUPLICATE_IMPRESSION)] > 0
    steps = {step for parts in counted.values() for step, _ in parts}
    assert steps == {"Counts/Publish"}, steps
    assert len({step for parts in plain.values() for step, _ in parts}) >= 5  # without: each stage reports its own


def test_counts_round_trip_and_add_up():
    a = {("ns", "x"): 3, ("distribution", "ns", "d"): [2, 10, 4, 6]}
    b = {("ns", "x"): 4, ("ns", "y"): 1, ("distribution", "ns", "d"): [1, 1, 1, 1]}
    assert decode_counts(encode_counts(a)) == a
    fn = CountsCombineFn()
    acc = fn.merge_accumulators([fn.add_input(fn.create_accumulator(), encode_counts(a)),
                                 fn.add_input(fn.create_accumulator(), encode_counts(b)), fn.create_accumulator()])
    assert decode_counts(fn.extract_output(acc)) == {("ns", "x"): 7, ("ns", "y"): 1,
                                                     ("distribution", "ns", "d"): [3, 11, 1, 6]}
    assert add_counts({}, {}) == {} and fn.merge_accumulators([]) == {}


@pytest.mark.parametrize("count,total,lo,hi", [(1, 5, 5, 5), (2, 7, 3, 4), (5, 23, 1, 9), (1000, 123457, 0, 1000)])
def test_a_distribution_published_from_its_four_numbers_reads_back_as_them(count, total, lo, hi):
    def publish(_):
        publish_distribution("ns", "d", count, total, lo, hi)
        return ()

    p = beam.Pipeline(runner=FnApiRunner())
    _ = p | beam.Create([None]) | beam.FlatMap(publish)
    result = p.run()
    result.wait_until_finish()
    (d,) = result.metrics().query(MetricsFilter().with_namespace("ns"))["distributions"]
    v = d.committed
    assert (v.count, v.sum, v.min, v.max) == (count, total, lo, hi)
