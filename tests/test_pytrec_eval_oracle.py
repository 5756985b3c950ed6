"""Randomised runs and qrels against pytrec_eval (trec_eval's C code): per query, to 1e-9.
pytrec_eval is trec_eval 9, which keeps a run's score as a C ``float``: it is compared with
``score_precision="float32"`` (the default, ``"float64"``, is trec_eval 10's doubles).

The generator makes score ties (scores rounded to one decimal), queries judged but not retrieved,
queries retrieved but not judged, judged-but-unretrieved documents, unjudged retrieved documents,
grades 0-4 and an occasional negative grade (in pool, unjudged)."""

import numpy as np
import pytest

pytrec_eval = pytest.importorskip("pytrec_eval")

from streameval.api import score_queries  # noqa: E402

TREC_MEASURES = {"map", "P.1,3,5,10", "recall.3,10", "ndcg", "ndcg_cut.3,10", "recip_rank", "Rprec", "bpref",
                 "success.1,5", "map_cut.5,10", "num_ret", "num_rel", "num_rel_ret"}
OURS = ["map", "P@1", "P@3", "P@5", "P@10", "recall@3", "recall@10", "ndcg", "ndcg@3", "ndcg@10", "recip_rank",
        "Rprec", "bpref", "success@1", "success@5", "map@5", "map@10", "num_ret", "num_rel", "num_rel_ret"]


def random_collection(rng, n_queries=40, n_docs=60):
    qrels, run = {}, {}
    for q in range(n_queries):
        qid = f"q{q:03d}"
        docs = [f"d{d:03d}" for d in rng.choice(n_docs * 3, size=n_docs, replace=False)]
        kind = rng.random()
        if kind > 0.1:  # judged
            nj = int(rng.integers(0, n_docs))
            judged = rng.choice(docs + [f"u{i}" for i in range(10)], size=nj, replace=False)
            grades = rng.integers(0, 5, size=nj)
            grades[rng.random(nj) < 0.03] = -1
            qrels[qid] = {str(d): int(g) for d, g in zip(judged, grades)}
        if kind < 0.05 or kind > 0.15:  # retrieved (some judged queries are not: 'empty queries')
            nr = int(rng.integers(1, n_docs))
            ret = rng.choice(docs, size=nr, replace=False)
            scores = np.round(rng.normal(size=nr), 1)  # many ties
            run[qid] = {str(d): float(s) for d, s in zip(ret, scores)}
    return qrels, run


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("level", [1, 2])
def test_agrees_with_pytrec_eval(seed, level):
    rng = np.random.default_rng(seed)
    qrels, run = random_collection(rng)
    expected = pytrec_eval.RelevanceEvaluator(qrels, TREC_MEASURES, relevance_level=level).evaluate(run)
    specs, prep, values = score_queries(qrels, run, OURS, relevance_level=level, warn=False,
                                        score_precision="float32")
    assert sorted(expected) == [str(q) for q in prep.qids]
    assert len(expected) > 20
    for j, qid in enumerate(prep.qids):
        for i, s in enumerate(specs):
            want = expected[str(qid)][s.trec_name]
            assert values[i, j] == pytest.approx(want, abs=1e-9, rel=0), (qid, s.name)


def test_scores_equal_in_single_precision_tie_like_trec_eval_9():
    """trec_eval 9 (pytrec_eval) keeps scores as C floats: 0.91047674 and 0.91047677 tie and the
    docno decides, with score_precision="float32"; the default compares them as doubles (trec_eval
    10: tests/test_score_precision.py)."""
    qrels = {"q": {"d1": 1, "d2": 0}}
    run = {"q": {"d1": 0.91047677, "d2": 0.91047674, "d3": 0.5}}
    want = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)["q"]["recip_rank"]
    assert want == 0.5  # d2 > d1 by docno wins the float32 tie
    specs, _, v = score_queries(qrels, run, ["recip_rank"], warn=False, score_precision="float32")
    assert v[0, 0] == want
    specs, _, v = score_queries(qrels, run, ["recip_rank"], warn=False)
    assert v[0, 0] == 1.0
