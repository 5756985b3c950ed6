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


ACCURACY = ["Accuracy", "Accuracy@10", "Accuracy@3", "Accuracy(rel=2)", "Accuracy(rel=3)@20"]


def _accuracy_by_hand(grades, rel, k):
    """1 - mean over the relevant documents of the top k of the non-relevant ones above each, / the
    non-relevant ones there (1 with none of them, 0 with no relevant one)."""
    top = [g is not None and g >= rel for g in grades[:k]]
    above, n_non = [], 0
    for is_rel in top:
        if is_rel:
            above.append(n_non)
        else:
            n_non += 1
    if not above:
        return 0.0
    return 1.0 if n_non == 0 else 1.0 - sum(above) / (n_non * len(above))


@pytest.mark.parametrize("which", sorted(COLLECTIONS))
def test_accuracy_equal_to_ir_measures_where_it_gives_a_value(which):
    """ir_measures' accuracy provider per query (to 1e-12) wherever it gives a value, and its mean over
    those queries; by hand where it gives none (no relevant document in the top k: ours 0) or raises
    ZeroDivisionError (every document there relevant: ours 1)."""
    qrels, run = COLLECTIONS[which]()
    qrels, run = dict(qrels), dict(run)
    qrels["all_relevant"], run["all_relevant"] = {"a": 3, "b": 2, "c": 0}, {"a": 2.0, "b": 1.0}
    ours = evaluate(qrels, run, ACCURACY, per_query=True)
    defined = {"value": 0, "none": 0, "zero_division": 0}
    for name in ACCURACY:
        m = ir_measures.parse_measure(name)
        spec = parse_metrics([name])[0]
        rel = m["rel"]
        k = m["cutoff"] if isinstance(m["cutoff"], int) else None
        kept = []
        for qid in ours.per_query:
            got = ours.per_query[qid][name]
            order = sorted(run[qid], key=lambda d: -run[qid][d])
            grades = [qrels[qid].get(d) for d in order]
            try:
                theirs = list(ir_measures.iter_calc([m], {qid: qrels[qid]}, {qid: run[qid]}))
            except ZeroDivisionError:
                defined["zero_division"] += 1
                assert got == 1.0 == _accuracy_by_hand(grades, rel, k or len(grades)), (name, qid)
                continue
            if not theirs:
                defined["none"] += 1
                assert got == 0.0 == _accuracy_by_hand(grades, rel, k or len(grades)), (name, qid)
                continue
            defined["value"] += 1
            assert abs(got - theirs[0].value) <= TOL, (which, name, qid, got, theirs[0].value)
            assert got == pytest.approx(_accuracy_by_hand(grades, rel, k or len(grades)), abs=1e-12)
            kept.append(got)
        assert spec.family == "Accuracy"
        assert kept, name
    # the three cases each occur, so each branch above is checked
    assert defined["value"] > 10 and defined["none"] > 0 and defined["zero_division"] > 0, defined


@pytest.mark.parametrize("which", sorted(COLLECTIONS))
def test_accuracy_mean_over_the_queries_ir_measures_scores(which):
    """ir_measures' aggregate is the mean over the queries it gives a value for: ours over the queries
    with a relevant and a non-relevant document in the top k is the same number."""
    qrels, run = COLLECTIONS[which]()
    for name, rel, k in (("Accuracy", 1, None), ("Accuracy@10", 1, 10), ("Accuracy(rel=2)", 2, None)):
        m = ir_measures.parse_measure(name)
        theirs = ir_measures.calc_aggregate([m], qrels, run)[m]
        ours = evaluate(qrels, run, name, per_query=True).per_query
        values = []
        for q in ours:
            top = [qrels[q].get(d) for d in sorted(run[q], key=lambda d: -run[q][d])][:k]
            relevant = sum(g is not None and g >= rel for g in top)
            if 0 < relevant < len(top):
                values.append(ours[q][name])
        assert len(values) >= 2
        assert sum(values) / len(values) == pytest.approx(theirs, abs=1e-12)


def test_accuracy_by_hand_and_its_parameters():
    qrels = {"q1": {"a": 1, "b": 1, "c": 0}, "q2": {"x": 1}, "q3": {"m": 2, "n": 0}}
    run = {"q1": {"a": 3.0, "c": 2.0, "b": 1.0, "z": 0.5}, "q2": {"y": 1.0, "w": 0.5}, "q3": {"m": 1.0}}
    ev = evaluate(qrels, run, ["Accuracy", "Accuracy@2", "Accuracy(rel=2)"], per_query=True)
    # q1: a (0 non-relevant above), b (1 above: c); 2 non-relevant (c, unjudged z): 1 - 1 / (2 x 2)
    assert ev.per_query["q1"] == {"Accuracy": 0.75, "Accuracy@2": 1.0, "Accuracy(rel=2)": 0.0}
    assert ev.per_query["q2"]["Accuracy"] == 0.0  # no relevant document ranked
    assert ev.per_query["q3"]["Accuracy"] == 1.0  # no non-relevant one
    assert ev["Accuracy"] == pytest.approx((0.75 + 0 + 1) / 3)
    with pytest.raises(MetricNameError, match="rel must be an integer of at least 1"):
        parse_metrics(["Accuracy(rel=0)"])
    with pytest.raises(MetricNameError, match="takes no parameter"):
        parse_metrics(["Accuracy(p=0.5)"])


def test_spellings_and_canonical_names():
    a, b, c = parse_metrics(["INST(max_rel=3)", "INST(T=1, min_rel=0, max_rel=3)", "inst(max_rel=3)"])
    # one measure (its rows keep the names as written, as RBP's)
    assert a.canonical == b.canonical == c.canonical == "INST(T=1.0,min_rel=0,max_rel=3)"
    assert [s.name for s in (a, b, c)] == ["INST(max_rel=3)", "INST(T=1, min_rel=0, max_rel=3)", "inst(max_rel=3)"]
    assert parse_metrics(["Compat"])[0].canonical == "Compat(p=0.95,normalize=True)"  # ir_measures' defaults
    assert parse_metrics(["NERR10(max_rel=3)"])[0].canonical == "NERR10(p=0.9,min_rel=0,max_rel=3)"
