"""Diversity measures over subtopic judgments (issue 17 item 4): streameval.metrics.diversity,
evaluate() with diversity qrels, the TREC diversity qrels reader, ``streameval ndeval`` and the
judgment schema's optional subtopic.

Oracle: pyndeval 0.0.8 (ndeval.c 4.5 compiled as a Python extension; the test extra). pyndeval
ranks a run by its own order (score descending, docno ascending), so each test hands it the order
to check as scores ``-position``: trec_eval's order (score descending, docno descending) for
evaluate() and ``-traditional``, the file's rank column for ndeval's default.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

import streameval
from streameval.metrics.diversity import NDEVAL_COLUMNS, parse_diversity
from streameval.metrics.names import MetricNameError, parse_metrics

try:
    import pyndeval
except ImportError:  # pragma: no cover - the test extra installs it
    pyndeval = None

needs_pyndeval = pytest.mark.skipif(pyndeval is None, reason="pyndeval is not installed (pip install "
                                                             "'streameval[test]'): the ndeval oracle tests skip")

NDEVAL_NAMES = [m if k is None else f"{m}@{k}" for m, k in NDEVAL_COLUMNS]
EXTRA = ["alpha-nDCG@1", "alpha-DCG@1", "ERR-IA@1", "nERR-IA@2", "P-IA@1", "strec@3", "alpha-nDCG@7", "ERR-IA@13"]


def collection(seed: int, n_queries: int = 14):
    """A seeded diversity collection: 1-5 subtopics per query, grades 0-2, tied scores, a query
    with only non-relevant judgments every fifth, unjudged documents in the run, a query judged but
    not ranked and one ranked but not judged."""
    rng = np.random.default_rng(seed)
    qrels, run = [], []
    for q in range(1, n_queries + 1):
        qid = str(q)
        pool = sorted({f"d{int(x):03d}" for x in rng.integers(0, 60, rng.integers(4, 40))})
        none_relevant = q % 5 == 0
        for doc in pool:
            for sub in range(1, int(rng.integers(1, 6)) + 1):
                if rng.random() < 0.6:
                    qrels.append((qid, str(sub), doc, 0 if none_relevant else int(rng.integers(0, 3))))
        if q == n_queries:
            continue  # judged, not ranked
        ranked = sorted({f"d{int(x):03d}" for x in rng.integers(0, 70, rng.integers(1, 35))})
        for doc in ranked:
            run.append((qid, doc, float(rng.integers(0, 6))))  # few distinct scores: ties
    run.append((str(n_queries + 1), "d001", 1.0))  # ranked, not judged
    return qrels, run


def trec_order(run):
    """trec_eval's order, written independently: per query, score descending, then docno descending."""
    return sorted(run, key=lambda r: (r[0], r[2], r[1]), reverse=True)


def oracle(qrels, ordered_run, measures, **kw):
    """pyndeval on a run whose order is given: scores -position, rows grouped by query."""
    ranked = [(q, d, -float(i)) for i, (q, d, *_) in enumerate(sorted(ordered_run, key=lambda r: r[0]))]
    # sorted() is stable: each query's rows keep the given order
    ev = pyndeval.RelevanceEvaluator(qrels, measures, **kw)
    return ev.evaluate(ranked)


def assert_close(ours: dict, ref: dict, names):
    assert set(ours) == set(ref), (sorted(ours), sorted(ref))
    for q in ref:
        for ours_name, ref_name in names:
            a, b = ours[q][ours_name], ref[q][ref_name]
            assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-9, (q, ours_name, a, b)


# --------------------------------------------------------------------------
# evaluate(): trec_eval's order, against pyndeval per query


@needs_pyndeval
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("alpha,beta,level", [(0.5, 0.5, 1), (0.3, 0.8, 1), (0.5, 0.5, 2), (1.0, 0.2, 1)])
def test_evaluate_equals_ndeval_per_query(seed, alpha, beta, level):
    qrels, run = collection(seed)
    names = NDEVAL_NAMES + EXTRA
    ref = oracle(qrels, trec_order(run), names, relevance_level=level, alpha=alpha, beta=beta)
    ours_names = []
    for n in names:  # alpha/beta as parameters of the names, ir_measures' way
        m, _, k = n.partition("@")
        params = [f"alpha={alpha}"] if m in ("ERR-IA", "nERR-IA", "alpha-DCG", "alpha-nDCG", "NRBP", "nNRBP") else []
        params += [f"beta={beta}"] if m in ("NRBP", "nNRBP") else []
        ours_names.append(m + (f"({','.join(params)})" if params else "") + (f"@{k}" if k else ""))
    qd = {}
    for q, s, d, g in qrels:
        qd.setdefault(q, {}).setdefault(s, {})[d] = g
    rd = {}
    for q, d, sc in run:
        rd.setdefault(q, {})[d] = sc
    with pytest.warns(UserWarning, match="1 run queries have no judgments"):
        ev = streameval.evaluate(qd, rd, ours_names, per_query=True, relevance_level=level)
    assert_close(ev.per_query, ref, list(zip(ours_names, names)))
    assert ev.num_queries == len(ref) == 13  # judged and ranked


@needs_pyndeval
def test_evaluate_input_shapes_agree(tmp_path):
    """The same judgments as a file, records, a DataFrame and arrays give the same numbers."""
    pd = pytest.importorskip("pandas")
    qrels, run = collection(5)
    path = tmp_path / "qrels.div"
    path.write_text("".join(f"{q} {s} {d} {g}\n" for q, s, d, g in qrels))
    rpath = tmp_path / "run.txt"
    rpath.write_text("".join(f"{q} Q0 {d} {i} {sc} tag\n" for i, (q, d, sc) in enumerate(run)))
    names = ["alpha_nDCG@20", "ERR_IA@10", "NRBP", "AP_IA", "P_IA@5", "S_recall@20"]
    records = [pyndeval.SubtopicQrel(*r) for r in qrels]
    frame = pd.DataFrame(qrels, columns=["query_id", "subtopic", "doc_id", "relevance"])
    arrays = tuple(np.array(c) for c in zip(*qrels))
    results = []
    for q in (str(path), records, frame, arrays):
        with pytest.warns(UserWarning):
            results.append(streameval.evaluate(q, str(rpath), names, per_query=True))
    for r in results[1:]:
        assert r.per_query == results[0].per_query and r.means.keys() == results[0].means.keys()
    ref = oracle(qrels, trec_order(run), ["alpha-nDCG@20", "ERR-IA@10", "NRBP", "MAP-IA", "P-IA@5", "strec@20"])
    assert_close(results[0].per_query, ref, list(zip(names, ["alpha-nDCG@20", "ERR-IA@10", "NRBP", "MAP-IA",
                                                             "P-IA@5", "strec@20"])))


@needs_pyndeval
def test_depth_and_complete():
    qrels, run = collection(3)
    qd = {}
    for q, s, d, g in qrels:
        qd.setdefault(q, {}).setdefault(s, {})[d] = g
    rd = {}
    for q, d, sc in run:
        rd.setdefault(q, {})[d] = sc
    ordered = trec_order(run)
    cut = [r for q in sorted({r[0] for r in ordered}) for r in [x for x in ordered if x[0] == q][:5]]
    ref = oracle(qrels, cut, ["alpha-nDCG@20", "NRBP", "MAP-IA"])
    with pytest.warns(UserWarning):
        ev = streameval.evaluate(qd, rd, ["alpha_nDCG@20", "NRBP", "MAP-IA"], per_query=True, depth=5)
    assert_close(ev.per_query, ref, [("alpha_nDCG@20", "alpha-nDCG@20"), ("NRBP", "NRBP"), ("MAP-IA", "MAP-IA")])
    with pytest.warns(UserWarning):
        full = streameval.evaluate(qd, rd, ["alpha_nDCG@20"], per_query=True, complete=True)
    assert full.num_queries == 14 and full.per_query["14"]["alpha_nDCG@20"] == 0.0  # judged, not ranked
    # the mean divides by every judged query (ndeval -c)
    ref_full = oracle(qrels, ordered, ["alpha-nDCG@20"])
    assert len(ref_full) == 13
    assert full.means["alpha_nDCG@20"] == pytest.approx(sum(v["alpha-nDCG@20"] for v in ref_full.values()) / 14,
                                                        abs=1e-12)


# --------------------------------------------------------------------------
# a TREC Web track style example, by hand


QRELS_HAND = """\
# topic subtopic docno grade (TREC Web track diversity qrels)
51 1 d1 1
51 1 d3 2
51 2 d2 1
51 2 d3 1
51 3 d4 1
51 3 d6 0
52 1 d1 0
52 2 d2 0
"""
RUN_HAND = """\
51 Q0 d3 1 5.0 hand
51 Q0 d1 2 4.0 hand
51 Q0 d5 3 3.0 hand
51 Q0 d2 4 2.0 hand
51 Q0 d4 5 1.0 hand
52 Q0 d1 1 1.0 hand
"""


def test_hand_example(tmp_path):
    """Topic 51, three subtopics, alpha = beta = 0.5; d5 is unjudged, d6 judged non-relevant.

    Gains G(r) of the run d3 d1 d5 d2 d4: d3 covers s1 and s2 (1 + 1 = 2); d1 covers s1 again
    (0.5); d5 nothing (0); d2 covers s2 again (0.5); d4 covers s3 first (1).
    Greedy ideal from d1{s1} d2{s2} d3{s1,s2} d4{s3}: d3 (2), then d4 (1 against d1, d2 at 0.5),
    then d1 / d2 tie at 0.5 -> the larger docno d2 (0.5), then d1 (0.5): ideal gains 2, 1, .5, .5.
    """
    q, r = tmp_path / "q.txt", tmp_path / "r.txt"
    q.write_text(QRELS_HAND)
    r.write_text(RUN_HAND)
    names = ["alpha_nDCG@5", "alpha_DCG@5", "ERR_IA@5", "nERR_IA@5", "NRBP", "nNRBP", "AP_IA", "P_IA@5",
             "S_recall@2", "S_recall@5"]
    ev = streameval.evaluate(str(q), str(r), names, per_query=True)
    v = ev.per_query["51"]
    log2 = math.log2
    run_dcg = 2 / 1 + 0.5 / log2(3) + 0 / log2(4) + 0.5 / log2(5) + 1 / log2(6)  # 2.917656
    ideal_dcg = 2 / 1 + 1 / log2(3) + 0.5 / log2(4) + 0.5 / log2(5)  # 3.096268
    assert v["alpha_nDCG@5"] == pytest.approx(run_dcg / ideal_dcg, abs=1e-12)  # 0.942313
    # "ideal ideal" normaliser of alpha-DCG: S = 3 subtopics, 3 * 0.5^(r-1) / log2(r+1)
    ii = sum(3 * 0.5 ** (i - 1) / log2(i + 1) for i in range(1, 6))
    assert v["alpha_DCG@5"] == pytest.approx(run_dcg / ii, abs=1e-12)
    run_err = 2 / 1 + 0.5 / 2 + 0 / 3 + 0.5 / 4 + 1 / 5  # 2.575
    ideal_err = 2 / 1 + 1 / 2 + 0.5 / 3 + 0.5 / 4  # 2.791667
    assert v["ERR_IA@5"] == pytest.approx(run_err / (3 + 1.5 / 2 + 0.75 / 3 + 0.375 / 4 + 0.1875 / 5), abs=1e-12)
    assert v["nERR_IA@5"] == pytest.approx(run_err / ideal_err, abs=1e-12)  # 0.922388
    # NRBP: (1 - (1 - a) b) / S * sum G(r) b^(r-1) = 0.75 / 3 * (2 + .25 + 0 + .0625 + .0625) = 0.59375
    assert v["NRBP"] == pytest.approx(0.25 * 2.375, abs=1e-12)
    assert v["nNRBP"] == pytest.approx(2.375 / (2 + 1 * 0.5 + 0.5 * 0.25 + 0.5 * 0.125), abs=1e-12)
    # AP per subtopic: s1 (d3@1, d1@2) (1/1 + 2/2) / 2 = 1; s2 (d3@1, d2@4) (1 + 2/4) / 2 = .75;
    # s3 (d4@5) (1/5) / 1 = .2; MAP-IA = (1 + .75 + .2) / 3 = .65
    assert v["AP_IA"] == pytest.approx(0.65, abs=1e-12)
    assert v["P_IA@5"] == pytest.approx(5 / 15, abs=1e-12)  # pairs: d3 2, d1 1, d2 1, d4 1
    assert v["S_recall@2"] == pytest.approx(2 / 3, abs=1e-12) and v["S_recall@5"] == 1.0
    # topic 52: judged, nothing relevant: 0, and nNRBP is ndeval's 0 / 0
    assert ev.per_query["52"]["alpha_nDCG@5"] == 0.0 and math.isnan(ev.per_query["52"]["nNRBP"])


def test_ndeval_command_hand_example(tmp_path):
    from streameval.cli import main

    q, r = tmp_path / "q.txt", tmp_path / "r.txt"
    q.write_text(QRELS_HAND.replace("51 ", "051 ", 1))  # "051" is topic 51, as ndeval reads numbers
    r.write_text(RUN_HAND.replace("51 Q0 d4", "wt10-51 Q0 d4"))  # a task prefix, as ndeval allows
    out = io.StringIO()
    from streameval.commands import ndeval

    assert ndeval.main([str(q), str(r)], out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "runid,topic," + ",".join(NDEVAL_NAMES)
    assert [ln.split(",")[:2] for ln in lines[1:]] == [["hand", "51"], ["hand", "52"], ["hand", "amean"]]
    row = dict(zip(NDEVAL_NAMES, lines[1].split(",")[2:]))
    run_dcg = 2 / 1 + 0.5 / math.log2(3) + 0.5 / math.log2(5) + 1 / math.log2(6)  # as test_hand_example
    ideal_dcg = 2 / 1 + 1 / math.log2(3) + 0.5 / math.log2(4) + 0.5 / math.log2(5)
    assert row["alpha-nDCG@5"] == "%.6f" % (run_dcg / ideal_dcg) == "0.942314"
    assert row["MAP-IA"] == "0.650000" and row["NRBP"] == "0.593750" and row["strec@5"] == "1.000000"
    assert lines[2].split(",")[2 + NDEVAL_NAMES.index("nNRBP")] == "-nan"  # printf("%.6f", 0.0 / 0.0) on glibc
    assert main(["ndeval", str(q), str(r)]) == 0


# --------------------------------------------------------------------------
# streameval ndeval: the rank column, -traditional, -M, -c; ndeval's printf formats


def _write_collection(tmp_path, qrels, run, ranks):
    q, r = tmp_path / "q.txt", tmp_path / "r.txt"
    q.write_text("".join(f"{a} {s} {d} {g}\n" for a, s, d, g in qrels))
    r.write_text("".join(f"{a} Q0 {d} {k} {sc} myrun\n" for (a, d, sc), k in zip(run, ranks)))
    return str(q), str(r)


def _expected_text(ref, topics, actual, runid="myrun"):
    """ndeval.c outputMeasures' text from the oracle's numbers: printf("%s,%d" + ",%.6f" * 21), topics
    of the run in numeric order (zeros for a topic without judgments), then totals / actual topics."""
    fmt = lambda v: "-nan" if math.isnan(v) else "%.6f" % v  # noqa: E731 (glibc prints 0.0/0.0 as -nan)
    lines = ["runid,topic," + ",".join(NDEVAL_NAMES)]
    totals = [0.0] * len(NDEVAL_NAMES)
    for t in topics:
        vals = [ref.get(str(t), {}).get(n, 0.0) for n in NDEVAL_NAMES]
        lines.append(f"{runid},{t}," + ",".join(fmt(v) for v in vals))
        totals = [a + b for a, b in zip(totals, vals)]
    lines.append(f"{runid},amean," + ",".join(fmt(x / actual) for x in totals))
    return "\n".join(lines) + "\n"


@needs_pyndeval
@pytest.mark.parametrize("seed", [0, 4])
@pytest.mark.parametrize("flags", [[], ["-traditional"], ["-M", "7"], ["-traditional", "-c", "-alpha", "0.7",
                                                                       "-beta", "0.9"]])
def test_ndeval_command_equals_pyndeval(tmp_path, seed, flags):
    from streameval.commands import ndeval

    qrels, run = collection(seed)
    rng = np.random.default_rng(seed + 100)
    ranks = []
    for q in sorted({r[0] for r in run}):  # the rank column: a shuffle unrelated to the scores
        n = sum(1 for r in run if r[0] == q)
        ranks += (rng.permutation(n) + 1).tolist()
    run = sorted(run, key=lambda r: r[0])
    q, r = _write_collection(tmp_path, qrels, run, ranks)
    if "-traditional" in flags:
        ordered = trec_order(run)
    else:
        ordered = [x for _, x in sorted(zip(ranks, run), key=lambda p: (p[1][0], p[0]))]
    if "-M" in flags:
        depth = int(flags[flags.index("-M") + 1])
        ordered = [x for t in sorted({x[0] for x in ordered}) for x in [y for y in ordered if y[0] == t][:depth]]
    alpha = float(flags[flags.index("-alpha") + 1]) if "-alpha" in flags else 0.5
    beta = float(flags[flags.index("-beta") + 1]) if "-beta" in flags else 0.5
    ref = oracle(qrels, ordered, NDEVAL_NAMES, alpha=alpha, beta=beta)
    runid, topics, values, actual = ndeval.ndeval_table(q, r, alpha=alpha, beta=beta,
                                                        traditional="-traditional" in flags,
                                                        complete="-c" in flags,
                                                        depth=int(flags[flags.index("-M") + 1]) if "-M" in flags
                                                        else None)
    ours = {str(t): dict(zip(NDEVAL_NAMES, values[:, j].tolist())) for j, t in enumerate(topics.tolist())
            if str(t) in ref}
    assert_close(ours, ref, [(n, n) for n in NDEVAL_NAMES])
    judged = {int(x[0]) for x in qrels}
    ranked = sorted({int(x[0]) for x in run})
    assert topics.tolist() == ranked and actual == (len(judged) if "-c" in flags else len(judged & set(ranked)))
    out = io.StringIO()
    assert ndeval.main([*flags, q, r], out=out) == 0
    assert out.getvalue() == _expected_text(ref, ranked, actual)


def _ndeval_risk(r, b, a):
    """The risk-sensitive difference of the TREC 2013 Web track (Collins-Thompson et al., "TREC 2013
    Web Track Overview"; ndeval.c 4.5's RiskBased): r - b for a win, (1 + a)(r - b) for a loss."""
    return r - b if r >= b else (1 + a) * (r - b)


def _same_csv(got: str, want: str):
    """ndeval's CSV, the run ids, topics and -nan exactly, the numbers to the printed 6 decimals (a
    difference r - b can end on a rounding boundary, x.xxxxxx5, where the last bit of r or b, ours or
    pyndeval's, picks the printed digit)."""
    g, w = got.splitlines(), want.splitlines()
    assert len(g) == len(w) and g[0] == w[0]
    for a, b in zip(g[1:], w[1:]):
        fa, fb = a.rsplit(",", 21), b.rsplit(",", 21)
        assert fa[0] == fb[0] and len(fa) == len(fb) == 22, (a, b)
        for x, y in zip(fa[1:], fb[1:]):
            assert x == y or ("nan" not in x + y and abs(float(x) - float(y)) <= 1.000001e-6), (a, b)


@needs_pyndeval
@pytest.mark.parametrize("seed", [1, 6])
@pytest.mark.parametrize("flags", [["-riskAlpha", "1"], ["-riskAlpha", "5", "-c"], [], ["-c", "-M", "9"],
                                   ["-riskAlpha", "0.25", "-alpha", "0.7"]])
def test_ndeval_risk_sensitive_equals_the_formula_on_pyndeval(tmp_path, seed, flags):
    """-baseline / -riskAlpha: every printed value is the formula applied to pyndeval's values of the
    run and of the baseline; topics of the run (and of the baseline under -c), the missing side 0;
    the mean divides by ndeval's topic count or the number printed, whichever is larger."""
    from streameval.commands import ndeval

    qrels, run = collection(seed)
    rng = np.random.default_rng(seed + 200)
    base = []
    for q in [*range(1, 14), 15, 16]:  # 14: judged, only in the baseline; 16: in neither qrels nor run
        if q == 3:
            continue  # 3: in the run only
        for doc in sorted({f"d{int(x):03d}" for x in rng.integers(0, 70, rng.integers(1, 30))}):
            base.append((str(q), doc, float(rng.integers(0, 6))))
    run = sorted(run, key=lambda r: r[0])
    q, r = _write_collection(tmp_path, qrels, run, list(range(1, len(run) + 1)))
    b = tmp_path / "b.txt"
    b.write_text("".join(f"{a} Q0 {d} {k} {sc} base\n" for k, (a, d, sc) in enumerate(base, 1)))
    a = float(flags[flags.index("-riskAlpha") + 1]) if "-riskAlpha" in flags else 0.0
    alpha = float(flags[flags.index("-alpha") + 1]) if "-alpha" in flags else 0.5
    depth = int(flags[flags.index("-M") + 1]) if "-M" in flags else None

    def cut(rows):
        rows = trec_order(rows)
        return rows if depth is None else [x for t in sorted({x[0] for x in rows})
                                           for x in [y for y in rows if y[0] == t][:depth]]

    ref_run = oracle(qrels, cut(run), NDEVAL_NAMES, alpha=alpha)
    ref_base = oracle(qrels, cut(base), NDEVAL_NAMES, alpha=alpha)
    run_topics = {int(x[0]) for x in run}
    base_topics = {int(x[0]) for x in base}
    topics = sorted(run_topics | base_topics) if "-c" in flags else sorted(run_topics)
    zero = dict.fromkeys(NDEVAL_NAMES, 0.0)
    want = {str(t): {n: _ndeval_risk(ref_run.get(str(t), zero)[n] if t in run_topics else 0.0,
                                     ref_base.get(str(t), zero)[n] if t in base_topics else 0.0, a)
                     for n in NDEVAL_NAMES} for t in topics}
    judged = {int(x[0]) for x in qrels}
    actual = max(len(judged) if "-c" in flags else len(judged & run_topics), len(topics))
    risk_text = flags[flags.index("-riskAlpha") + 1] if "-riskAlpha" in flags else "0"
    out = io.StringIO()
    assert ndeval.main(["-traditional", *flags, "-baseline", str(b), q, r], out=out) == 0
    _same_csv(out.getvalue(), _expected_text(want, topics, actual, f"myrun (rel to. base, rs=1+a, a={risk_text})"))
    # a loss counts 1 + a times: some topic is below the baseline (else the test would not test a)
    assert any(v < 0 for row in want.values() for v in row.values())


def test_ndeval_risk_without_baseline_changes_nothing(tmp_path):
    from streameval.commands import ndeval

    qrels, run = collection(2)
    q, r = _write_collection(tmp_path, qrels, sorted(run, key=lambda x: x[0]), list(range(1, len(run) + 1)))
    plain, risky, itself = io.StringIO(), io.StringIO(), io.StringIO()
    assert ndeval.main([q, r], out=plain) == 0
    assert ndeval.main(["-riskAlpha", "3", q, r], out=risky) == 0
    assert plain.getvalue() == risky.getvalue()
    # the run against itself: every difference 0 (NaN where ndeval's nNRBP is NaN)
    assert ndeval.main(["-riskAlpha", "3", "-baseline", r, q, r], out=itself) == 0
    lines = itself.getvalue().splitlines()
    assert lines[1].startswith("myrun (rel to. myrun, rs=1+a, a=3),")
    assert {v for ln in lines[1:] for v in ln.rsplit(",", 21)[1:]} <= {"0.000000", "-nan"}


def test_ndeval_command_errors(tmp_path, capsys):
    from streameval.commands import ndeval

    q, r = tmp_path / "q.txt", tmp_path / "r.txt"
    q.write_text("1 1 d1 1\n1 2 d2 1\n")
    r.write_text("1 Q0 d1 1 2.0 t\n1 Q0 d2 1 1.0 t\n")  # rank 1 twice
    assert ndeval.main([str(q), str(r)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "duplicate rank (1) for topic 1" in err
    assert ndeval.main(["-traditional", str(q), str(r)]) == 0  # -traditional orders by score
    capsys.readouterr()
    q.write_text("1 1 d1 1\nq2 1 d2 1\n")
    assert ndeval.main([str(q), str(r)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{q}:2: query id 'q2' is not a natural number" in err
    q.write_text("1 1 d1 1\n")
    r.write_text("1 Q0 d1 1 2.0 t\n1 Q0 d1 2 1.0 t\n")
    assert ndeval.main([str(q), str(r)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{r}:2: docno 'd1' ranked twice for topic 1" in err
    assert ndeval.main(["-baseline", str(r), str(q), str(r)]) == 2  # the baseline's errors too
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{r}:2: docno 'd1' ranked twice for topic 1" in err
    for bad in ("-1", "x", "nan", "inf"):
        assert ndeval.main(["-riskAlpha", bad, str(q), str(r)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "-riskAlpha" in err
    assert ndeval.main(["-alpha", "2", str(q), str(r)]) == 2
    assert ndeval.main([str(tmp_path / "missing"), str(r)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "missing" in err


# --------------------------------------------------------------------------
# the reader, names, mixed calls


@pytest.mark.parametrize("text,line,reason", [
    ("1 1 d1 1\n1 1 d2\n", 2, "expected 4 columns (qid subtopic docno grade), got 3"),
    ("1 1 d1 1\n\n# note\n1 2 d2 x\n", 4, "grade 'x' is not an integer"),
    ("1 1 d1 1\n1 2 d1 1\n1 1 d1 0\n", 3, "docno 'd1' judged twice for subtopic '1' of query '1' (also at line 1)"),
    ("1 1 d1 1 extra\n", 1, "expected 4 columns"),
])
def test_reader_errors(tmp_path, text, line, reason):
    from streameval.io.trec import TrecFormatError
    from streameval.io.trec_subtopics import read_diversity_qrels

    p = tmp_path / "q.txt"
    p.write_text(text)
    with pytest.raises(TrecFormatError) as e:
        read_diversity_qrels(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:{line}: {reason}") and "\n" not in msg


def test_reader_reads(tmp_path):
    from streameval.io.trec_subtopics import read_diversity_qrels

    p = tmp_path / "q.txt"
    p.write_text("# c\n7 1 d1 2\n\n7 2 d1 -1\n")
    q = read_diversity_qrels(p)
    assert q.qid.tolist() == ["7", "7"] and q.subtopic.tolist() == ["1", "2"] and q.grade.tolist() == [2, -1]
    assert q.lineno.tolist() == [2, 4]
    with pytest.raises(ValueError, match=":4: grade '-1' is not a natural number"):
        read_diversity_qrels(p, ndeval=True)


def test_names():
    sp = parse_diversity("alpha_nDCG(alpha=0.25)@20")
    assert (sp.measure, sp.k, sp.alpha, sp.name) == ("alpha-nDCG", 20, 0.25, "alpha_nDCG(alpha=0.25)@20")
    assert parse_diversity("NRBP(alpha=0.5,beta=0.9)").beta == 0.9
    assert parse_diversity("strec@10").measure == parse_diversity("StRecall@10").measure == "strec"
    assert parse_diversity("S_recall@10").measure == "strec" and parse_diversity("MAP-IA").measure == "MAP-IA"
    assert parse_diversity("ndcg@10") is None
    for bad, why in [("alpha_nDCG", "needs a cutoff"), ("NRBP@10", "takes no cutoff"),
                     ("P_IA(beta=0.5)@5", "takes no parameter 'beta'"), ("alpha_nDCG(alpha=2)@5", "between 0 and 1")]:
        with pytest.raises(MetricNameError, match=why):
            parse_diversity(bad)
    # the commands that read ad hoc qrels only (trec-eval, the streaming job) refuse them in one line
    with pytest.raises(MetricNameError, match="is a diversity measure .* `streameval ndeval` .*compute it"):
        parse_metrics(["ndcg@10", "alpha_nDCG@20"])


def test_evaluate_refuses_mixed_calls_and_flat_qrels():
    run = {"1": {"d1": 1.0}}
    with pytest.raises(MetricNameError, match="evaluate them in separate calls"):
        streameval.evaluate({"1": {"a": {"d1": 1}}}, run, ["alpha_nDCG@20", "ndcg@10"])
    with pytest.raises(TypeError, match="diversity measures need subtopic judgments"):
        streameval.evaluate({"1": {"d1": 1}}, run, "alpha_nDCG@20")
    with pytest.raises(ValueError, match="judged twice for subtopic 'a'"):
        streameval.evaluate([("1", "a", "d1", 1), ("1", "a", "d1", 0)], run, "alpha_nDCG@20")
    with pytest.raises(ValueError, match="gain: not options of the diversity measures"):
        streameval.evaluate({"1": {"a": {"d1": 1}}}, run, "alpha_nDCG@20", gain="exponential")


def test_stream_job_refuses_diversity_names_in_one_line(tmp_path, capsys):
    """The batch job and the streaming job's columnar engine score them (tests/test_diversity_jobs.py);
    the per-event streaming engine does not."""
    from streameval.cli import main

    from streameval.io import avro

    imps = tmp_path / "imps.avro"
    avro.write_records(imps, "impression", [{"event_id": "e", "request_id": "r", "query_id": "q", "system_id": "S",
                                             "item_id": "d", "position": 1, "timestamp": 0}])
    rc = main(["stream", "--replay", "--engine", "events", "--window", "1h", "--impressions", str(imps), "--metrics",
               "alpha_nDCG@20", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "diversity measures (alpha_nDCG@20) need the columnar engine" in err


# --------------------------------------------------------------------------
# the judgment schema's subtopic (version 2) and files of version 1


def test_old_judgment_files_still_read(tmp_path):
    import fastavro

    from streameval.io import arrow_avro, avro

    v1 = json.loads(avro.schema_path("judgment").read_text())
    v1["fields"] = [f for f in v1["fields"] if f["name"] != "subtopic"]
    v1["streameval_schema_version"] = 1
    path = tmp_path / "old.avro"
    with open(path, "wb") as fo:
        fastavro.writer(fo, fastavro.parse_schema(v1), [{"query_id": "q", "item_id": "d", "grade": 1,
                                                         "timestamp": 0, "source": "s"}])
    (rec,) = avro.read_records([str(path)], "judgment")
    assert rec == {"query_id": "q", "item_id": "d", "grade": 1, "timestamp": 0, "source": "s", "subtopic": None}
    new = tmp_path / "new.avro"
    avro.write_records(new, "judgment", [{"query_id": "q", "item_id": "d", "grade": 1, "subtopic": "2"}])
    assert next(iter(avro.read_records([str(new)], "judgment")))["subtopic"] == "2"
    if arrow_avro.available():  # both versions keep the DataFusion fast path
        old_tables = list(arrow_avro._tables(str(path), "judgment", 10))
        new_tables = list(arrow_avro._tables(str(new), "judgment", 10))
        # the column the file lacks, all null (as fastavro's resolution fills the default)
        assert old_tables[0].column_names == list(rec) and old_tables[0].num_rows == 1
        assert old_tables[0].column("subtopic").to_pylist() == [None]
        assert new_tables[0].column("subtopic").to_pylist() == ["2"]
    from streameval.io.records import check_judgment

    assert check_judgment({"query_id": "q", "item_id": "d", "grade": 1, "subtopic": 3}).startswith(
        "subtopic must be a string or null")
