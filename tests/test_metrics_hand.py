"""Hand-calculated values for the conventions trec_eval does not have, and name parsing."""

import math

import pytest

import streameval
from streameval.metrics.kernel import MetricOptions, RankedLists, compute
from streameval.metrics.names import MetricNameError, parse_metric, parse_metrics


def one(grades_ranked, judged, metric, **opts):
    lists = RankedLists.from_lists([grades_ranked], [judged])
    return compute(lists, parse_metrics([metric]), MetricOptions(**opts))[0, 0]


def test_err_chapelle_hand():
    # R = (2^g - 1) / 2^4: 15/16, 0, 3/16. ERR@3 = 15/16 + (1/3)(1/16)(1)(3/16)
    assert one([4, 0, 2], [4, 0, 2], "err@3") == pytest.approx(15 / 16 + (1 / 3) * (1 / 16) * (3 / 16), abs=1e-15)
    # cut at 1: only the first term
    assert one([4, 0, 2], [4, 0, 2], "err@1") == pytest.approx(15 / 16, abs=1e-15)
    # g_max is a parameter: with g_max = 2, a grade-2 item at rank 1 satisfies with 3/4
    assert one([2, None], [2], "err@2", err_max_grade=2) == pytest.approx(0.75, abs=1e-15)
    with pytest.raises(ValueError, match="err_max_grade"):
        one([5], [5], "err@1")


def test_exponential_gain_hand():
    dcg = (2 ** 1 - 1) + (2 ** 3 - 1) / math.log2(3)
    idcg = (2 ** 3 - 1) + (2 ** 1 - 1) / math.log2(3)
    assert one([1, 3], [3, 1], "ndcg@2", gain="exponential") == pytest.approx(dcg / idcg, abs=1e-12)
    assert one([1, 3], [3, 1], "ndcg@2") == pytest.approx((1 + 3 / math.log2(3)) / (3 + 1 / math.log2(3)), abs=1e-12)


def test_ideal_from_served_hand():
    # judged: a=1, b=3, c=3 (c not served); served a then b
    dcg = 1 + 3 / math.log2(3)
    assert one([1, 3], [1, 3, 3], "ndcg@5") == pytest.approx(dcg / (3 + 3 / math.log2(3) + 1 / 2), abs=1e-12)
    assert one([1, 3], [1, 3, 3], "ndcg@5", ideal="served") == pytest.approx(dcg / (3 + 1 / math.log2(3)), abs=1e-12)


def test_ties_by_docno_descending_or_by_position():
    qrels = {"q": {"a": 1}}
    run = {"q": {"a": 1.0, "b": 1.0}}  # a tie: trec_eval ranks docno 'b' first
    assert streameval.evaluate(qrels, run, "recip_rank").value() == 0.5
    from streameval.metrics.prepare import prepare

    p = prepare(["q", "q"], ["a", "b"], [1.0, 1.0], ["q"], ["a"], [1], tie_break="position", run_position=[1, 2])
    assert compute(p.lists, parse_metrics(["recip_rank"]))[0, 0] == 1.0
    p = prepare(["q", "q"], ["a", "b"], [0.0, 0.0], ["q"], ["a"], [1], order="position", run_position=[2, 1])
    assert compute(p.lists, parse_metrics(["recip_rank"]))[0, 0] == 0.5


def test_evaluate_inputs_and_per_query():
    pd = pytest.importorskip("pandas")
    qrels = {"q1": {"a": 2, "b": 0}, "q2": {"c": 1}}
    run = {"q1": {"a": 0.9, "b": 0.8}, "q2": {"x": 1.0, "c": 0.5}, "q3": {"z": 1.0}}
    with pytest.warns(UserWarning, match="1 run queries have no judgments"):
        res = streameval.evaluate(qrels, run, ["mrr@10", "P@1", "ndcg@2"], per_query="pandas")
    assert res.means["mrr@10"] == (1.0 + 0.5) / 2
    assert res.means["P@1"] == 0.5
    assert list(res.per_query.index) == ["q1", "q2"]
    assert res.per_query.loc["q2", "mrr@10"] == 0.5
    df_run = pd.DataFrame([(q, d, s) for q, ds in run.items() for d, s in ds.items()], columns=["q_id", "doc_id", "score"])
    df_qrels = pd.DataFrame([(q, d, g) for q, ds in qrels.items() for d, g in ds.items()], columns=["q_id", "doc_id", "rel"])
    with pytest.warns(UserWarning):
        assert streameval.evaluate(df_qrels, df_run, "mrr@10").value() == 0.75


def test_bad_inputs_raise_clearly():
    with pytest.raises(ValueError, match="twice"):
        streameval.evaluate({"q": {"a": 1}}, ([("q"), "q"], ["a", "a"], [1.0, 0.5]), "map")
    with pytest.raises(ValueError, match="not finite"):
        streameval.evaluate({"q": {"a": 1}}, (["q"], ["a"], [float("nan")]), "map")


@pytest.mark.parametrize("name,expected", [
    ("ndcg@10", [("ndcg@10", "ndcg_cut_10")]), ("ndcg_cut_10", [("ndcg@10", "ndcg_cut_10")]),
    ("P@5", [("P@5", "P_5")]), ("P_5", [("P@5", "P_5")]), ("p@5", [("P@5", "P_5")]),
    ("P.5,10", [("P@5", "P_5"), ("P@10", "P_10")]), ("map", [("map", "map")]),
    ("map@100", [("map@100", "map_cut_100")]), ("recip_rank", [("recip_rank", "recip_rank")]),
    ("mrr@10", [("mrr@10", None)]), ("err@20", [("err@20", None)]), ("recall@100", [("recall@100", "recall_100")]),
    ("Rprec", [("Rprec", "Rprec")]), ("bpref", [("bpref", "bpref")]), ("success@1", [("success@1", "success_1")]),
    ("ndcg_cut.10,20,23.4", [("ndcg@10", "ndcg_cut_10"), ("ndcg@20", "ndcg_cut_20"), ("ndcg@23", "ndcg_cut_23")]),
])
def test_names(name, expected):
    assert [(s.canonical, s.trec_name) for s in parse_metric(name)] == expected  # the row name: as written


@pytest.mark.parametrize("bad", ["foo", "P", "ndcg@x", "bpref@5", "", "ndcg@0", "map@"])
def test_bad_names_list_accepted_forms(bad):
    # issue 42: the closest accepted names, not every form
    with pytest.raises(MetricNameError, match="closest accepted names|cutoff|e\\.g\\. ndcg@10"):
        parse_metric(bad)
