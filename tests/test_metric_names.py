"""Issue 42: every name users type.

Unknown names: one line naming the three closest accepted names (difflib), in the library
(ValueError) and on the command line (exit 2), not the ~900-character list of every form.
"""

from __future__ import annotations

import difflib

import pytest

import streameval as se
from streameval import cli
from streameval.metrics.names import MetricNameError, parse_metric
from streameval.metrics.online import parse_online_metric
from streameval.jobs import batch


def _picks(message: str) -> list[str]:
    assert "\n" not in message and len(message) < 200, message
    return message.split("; closest accepted names: ")[1].split(" (every name")[0].split(", ")


@pytest.mark.parametrize("typed,expected", [
    ("ndgc@10", "ndcg@10"), ("ndgc_cut_10", "ndcg_cut_10"), ("nDGC@10", "ndcg@10"), ("mapp", "map"),
    ("precison@5", "precision@5"), ("recal@100", "recall@100"), ("iprec_at_recal.0.5", "iprec_at_recall.0.5"),
    ("bpre", "bpref"), ("RR(rell=2)", None), ("nDCGG(dcg='exp-log2')@10", "nDCG(dcg='exp-log2')@10"),
    ("precison@5-l2", "precision@5-l2"), ("ndcg_burgess@10", "ndcg_burges@10"),
])
def test_library_unknown_name_names_three_closest(typed, expected):
    if expected is None:  # a known measure with an unknown parameter: its own one-line message
        with pytest.raises(ValueError, match="takes no parameter 'rell'"):
            se.evaluate({"q": {"a": 1}}, {"q": {"a": 1.0}}, typed)
        return
    with pytest.raises(ValueError) as e:
        se.evaluate({"q": {"a": 1}}, {"q": {"a": 1.0}}, typed)
    assert isinstance(e.value, MetricNameError)
    message = str(e.value)
    assert message.startswith(f"unknown metric {typed!r}") or "unknown ir_measures measure" in message
    picks = _picks(message)
    assert len(picks) == 3 and expected in picks
    # the picks are accepted names, and the first is difflib's closest of them (case ignored)
    for p in picks:
        assert parse_metric(p)
    assert picks[0] == expected
    assert difflib.SequenceMatcher(None, typed.lower(), expected.lower()).ratio() >= max(
        difflib.SequenceMatcher(None, typed.lower(), p.lower()).ratio() for p in picks)


def test_online_unknown_name_names_three_closest():
    with pytest.raises(MetricNameError) as e:
        parse_online_metric("ctrr")
    picks = _picks(str(e.value))
    assert len(picks) == 3 and picks[0] == "ctr"
    assert all(parse_online_metric(p) for p in picks)


def test_cli_trec_eval_unknown_name(tmp_path, capsys):
    (tmp_path / "qrels").write_text("q1 0 d1 1\n")
    (tmp_path / "run").write_text("q1 Q0 d1 1 1.0 t\n")
    assert cli.main(["trec-eval", "-m", "ndgc_cut_10", str(tmp_path / "qrels"), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("streameval trec-eval: unknown metric 'ndgc_cut_10'")
    assert _picks(err)[0] == "ndcg_cut_10" and len(_picks(err)) == 3


def test_cli_batch_unknown_ranking_or_online_name(tmp_path, capsys):
    """The batch job's --metrics takes ranking and online names: the closest of both kinds."""
    for typed, first in (("ndgc@10", "ndcg@10"), ("gacu[user]", "gauc[user]")):
        assert batch.main(["--impressions", "x.avro", "--metrics", f"map,{typed}", "--judgments", "y.avro",
                           "--output", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"unknown metric {typed!r}" in err
        picks = _picks(err)
        assert len(picks) == 3 and picks[0] == first


# --------------------------------------------------------------------------------------------
# names echoed as written; every reader takes any spelling (item 2)

import json  # noqa: E402

import ir_measures  # noqa: E402

from streameval.plan import alerts  # noqa: E402
from streameval.beam.transforms import metric_row  # noqa: E402
from streameval.commands import reconcile, report  # noqa: E402
from streameval.io import avro  # noqa: E402
from streameval.io.tables import read_metrics  # noqa: E402

QRELS = {"q1": {"a": 2, "b": 0, "c": 1, "d": 2}, "q2": {"x": 1, "y": 0}, "q3": {"m": 1, "n": 2}}
RUN = {"q1": {"a": 0.3, "b": 0.9, "c": 0.5, "d": 0.1}, "q2": {"x": 1.0, "y": 2.0, "z": 0.5},
       "q3": {"m": 0.2, "n": 0.4, "o": 0.9}}


def test_library_keys_are_the_names_as_written():
    """nDCG@10 was keyed ndcg@10 and AP map while P(rel=2)@5 kept its spelling; now each as written,
    values equal to ir_measures' own."""
    written = ["nDCG@10", "AP", "P(rel=2)@5", "ndcg_cut_5", "RR"]
    ev = se.evaluate(QRELS, RUN, written)
    assert list(ev.means) == written
    ref = ir_measures.calc_aggregate([ir_measures.nDCG @ 10, ir_measures.AP, ir_measures.P(rel=2) @ 5,
                                      ir_measures.nDCG @ 5, ir_measures.RR], QRELS, RUN)
    assert ev["nDCG@10"] == pytest.approx(ref[ir_measures.nDCG @ 10], abs=1e-12)
    assert ev["AP"] == pytest.approx(ref[ir_measures.AP], abs=1e-12)
    assert ev["P(rel=2)@5"] == pytest.approx(ref[ir_measures.P(rel=2) @ 5], abs=1e-12)
    assert ev["ndcg_cut_5"] == pytest.approx(ref[ir_measures.nDCG @ 5], abs=1e-12)
    # any spelling reads a value: ev["ndcg@10"], ev["map"], ev["recip_rank"]
    assert ev["ndcg@10"] == ev["nDCG@10"] and ev["map"] == ev["AP"] and ev["recip_rank"] == ev["RR"]
    assert ev["nDCG@5"] == ev["ndcg_cut_5"]


def test_ir_measures_objects_wherever_a_name_is():
    measures = [ir_measures.nDCG @ 10, ir_measures.AP, ir_measures.P(rel=2) @ 5, ir_measures.R @ 3]
    ev = se.evaluate(QRELS, RUN, measures)
    ref = ir_measures.calc_aggregate(measures, QRELS, RUN)
    assert list(ev.means) == [str(m) for m in measures]
    for m in measures:
        assert ev[m] == pytest.approx(ref[m], abs=1e-12)
    one = se.evaluate(QRELS, RUN, ir_measures.nDCG @ 10)
    assert one.value() == pytest.approx(ref[ir_measures.nDCG @ 10], abs=1e-12)
    assert [s.canonical for s in se.parse_metrics([ir_measures.nDCG @ 10, ir_measures.AP])] == ["ndcg@10", "map"]


def test_ranx_metric_strings():
    """ranx's names (ranx 0.3.21 metrics: precision, recall, mrr, map, ndcg, hit_rate, r-precision)
    give ir_measures' values for the same measures on distinct scores."""
    irm = ir_measures
    pairs = {"precision@3": irm.P @ 3, "recall@3": irm.R @ 3, "mrr": irm.RR, "map@2": irm.AP @ 2,
             "ndcg@3": irm.nDCG @ 3,
             "hit_rate@1": irm.Success @ 1, "r-precision": irm.Rprec, "map": irm.AP, "ndcg": irm.nDCG}
    ev = se.evaluate(QRELS, RUN, list(pairs))
    ref = irm.calc_aggregate(list(pairs.values()), QRELS, RUN)
    assert list(ev.means) == list(pairs)
    for name, measure in pairs.items():
        assert ev[name] == pytest.approx(ref[measure], abs=1e-12), name


def _rows(metric, value=0.9, system="A"):
    return [metric_row(None, None, "all", system, metric, value, 100, 0.01, ci_low=value - 0.02, ci_high=value + 0.02,
                       ci_level=0.95, ci_method="t")]


def _write_jsonl(path, rows, drop_canonical=False):
    with open(path, "w") as f:
        for r in rows:
            r = dict(r)
            if drop_canonical:  # a file of schema version 1: no metric_canonical, the canonical name
                r.pop("metric_canonical")
            f.write(json.dumps(r) + "\n")
    return str(path)


def test_rows_carry_the_spelling_and_the_canonical_name():
    row = _rows("nDCG@10")[0]
    assert row["metric"] == "nDCG@10" and row["metric_canonical"] == "ndcg@10"
    assert _rows("AP")[0]["metric_canonical"] == "map"
    assert _rows("gauc")[0]["metric_canonical"] == "gauc[user,impressions]"


def test_readers_take_any_spelling(tmp_path):
    new = _write_jsonl(tmp_path / "new.jsonl", _rows("nDCG@10", 0.9))
    old = _write_jsonl(tmp_path / "old.jsonl", _rows("ndcg@10", 0.7), drop_canonical=True)
    avro_old = tmp_path / "old.avro"  # the version 1 schema's rows read through the version 2 schema
    avro.write_records(avro_old, "metric_result", [{k: v for k, v in r.items() if k != "metric_canonical"}
                                                   for r in _rows("ndcg@10", 0.7)])
    for spelling in ("ndcg_cut_10", "NDCG@10", "ndcg@10", ir_measures.nDCG @ 10):
        assert [r["value"] for r in read_metrics(new, metrics=spelling)] == [0.9]
        assert [r["value"] for r in read_metrics(old, metrics=spelling)] == [0.7]
        assert [r["value"] for r in read_metrics(str(avro_old), metrics=spelling)] == [0.7]
    assert read_metrics(old)[0]["metric_canonical"] == "ndcg@10"
    # reconcile matches the old file's ndcg@10 with the new file's nDCG@10 (0.7 against 0.9)
    cmp = reconcile.compare(reconcile.read_table(old), reconcile.read_table(new), metrics=["ndcg_cut_10"])
    assert cmp.matched == 1 and not cmp.only_a and not cmp.only_b
    assert [(d["a"], d["b"]) for d in cmp.differences] == [(0.7, 0.9)]


def test_report_metrics_in_another_spelling(tmp_path):
    pytest.importorskip("matplotlib")
    new = _write_jsonl(tmp_path / "new.jsonl", _rows("nDCG@10", 0.9))
    assert report.main([new, "--metrics", "ndcg_cut_10", "--out", str(tmp_path / "r")]) == 0
    assert "nDCG@10" in (tmp_path / "r" / "report.html").read_text()


def test_alert_rule_in_another_spelling(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nname = "high"\nmetric = "ndcg_cut_10"\nabove = 0.5\n')
    fired = alerts.evaluate(alerts.load_rules(str(rules)), _rows("nDCG@10", 0.9))
    assert [(a["rule"], a["metric"]) for a in fired] == [("high", "nDCG@10")]


def test_batch_rows_keep_the_spelling(tmp_path, capsys):
    """The batch job's rows: the metric as written, its canonical name, the value ir_measures gives;
    report --metrics in another spelling finds them (before: ndcg_cut_10's rows were ndcg@10, and
    report --metrics ndcg_cut_10 found none)."""
    imps, judg = [], []
    for q, docs in RUN.items():
        order = sorted(docs, key=lambda d: -docs[d])
        for pos, d in enumerate(order, 1):
            imps.append({"event_id": f"{q}-{d}", "request_id": f"r-{q}", "query_id": q, "user_id": None,
                         "system_id": "A", "item_id": d, "position": pos, "score": docs[d], "clicked": False,
                         "timestamp": 1_700_000_000_000_000, "propensity": None, "attributes": {}})
    for q, docs in QRELS.items():
        judg += [{"query_id": q, "item_id": d, "grade": g, "timestamp": 0, "source": ""} for d, g in docs.items()]
    avro.write_records(tmp_path / "imps.avro", "impression", imps)
    avro.write_records(tmp_path / "judg.avro", "judgment", judg)
    out = tmp_path / "out"
    assert batch.main(["--impressions", str(tmp_path / "imps.avro"), "--judgments", str(tmp_path / "judg.avro"),
                       "--metrics", "ndcg_cut_10,AP", "--output", str(out), "--quiet"]) == 0
    rows = {r["metric"]: r for r in read_metrics(str(out)) if r["slice"] == "all"}
    ref = ir_measures.calc_aggregate([ir_measures.nDCG @ 10, ir_measures.AP], QRELS, RUN)
    assert rows["ndcg_cut_10"]["metric_canonical"] == "ndcg@10" and rows["AP"]["metric_canonical"] == "map"
    assert rows["ndcg_cut_10"]["value"] == pytest.approx(ref[ir_measures.nDCG @ 10], abs=1e-12)
    assert rows["AP"]["value"] == pytest.approx(ref[ir_measures.AP], abs=1e-12)
    capsys.readouterr()
    assert report.main([str(out), "--metrics", "nDCG@10,map", "--out", str(tmp_path / "r")]) == 0
    assert "2 PNG plots" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# DataFrames in ir_measures', ranx's, TREC's and pyterrier's columns; a one-measure result as a float (item 3)

import pandas as pd  # noqa: E402


def _frame(d, cols):
    return pd.DataFrame([(q, doc, v) for q, docs in d.items() for doc, v in docs.items()], columns=cols)


# names as strings here (Measure objects are item 2's): each with ir_measures' measure, the reference
MEASURES = {"ndcg@3": ir_measures.nDCG @ 3, "map": ir_measures.AP, "P@2": ir_measures.P @ 2}


def _check(ev):
    ref = ir_measures.calc_aggregate(list(MEASURES.values()), QRELS, RUN)
    for name, m in MEASURES.items():
        assert ev[name] == pytest.approx(ref[m], abs=1e-12), name


@pytest.mark.parametrize("qcols,rcols", [
    (["query_id", "doc_id", "relevance"], ["query_id", "doc_id", "score"]),  # ir_measures
    (["q_id", "doc_id", "score"], ["q_id", "doc_id", "score"]),  # ranx (Qrels.from_df / Run.from_df defaults)
    (["qid", "docno", "rel"], ["qid", "docno", "score"]),  # TREC (was: AttributeError ... no attribute 'grade')
    (["qid", "docno", "label"], ["qid", "docno", "score"]),  # pyterrier
])
def test_dataframe_columns(qcols, rcols):
    _check(se.evaluate(_frame(QRELS, qcols), _frame(RUN, rcols), list(MEASURES)))


def test_dataframe_column_map():
    qrels = _frame(QRELS, ["topic", "pid", "judgment"])
    run = _frame(RUN, ["topic", "pid", "sim"]).assign(rank=1)
    columns = {"query_id": "topic", "doc_id": "pid", "relevance": "judgment", "score": "sim"}
    ev = se.evaluate(qrels, run, list(MEASURES), columns=columns)
    _check(ev)
    # a map of some roles only: the others are found by their usual names
    ev2 = se.evaluate(_frame(QRELS, ["qid", "docno", "judgment"]), _frame(RUN, ["qid", "docno", "score"]),
                      list(MEASURES), columns={"relevance": "judgment"})
    assert ev2.means == ev.means
    with pytest.raises(ValueError, match="unknown role 'grade'; roles: query_id, doc_id, relevance, score"):
        se.evaluate(qrels, run, list(MEASURES), columns={"grade": "judgment"})
    with pytest.raises(ValueError, match="qrels DataFrame has no column 'nope'"):
        se.evaluate(qrels, run, list(MEASURES), columns={**columns, "relevance": "nope"})
    with pytest.raises(ValueError, match=r"run DataFrame has no score column .*columns=\{'score': \.\.\.\}"):
        se.evaluate(qrels, run, list(MEASURES),
                    columns={"query_id": "topic", "doc_id": "pid", "relevance": "judgment"})


def test_one_measure_result_is_a_float():
    ev = se.evaluate(QRELS, RUN, "map")
    want = ir_measures.calc_aggregate([ir_measures.AP], QRELS, RUN)[ir_measures.AP]
    assert float(ev) == pytest.approx(want, abs=1e-12)
    assert (ev > want - 0.01) and (ev < want + 0.01) and (ev >= float(ev)) and (ev <= float(ev))
    assert ev == float(ev) and not (ev == float(ev) + 1) and f"{ev:.4f}" == f"{want:.4f}"
    assert round(ev, 3) == round(want, 3)
    several = se.evaluate(QRELS, RUN, ["map", "P@2"])
    for use in (float, lambda e: e > 0.5):
        with pytest.raises(ValueError, match="exactly one metric"):
            use(several)
    assert several == se.evaluate(QRELS, RUN, ["map", "P@2"]) and several != 0.5


# --------------------------------------------------------------------------------------------
# ranx's names that were refused (item 4): f1, f1@k, dcg_burges@k, ndcg_burges@k, rbp.95, the -lN suffix

import math  # noqa: E402

# one query: grades a=2, b=0, c=1, d=3 (not ranked); ranked b, a, c, e (e unjudged)
HQ = {"q": {"a": 2, "b": 0, "c": 1, "d": 3}}
HR = {"q": {"b": 0.9, "a": 0.5, "c": 0.3, "e": 0.1}}
L3 = math.log2(3)
BY_HAND = {
    # ranx/metrics/f1.py: P = h / k (k: the ranked items without a cutoff), R = h / R, 2PR / (P + R)
    "f1": 2 * (2 / 4) * (2 / 3) / (2 / 4 + 2 / 3),  # h = 2 (a, c), 4 ranked, R = 3 (a, c, d)
    "f1@2": 2 * (1 / 2) * (1 / 3) / (1 / 2 + 1 / 3),  # top 2: b, a
    "f1@2-l2": 2 * (1 / 2) * (1 / 2) / (1 / 2 + 1 / 2),  # relevant from grade 2: a, d
    # ranx/metrics/rank_biased_precision.py: (1 - p) sum of grade * p^(rank - 1), grades as they are
    "rbp.8": 0.2 * (2 * 0.8 + 1 * 0.8 ** 2),
    "rbp.8-l2": 0.2 * (2 * 0.8),
    "rbp.95": 0.05 * (2 * 0.95 + 1 * 0.95 ** 2),
    # ranx/metrics/ndcg.py: -l2 drops the judgments below 2 (c gains 0, the ideal is d, a)
    "ndcg@3-l2": (2 / L3) / (3 + 2 / L3),
    "dcg@3-l2": 2 / L3,
    # *_burges: gain 2^g - 1
    "dcg_burges@3": 3 / L3 + 1 / 2,
    "ndcg_burges@3": (3 / L3 + 1 / 2) / (7 + 3 / L3 + 1 / 2),
    "precision@3-l2": 1 / 3,
    "mrr-l2": 1 / 2,
}


def test_ranx_names_by_hand():
    ev = se.evaluate(HQ, HR, list(BY_HAND))
    assert list(ev.means) == list(BY_HAND)  # rows named as written
    for name, want in BY_HAND.items():
        assert ev[name] == pytest.approx(want, rel=1e-12, abs=1e-15), name
    assert [s.canonical for s in se.parse_metrics(["precision@5-l2", "ndcg_burges@10", "ndcg@10-l2"])] == \
        ["P(rel=2)@5", "ndcg(gain=exponential)@10", "ndcg(floor=2)@10"]
    # the same measure as ir_measures' spelling: one value
    ev2 = se.evaluate(HQ, HR, ["precision@3-l2", "P(rel=2)@3"])
    assert ev2["precision@3-l2"] == ev2["P(rel=2)@3"] == 1 / 3
    with pytest.raises(MetricNameError, match="-l2 does not apply to err@10"):
        parse_metric("err@10-l2")


def test_ranx_names_equal_ranx():
    """Each name equal per query to ranx 0.3.21's own value on a random collection (distinct scores:
    ties do not decide). ranx's qrels hold the positive judgments (it reads 0 as not judged)."""
    ranx = pytest.importorskip("ranx")
    import numpy as np

    rng = np.random.default_rng(7)
    qrels, run = {}, {}
    for i in range(30):
        docs = [f"d{j}" for j in range(25)]
        qrels[f"q{i}"] = {d: int(rng.integers(0, 4)) for d in rng.choice(docs, 12, replace=False)}
        qrels[f"q{i}"].setdefault("d0", 1)
        scores = rng.permutation(200)[:20] / 7.0
        run[f"q{i}"] = {d: float(s) for d, s in zip(rng.choice(docs, 20, replace=False), scores)}
    names = ["f1", "f1@10", "f1@3", "dcg_burges@10", "ndcg_burges@10", "ndcg_burges", "rbp.95", "rbp.8", "rbp.5",
             "ndcg@10-l2", "ndcg-l3", "dcg@5-l2", "precision@5-l2", "recall@10-l2", "mrr-l2", "map@10-l2", "map-l3",
             "hits@5-l2", "hit_rate@3-l2", "r-precision-l2", "f1@10-l2", "rbp.8-l2", "ndcg_burges@10-l2"]
    positive = {q: {d: g for d, g in docs.items() if g > 0} for q, docs in qrels.items()}
    rq = ranx.Qrels(positive)
    got = se.evaluate(qrels, run, names, per_query=True).per_query
    for name in names:
        want = ranx.evaluate(rq, ranx.Run(run), name, return_mean=False)
        assert want.sum() > 0, name
        for i, q in enumerate(rq.keys()):  # ranx's order of queries
            assert got[q][name] == pytest.approx(want[i], rel=1e-12, abs=1e-14), (name, q)


# ir_measures' refused ones that are simple (item 4): judged_only=True, IPrec@x, RBP(rel=r)

JQ = {"q1": {"a": 2, "b": 0, "c": 1, "d": 2, "e": 1}, "q2": {"x": 1, "y": 0, "w": 1}, "q3": {"m": 1, "n": 2}}
JR = {"q1": {"u": 0.95, "a": 0.3, "b": 0.9, "c": 0.5, "d": 0.1, "v": 0.4},  # u, v, o, z unjudged
      "q2": {"x": 1.0, "y": 2.0, "z": 3.5, "w": 0.2}, "q3": {"m": 0.2, "n": 0.4, "o": 0.9}}


def test_ir_measures_judged_only_and_iprec_at():
    """judged_only=True (trec_eval -J for that measure: its unjudged ranked documents removed first)
    and IPrec@x (ir_measures' spelling of IPrec(recall=x)) equal ir_measures' own values per query
    (recall levels x R not at .5: trec_eval 9's and 10's rounding agree)."""
    irm = ir_measures
    measures = [irm.nDCG(judged_only=True) @ 10, irm.P(judged_only=True) @ 2, irm.AP(judged_only=True),
                irm.RR(judged_only=True), irm.IPrec @ 0.5, irm.IPrec @ 0.25]
    got = se.evaluate(JQ, JR, [str(m) for m in measures], per_query=True).per_query
    want = {(r.query_id, str(r.measure)): r.value for r in irm.iter_calc(measures, JQ, JR)}
    assert len(want) == 3 * len(measures)
    for (q, name), value in want.items():
        assert got[q][name] == pytest.approx(value, abs=1e-12), (q, name)
    # and judged_only changes something here: u (unjudged) is ranked first in q1
    plain = se.evaluate(JQ, JR, ["P@2"], per_query=True).per_query
    assert plain["q1"]["P@2"] != got["q1"]["P(judged_only=True)@2"]
    with pytest.raises(MetricNameError, match="recall level 10.0 must be between 0 and 1"):
        parse_metric("IPrec@10")


def test_ir_measures_binary_rbp_by_hand():
    """RBP(rel=r): cwl_eval's binary RBP, as ir_measures' cwl_eval provider asks it (gain 1 for a grade
    at or above r, else 0; (1 - p) sum of gain p^(rank - 1)); cwl_eval is not installed here: by hand."""
    ev = se.evaluate(HQ, HR, ["RBP(rel=1)", "RBP(rel=2, p=0.5)", "RBP(p=0.8)"])
    assert ev["RBP(rel=1)"] == pytest.approx(0.2 * (0.8 + 0.8 ** 2), rel=1e-12)  # a (rank 2), c (rank 3)
    assert ev["RBP(rel=2, p=0.5)"] == pytest.approx(0.5 * 0.5, rel=1e-12)  # a only
    # trec_eval's graded rbp (RBP without rel) is another measure: grades / the largest (3)
    assert ev["RBP(p=0.8)"] == pytest.approx(0.2 * (2 / 3 * 0.8 + 1 / 3 * 0.8 ** 2), rel=1e-12)


def test_ir_measures_ndcg_gains():
    """nDCG(gains={grade: gain}): the qrels' grades mapped before scoring (a grade not named keeps its
    value), alone and with judged_only=True, equal to ir_measures' own values per query."""
    irm = ir_measures
    measures = [irm.nDCG(gains={0: 0, 1: 1, 2: 3}) @ 10, irm.nDCG(gains={1: 5, 2: 1}),
                irm.nDCG(gains={0: 1, 1: 0, 2: 2}) @ 3, irm.nDCG(gains={2: 3}, judged_only=True) @ 10]
    got = se.evaluate(JQ, JR, measures, per_query=True).per_query
    want = list(irm.iter_calc(measures, JQ, JR))
    assert len(want) == 3 * len(measures)
    for r in want:
        assert got[r.query_id][str(r.measure)] == pytest.approx(r.value, abs=1e-12), (r.query_id, str(r.measure))
    # written as a string too, and the gains change the value here
    ev = se.evaluate(JQ, JR, ["nDCG(gains={0: 0, 1: 1, 2: 3})@10", "nDCG@10"])
    assert ev["nDCG(gains={0: 0, 1: 1, 2: 3})@10"] == ev[measures[0]] != ev["nDCG@10"]
