"""streameval.compare (issue 42 item 4): paired tests of several runs in the library, against scipy,
statsmodels, a brute-force enumeration of sign flips and ranx's compare."""

from __future__ import annotations

import gc
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats as sst

import streameval

NAMES = ["bm25", "dense", "hybrid", "rerank"]


def collection(seed, n_queries, docs=10, names=NAMES, shift=None):
    """Random graded qrels and runs with distinct scores; ``shift[name]``: a bonus to the relevant
    documents' scores (a better run)."""
    rng = np.random.default_rng(seed)
    qrels = {f"q{q}": {f"d{d}": int(rng.integers(0, 3)) for d in range(docs)} for q in range(n_queries)}
    runs = {}
    for name in names:
        bonus = (shift or {}).get(name, 0.0)
        runs[name] = {q: {d: float(rng.random()) + bonus * g for d, g in qs.items()} for q, qs in qrels.items()}
    return qrels, runs


def per_query(qrels, run, metric):
    ev = streameval.evaluate(qrels, run, metric, per_query=True)
    return {q: v[metric] for q, v in ev.per_query.items()}


def _sm(p, method):
    from statsmodels.stats.multitest import multipletests

    collect = gc.collect  # statsmodels' Holm calls gc.collect() (slow in a long session); no number changes
    gc.collect = lambda *args: 0
    try:
        return multipletests(p, method={"holm": "holm", "bh": "fdr_bh", "bonferroni": "bonferroni"}[method])[1]
    finally:
        gc.collect = collect


def test_t_test_all_pairs_equal_scipy_with_corrections_and_counts():
    qrels, runs = collection(7, 30, shift={"rerank": 0.6, "hybrid": 0.3})
    metrics = ["ndcg@5", "P_3"]
    pq = {n: {m: per_query(qrels, r, m) for m in metrics} for n, r in runs.items()}
    for correction in ("holm", "bh", "bonferroni", None):
        res = streameval.compare(qrels, runs, metrics, test="t", correction=correction, alpha=0.05)
        assert res.runs == NAMES and res.metrics == ["ndcg@5", "P_3"]  # names as written
        assert len(res.rows) == 2 * 6
        for m, name in zip(metrics, res.metrics):
            family = [r for r in res.rows if r["metric"] == name]
            assert [(r["system_a"], r["system_b"]) for r in family] == list(itertools.combinations(NAMES, 2))
            raw = []
            for r in family:
                a, b = pq[r["system_a"]][m], pq[r["system_b"]][m]
                x = np.array([a[q] for q in sorted(a)])
                y = np.array([b[q] for q in sorted(a)])
                want = sst.ttest_rel(y, x)
                assert r["p_value"] == pytest.approx(want.pvalue, abs=1e-12)
                assert r["statistic"] == pytest.approx(want.statistic, rel=1e-12)
                assert r["diff"] == pytest.approx(y.mean() - x.mean(), abs=1e-15)
                assert r["num_queries"] == 30
                d = y - x  # win/tie/loss of B against A, ties within 1e-12, counted here by hand
                assert (r["wins"], r["ties"], r["losses"]) == (int((d > 1e-12).sum()), int((abs(d) <= 1e-12).sum()),
                                                               int((d < -1e-12).sum()))
                raw.append(want.pvalue)
            want_adj = raw if correction is None else _sm(np.array(raw), correction)
            assert [r["p_corrected"] for r in family] == pytest.approx(list(want_adj), abs=1e-12)
            assert [r["significant"] for r in family] == [p <= 0.05 for p in want_adj]
            assert all(r["correction"] == correction for r in family)
    # something is significant here (rerank's bonus), so the table's superscripts are under test
    assert any(r["significant"] for r in res.rows)
    # P@3 ties often (it takes 4 values): the counts include ties
    assert any(r["ties"] > 0 for r in res.rows if r["metric"] == "P_3")


def test_baseline_pairs_and_table_superscripts():
    qrels, runs = collection(11, 40, shift={"rerank": 0.8, "dense": -0.5})
    res = streameval.compare(qrels, runs, ["ndcg@10"], baseline="hybrid")  # t, Holm: the defaults
    assert res.test == "t" and res.correction == "holm" and res.baseline == "hybrid"
    assert [(r["system_a"], r["system_b"]) for r in res.rows] == [("hybrid", "bm25"), ("hybrid", "dense"),
                                                                  ("hybrid", "rerank")]
    pq = {n: per_query(qrels, r, "ndcg@10") for n, r in runs.items()}
    qs = sorted(pq["hybrid"])
    raw = [sst.ttest_rel([pq[n][q] for q in qs], [pq["hybrid"][q] for q in qs]).pvalue for n in ("bm25", "dense", "rerank")]
    adj = _sm(np.array(raw), "holm")
    assert [r["p_corrected"] for r in res.rows] == pytest.approx(list(adj), abs=1e-12)
    # the expected letters from scipy and statsmodels: a run gets the letter of a run it beats
    means = {n: float(np.mean([pq[n][q] for q in qs])) for n in NAMES}
    letters = dict(zip(NAMES, "abcd"))
    beats = {n: "" for n in NAMES}
    for n, p in zip(("bm25", "dense", "rerank"), adj):
        if p <= 0.05:
            winner, loser = (n, "hybrid") if means[n] > means["hybrid"] else ("hybrid", n)
            beats[winner] += letters[loser]
    beats = {n: "".join(sorted(s)) for n, s in beats.items()}
    assert beats["rerank"] == "c" and "b" in beats["hybrid"]  # the collection was made so
    assert res.means["rerank"]["ndcg@10"] == pytest.approx(means["rerank"], abs=1e-15)
    sup = dict(zip("abcd", "ᵃᵇᶜᵈ"))
    md = res.to_markdown()
    assert str(res) == md
    best = f"{means['rerank']:.4f}"
    tex = res.to_latex()
    assert r"\textbf{" + best + "}" in tex  # the best mean in bold
    tex = tex.replace(r"\textbf{" + best + "}", best)
    for n in NAMES:
        cell = f"{means[n]:.4f}" + "".join(sup[c] for c in beats[n])
        assert f"| {letters[n]} | {n}" in md and f" {cell} |" in md.replace("  ", " ")
        tex_cell = f"{means[n]:.4f}" + (f"$^{{{beats[n]}}}$" if beats[n] else "")
        assert f"{letters[n]} & {n} & {tex_cell} " in tex
        html_cell = f"<td>{means[n]:.4f}" + (f"<sup>{beats[n]}</sup>" if beats[n] else "") + "</td>"
        assert html_cell in res.to_html()
    df = res.to_dataframe()
    assert list(df["system_b"]) == ["bm25", "dense", "rerank"] and "p_corrected" in df.columns


def _brute_force_p(d) -> float:
    """Every sign pattern, sums exact: the differences as integers over a common power-of-two
    denominator (every double is a dyadic rational)."""
    fr = [Fraction(x) for x in d]
    den = max(f.denominator for f in fr)
    ints = [f.numerator * (den // f.denominator) for f in fr]
    t = abs(sum(ints))
    hits = sum(abs(sum(s * x for s, x in zip(signs, ints))) >= t for signs in itertools.product((1, -1), repeat=len(ints)))
    return hits / 2 ** len(ints)


def test_fisher_exact_up_to_20_queries_equals_brute_force():
    qrels, runs = collection(3, 12, names=NAMES[:3], shift={"hybrid": 0.4})
    res = streameval.compare(qrels, runs, ["ndcg@5", "P_5"], test="fisher", correction=None)
    for r in res.rows:
        m = r["metric"]
        a, b = per_query(qrels, runs[r["system_a"]], m), per_query(qrels, runs[r["system_b"]], m)
        d = [b[q] - a[q] for q in sorted(a)]
        assert r["perm_method"] == "exact" and r["permutations"] == 2 ** 12
        assert r["p_value"] == _brute_force_p(d)
        assert r["p_corrected"] == r["p_value"]


def test_fisher_sampled_beyond_20_queries_within_its_sampling_error():
    qrels, runs = collection(5, 22, names=NAMES[:2], shift={"dense": 0.25})
    n_perm = 4000
    res = streameval.compare(qrels, runs, ["ndcg@10", "map"], test="fisher", n_permutations=n_perm, seed=3)
    for r in res.rows:
        a, b = per_query(qrels, runs["bm25"], r["metric"]), per_query(qrels, runs["dense"], r["metric"])
        d = np.array([b[q] - a[q] for q in sorted(a)])
        assert r["perm_method"] == "sampled" and r["permutations"] == n_perm and r["num_queries"] == 22
        # the exact p by brute force: all 2**22 sign patterns (two halves, every sum of one with the other)
        half = np.array(list(itertools.product((1.0, -1.0), repeat=11)))
        left, right = half @ d[:11], half @ d[11:]
        t = abs(d.sum())
        hits = sum(int(np.count_nonzero(np.abs(lv + right) >= t * (1 - 1e-12))) for lv in left)
        exact = hits / 2 ** 22
        se = math.sqrt(exact * (1 - exact) / n_perm)
        assert abs(r["p_value"] - exact) <= 3 * se + 1 / (n_perm + 1), (r["metric"], r["p_value"], exact)
    # another seed: other sign patterns
    other = streameval.compare(qrels, runs, ["ndcg@10", "map"], test="fisher", n_permutations=n_perm, seed=4)
    assert [r["p_value"] for r in other.rows] != [r["p_value"] for r in res.rows]


def test_tukey_equals_scipy_tukey_hsd():
    qrels, runs = collection(9, 25, shift={"rerank": 0.5})
    res = streameval.compare(qrels, runs, ["ndcg@10"], test="tukey", alpha=0.05)
    assert res.correction == "tukey"
    pq = {n: per_query(qrels, r, "ndcg@10") for n, r in runs.items()}
    qs = sorted(pq["bm25"])
    want = sst.tukey_hsd(*[np.array([pq[n][q] for q in qs]) for n in NAMES])
    ci = want.confidence_interval(0.95)
    for r in res.rows:
        i, j = NAMES.index(r["system_a"]), NAMES.index(r["system_b"])
        assert r["p_value"] == pytest.approx(want.pvalue[i, j], abs=1e-12)
        assert r["p_corrected"] == r["p_value"] and r["significant"] == (want.pvalue[i, j] <= 0.05)
        assert r["diff"] == pytest.approx(-want.statistic[i, j], abs=1e-15)  # scipy's statistic is mean_i - mean_j
        assert (r["ci_low"], r["ci_high"]) == pytest.approx((-ci.high[i, j], -ci.low[i, j]), abs=1e-9)
    assert any(r["significant"] for r in res.rows)
    # against a baseline: the same all-runs test, the baseline's pairs, difference other - baseline
    base = streameval.compare(qrels, runs, ["ndcg@10"], test="tukey", baseline="rerank")
    for r in base.rows:
        j = NAMES.index(r["system_b"])
        assert r["system_a"] == "rerank" and r["p_value"] == pytest.approx(want.pvalue[3, j], abs=1e-12)
        assert r["diff"] == pytest.approx(-want.statistic[3, j], abs=1e-15)


def test_bad_arguments_are_one_line_errors():
    qrels, runs = collection(1, 5, names=NAMES[:2])
    with pytest.raises(ValueError, match="test must be one of .*closest: 'tukey'"):
        streameval.compare(qrels, runs, ["map"], test="tukye")
    with pytest.raises(ValueError, match="correction must be one of .*closest: 'holm'"):
        streameval.compare(qrels, runs, ["map"], correction="hölm")
    with pytest.raises(ValueError, match="baseline 'BM25' is not one of the runs; closest: 'bm25'"):
        streameval.compare(qrels, runs, ["map"], baseline="BM25")
    with pytest.raises(ValueError, match="adjusted for all pairs already"):
        streameval.compare(qrels, runs, ["map"], test="tukey", correction="bh")
    with pytest.raises(ValueError, match="two runs or more"):
        streameval.compare(qrels, {"bm25": runs["bm25"]}, ["map"])
    with pytest.raises(ValueError, match="unknown|closest"):
        streameval.compare(qrels, runs, ["ndgc@10"])
    # ranx's test name is accepted
    assert streameval.compare(qrels, runs, ["map"], test="student").test == "t"


def test_equal_to_ranx_compare():
    import ranx

    qrels, runs = collection(13, 30, shift={"rerank": 0.5, "hybrid": 0.2})
    rq = ranx.Qrels(qrels)
    rr = []
    for n, r in runs.items():
        rr.append(ranx.Run(r, name=n))
    for test in ("t", "tukey"):
        ours = streameval.compare(qrels, runs, ["ndcg@10", "map"], test=test, correction=None, alpha=0.01)
        theirs = ranx.compare(rq, rr, ["ndcg@10", "map"], stat_test={"t": "student"}.get(test, test), max_p=0.01)
        for r in ours.rows:
            got = theirs.comparisons[r["system_a"], r["system_b"]][r["metric"]]
            assert r["p_value"] == pytest.approx(float(got["p_value"]), abs=1e-12)
            assert r["significant"] == bool(got["significant"])
            wtl = theirs.win_tie_loss[(r["system_b"], r["system_a"])][r["metric"]]  # ranx: control vs treatment
            assert (r["wins"], r["ties"], r["losses"]) == (wtl["W"], wtl["T"], wtl["L"])
        for n in NAMES:
            for m in ("ndcg@10", "map"):
                assert ours.means[n][m] == pytest.approx(theirs.results[n][m], abs=1e-12)
    # Fisher: ranx samples permutations (1000, its seed): within the sampling error of our exact-or-sampled p
    ours = streameval.compare(qrels, runs, ["ndcg@10"], test="fisher", correction=None, n_permutations=20000)
    theirs = ranx.compare(rq, rr, ["ndcg@10"], stat_test="fisher", n_permutations=1000)
    for r in ours.rows:
        p = float(theirs.comparisons[r["system_a"], r["system_b"]]["ndcg@10"]["p_value"])
        se = math.sqrt(r["p_value"] * (1 - r["p_value"]) / 1000) + math.sqrt(r["p_value"] * (1 - r["p_value"]) / 20000)
        assert abs(p - r["p_value"]) <= 3 * se + 2e-3
