"""ir_measures spellings against ir_measures itself (issue 17, item 3) and ranx's hits@k (item 6).

ir_measures is a test oracle only (``pip install ir-measures``; its pytrec_eval provider, and for the
measures pytrec_eval lacks the provider ir_measures picks: judged for Judged@k, gdeval for ERR@k and
nDCG(dcg='exp-log2'), msmarco for RR@k). gdeval prints 5 decimals, so those two compare to 6e-6;
everything else per query and in aggregate to 1e-9.
"""

import math

import numpy as np
import pytest

from streameval import evaluate
from streameval.beam.online import split_metric_names
from streameval.metrics.names import MetricNameError, parse_metrics

ir_measures = pytest.importorskip("ir_measures")

NAMES = ["AP(rel=2)@100", "nDCG(dcg='exp-log2')@10", "Judged@10", "R@100", "RR(rel=2)@10", "SetP", "NumQ",
         "NumRet(rel=1)", "infAP", "ERR@20", "Bpref", "Rprec", "P@10", "P(rel=2)@10", "AP", "nDCG@10", "nDCG",
         "NumRet", "RR", "SetR(rel=2)", "Success(rel=2)@5", "NumRelRet", "IPrec(recall=0.5)", "SetAP", "SetRelP",
         "MAP(rel=3)", "Recall(rel=2)@20"]
GDEVAL = {"nDCG(dcg='exp-log2')@10", "ERR@20"}


def _collection(seed, n_queries, max_docs):
    rng = np.random.default_rng(seed)
    qrels, run = {}, {}
    for q in range(n_queries):
        qid = str(101 + q)  # gdeval reads numeric topics
        n_docs = int(rng.integers(1, max_docs))
        docs = [f"d{q}_{i}" for i in range(n_docs + 20)]
        judged = rng.choice(len(docs), size=int(rng.integers(1, len(docs))), replace=False)
        qrels[qid] = {docs[i]: int(rng.choice([0, 0, 1, 2, 3, 4])) for i in judged}
        qrels[qid][docs[judged[0]]] = int(rng.integers(1, 5))  # gdeval scores topics with a positive grade
        ranked = rng.choice(len(docs), size=n_docs, replace=False)
        scores = rng.permutation(n_docs) + 1  # distinct scores: no tie-breaking differences
        run[qid] = {docs[i]: float(s) for i, s in zip(ranked, scores)}
    return qrels, run


COLLECTIONS = {"small": _collection(7, 25, 30), "deep": _collection(11, 15, 150)}


@pytest.mark.parametrize("which", sorted(COLLECTIONS))
def test_ir_measures_names_equal_ir_measures(which):
    qrels, run = COLLECTIONS[which]
    ours = evaluate(qrels, run, NAMES, per_query=True)
    table = ours.per_query
    measures = [ir_measures.parse_measure(n) for n in NAMES]
    theirs = {}
    for m in ir_measures.iter_calc(measures, qrels, run):
        theirs[(str(m.measure), m.query_id)] = m.value
    agg = ir_measures.calc_aggregate(measures, qrels, run)
    worst = {}
    for name, measure in zip(NAMES, measures):
        tol = 6e-6 if name in GDEVAL else 1e-9
        row = parse_metrics([name])[0].name  # the name as written (ir_measures syntax) or canonical
        name = row
        for qid in run:
            want = theirs[(str(measure), qid)]
            got = float(table[qid][name])
            assert abs(got - want) <= tol, (which, name, qid, got, want)
            worst[tol] = max(worst.get(tol, 0.0), abs(got - want))
        assert abs(ours.means[name] - agg[measure]) <= tol * max(1.0, abs(agg[measure])), \
            (which, name, ours.means[name], agg[measure])
    print(which, "largest per-query difference by tolerance:", worst)


def _rbp(ranked_grades, judged, p):
    """trec_eval m_rbp.c by hand: (1 - p) sum_i p**i gain_i, gains = grade / top grade (when > 1)."""
    top = max([g for g in judged if g >= 0], default=0)
    scale = top if top > 1 else 1
    return (1 - p) * sum(p ** i * (g / scale) for i, g in enumerate(ranked_grades) if g is not None and g > 0)


@pytest.mark.parametrize("which", sorted(COLLECTIONS))
def test_rbp_hits_by_hand(which):
    # ir_measures has RBP through cwl_eval only (binary, rel required); RBP(p=x) is trec_eval's rbp
    qrels, run = COLLECTIONS[which]
    ours = evaluate(qrels, run, ["RBP(p=0.8)", "RBP", "hits@5", "hits@10", "success@10"],
                    per_query=True).per_query
    assert parse_metrics("hit@10")[0].canonical == "success@10"  # hit@k / hit_rate@k stay success@k
    for qid, docs in run.items():
        order = sorted(docs, key=lambda d: -docs[d])
        grades = [qrels[qid].get(d) for d in order]
        want = _rbp(grades, list(qrels[qid].values()), 0.8)
        assert abs(ours[qid]["RBP(p=0.8)"] - want) <= 1e-12
        assert ours[qid]["RBP"] == ours[qid]["RBP(p=0.8)"]  # ir_measures' default p
        for k in (5, 10):
            hits = sum(1 for g in grades[:k] if g is not None and g >= 1)
            assert ours[qid][f"hits@{k}"] == hits
        assert ours[qid]["success@10"] == float(ours[qid]["hits@10"] > 0)


def test_hits_equals_ranx_when_installed():
    # ranx/metrics/hits.py (0.3.21): relevant (grade >= rel_lvl = 1) documents among the top k
    ranx = pytest.importorskip("ranx")
    qrels, run = COLLECTIONS["small"]
    rq = {q: {d: g for d, g in docs.items() if g > 0} for q, docs in qrels.items()}
    rq = {q: d for q, d in rq.items() if d}
    sub = {q: run[q] for q in rq}
    want = ranx.evaluate(ranx.Qrels(rq), ranx.Run(sub), "hits@10", return_mean=False)
    got = evaluate(qrels, sub, ["hits@10"], per_query=True).per_query
    assert want.sum() > 0
    for i, q in enumerate(sub):  # ranx's order: the qrels' queries
        assert got[q]["hits@10"] == want[i]


def test_per_measure_options_override_globals_for_that_measure_only():
    qrels, run = COLLECTIONS["small"]
    both = evaluate(qrels, run, ["P@10", "P(rel=2)@10", "nDCG@10", "nDCG(dcg='exp-log2')@10",
                                 "nDCG(dcg='log2')@10"], relevance_level=3, gain="exponential")
    assert both["P@10"] == evaluate(qrels, run, "P@10", relevance_level=3).value()
    assert both["P(rel=2)@10"] == evaluate(qrels, run, "P@10", relevance_level=2).value()
    assert both["ndcg@10"] == both["nDCG(dcg='exp-log2')@10"] == evaluate(qrels, run, "ndcg@10", gain="exponential").value()
    assert both["nDCG(dcg='log2')@10"] == evaluate(qrels, run, "ndcg@10").value()


@pytest.mark.parametrize("name, words", [
    ("alpha_nDCG@10", "is a diversity measure (subtopic judgments)"),
    ("Foo(rel=1)", "unknown ir_measures measure 'Foo'"),
    ("P(rel=2)", "needs a cutoff"),
    ("nDCG(gains={0:x})@10", "gains maps numbers to numbers"),
    # judged_only=True and RBP(rel=r) are computed since issue 42 (tests/test_metric_names.py)
    ("P(judged_only=2)@5", "judged_only is True or False"),
    ("RBP(rel=1, p=0.5)@10", "RBP takes no cutoff"),
    ("NumQ@5", "takes no cutoff"),
    ("AP(rel=two)", "not a number"),
])
def test_parse_errors_are_one_line_naming_the_measure(name, words):
    with pytest.raises(MetricNameError) as e:
        parse_metrics([name])
    assert words in str(e.value) and "\n" not in str(e.value) and name in str(e.value)


def test_metric_lists_keep_parentheses_together():
    ranking, online = split_metric_names("P@10,SetF(rel=2, beta=0.5),nDCG(dcg='exp-log2')@10,P.5,10,gauc[user,clicks]")
    assert ranking == ["P@10", "SetF(rel=2, beta=0.5)", "nDCG(dcg='exp-log2')@10", "P.5,10"]
    assert online == ["gauc[user,clicks]"]
    from streameval.beam.arguments import split_metrics, split_names  # the streaming job; report, reconcile

    assert split_metrics("P.5,10,SetF(rel=2, beta=0.5),RR(rel=2)@10") == ["P.5,10", "SetF(rel=2, beta=0.5)",
                                                                          "RR(rel=2)@10"]
    assert split_names("SetF(rel=2, beta=0.5),map") == ["SetF(rel=2, beta=0.5)", "map"]
    specs = parse_metrics(ranking)
    assert [s.name for s in specs][:3] == ["P@10", "SetF(rel=2, beta=0.5)", "nDCG(dcg='exp-log2')@10"]
    assert not math.isnan(evaluate(*COLLECTIONS["small"], "SetF(rel=2, beta=0.5)").value())


def test_pruning_keeps_what_each_cutoff_needs():
    from streameval.accumulators.ranking import keep_for

    assert keep_for(parse_metrics(["P(rel=2)@10", "AP(rel=3)@100", "NumQ", "Judged@5"])) == 100
    assert keep_for(parse_metrics(["NumQ"])) == 1
    assert keep_for(parse_metrics(["P@3", "AP(rel=2)"])) is None
    assert keep_for(parse_metrics(["P@3", "RBP(p=0.5)"])) is None
    assert keep_for(parse_metrics(["P@3"]), ideal="served") is None
