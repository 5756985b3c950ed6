"""Paired comparison: the paired t-test against scipy.stats.ttest_rel, the sign-flip test against a
brute-force enumeration (and scipy.stats.permutation_test), the mergeable state's merge-order
invariance, the Beam transform, and ``streameval compare`` on synthetic files and on DL-HARD."""

import itertools
import json
import math
import os
import random
import subprocess
import sys
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import stats as sst

from streameval import api
from streameval.accumulators.paired import PairedComparison
from streameval.commands import compare
from streameval.metrics import stats

from .conftest import REPO, data_path
from .test_stats import coder_round_trip, random_tree_merge, same, split

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*judged queries have no results:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*run queries have no judgments:UserWarning"),
]


def brute_force_sign_flip(d):
    """Every sign pattern, sums in exact rationals."""
    d = [Fraction(x) for x in d]
    t = abs(sum(d))
    hits = sum(1 for signs in itertools.product((1, -1), repeat=len(d))
               if abs(sum(s * x for s, x in zip(signs, d))) >= t)
    return hits / 2 ** len(d)


def feed(pc, a, b, keys=None):
    s = pc.create()
    for i in range(len(a)):
        pc.add(s, keys[i] if keys else f"q{i}", a[i], b[i])
    return s


# --------------------------------------------------------------------------------------------
# the tests themselves


# metric-like values (squares of values below ~1e-154 underflow in any float implementation)
score = st.one_of(st.just(0.0), st.just(1.0), st.floats(1e-9, 1))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(score, score), min_size=2, max_size=50))
@example(pairs=[(0.0, 1.0000000000000003e-09), (0.0, 1e-09)])  # nearly equal differences (found under numpy 2.2)
def test_paired_t_matches_scipy(pairs):
    a = np.array([p[0] for p in pairs])
    b = np.array([p[1] for p in pairs])
    pc = PairedComparison(1, replicates=10, flips=0, exact_max=0)
    res = pc.extract(feed(pc, a[:, None], b[:, None]))[0]
    d = b - a
    if np.all(d == d[0]):  # no variance: scipy warns and divides by zero
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        want = sst.ttest_rel(b, a)
    if any("catastrophic cancellation" in str(w.message) for w in caught):
        # nearly equal differences: scipy says its own result is unreliable (numpy 2.2's sums gave
        # t = 6.8e15 where the exact value is 9.7e15); the reference is then the exact t from Fractions
        fd = [Fraction(y) - Fraction(x) for x, y in zip(a.tolist(), b.tolist())]
        mean = sum(fd) / len(fd)
        var = sum((x - mean) ** 2 for x in fd) / (len(fd) - 1)
        assert res["t"] == pytest.approx(float(mean) / math.sqrt(float(var / len(fd))), rel=1e-9)
        return
    assert res["t"] == pytest.approx(want.statistic, rel=1e-9, abs=1e-12)
    assert res["p_t"] == pytest.approx(want.pvalue, rel=1e-9, abs=1e-15)
    assert stats.paired_t_test(a, b) == pytest.approx((want.statistic, want.pvalue), rel=1e-9, abs=1e-12)
    lo, hi = sst.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=sst.sem(d))
    assert (res["t_low"], res["t_high"]) == pytest.approx((lo, hi), rel=1e-9, abs=1e-12)
    assert res["diff"] == math.fsum(d.tolist()) / len(d)
    assert res["mean_a"] == math.fsum(a.tolist()) / len(a) and res["mean_b"] == math.fsum(b.tolist()) / len(b)


def test_t_test_edges():
    assert stats.t_test(0.1, 10, 0.0) == (math.inf, 0.0)
    assert all(math.isnan(v) for v in stats.t_test(0.0, 10, 0.0))
    assert all(math.isnan(v) for v in stats.t_test(0.1, 1, math.nan))


def test_exact_sign_flip_matches_brute_force_and_scipy():
    rng = np.random.default_rng(3)
    for n in range(1, 13):
        # values on a coarse grid, so exact ties between sign patterns happen
        d = (rng.integers(-4, 5, size=n) * 0.1).tolist()
        assert stats.sign_flip_pvalue_exact(d) == brute_force_sign_flip(d), d
        c = rng.normal(0.05, 0.2, size=n)
        p = stats.sign_flip_pvalue_exact(c)
        assert p == brute_force_sign_flip(c.tolist())
        if n < 2:
            continue
        ref = sst.permutation_test((c, np.zeros(n)), lambda x, y, axis: np.mean(x - y, axis=axis),
                                   permutation_type="samples", n_resamples=math.inf, vectorized=True)
        assert p == pytest.approx(ref.pvalue, abs=1e-12)
    assert stats.sign_flip_pvalue_exact([0.0, 0.0]) == 1.0
    assert stats.sign_flip_pvalue_exact([0.3]) == 1.0
    assert math.isnan(stats.sign_flip_pvalue_exact([math.nan]))
    # 26 differences: meet in the middle against scipy's exact enumeration is too slow; check
    # the symmetry instead (flipping every sign keeps p)
    d = rng.normal(0.1, 0.3, size=26)
    assert stats.sign_flip_pvalue_exact(d) == stats.sign_flip_pvalue_exact(-d)


def test_state_permutation_p_exact_then_monte_carlo():
    rng = np.random.default_rng(8)
    a = rng.random((30, 2))
    b = a + rng.normal(0.04, 0.15, size=(30, 2))
    # up to exact_max queries: the exact p-value, to the bit
    pc = PairedComparison(2, replicates=20, flips=4000, exact_max=14)
    res = pc.extract(feed(pc, a[:14], b[:14]))
    for m in range(2):
        assert res[m]["perm_method"] == "exact" and res[m]["perm_samples"] == 2 ** 14
        assert res[m]["p_perm"] == brute_force_sign_flip((b[:14, m] - a[:14, m]).tolist())
    # beyond: Monte Carlo over hash-seeded sign patterns, within sampling error of the exact value
    res = pc.extract(feed(pc, a, b))
    for m in range(2):
        exact = stats.sign_flip_pvalue_exact(b[:, m] - a[:, m])
        assert res[m]["perm_method"] == "monte-carlo" and res[m]["perm_samples"] == 4000
        assert abs(res[m]["p_perm"] - exact) <= 4 * math.sqrt(exact * (1 - exact) / 4000) + 1 / 4000
    # the Monte Carlo p-value is (1 + hits) / (R + 1) over exactly these signs
    keys = [f"q{i}" for i in range(30)]
    signs = pc.signs.weights(keys)
    d = b[:, 0] - a[:, 0]
    t_obs = math.fsum(d.tolist())
    reps = [float(sum(Fraction(int(signs[q, r])) * Fraction(d[q]) for q in range(30))) for r in range(4000)]
    assert res[0]["p_perm"] == (1 + sum(abs(x) >= abs(t_obs) for x in reps)) / 4001


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.one_of(st.floats(0, 1), st.just(math.nan))), max_size=30),
       st.integers(0, 2 ** 32))
def test_paired_state_is_identical_whatever_the_split_and_merge_order(rows, seed):
    rnd = random.Random(seed)
    pc = PairedComparison(2, replicates=40, flips=300, exact_max=12)
    data = [(f"q{i}", [a, 0.5 * a], [b, 1 - a]) for i, (a, b) in enumerate(rows)]
    one = pc.create()
    for k, a, b in data:
        pc.add(one, k, a, b)
    pieces = []
    for part in split(data, rnd):
        s = pc.create()
        for k, a, b in part:
            pc.add(s, k, a, b)
        if rnd.random() < 0.5:
            pc.compact(s)
        pieces.append(coder_round_trip(s))
    merged = random_tree_merge(pieces, pc.merge, rnd)
    got, want = pc.extract(merged), pc.extract(one)
    for g, w in zip(got, want):
        assert all(same(g[k], w[k]) for k in g), (g, w)
    assert (merged[4] is None) == (len(rows) > 12)


def test_paired_bootstrap_uses_the_same_weights_as_the_bootstrap():
    """The difference's replicates are the replicates of B minus those of A (same query keys)."""
    from streameval.accumulators.bootstrap import PoissonBootstrap

    rng = np.random.default_rng(4)
    a, b = rng.random(40), rng.random(40)
    boot = PoissonBootstrap(2, replicates=50)
    s = boot.create()
    for i in range(40):
        boot.add(s, f"q{i}", [a[i], b[i]])
    means = boot.replicate_means(s)
    pc = PairedComparison(1, replicates=50, flips=0, exact_max=0)
    res = pc.extract(feed(pc, a[:, None], b[:, None]))[0]
    lo, hi = stats.percentile_interval(means[1] - means[0])
    assert res["boot_low"] == pytest.approx(lo, abs=1e-12) and res["boot_high"] == pytest.approx(hi, abs=1e-12)


# --------------------------------------------------------------------------------------------
# Beam


_SINK: dict = {}


def _collect(x, key):
    _SINK.setdefault(key, []).append(x)


def test_compare_systems_transform():
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from streameval.beam.stats import CompareSystems

    rng = np.random.default_rng(9)
    elements, scores = [], {}
    for window in (0, 3600):
        for q in range(25):
            for system in ("base", "new", "other"):
                if system == "other" and q % 5 == 0:
                    continue  # 'other' misses some queries: they are not paired
                vals = [float(rng.random()), float(rng.random())]
                reps = [vals]
                if system == "new" and q == 3:  # two requests for one query: averaged
                    reps.append([float(rng.random()), float(rng.random())])
                for v in reps:
                    for label in ("all", f"g={q % 2}"):
                        elements.append(((window, window + 3600, label, system), (f"q{q}", v)))
                scores[(window, system, q)] = [math.fsum(c) / len(c) for c in zip(*reps)]
    with beam.Pipeline(runner=FnApiRunner()) as p:
        (p | beam.Create(elements, reshuffle=False)
         | CompareSystems(["m1", "m2"], baseline="base", replicates=30, flips=500, exact_max=5)
         | beam.Map(_collect, "compare"))
    rows = _SINK.pop("compare")
    assert len(rows) == 2 * 3 * 2 * 2  # windows x slices x pairs x metrics
    pc = PairedComparison(2, replicates=30, flips=500, exact_max=5)
    for r in rows:
        qs = [q for q in range(25) if r["slice"] == "all" or r["slice"] == f"g={q % 2}"]
        qs = [q for q in qs if (r["window_start"], r["system_b"], q) in scores]
        s = pc.create()
        for q in qs:
            pc.add(s, f"q{q}", scores[(r["window_start"], "base", q)], scores[(r["window_start"], r["system_b"], q)])
        want = pc.extract(s)[0 if r["metric"] == "m1" else 1]
        assert r["system_a"] == "base" and r["num_queries"] == len(qs)
        for k in ("diff", "t_low", "boot_low", "boot_high", "p_t", "p_perm"):
            assert r[k] == want[k], (k, r)


# --------------------------------------------------------------------------------------------
# the command


def write_trec(tmp_path, rng, n_queries=8):
    qrels, run_a, run_b = [], [], []
    for q in range(n_queries):
        for d in range(6):
            qrels.append(f"{q} 0 d{d} {int(rng.integers(0, 3))}")
        for name, lines in (("a", run_a), ("b", run_b)):
            for rank, d in enumerate(rng.permutation(6)):
                lines.append(f"{q} Q0 d{d} {rank + 1} {10 - rank} {name}")
    paths = {}
    for name, lines in (("qrels", qrels), ("a.run", run_a), ("b.run", run_b)):
        paths[name] = tmp_path / name
        paths[name].write_text("\n".join(lines) + "\n")
    return paths


def test_compare_command_small(tmp_path, capsys):
    paths = write_trec(tmp_path, np.random.default_rng(2))
    rc = compare.main([str(paths["qrels"]), str(paths["a.run"]), str(paths["b.run"]), "-m", "ndcg@5", "-m", "P_3",
                       "--json"])
    assert rc == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["metric"] for r in rows] == ["ndcg@5", "P_3"]  # as written (issue 42)
    res = api.evaluate(str(paths["qrels"]), str(paths["a.run"]), ["ndcg@5", "P_3"], per_query="pandas")
    res_b = api.evaluate(str(paths["qrels"]), str(paths["b.run"]), ["ndcg@5", "P_3"], per_query="pandas")
    for r in rows:
        a = res.per_query[r["metric"]].to_numpy()
        b = res_b.per_query[r["metric"]].to_numpy()
        assert r["system_a"] == "a" and r["system_b"] == "b" and r["num_queries"] == 8
        assert r["mean_a"] == res.means[r["metric"]] and r["mean_b"] == res_b.means[r["metric"]]
        assert r["perm_method"] == "exact" and r["p_perm"] == brute_force_sign_flip((b - a).tolist())
        assert r["p_t"] == pytest.approx(sst.ttest_rel(b, a).pvalue, rel=1e-9)
    assert compare.main([str(paths["qrels"]), str(paths["a.run"]), str(paths["b.run"]), "-m", "nonsense"]) == 2
    assert "nonsense" in capsys.readouterr().err


def test_compare_dl_hard(capsys):
    qrels = data_path("dl_hard_passage", "dl_hard-passage.qrels")
    runs = data_path("dl_hard_passage", "runs")
    rc = compare.main([str(qrels), str(runs / "bm25.run"), str(runs / "bm25+bert(zs).run"),
                       str(runs / "bm25+t5(zs).run"), "-l", "2", "-c", "-M", "1000", "-m", "ndcg@10", "-m", "map",
                       "--json"])
    assert rc == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 4
    opts = dict(relevance_level=2, complete=True, depth=1000, per_query="pandas")
    base = api.evaluate(str(qrels), str(runs / "bm25.run"), ["ndcg@10", "map"], **opts)
    assert base.means["map"] == pytest.approx(0.1731, abs=5e-5)  # trec_eval's bm25.run.eval
    for r in rows:
        other = api.evaluate(str(qrels), str(runs / (r["system_b"] + ".run")), ["ndcg@10", "map"], **opts)
        a = base.per_query[r["metric"]].to_numpy()
        b = other.per_query.loc[base.per_query.index, r["metric"]].to_numpy()
        assert r["num_queries"] == 50 and r["perm_method"] == "monte-carlo"
        assert r["mean_a"] == base.means[r["metric"]] and r["mean_b"] == other.means[r["metric"]]
        assert r["diff"] == pytest.approx((b - a).mean(), abs=1e-15)
        want = sst.ttest_rel(b, a)
        assert r["t"] == pytest.approx(want.statistic, rel=1e-9) and r["p_t"] == pytest.approx(want.pvalue, rel=1e-9)
        assert r["t_low"] < r["diff"] < r["t_high"] and r["boot_low"] < r["diff"] < r["boot_high"]
        # the randomization test agrees with scipy's (independent random permutations)
        ref = sst.permutation_test((b, a), lambda x, y, axis: np.mean(x - y, axis=axis), permutation_type="samples",
                                   n_resamples=20000, vectorized=True, random_state=0).pvalue
        assert abs(r["p_perm"] - ref) <= 4 * math.sqrt(ref * (1 - ref) / 10000) + 2e-4
    # the table prints every pair
    assert compare.main([str(qrels), str(runs / "bm25.run"), str(runs / "bm25+bert(zs).run"), "-l", "2", "-c",
                         "-M", "1000", "-m", "ndcg@10"]) == 0
    out = capsys.readouterr().out
    assert "A = bm25, B = bm25+bert(zs): 50 paired queries" in out and "ndcg@10" in out


def test_header_and_table_name_the_runs_alike(tmp_path, capsys):
    """Issue 36: with runs partA.run and B.run the header said "B vs partA" while the table's columns
    call the runs A and B. The header names each run by the table's column label and the name in
    that column, and says which queries were left out with the same labels."""
    (tmp_path / "qrels").write_text("q1 0 d1 2\nq1 0 d2 0\nq1 0 d3 1\nq2 0 d1 1\nq2 0 d4 1\nq3 0 d2 1\n")
    (tmp_path / "partA.run").write_text("q1 Q0 d1 1 3.0 x\nq1 Q0 d2 2 2.0 x\nq1 Q0 d3 3 1.0 x\nq2 Q0 d1 1 1.0 x\n"
                                        "q2 Q0 d4 2 0.5 x\nq3 Q0 d1 1 1 x\nq3 Q0 d2 2 0.5 x\n")
    (tmp_path / "B.run").write_text("q1 Q0 d3 1 3.0 y\nq1 Q0 d1 2 2.0 y\nq2 Q0 d4 1 1.0 y\nq2 Q0 d1 2 0.5 y\n")
    assert compare.main([str(tmp_path / "qrels"), str(tmp_path / "partA.run"), str(tmp_path / "B.run"),
                         "-m", "ndcg@10"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, columns, _, row = lines[:4]
    labels = columns.split()[:3]
    cells = row.split()[:3]
    assert labels == ["metric", "A", "B"] and cells == ["ndcg@10", "partA", "B"]
    # q3 is only in partA's run: 2 paired queries, 1 left out
    assert header == f"{labels[1]} = {cells[1]}, {labels[2]} = {cells[2]}: 2 paired queries (left out: 1 only in " \
                     f"{labels[1]}, 0 only in {labels[2]})"


def test_compare_and_report_do_not_import_beam(tmp_path):
    paths = write_trec(tmp_path, np.random.default_rng(1))
    code = ("import sys; from streameval.cli import main; "
            f"rc = main(['compare', {str(paths['qrels'])!r}, {str(paths['a.run'])!r}, {str(paths['b.run'])!r}]); "
            "from streameval.commands import report; "
            "assert rc == 0 and 'apache_beam' not in sys.modules, sorted(m for m in sys.modules if 'beam' in m)")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)


# --------------------------------------------------------------------------------------------
# multiple comparisons (--adjust, --tukey)


def write_runs(tmp_path, rng, names, n_queries=12, docs=8):
    """qrels and one run per name; run 'd' has no results for query 0 (it is left out of its pair
    and of Tukey's common queries)."""
    qrels = [f"{q} 0 d{d} {int(rng.integers(0, 3))}" for q in range(n_queries) for d in range(docs)]
    (tmp_path / "qrels").write_text("\n".join(qrels) + "\n")
    paths = []
    for name in names:
        lines = [f"{q} Q0 d{d} {rank + 1} {10 - rank} {name}" for q in range(n_queries)
                 if not (name == "d" and q == 0) for rank, d in enumerate(rng.permutation(docs))]
        paths.append(tmp_path / f"{name}.run")
        paths[-1].write_text("\n".join(lines) + "\n")
    return tmp_path / "qrels", paths


def test_compare_command_adjust_and_tukey(tmp_path, capsys):
    from statsmodels.stats.multicomp import pairwise_tukeyhsd

    from .test_multiple import _sm

    names, metrics = ["a", "b", "c", "d"], ["ndcg@5", "P_3"]  # rows name P_3 as written (issue 42)
    qrels, paths = write_runs(tmp_path, np.random.default_rng(5), names)
    files = [str(qrels), *map(str, paths)]
    fast = ["--replicates", "20", "--flips", "100"]  # not under test here (12 queries: exact sign flips)
    per_query = {n: api.evaluate(str(qrels), str(p), metrics, per_query="pandas").per_query for n, p in zip(names, paths)}
    # --adjust: one family per metric, the comparisons of b, c, d with a
    for method in ("holm", "bh", "bonferroni"):
        assert compare.main(files + ["-m", "ndcg@5", "-m", "P_3", "--json", "--adjust", method] + fast) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert len(rows) == 6 and all(r["adjust"] == method for r in rows)
        for m in metrics:
            family = [r for r in rows if r["metric"] == m]
            assert [r["system_b"] for r in family] == ["b", "c", "d"]
            raw = []
            for r in family:  # the raw p-values, from scipy on the evaluated per-query scores
                a, b = per_query["a"][m], per_query[r["system_b"]][m]
                shared = a.index.intersection(b.index)
                assert r["num_queries"] == len(shared) == (11 if r["system_b"] == "d" else 12)
                raw.append(sst.ttest_rel(b[shared].to_numpy(), a[shared].to_numpy()).pvalue)
            assert [r["p_t"] for r in family] == pytest.approx(raw, rel=1e-9)
            assert [r["p_t_adj"] for r in family] == pytest.approx(_sm(np.array(raw), method), rel=1e-9)
            assert [r["p_perm_adj"] for r in family] == pytest.approx(
                _sm(np.array([r["p_perm"] for r in family]), method), rel=1e-12)
    # --tukey: all 6 pairs on the 11 queries every run scored, as statsmodels on the same scores (one
    # metric: each pair's p-value is a numerical integration)
    assert compare.main(files + ["-m", "ndcg@5", "--json", "--tukey"] + fast) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all("p_t_adj" not in r for r in out if "test" not in r)  # no --adjust: no adjusted fields
    tukey = [r for r in out if r.get("test") == "tukey_hsd"]
    common = sorted(set.intersection(*(set(per_query[n].index) for n in names)))
    assert len(common) == 11 and len(tukey) == 6
    scores = np.concatenate([per_query[n].loc[common, "ndcg@5"].to_numpy() for n in names])
    sm = pairwise_tukeyhsd(scores, np.repeat(names, len(common)), alpha=0.05)
    assert [(r["system_a"], r["system_b"]) for r in tukey] == list(itertools.combinations(names, 2))  # sm's order
    assert all(r["num_queries"] == 11 and r["df"] == 40 and r["ci_level"] == 0.95 for r in tukey)
    assert [r["diff"] for r in tukey] == pytest.approx(sm.meandiffs, rel=1e-12, abs=1e-15)
    assert [r["p_tukey"] for r in tukey] == pytest.approx(sm.pvalues, rel=1e-9, abs=1e-14)
    np.testing.assert_allclose([[r["ci_low"], r["ci_high"]] for r in tukey], sm.confint, rtol=1e-12, atol=1e-15)
    assert [r["reject"] for r in tukey] == sm.reject.tolist()
    # the tables
    assert compare.main(files + ["-m", "ndcg@5", "--adjust", "bh", "--tukey"] + fast) == 0
    text = capsys.readouterr().out
    assert "p (t, bh)" in text and "p (perm, bh)" in text and "Benjamini-Hochberg" in text
    assert "Tukey HSD, all pairs of the 4 runs, on the 11 queries every run scored" in text
    assert "95% simultaneous CI" in text and "No correction" not in text
    assert compare.main(files + ["-m", "ndcg@5"] + fast) == 0
    text = capsys.readouterr().out
    assert "No correction for multiple comparisons." in text and "Tukey" not in text and "p (t, " not in text
    # bad input
    with pytest.raises(SystemExit):
        compare.main(files + ["--adjust", "sidak"])
    with pytest.raises(ValueError, match="adjust must be one of none, holm, bh, bonferroni"):
        compare.compare_runs(str(qrels), str(paths[0]), [str(paths[1])], ["P@3"], adjust="fdr")
    for line, n in (("5 Q0 d1 1 1 one", 1), ("99 Q0 d1 1 1 one", 0)):  # Tukey needs two queries every run scored
        (tmp_path / "one.run").write_text(line + "\n")
        assert compare.main([*files[:3], str(tmp_path / "one.run"), "--tukey"] + fast) == 2
        assert f"fewer than two queries scored by every run ({n})" in capsys.readouterr().err


def test_columnar_system_means_equal_fsum_per_run():
    """columnar_compare.system_means (vectorised exact run sums, math.fsum for the runs it cannot
    do) equals, bit for bit, math.fsum over each run's non-NaN values divided by their count (a
    run of one value: the value itself, as before), on runs mixing NaN, sevenths, 1e-20 next to
    values near 1 (a third level: the fsum fallback), -0.0 and an infinity."""
    from streameval.beam.columnar_compare import system_means

    rng = np.random.default_rng(0)
    for trial in range(20):
        n = int(rng.integers(1, 400))
        v = rng.random((4, n))
        v[0, rng.random(n) < 0.2] = np.nan
        v[1] = rng.integers(0, 5, n) / 7
        v[2, rng.random(n) < 0.1] = 1e-20
        v[3, rng.random(n) < 0.05] = -0.0
        if trial % 3 == 0:
            v[3, 0] = np.inf
        k = min(n - 1, int(rng.integers(0, n)))
        cuts = np.sort(rng.choice(np.arange(1, n), size=k, replace=False)) if k else np.array([], np.int64)
        starts = np.concatenate([[0], cuts]).astype(np.int64)
        ends = np.concatenate([cuts, [n]]).astype(np.int64)
        got = system_means(v, starts, ends)
        ref = np.full_like(got, np.nan)
        for m in range(4):
            for i, (lo, hi) in enumerate(zip(starts, ends)):
                ok = [x for x in v[m, lo:hi] if not math.isnan(x)]
                if ok:
                    ref[m, i] = (math.fsum(ok) if hi - lo > 1 else v[m, lo]) / len(ok)
        assert np.array_equal(got.view(np.int64), ref.view(np.int64)), trial


def test_columnar_system_means_with_order_equal_fsum_per_run():
    """system_means with ``order`` (the runs are of ``values[:, order]``, gathered by the function
    on transposed columns) equals math.fsum over each run's non-NaN values over their count, bit
    for bit, on values spread over the whole double range: subnormals, 1e-300 and 1e300 (the
    power-of-two scalings fall back to ldexp), negative values, all-zero runs and NaN."""
    from streameval.beam.columnar_compare import system_means

    rng = np.random.default_rng(7)
    for trial in range(30):
        n = int(rng.integers(2, 300))
        v = rng.standard_normal((5, n)) * np.exp2(rng.integers(-40, 40, (5, n)))
        v[0, rng.random(n) < 0.3] = np.nan
        v[1, rng.random(n) < 0.6] = 0.0
        v[2, rng.random(n) < 0.3] = 5e-324 * float(rng.integers(1, 1000))
        v[3] = rng.random(n) * (1e-300 if trial % 2 else 1e300)
        order = rng.permutation(n)
        cuts = np.sort(rng.choice(np.arange(1, n), size=int(rng.integers(0, n)), replace=False))
        starts = np.concatenate([[0], cuts]).astype(np.int64)
        ends = np.concatenate([cuts, [n]]).astype(np.int64)
        got = system_means(v, starts, ends, order)
        x = v[:, order]
        ref = np.full_like(got, np.nan)
        for m in range(len(v)):
            for i, (lo, hi) in enumerate(zip(starts, ends)):
                ok = [y for y in x[m, lo:hi] if not math.isnan(y)]
                if ok:
                    ref[m, i] = (math.fsum(ok) if hi - lo > 1 else x[m, lo]) / len(ok)
        assert np.array_equal(got.view(np.int64), ref.view(np.int64)), trial



def _fsum_means(x, starts, ends):
    """The reference of system_means: per run math.fsum of its values with NaN as 0.0 (a run of one
    value: the value) over the count of its non-NaN values."""
    out = np.full((len(x), len(starts)), np.nan)
    for m in range(len(x)):
        for j, (lo, hi) in enumerate(zip(starts, ends)):
            col = [0.0 if math.isnan(y) else y for y in x[m, lo:hi]]
            c = sum(not math.isnan(y) for y in x[m, lo:hi])
            if c:
                out[m, j] = (math.fsum(col) if hi - lo > 1 else col[0]) / c
    return out


def _same_bits(a, b):
    return np.array_equal(np.asarray(a).view(np.int64), np.asarray(b).view(np.int64))


def test_columnar_nested_means_equal_the_direct_means_bit_for_bit():
    """columnar_compare.nested_means (the means of runs and of coarser runs made of consecutive runs,
    from one pass: every value split on its coarse run's grid) equals system_means of either runs
    and math.fsum per run, bit for bit, on adversarial magnitudes: sums whose rounding loses bits
    (1 and 2**-60 of either sign), values 2**80 apart, ties to even (2**53 and 1), subnormals,
    -0.0, infinities, NaN, runs of one value; and on full 53-bit values, where adding the fine
    runs' rounded sums instead gives other coarse sums (the data can tell the two apart)."""
    from streameval.beam.columnar_compare import nested_means, system_means

    rng = np.random.default_rng(11)
    for trial in range(60):
        n = int(rng.integers(2, 200))
        v = rng.random((6, n))
        v[0, rng.random(n) < 0.3] = np.nan
        v[1] = np.where(rng.random(n) < 0.5, 1.0, 2.0 ** -60) * rng.choice([-1.0, 1.0], n)
        v[2] = rng.standard_normal(n) * np.exp2(rng.integers(-80, 80, n))
        v[3] = np.where(rng.random(n) < 0.5, 2.0 ** 53, rng.choice([1.0, -1.0, 0.5], n))
        v[4, rng.random(n) < 0.3] = 5e-324 * float(rng.integers(1, 1000))
        v[5, rng.random(n) < 0.05] = -0.0
        if trial % 4 == 0:
            v[5, int(rng.integers(0, n))] = np.inf
        if trial % 5 == 0:
            v[2, :] = -0.0
        if trial % 7 == 0:
            v[4] *= 1e-300
        order = rng.permutation(n)
        cuts = np.sort(rng.choice(np.arange(1, n), size=int(rng.integers(0, n)), replace=False))
        starts = np.concatenate([[0], cuts]).astype(np.int64)
        ends = np.concatenate([cuts, [n]]).astype(np.int64)
        k = len(starts)
        ccuts = np.sort(rng.choice(np.arange(1, k), size=int(rng.integers(0, k)), replace=False)) if k > 1 \
            else np.zeros(0, np.int64)
        first = np.concatenate([[0], ccuts]).astype(np.int64)
        last = np.append(first[1:], k)
        fine, coarse = nested_means(v, starts, ends, order, first, last)
        x = v[:, order]
        assert _same_bits(fine, system_means(v, starts, ends, order)), trial
        assert _same_bits(fine, _fsum_means(x, starts, ends)), trial
        assert _same_bits(coarse, system_means(v, starts[first], ends[last - 1], order)), trial
        assert _same_bits(coarse, _fsum_means(x, starts[first], ends[last - 1])), trial
    for values, cuts in (([1.0, 2.0 ** -60, -1.0], [0, 2]), ([2.0 ** 53, 1.0, 1.0], [0, 2]),
                         ([1e300, 1e-300, -1e300], [0, 2]), ([0.1, 0.2, 0.3, -0.6], [0, 1, 3]),
                         ([-0.0], [0]), ([-0.0, -0.0], [0, 1]), ([5e-324, -5e-324, 0.0], [0, 1, 2])):
        v = np.array([values])
        starts = np.array(cuts, np.int64)
        ends = np.append(starts[1:], len(values))
        _, coarse = nested_means(v, starts, ends, None, np.array([0]), np.array([len(starts)]))
        want = math.fsum(values) if len(values) > 1 else values[0]
        assert _same_bits(coarse[0, 0], want / len(values)), values
    v = np.random.default_rng(1).random((2, 4000))
    starts = np.arange(0, 4000, 4)
    ends = starts + 4
    first = np.arange(0, 1000, 10)
    fine, coarse = nested_means(v, starts, ends, None, first, first + 10)
    ref = _fsum_means(v, starts[first], ends[first + 9])
    assert _same_bits(coarse, ref)
    rounded = np.add.reduceat(fine.T * 4, first, axis=0).T / 40  # the fine runs' rounded sums added
    assert not _same_bits(rounded, ref)


@pytest.mark.parametrize("seed,extra", [
    (24, ["--complete", "--compare-baseline", "B", "--slices", "device,campaign", "--slices", "campaign+device",
          "--replicates", "20", "--metrics", "map,ndcg@5,num_rel,P@3"]),
    (25, ["--compare-baseline", "A", "--window", "1h", "--slices", "campaign,device", "--replicates", "20",
          "--metrics", "ndcg@5,recip_rank,num_ret"]),
])
def test_columnar_comparisons_with_several_slice_specifications(tmp_path, seed, extra):
    """The columnar comparisons (the first slice specification's means summed with the slice all's in
    one pass, the others' directly) equal the per-record engine's, with empty rankings from
    --complete (in the slice all only) and with windows."""
    sys.path.insert(0, os.path.dirname(__file__))
    from test_columnar import _messy_logs, _run

    imp_files, judg = _messy_logs(seed)
    got = _run(tmp_path, f"s{seed}", imp_files, judg, extra)
    assert got["records"]["comparisons.jsonl"], "the reference compared nothing"
    assert got["columnar"]["comparisons.jsonl"] == got["records"]["comparisons.jsonl"]


def test_compare_command_all_pairs(tmp_path, capsys):
    """--all-pairs (issue 42 item 4): every pair of runs, the later minus the earlier, on the queries
    both scored; --adjust's family is every pair of a metric. p-values from scipy and statsmodels."""
    from .test_multiple import _sm

    names = ["a", "b", "c", "d"]
    qrels, paths = write_runs(tmp_path, np.random.default_rng(8), names)
    files = [str(qrels), *map(str, paths)]
    per_query = {n: api.evaluate(str(qrels), str(p), "ndcg@5", per_query="pandas").per_query["ndcg@5"]
                 for n, p in zip(names, paths)}
    assert compare.main(files + ["-m", "ndcg@5", "--all-pairs", "--adjust", "bonferroni", "--json",
                                 "--replicates", "20", "--flips", "100"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["system_a"], r["system_b"]) for r in rows] == list(itertools.combinations(names, 2))
    raw = []
    for r in rows:
        a, b = per_query[r["system_a"]], per_query[r["system_b"]]
        shared = a.index.intersection(b.index)
        assert r["num_queries"] == len(shared) == (11 if "d" in (r["system_a"], r["system_b"]) else 12)
        assert r["diff"] == pytest.approx(float((b[shared] - a[shared]).mean()), abs=1e-15)
        raw.append(sst.ttest_rel(b[shared].to_numpy(), a[shared].to_numpy()).pvalue)
    assert [r["p_t"] for r in rows] == pytest.approx(raw, rel=1e-9)
    assert [r["p_t_adj"] for r in rows] == pytest.approx(list(_sm(np.array(raw), "bonferroni")), rel=1e-12)
    assert compare.main(files + ["-m", "ndcg@5", "--all-pairs", "--adjust", "holm", "--replicates", "20",
                                 "--flips", "100"]) == 0
    text = capsys.readouterr().out
    assert "A = b, B = c: 12 paired queries" in text and "over its 6 comparisons (all pairs)." in text
