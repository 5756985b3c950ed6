"""The batched diversity kernel (issue 17, measures): ``request_values`` and ``evaluate_lists`` score
many rankings at once (``diversity.batch_values``); every value must be bit for bit the one of the
per-query specification ``query_values`` (the conformance matrix compares engines exactly).

Oracle: ``query_values`` called once per ranking on judgment matrices built here in plain Python
(subtopic and docno order by ``sorted``), with its own ideal gains and relevant counts.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from streameval.metrics import diversity
from streameval.metrics.diversity import parse_diversity, query_values

NAMES = ["alpha_nDCG@10", "alpha-nDCG@1", "alpha_DCG@3", "alpha-DCG@1", "ERR_IA@20", "nERR_IA@2", "ERR-IA@1",
         "NRBP", "nNRBP", "AP_IA", "P_IA@5", "P_IA@1", "P_IA@30", "S_recall@20", "strec@1",
         "alpha_nDCG(alpha=0.3)@5", "nERR_IA(alpha=0.3)@25", "NRBP(alpha=0.2,beta=0.9)", "nNRBP(beta=0.1)",
         "nNRBP(alpha=1,beta=1)", "alpha_nDCG(rel=2)@7", "AP_IA(rel=2)", "strec(rel=2)@4", "nNRBP(rel=2)",
         "alpha_nDCG(alpha=1)@4", "alpha_nDCG(alpha=0)@50", "ERR_IA(alpha=0)@3"]


def reference(specs, rq, offsets, ranked, jq, js, jd, jg, level=1):
    """(len(specs), n): query_values of each request, one call per request and (alpha, beta, rel)."""
    out = np.zeros((len(specs), len(rq)))
    for r, q in enumerate(rq):
        docs_ranked = ranked[offsets[r]:offsets[r + 1]]
        rows = [i for i in range(len(jq)) if jq[i] == q]
        if not rows or not docs_ranked:
            continue  # no judgment or an empty ranking: 0 everywhere
        for i, sp in enumerate(specs):
            lvl = level if sp.rel is None else sp.rel
            relevant = [(js[j], jd[j]) for j in rows if jg[j] >= lvl]
            subs = sorted({s for s, _ in relevant})
            docs = sorted({jd[j] for j in rows})
            judged = np.zeros((len(docs), len(subs)), dtype=bool)
            for s, d in relevant:
                judged[docs.index(d), subs.index(s)] = True
            rel = np.array([judged[docs.index(d)] if d in docs else np.zeros(len(subs), dtype=bool)
                            for d in docs_ranked], dtype=bool).reshape(len(docs_ranked), len(subs))
            out[i, r] = query_values(rel, judged, [sp])[0]
    return out


def assert_bits(ours, ref):
    assert ours.shape == ref.shape
    diff = np.argwhere(ours.view(np.uint64) != ref.view(np.uint64))
    assert not len(diff), [(tuple(ix), ours[tuple(ix)], ref[tuple(ix)]) for ix in diff[:5]]


def collection(seed, n_queries=25, n_requests=160):
    """Judgments with 1-6 subtopics per query, grades 0-3, every seventh query with only grade 0 (S = 0),
    queries without judgments; requests of lengths 0-40 (shorter and longer than the cutoffs), several
    per query, with unjudged documents."""
    rnd = random.Random(seed)
    jq, js, jd, jg = [], [], [], []
    for q in range(n_queries):
        for d in rnd.sample(range(40), rnd.randint(0, 25)):
            for s in range(1, rnd.randint(1, 6) + 1):
                if rnd.random() < 0.7:
                    jq.append(f"q{q}")
                    js.append(f"s{s}" if s != 4 else "S4")  # subtopic order is byte order
                    jd.append(f"d{d}")
                    jg.append(rnd.randint(0, 3) if q % 7 else 0)
    rq, ranked, offsets = [], [], [0]
    for _ in range(n_requests):
        rq.append(f"q{rnd.randrange(n_queries + 3)}")
        ranked += [f"d{d}" for d in rnd.sample(range(50), rnd.choice([0, 1, 2, 3, 5, 10, 19, 25, 40]))]
        offsets.append(len(ranked))
    return rq, np.array(offsets), ranked, jq, js, jd, jg


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_request_values_equal_query_values_bit_for_bit(seed):
    specs = [parse_diversity(n) for n in NAMES]
    rq, offsets, ranked, jq, js, jd, jg = collection(seed)
    got = diversity.request_values(specs, rq, offsets, ranked, jq, js, jd, jg)
    ref = reference(specs, rq, offsets, ranked, jq, js, jd, jg)
    assert_bits(got, ref)
    assert np.isnan(got).any() and (got > 0).any()  # the S = 0 queries' nNRBP, and real scores


def test_small_batches_and_relevance_level(monkeypatch):
    """Batches split at any size (one ranking per batch at the smallest) give the same bits; the
    caller's relevance level applies to specs without their own ``rel``."""
    specs = [parse_diversity(n) for n in NAMES]
    rq, offsets, ranked, jq, js, jd, jg = collection(5)
    ref = reference(specs, rq, offsets, ranked, jq, js, jd, jg, level=2)
    for elements in (1, 37, 500):
        monkeypatch.setattr(diversity, "_BATCH_ELEMENTS", elements)
        assert_bits(diversity.request_values(specs, rq, offsets, ranked, jq, js, jd, jg, relevance_level=2), ref)


def test_offsets_not_from_zero_and_arrow_inputs():
    pa = pytest.importorskip("pyarrow")
    specs = [parse_diversity(n) for n in ("alpha_nDCG@5", "nNRBP", "AP_IA", "strec@10")]
    rq, offsets, ranked, jq, js, jd, jg = collection(3, n_requests=40)
    ref = reference(specs, rq, offsets, ranked, jq, js, jd, jg)
    shifted = ["x", "y"] + ranked
    got = diversity.request_values(specs, pa.array(rq), offsets + 2, pa.array(shifted), pa.array(jq), js, jd,
                                   np.array(jg))
    assert_bits(got, ref)


def test_degenerate_inputs():
    specs = [parse_diversity(n) for n in ("alpha_nDCG@5", "nNRBP", "P_IA@3")]
    # no requests, no specs, no judgments, only empty rankings
    assert diversity.request_values(specs, [], [0], [], [], [], [], []).shape == (3, 0)
    assert diversity.request_values([], ["q"], [0, 1], ["d"], ["q"], ["s"], ["d"], [1]).shape == (0, 1)
    assert not diversity.request_values(specs, ["q", "r"], [0, 1, 2], ["d", "e"], [], [], [], []).any()
    assert not diversity.request_values(specs, ["", ""], [0, 0, 0], [], ["q"], ["s"], ["d"], [1]).any()
    # judged, nothing relevant (S = 0): 0 but nNRBP, NaN (ndeval's 0 / 0); an empty ranking: 0
    got = diversity.request_values(specs, ["q", "q"], [0, 1, 1], ["d"], ["q"], ["s"], ["d"], [0])
    assert_bits(got, np.array([[0.0, 0.0], [np.nan, 0.0], [0.0, 0.0]]))


@pytest.mark.parametrize("seed", [0, 4])
def test_evaluate_lists_equal_query_values_bit_for_bit(seed):
    """evaluate_lists: each query's ranking through the same kernel; queries of ``qids`` without
    results or judgments score 0, in ``qids``' order, repeats included."""
    specs = [parse_diversity(n) for n in NAMES]
    rq, offsets, ranked, jq, js, jd, jg = collection(seed)
    first = {}
    for r, q in enumerate(rq):
        first.setdefault(q, r)
    run_q = sorted(first)
    queue = {q: list(ranked[offsets[first[q]]:offsets[first[q] + 1]]) for q in run_q}
    rnd, rows = random.Random(seed), []
    while any(queue.values()):  # queries interleaved, each query's rows in rank order
        q = rnd.choice([q for q, docs in queue.items() if docs])
        rows.append((q, queue[q].pop(0)))
    qids_asked = list(reversed(run_q)) + ["nowhere", run_q[0]]
    qids, got = diversity.evaluate_lists(jq, js, jd, jg, [q for q, _ in rows], [d for _, d in rows], specs,
                                         qids=qids_asked)
    assert qids.tolist() == qids_asked
    req = [first[q] for q in qids_asked[:-2]]
    ref = reference(specs, [rq[r] for r in req], np.concatenate([[0], np.cumsum(np.diff(offsets)[req])]),
                    [d for r in req for d in ranked[offsets[r]:offsets[r + 1]]], jq, js, jd, jg)
    assert_bits(got[:, :-2], ref)
    assert not got[:, -2].any()
    assert_bits(got[:, -1], got[:, qids_asked.index(run_q[0])])
    # the default queries: those judged and ranked, in byte order
    qids, _ = diversity.evaluate_lists(jq, js, jd, jg, [q for q, _ in rows], [d for _, d in rows], specs)
    assert qids.tolist() == sorted(set(jq) & {q for q, _ in rows})


@pytest.mark.parametrize("alpha", [0.5, 0.0, 1.0, 0.3])
def test_ideal_gains_rows_equal_ideal_gains_bit_for_bit(alpha):
    """The greedy ideal ranking of many queries at once against ideal_gains per query: many ties
    (few subtopics, equal subtopic sets), documents relevant to nothing, queries of 0 to 60 rows."""
    rng = np.random.default_rng(int(alpha * 10))
    for s in (1, 2, 3, 6):
        mats = [rng.random((int(rng.integers(0, 60)), s)) < rng.choice([0.2, 0.5, 0.9]) for _ in range(30)]
        m = max(len(x) for x in mats)
        rel = np.zeros((len(mats), m, s), dtype=bool)
        for i, x in enumerate(mats):
            rel[i, :len(x)] = x
        got = diversity._ideal_gains_rows(rel, alpha)
        for i, x in enumerate(mats):
            ref = diversity.ideal_gains(x, alpha)
            assert_bits(got[i, :len(ref)], ref)
            assert not got[i, len(ref):].any()


def test_long_queries_take_the_per_query_greedy(monkeypatch):
    """Queries with more relevant documents than _GREEDY_ROWS, and batches of fewer queries than
    _GREEDY_QUERIES, take ideal_gains: the same bits."""
    specs = [parse_diversity(n) for n in NAMES]
    rq, offsets, ranked, jq, js, jd, jg = collection(6)
    ref = reference(specs, rq, offsets, ranked, jq, js, jd, jg)
    for rows, queries in ((0, 1), (5, 1), (256, 1), (256, 10 ** 6)):
        monkeypatch.setattr(diversity, "_GREEDY_ROWS", rows)
        monkeypatch.setattr(diversity, "_GREEDY_QUERIES", queries)
        assert_bits(diversity.request_values(specs, rq, offsets, ranked, jq, js, jd, jg), ref)
