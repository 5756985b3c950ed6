"""Multiple comparisons (streameval.metrics.multiple): Holm and Benjamini-Hochberg against
statsmodels' multipletests, scipy's false_discovery_control and hand-computed values; Tukey's HSD
against statsmodels' pairwise_tukeyhsd, scipy.stats.tukey_hsd and, for two groups, the pooled
two-sample t-test. statsmodels is a test-only oracle."""

import gc
import math

import numpy as np
import pytest
from scipy import stats as sst
from statsmodels.stats.multicomp import pairwise_tukeyhsd
from statsmodels.stats.multitest import multipletests

from streameval.metrics import multiple


def _sm(p, method):
    """statsmodels' adjusted p-values. Its Holm branch calls gc.collect() on every call (0.1 s and
    more in a full test session): skipped here, it changes no number."""
    collect = gc.collect
    gc.collect = lambda *args: 0
    try:
        return multipletests(p, method={"holm": "holm", "bh": "fdr_bh", "bonferroni": "bonferroni"}[method])[1]
    finally:
        gc.collect = collect


FAMILIES = [
    [0.3],  # a single comparison: unchanged
    [0.01, 0.01],  # equal p-values
    [0.02, 0.04, 0.04, 0.04, 0.5],
    [1.0, 1.0, 0.2],  # p = 1
    [0.0, 0.9, 0.049],  # p = 0
    [0.8, 0.8, 0.8, 0.8],
]


@pytest.mark.parametrize("method", ["holm", "bh", "bonferroni"])
def test_adjusted_pvalues_match_statsmodels(method):
    rng = np.random.default_rng(11)
    families = FAMILIES + [rng.random(m) ** 3 for m in (2, 3, 7, 40)]
    for p in families:
        got = multiple.adjust_pvalues(p, method)
        want = _sm(np.asarray(p, dtype=float), method)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
        assert got.dtype == np.float64 and got.shape == (len(p),)
        if method == "bh":
            np.testing.assert_allclose(got, sst.false_discovery_control(p, method="bh"), rtol=1e-12, atol=0)
        # ties get equal values and the result follows the input order
        perm = rng.permutation(len(p))
        np.testing.assert_array_equal(multiple.adjust_pvalues(np.asarray(p)[perm], method), got[perm])
    assert multiple.holm([0.3]).tolist() == [0.3] and multiple.benjamini_hochberg([0.3]).tolist() == [0.3]


def test_adjusted_pvalues_by_hand():
    p = [0.01, 0.04, 0.03, 0.005]
    # Holm: sorted 0.005 * 4, 0.01 * 3, 0.03 * 2, max(0.06, 0.04 * 1)
    assert multiple.holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)
    # BH: sorted 0.005 * 4/1, 0.01 * 4/2, 0.03 * 4/3, 0.04 * 4/4, then running minimum from the top
    assert multiple.benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, 0.02], abs=1e-15)
    assert multiple.holm([0.6, 0.7]).tolist() == [1.0, 1.0]  # capped at 1
    # Bonferroni: each times m = 5, capped at 1
    assert multiple.bonferroni(p + [0.3]) == pytest.approx([0.05, 0.2, 0.15, 0.025, 1.0], abs=1e-15)


def test_adjusted_pvalues_nan_shape_and_errors():
    p = np.array([[0.01, math.nan], [0.04, 0.03]])
    for method in ("holm", "bh", "bonferroni"):
        got = multiple.adjust_pvalues(p, method)
        assert got.shape == (2, 2) and math.isnan(got[0, 1])
        # NaN is no test: the family is the three others (as R's p.adjust)
        np.testing.assert_allclose(got[~np.isnan(p)], _sm(p[~np.isnan(p)], method), rtol=1e-12)
    assert np.isnan(multiple.holm([math.nan])).all() and multiple.holm([]).size == 0
    none = multiple.adjust_pvalues(p, "none")
    np.testing.assert_array_equal(none, p)
    assert none is not p
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        multiple.holm([0.2, 1.5])
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        multiple.benjamini_hochberg([-0.1])
    with pytest.raises(ValueError, match="one of none, holm, bh, bonferroni"):
        multiple.adjust_pvalues([0.1], "sidak")


def test_tukey_hsd_matches_statsmodels_and_scipy():
    rng = np.random.default_rng(5)
    # unequal group sizes (Tukey-Kramer), one clearly better group
    groups = [rng.random(12), rng.random(9) + 0.45, rng.random(15) + 0.1, rng.random(10)]
    res = multiple.tukey_hsd(groups, level=0.95)
    x = np.concatenate(groups)
    labels = np.repeat(["s0", "s1", "s2", "s3"], [len(g) for g in groups])
    sm = pairwise_tukeyhsd(x, labels, alpha=0.05)
    assert res.pairs.tolist() == [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]
    np.testing.assert_allclose(res.diff, sm.meandiffs, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(res.stderr, sm.std_pairs, rtol=1e-12)
    np.testing.assert_allclose(res.pvalue, sm.pvalues, rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(np.column_stack([res.low, res.high]), sm.confint, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(res.reject, sm.reject)
    assert res.reject.any() and not res.reject.all()  # the test can go either way on these data
    assert res.df == sm.df_total == 42 and res.q_crit == pytest.approx(sm.q_crit, rel=1e-12)
    # scipy: statistic[i, j] = mean_i - mean_j, so pair (i, j)'s B - A is statistic[j, i] (its
    # confidence_interval() is left out: one more 0.2 s quantile search, statsmodels checks ours)
    sc = sst.tukey_hsd(*groups)
    i, j = res.pairs.T
    np.testing.assert_allclose(res.diff, sc.statistic[j, i], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(res.pvalue, sc.pvalue[i, j], rtol=1e-9, atol=1e-14)
    assert res.means == pytest.approx([g.mean() for g in groups], rel=1e-14)
    assert res.nobs.tolist() == [12, 9, 15, 10]


def test_tukey_hsd_of_two_groups_is_the_pooled_t_test():
    """With k = 2 the studentized range is sqrt(2) |t|: p and interval of Student's pooled t-test."""
    a = np.array([0.2, 0.5, 0.4, 0.9, 0.1, 0.3, 0.6])
    b = np.array([0.7, 0.8, 0.4, 0.9, 0.95, 0.5])
    res = multiple.tukey_hsd([a, b], level=0.9)
    t = sst.ttest_ind(b, a, equal_var=True)
    assert res.q[0] == pytest.approx(math.sqrt(2) * abs(t.statistic), rel=1e-12)
    assert res.pvalue[0] == pytest.approx(t.pvalue, rel=1e-7)
    lo, hi = t.confidence_interval(0.9)
    assert (res.low[0], res.high[0]) == pytest.approx((lo, hi), rel=1e-9)
    assert res.df == 11 and bool(res.reject[0]) == (t.pvalue < 0.1)


def test_tukey_hsd_edges_and_errors():
    # no within-group variance: a nonzero difference is certain, a zero one undefined
    res = multiple.tukey_hsd([[1.0, 1.0], [2.0, 2.0], [2.0, 2.0]])
    assert res.mse == 0.0 and res.q.tolist()[:2] == [math.inf, math.inf] and math.isnan(res.q[2])
    assert res.pvalue.tolist()[:2] == [0.0, 0.0] and math.isnan(res.pvalue[2])
    assert res.reject.tolist() == [True, True, False] and res.low.tolist() == res.high.tolist() == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="at least two groups"):
        multiple.tukey_hsd([[1.0, 2.0]])
    with pytest.raises(ValueError, match="group 1 is empty"):
        multiple.tukey_hsd([[1.0, 2.0], []])
    with pytest.raises(ValueError, match="group 0 has a value that is not finite"):
        multiple.tukey_hsd([[1.0, math.nan], [1.0, 2.0]])
    with pytest.raises(ValueError, match="more observations than groups"):
        multiple.tukey_hsd([[1.0], [2.0], [3.0]])
    with pytest.raises(ValueError, match="confidence level"):
        multiple.tukey_hsd([[1.0, 2.0], [1.0, 2.0]], level=1.0)
