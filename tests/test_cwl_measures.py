"""ir_measures' measures of other providers (issue 42 item 1): cwl_eval's C/W/L measures (INST, INSQ,
BPM, SDCG, NERR8-11) and the compat provider's Compat, against ir_measures itself.

The oracle is ir_measures (0.4.3) with the provider it picks for each measure: cwl_eval (``pip install
cwl-eval``, MIT license; the ``test`` extra pins 1.0.12) for the C/W/L ones, its own compat provider for
Compat. Per query to 1e-12 (the same arithmetic, summed in another order), means to 1e-12, on a
random collection (graded 0-3, distinct scores, judged queries missing from the run, unjudged ranked
documents, a run query without judgments) and on trec_eval's test collection (graded qrels.rel_level,
results.test; its tied scores ordered first as trec_eval orders them, then given to both as distinct
scores).
"""

import logging
from pathlib import Path

import numpy as np
import pytest

from streameval import evaluate
from streameval.metrics.names import MetricNameError, parse_metrics

ir_measures = pytest.importorskip("ir_measures")
pytest.importorskip("cwl", reason="cwl-eval not installed (pip install cwl-eval; the test extra has it)")

DATA = Path(__file__).parent / "data" / "trec_eval_test"
TOL = 1e-12

#: every measure, spelled as ir_measures takes it (T as a float: its parser refuses T=2 for a float
#: parameter; we take both)
MEASURES = [
    "INST(max_rel=3)", "INSQ(max_rel=3)", "BPM(max_rel=3)@10", "SDCG(max_rel=3)@10", "NERR8(max_rel=3)@10",
    "NERR9(max_rel=3)@10", "NERR10(p=0.8,max_rel=3)", "NERR11(T=2.0,max_rel=3)", "Compat(p=0.8)", "Compat",
    # parameter variants
    "BPM(T=2.0,max_rel=3)@5", "INST(T=3.0,max_rel=3)", "INSQ(T=2.0,max_rel=3)", "NERR8(max_rel=3)@5",
    "NERR9(max_rel=3)@1", "NERR10(max_rel=3)", "NERR11(max_rel=3)", "SDCG(max_rel=3)@1", "SDCG(max_rel=2)@20",
    "INST(min_rel=1,max_rel=3)", "BPM(min_rel=1,max_rel=2)@20", "NERR10(p=0.5,min_rel=1,max_rel=3)",
    "Compat(p=0.5,normalize=False)", "Compat(p=1.0)",
    "RBP(p=0.8,rel=2)",  # cwl_eval's binary RBP (irm_names; was checked by hand without cwl-eval)
]


def _random(seed=5, n_queries=30):
    rng = np.random.default_rng(seed)
    qrels, run = {}, {}
    for q in range(n_queries):
        qid = f"q{q}"
        docs = [f"d{q}_{i}" for i in range(int(rng.integers(5, 80)))]
        judged = rng.choice(len(docs), size=int(rng.integers(1, len(docs))), replace=False)
        qrels[qid] = {docs[i]: int(rng.choice([0, 0, 1, 2, 3])) for i in judged}
        if q % 7 == 3:
            continue  # judged, not in the run: 0 under complete=True, as ir_measures' default
        n = int(rng.integers(1, len(docs)))
        ranked = rng.choice(len(docs), size=n, replace=False)
        run[qid] = {docs[i]: float(s) for i, s in zip(ranked, rng.permutation(n) + 1.0)}
        if q % 5 == 0:  # documents outside the qrels
            run[qid].update({f"x{q}_{i}": 0.5 / (i + 1) for i in range(3)})
    qrels["q0"]["d0_0"] = -1  # a negative grade: gains as 0 (cwl_eval) / not positive (Compat)
    run["no_judgments"] = {"a": 1.0, "b": 2.0}
    return qrels, run


def _trec_collection():
    if not (DATA / "qrels.rel_level").exists() or not (DATA / "results.test").exists():
        pytest.skip("trec_eval's test collection (tests/data/trec_eval_test) is not here")
    qrels = {}
    for line in (DATA / "qrels.rel_level").read_text().splitlines():
        q, _, d, r = line.split()
        qrels.setdefault(q, {})[d] = int(r)
    rows = {}
    for line in (DATA / "results.test").read_text().splitlines():
        q, _, d, _, s, _ = line.split()
        rows.setdefault(q, []).append((float(s), d))
    run = {}
    for q, docs in rows.items():  # trec_eval's order (score, then docno, descending), as distinct scores
        docs.sort(reverse=True)
        run[q] = {d: float(len(docs) - i) for i, (_, d) in enumerate(docs)}
    return qrels, run


def _theirs(names, qrels, run):
    logging.getLogger("ir_measures.cwl_eval").disabled = True  # min_rel/max_rel notes
    measures = [ir_measures.parse_measure(n) for n in names]
    per = {}
    for m in ir_measures.iter_calc(measures, qrels, run):
        per[(str(m.measure), m.query_id)] = m.value
    return measures, per, ir_measures.calc_aggregate(measures, qrels, run)


COLLECTIONS = {"random": _random, "trec_eval_test": _trec_collection}


@pytest.mark.parametrize("which", sorted(COLLECTIONS))
def test_equal_to_ir_measures_per_query_and_mean(which):
    qrels, run = COLLECTIONS[which]()
    measures, per, agg = _theirs(MEASURES, qrels, run)
    # ir_measures scores every judged query (0 when it has no results): complete=True
    ours = evaluate(qrels, run, MEASURES, per_query=True, complete=True)
    only_run = evaluate(qrels, run, MEASURES, per_query=True)  # the judged queries with results
    assert ours.num_queries == len(qrels)
    for name, m in zip(MEASURES, measures):
        for qid in qrels:
            want = per[(str(m), qid)]
            got = ours.per_query[qid][name]
            assert abs(got - want) <= TOL, (which, name, qid, got, want)
            if qid in run:
                assert only_run.per_query[qid][name] == got
        assert abs(ours.means[name] - agg[m]) <= TOL, (which, name, ours.means[name], agg[m])
    values = np.array([[ours.per_query[q][n] for n in MEASURES] for q in qrels])
    assert (values > 0).any(axis=0).all()  # every measure scores something
    assert (values < 1).any(axis=0).all()


def test_past_cwl_evals_1000_ranks_and_grades_above_max_rel():
    # cwl_eval reads 1000 ranks (max_n); a grade above max_rel gains 1 (clipped)
    qrels = {"q": {f"d{i}": (5 if i % 97 == 0 else i % 3) for i in range(0, 1500, 3)}}
    run = {"q": {f"d{i}": float(2000 - i) for i in range(1500)}}
    names = ["INST(max_rel=2)", "INSQ(T=50.0,max_rel=2)", "NERR10(p=0.999,max_rel=3)", "SDCG(max_rel=2)@1200",
             "BPM(T=100.0,max_rel=2)@1200", "Compat(p=0.999)"]
    measures, per, _ = _theirs(names, qrels, run)
    got = evaluate(qrels, run, names, per_query=True).per_query["q"]
    for name, m in zip(names, measures):
        assert abs(got[name] - per[(str(m), "q")]) <= TOL, (name, got[name], per[(str(m), "q")])


@pytest.mark.parametrize("name, why", [
    ("INST", "INST needs max_rel"),
    ("BPM(T=2,K=5,max_rel=3)@5", "BPM takes no parameter 'K' (parameters: T, max_rel, min_rel)"),
    ("NERR8(p=0.9,max_rel=3)@5", "NERR8 takes no parameter 'p' (parameters: max_rel, min_rel)"),
    ("NERR11(T=2,max_rel=3)@10", "NERR11 takes no cutoff"),
    ("INST(max_rel=3)@10", "INST takes no cutoff"),
    ("SDCG(max_rel=3)", "SDCG needs a cutoff"),
    ("BPM(max_rel=3)", "BPM needs a cutoff"),
    ("INST(T=0,max_rel=3)", "T must be positive"),
    ("INST(max_rel=2.5)", "max_rel must be an integer"),
    ("INST(min_rel=3,max_rel=3)", "min_rel (3) must be below max_rel (3)"),
    ("NERR10(p=1.5,max_rel=3)", "p must be in [0, 1]"),
    ("Compat(p=-0.1)", "p must be in [0, 1]"),
    ("Compat(normalize=1)", "normalize is True or False"),
    ("Compat(q=1)", "Compat takes no parameter 'q' (parameters: normalize, p)"),
    ("SDCG(dcg='exp-log2',max_rel=3)@10", "dcg must be 'log2'"),
    ("INSQ(judged_only=True,max_rel=3)", "INSQ takes no parameter 'judged_only'"),
])
def test_bad_parameters(name, why):
    with pytest.raises(MetricNameError) as e:
        parse_metrics([name])
    message = str(e.value)
    assert why in message and "\n" not in message, message
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("name", ["Accuracy", "Accuracy@10", "accuracy(rel=2)@5"])
def test_accuracy_is_refused_with_the_reason(name):
    # ir_measures' accuracy provider leaves a query without a relevant document in the top k out of its
    # mean and divides by zero when every document there is relevant
    with pytest.raises(ZeroDivisionError):
        list(ir_measures.iter_calc([ir_measures.parse_measure("Accuracy")], {"q1": {"a": 1, "b": 1}},
                                   {"q1": {"a": 2.0, "b": 1.0}}))
    with pytest.raises(MetricNameError) as e:
        evaluate({"q1": {"a": 1}}, {"q1": {"a": 1.0}}, name)
    assert "Accuracy is not implemented" in str(e.value) and "ZeroDivisionError" in str(e.value)
    assert "\n" not in str(e.value)


def test_spellings_and_canonical_names():
    a, b, c = parse_metrics(["INST(max_rel=3)", "INST(T=1, min_rel=0, max_rel=3)", "inst(max_rel=3)"])
    # one measure (its rows keep the names as written, as RBP's)
    assert a.canonical == b.canonical == c.canonical == "INST(T=1.0,min_rel=0,max_rel=3)"
    assert [s.name for s in (a, b, c)] == ["INST(max_rel=3)", "INST(T=1, min_rel=0, max_rel=3)", "inst(max_rel=3)"]
    assert parse_metrics(["Compat"])[0].canonical == "Compat(p=0.95,normalize=True)"  # ir_measures' defaults
    assert parse_metrics(["NERR10(max_rel=3)"])[0].canonical == "NERR10(p=0.9,min_rel=0,max_rel=3)"
