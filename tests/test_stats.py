"""Confidence intervals and the mergeable Poisson bootstrap: intervals against scipy.stats, the
stable weight generator against an independent implementation and the Poisson(1) law, exact
replicate sums against rational arithmetic, merge-order invariance (hypothesis), coverage by
simulation, and the Beam CombineFn."""

import hashlib
import math
import os
import random
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sst

from streameval.accumulators.bootstrap import PoissonBootstrap, ReplicateSums
from streameval.accumulators.moments import MeanMoments
from streameval.metrics import stats

from .conftest import REPO
from .test_accumulators import random_tree_merge, split

# --------------------------------------------------------------------------------------------
# helpers


def coder_round_trip(state):
    """Encode and decode with Beam's FastPrimitivesCoder, refusing any pickled fallback."""
    from apache_beam.coders import FastPrimitivesCoder

    def check(x):
        if isinstance(x, bool) or x is None or isinstance(x, (float, str, bytes)):
            return
        if isinstance(x, int):
            assert -(1 << 63) <= x < (1 << 63), "int outside int64 would be pickled"
            return
        if isinstance(x, (list, tuple)):
            for v in x:
                check(v)
            return
        if isinstance(x, dict):
            for k, v in x.items():
                check(k)
                check(v)
            return
        raise AssertionError(f"{type(x).__name__} in accumulator")

    check(state)
    c = FastPrimitivesCoder()
    return c.decode(c.encode(state))


def same(a, b):
    return (a is None and b is None) or a == b or (isinstance(a, float) and isinstance(b, float)
                                                  and math.isnan(a) and math.isnan(b))


# --------------------------------------------------------------------------------------------
# intervals


# 0, or magnitudes whose squares MeanMoments keeps exactly (docs/metrics.md: from 2**-480; a square
# beneath the smallest double, e.g. of 7.7e-161, is kept as IEEE arithmetic leaves it)
_EXACT_SQUARES = st.floats(-1e3, 1e3, allow_nan=False).filter(lambda x: x == 0 or abs(x) >= 2.0 ** -480)


@settings(max_examples=80, deadline=None)
@given(st.lists(_EXACT_SQUARES, min_size=2, max_size=60), st.floats(0.5, 0.999))
def test_t_interval_matches_scipy(xs, level):
    mm = MeanMoments(1)
    s = mm.create()
    for x in xs:
        mm.add(s, [x])
    mean, n, se = mm.extract(s)[0]
    lo, hi = stats.t_interval(mean, n, se, level)
    a = np.array(xs)
    sem = sst.sem(a)
    if sem == 0 or not np.isfinite(sem):
        assert lo == hi == mean
        return
    want = sst.t.interval(level, n - 1, loc=a.mean(), scale=sem)
    scale = max(abs(want[0]), abs(want[1]), sem, 1e-300)
    assert abs(lo - want[0]) <= 1e-9 * scale and abs(hi - want[1]) <= 1e-9 * scale


def test_t_interval_edges():
    assert all(math.isnan(v) for v in stats.t_interval(0.5, 1, math.nan))
    assert all(math.isnan(v) for v in stats.t_interval(0.5, 0, math.nan))
    assert all(math.isnan(v) for v in stats.t_interval(0.5, 10, None))
    assert stats.t_interval(0.5, 10, 0.0) == (0.5, 0.5)
    lo, hi = stats.t_interval(1.0, 3, 0.5, 0.9)
    assert hi - 1.0 == pytest.approx(sst.t.ppf(0.95, 2) * 0.5)
    with pytest.raises(ValueError):
        stats.t_interval(0.5, 10, 0.1, 1.5)


@pytest.mark.parametrize("level", [0.8, 0.95, 0.99])
def test_wilson_matches_scipy(level):
    for n in (1, 2, 7, 50, 1000, 30000):
        for k in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            if not 0 <= k <= n:
                continue
            want = sst.binomtest(k, n).proportion_ci(level, method="wilson")
            lo, hi = stats.wilson_interval(k, n, level)
            assert lo == pytest.approx(want.low, abs=1e-12) and hi == pytest.approx(want.high, abs=1e-12), (k, n)
    lo, hi = stats.wilson_interval(np.array([0, 5]), np.array([10, 0]), level)
    assert lo[0] == 0.0 and hi[0] > 0 and math.isnan(lo[1]) and math.isnan(hi[1])


def test_normal_and_percentile_intervals():
    lo, hi = stats.normal_interval(0.3, 0.01, 0.9)
    assert (lo, hi) == pytest.approx(sst.norm.interval(0.9, loc=0.3, scale=0.01))
    # type 6: the (R + 1) p-th order statistic; 199 values 1..199, 95%: the 5th and 195th
    reps = np.arange(1, 200, dtype=float)
    rng = np.random.default_rng(0)
    assert stats.percentile_interval(rng.permutation(reps), 0.95) == pytest.approx((5.0, 195.0))
    assert stats.percentile_interval(np.append(reps, np.nan), 0.95) == pytest.approx((5.0, 195.0))
    # brute force on random replicates: interpolate between order statistics at (R + 1) p
    r = np.sort(rng.random(137))
    for p in (0.025, 0.1, 0.9, 0.975):
        h = (len(r) + 1) * p
        j = int(math.floor(h))
        want = r[j - 1] + (h - j) * (r[j] - r[j - 1])
        got = stats.percentile_interval(r, 1 - 2 * p if p < 0.5 else 2 * p - 1)[0 if p < 0.5 else 1]
        assert got == pytest.approx(want, rel=1e-12)
    assert all(math.isnan(v) for v in stats.percentile_interval([0.3], 0.95))


def test_row_interval_picks_the_method():
    ctr = stats.row_interval("ctr@pos2", 0.004, 5000, 0.0009, 0.95)
    want = sst.binomtest(20, 5000).proportion_ci(0.95, method="wilson")
    assert ctr["ci_method"] == "wilson" and ctr["ci_level"] == 0.95
    assert (ctr["ci_low"], ctr["ci_high"]) == pytest.approx((want.low, want.high), abs=1e-12)
    nd = stats.row_interval("ndcg@10", 0.4, 50, 0.04, 0.9)
    assert nd["ci_method"] == "t" and (nd["ci_low"], nd["ci_high"]) == stats.t_interval(0.4, 50, 0.04, 0.9)
    assert stats.row_interval("num_rel", 3000.0, 50, None)["ci_low"] is None
    assert stats.row_interval("map", 0.2, 1, None)["ci_method"] is None
    assert stats.row_interval("ctr", math.nan, 0, math.nan)["ci_low"] is None


# --------------------------------------------------------------------------------------------
# the stable weights

_M64 = (1 << 64) - 1


def _splitmix64(seed, r):
    z = (seed + (r + 1) * 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def test_weights_follow_the_documented_scheme():
    """An independent implementation: hashlib BLAKE2b, splitmix64 in Python ints, scipy's Poisson
    quantile function on the top 53 bits."""
    keys = [f"query-{i}" for i in range(200)] + ["1048585", "q1"]
    seeds = stats.query_seeds(keys, seed=7)
    got = stats.poisson_weights(seeds, 25)
    signs = stats.sign_flips(stats.query_seeds(keys, stats.FLIP_STREAM, seed=7), 130)
    for i, k in enumerate(keys):
        h = hashlib.blake2b(k.encode(), digest_size=8, key=(7).to_bytes(8, "little"), person=b"streameval-boot")
        s = int.from_bytes(h.digest(), "little")
        assert int(seeds[i]) == s
        u = np.array([_splitmix64(s, r) >> 11 for r in range(25)], dtype=np.float64) / 2.0 ** 53
        assert got[i].tolist() == sst.poisson.ppf(u, 1.0).astype(int).tolist()
        hf = hashlib.blake2b(k.encode(), digest_size=8, key=(7).to_bytes(8, "little"), person=b"streameval-flip")
        sf = int.from_bytes(hf.digest(), "little")
        want = [1 - 2 * ((_splitmix64(sf, r // 64) >> (r % 64)) & 1) for r in range(130)]
        assert signs[i].tolist() == want
    # pinned values: changing the scheme changes every published bootstrap interval
    assert stats.poisson_weights(stats.query_seeds(["q1"]), 12).tolist() == [[0, 2, 1, 3, 1, 0, 0, 2, 0, 2, 2, 2]]
    assert stats.stable_key(("a", 3)) == "a\x1f3" and stats.stable_key(b"q") == "q"
    with pytest.raises(TypeError):
        stats.stable_key(1.5)


def test_poisson_thresholds_are_the_poisson_cdf():
    t = stats.POISSON_THRESHOLDS.astype(np.float64) / 2.0 ** 53
    assert np.allclose(t, sst.poisson.cdf(np.arange(len(t)), 1.0), rtol=0, atol=2e-16)
    assert int(stats.POISSON_THRESHOLDS[-1]) == 1 << 53


def test_weights_are_poisson_one_and_independent():
    keys = [f"k{i}" for i in range(4000)]
    w = stats.poisson_weights(stats.query_seeds(keys), 100)  # 400,000 draws
    counts = np.bincount(w.ravel(), minlength=8)
    probs = sst.poisson.pmf(np.arange(7), 1.0)
    expected = np.append(probs, 1 - probs.sum()) * w.size
    observed = np.append(counts[:7], counts[7:].sum())
    assert sst.chisquare(observed, expected).pvalue > 1e-3
    assert abs(w.mean() - 1) < 0.01 and abs(w.var() - 1) < 0.02
    # no correlation between replicates of a key, nor between keys in a replicate
    assert abs(np.corrcoef(w[:, 0], w[:, 1])[0, 1]) < 0.06
    assert abs(np.corrcoef(w[0::2].ravel(), w[1::2].ravel())[0, 1]) < 0.01
    # the user seed gives other weights
    other = stats.poisson_weights(stats.query_seeds(keys, seed=1), 100)
    assert (other != w).mean() > 0.5
    s = stats.sign_flips(stats.query_seeds(keys, stats.FLIP_STREAM), 100)
    assert set(np.unique(s).tolist()) == {-1, 1} and abs(s.mean()) < 0.01


def test_weights_do_not_depend_on_python_hash_seed():
    code = ("from streameval.metrics import stats; "
            "print(stats.poisson_weights(stats.query_seeds(['a', 'query 17', ('x', 2)]), 40).tolist())")
    outs = set()
    for seed in ("1", "2", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(REPO))
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout)
    assert len(outs) == 1


# --------------------------------------------------------------------------------------------
# exact replicate sums


@pytest.mark.parametrize("kind", ["poisson", "sign"])
def test_replicate_sums_are_exact(kind):
    rng = np.random.default_rng(5)
    n, m, r = 700, 3, 30  # more queries than one flush batch
    x = rng.random((n, m))
    x[rng.random((n, m)) < 0.1] = np.nan
    x[:, 2] *= 1e6
    x[:6, 1] = [1e-300, 5e-324, -1e200, 3.0, -7.5, 0.0]
    keys = [f"q{i}" for i in range(n)]
    rs = ReplicateSums(m, r, kind)
    state = rs.create()
    for k, row in zip(keys, x):
        rs.add(state, k, row)
    sums, totals = rs.extract(coder_round_trip(state))
    w = rs.weights(keys)
    for j in range(m):
        ok = np.isfinite(x[:, j])
        for rep in range(r):
            exact = sum((Fraction(int(w[q, rep])) * Fraction(float(x[q, j])) for q in range(n) if ok[q]), Fraction(0))
            assert sums[j, rep] == float(exact)
            if kind == "poisson":
                assert totals[j, rep] == w[ok, rep].sum()
    with pytest.raises(ValueError):
        rs.add(rs.create(), "q", [math.inf, 0.0, 0.0])


def test_limbs_carry_without_overflow():
    """Many large values in one replicate: limbs stay int64 and the sum stays exact."""
    rs = ReplicateSums(1, 3)
    state = rs.create()
    big = float(2 ** 52 - 1) * 2.0 ** 30
    for i in range(3000):
        rs.add(state, f"k{i}", [big])
    states = [state, rs.create()]
    for i in range(3000, 4000):
        rs.add(states[1], f"k{i}", [-big / 3])
    merged = rs.merge([coder_round_trip(s) for s in states])
    sums, totals = rs.extract(merged)
    w = rs.weights([f"k{i}" for i in range(4000)])
    for rep in range(3):
        exact = Fraction(big) * int(w[:3000, rep].sum()) + Fraction(-big / 3) * int(w[3000:, rep].sum())
        assert sums[0, rep] == float(exact)


# --------------------------------------------------------------------------------------------
# the bootstrap state


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=6), finite, st.one_of(st.floats(0, 1), st.just(math.nan))),
                max_size=40),
       st.integers(0, 2 ** 32), st.sampled_from([0.9, 0.95]))
def test_bootstrap_is_identical_whatever_the_split_and_merge_order(rows, seed, level):
    rnd = random.Random(seed)
    boot = PoissonBootstrap(2, replicates=64, seed=seed % 5)
    one = boot.create()
    for key, a, b in rows:
        boot.add(one, key, [a, b])
    pieces = []
    for part in split(rows, rnd):
        s = boot.create()
        for key, a, b in part:
            boot.add(s, key, [a, b])
        if rnd.random() < 0.5:
            boot.compact(s)
        pieces.append(coder_round_trip(s))
    merged = random_tree_merge(pieces, boot.merge, rnd)
    got, want = boot.extract(merged, level), boot.extract(one, level)
    for g, w in zip(got, want):
        assert g.keys() == w.keys() and all(same(g[k], w[k]) for k in g)
    means = boot.replicate_means(merged)
    assert np.array_equal(means, boot.replicate_means(one), equal_nan=True)
    # brute force: each replicate's mean is the exact weighted sum / the weight total
    if rows:
        w = boot.rs.weights([stats.stable_key(r[0]) for r in rows])
        for m in range(2):
            vals = [r[1 + m] for r in rows]
            for rep in range(0, 64, 9):
                tot = sum(int(w[i, rep]) for i, v in enumerate(vals) if not math.isnan(v))
                exact = sum((Fraction(int(w[i, rep])) * Fraction(v) for i, v in enumerate(vals) if not math.isnan(v)),
                            Fraction(0))
                want_mean = float(exact) / tot if tot else math.nan
                assert same(means[m, rep], want_mean)


def test_bootstrap_edges():
    boot = PoissonBootstrap(2, replicates=50)
    empty = boot.extract(boot.merge([]))
    assert empty[0]["num_queries"] == 0 and math.isnan(empty[0]["value"]) and math.isnan(empty[0]["ci_low"])
    s = boot.create()
    boot.add(s, "q", [0.5, math.nan])
    one = boot.extract(s)
    assert one[0]["value"] == 0.5 and math.isnan(one[0]["ci_low"]) and one[1]["num_queries"] == 0
    for i in range(30):
        boot.add(s, f"q{i}", [0.5, 1.0])
    res = boot.extract(s)
    assert res[0]["ci_low"] == res[0]["ci_high"] == 0.5 and res[0]["ci_method"] == "bootstrap"


def test_bootstrap_coverage_simulation():
    """1,000 trials of 100 skewed per-query scores (30% zeros, else Beta(2, 3)), each through the
    Poisson bootstrap state with the default 200 replicates: the 95% percentile interval covers
    the true mean within 2 points of 95%. The t interval is checked alongside."""
    trials, n, true = 1000, 100, 0.7 * 0.4
    rng = np.random.default_rng(2026)
    x = np.where(rng.random((trials, n)) < 0.3, 0.0, rng.beta(2.0, 3.0, size=(trials, n)))
    boot = PoissonBootstrap(1)
    hits_boot = hits_t = 0
    for t in range(trials):
        s = boot.create()
        for i in range(n):
            boot.add(s, f"trial{t}/q{i}", [x[t, i]])
        r = boot.extract(s)[0]
        hits_boot += r["ci_low"] <= true <= r["ci_high"]
        lo, hi = stats.t_interval(r["value"], r["num_queries"], r["stderr"])
        hits_t += lo <= true <= hi
    assert abs(hits_boot / trials - 0.95) <= 0.02, hits_boot / trials
    assert abs(hits_t / trials - 0.95) <= 0.02, hits_t / trials


# --------------------------------------------------------------------------------------------
# the Beam CombineFn


_SINK: dict = {}


def _collect(x, key):
    _SINK.setdefault(key, []).append(x)


def test_bootstrap_combinefn_in_a_pipeline():
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from streameval.beam.stats import BootstrapMeanCombineFn

    rng = np.random.default_rng(11)
    data = [(f"sys{i % 2}", (f"q{i // 2}", [float(rng.random()), float(rng.integers(0, 40))]))
            for i in range(600)]
    fn = BootstrapMeanCombineFn(2, replicates=80, level=0.9, totals=[False, True])
    want = {}
    for system in ("sys0", "sys1"):
        acc = fn.create_accumulator()
        for s, el in data:
            if s == system:
                fn.add_input(acc, el)
        want[system] = fn.extract_output(acc)
    assert want["sys0"][0]["ci_method"] == "bootstrap" and want["sys0"][1]["ci_low"] is None
    assert want["sys0"][1]["value"] == math.fsum(el[1][1] for s, el in data if s == "sys0")
    with beam.Pipeline(runner=FnApiRunner()) as p:
        (p | beam.Create(data, reshuffle=False) | beam.Reshuffle()
         | beam.CombinePerKey(BootstrapMeanCombineFn(2, replicates=80, level=0.9, totals=[False, True]))
         | beam.Map(_collect, "bootstrap"))
    got = _SINK.pop("bootstrap")
    assert len(got) == 2 and dict(got) == want
    empty = fn.extract_output(fn.merge_accumulators([]))
    assert empty[0]["num_queries"] == 0 and math.isnan(empty[0]["value"]) and empty[0]["ci_low"] is None


# --------------------------------------------------------------------------------------------
# confidence sequences (issue 18, item 2): valid at every look, where fixed intervals are not

def test_confidence_sequences_hold_at_every_look_where_fixed_intervals_do_not():
    """Seeded simulation, no real change, a look every 100 queries (50 looks) or every 400
    impressions (25 looks): the share of paths on which the fixed-sample interval ever excludes the
    true value grows far past 5% (about a third), the confidence sequence's stays at or under 5%."""
    rng = np.random.default_rng(20261126)
    paths, n_max, step, mu = 1000, 5000, 100, 0.3
    x = rng.normal(mu, 1.0, (paths, n_max))
    c, c2 = np.cumsum(x, 1), np.cumsum(x * x, 1)
    t_alarm = np.zeros(paths, bool)
    cs_alarm = np.zeros(paths, bool)
    for n in range(step, n_max + 1, step):
        m = c[:, n - 1] / n
        se = np.sqrt((c2[:, n - 1] - n * m * m) / (n - 1) / n)
        half = sst.t.ppf(0.975, n - 1) * se  # what stats.t_interval gives row by row
        t_alarm |= (m - half > mu) | (m + half < mu)
        lo, hi = stats.normal_mixture_cs(m, n, se)
        cs_alarm |= (lo > mu) | (hi < mu)
    assert t_alarm.mean() > 0.2, t_alarm.mean()
    assert cs_alarm.mean() <= 0.05, cs_alarm.mean()

    p0, paths, n_max, step = 0.05, 300, 10_000, 400
    k = np.cumsum(rng.random((paths, n_max)) < p0, 1)
    w_alarm = np.zeros(paths, bool)
    bb_alarm = np.zeros(paths, bool)
    for n in range(step, n_max + 1, step):
        lo, hi = stats.wilson_interval(k[:, n - 1], n)
        w_alarm |= (lo > p0) | (hi < p0)
        for i in np.flatnonzero(~bb_alarm):
            lo, hi = stats.beta_binomial_cs(int(k[i, n - 1]), n)
            bb_alarm[i] = lo > p0 or hi < p0
    assert w_alarm.mean() > 0.15, w_alarm.mean()
    assert bb_alarm.mean() <= 0.05, bb_alarm.mean()


def test_confidence_sequence_detects_a_real_change():
    """A real change of 0.1 standard deviations (null 0): the confidence sequence excludes 0 on
    every one of 400 seeded paths within 50 looks of 100 queries; the median delay is 9 looks
    (900 queries), the 90th percentile 18 (docs/metrics.md, "Anytime-valid intervals")."""
    rng = np.random.default_rng(7)
    paths, n_max, step = 400, 5000, 100
    x = rng.normal(0.1, 1.0, (paths, n_max))
    c, c2 = np.cumsum(x, 1), np.cumsum(x * x, 1)
    first = np.full(paths, -1)
    for look, n in enumerate(range(step, n_max + 1, step), 1):
        m = c[:, n - 1] / n
        lo, _ = stats.normal_mixture_cs(m, n, np.sqrt((c2[:, n - 1] - n * m * m) / (n - 1) / n))
        first[(lo > 0) & (first < 0)] = look
    assert (first > 0).all()
    assert np.median(first) == 9 and np.percentile(first, 90) == 18


def test_beta_binomial_cs_ends_are_where_the_mixture_crosses_one_over_alpha():
    """The ends are the p where the beta-binomial mixture likelihood ratio equals 1/alpha, computed
    independently from scipy's beta-binomial and binomial distributions (the binomial coefficients
    cancel); inside, the ratio is below it; k = 0 and k = n reach 0 and 1."""
    for k, n, level, a, b in ((3, 10, 0.95, 1, 1), (50, 1000, 0.9, 1, 1), (7, 40, 0.99, 0.5, 2)):
        lo, hi = stats.beta_binomial_cs(k, n, level, a, b)

        def ratio(p):
            return sst.betabinom.pmf(k, n, a, b) / sst.binom.pmf(k, n, p)

        assert ratio(lo) == pytest.approx(1 / (1 - level), rel=1e-9)
        assert ratio(hi) == pytest.approx(1 / (1 - level), rel=1e-9)
        assert ratio((lo + hi) / 2) < 1 / (1 - level) and lo < k / n < hi
    assert stats.beta_binomial_cs(0, 10)[0] == 0.0 and stats.beta_binomial_cs(10, 10)[1] == 1.0
    # wider than Wilson at any one look: the price of holding at every look
    w = stats.wilson_interval(50, 1000)
    cs = stats.beta_binomial_cs(50, 1000)
    assert cs[0] < w[0] and cs[1] > w[1]


def test_normal_mixture_cs_is_tightest_at_its_target_and_wider_than_t():
    """``target_n`` tunes the mixture so that the sequence is narrowest there (Waudby-Smith et al.
    2024, the choice of rho); at every n it is wider than the t interval; row_interval picks the
    sequences with kind="anytime"."""
    width = {t: np.subtract(*stats.normal_mixture_cs(0.0, 1000, 0.03, target_n=t)[::-1]) for t in (250, 1000, 4000)}
    assert width[1000] < width[250] and width[1000] < width[4000]
    for n in (2, 30, 1000, 100_000):
        lo, hi = stats.normal_mixture_cs(0.5, n, 0.1)
        t_lo, t_hi = stats.t_interval(0.5, n, 0.1)
        assert lo < t_lo and hi > t_hi
    assert stats.row_interval("map", 0.5, 100, 0.02, kind="anytime")["ci_method"] == "cs-normal-mixture"
    assert stats.row_interval("ctr", 0.05, 1000, 0.007, kind="anytime")["ci_method"] == "cs-beta-binomial"
    assert stats.row_interval("map", 0.5, 1, None, kind="anytime")["ci_low"] is None
    with pytest.raises(ValueError, match="kind"):
        stats.row_interval("map", 0.5, 10, 0.1, kind="sometimes")


# --------------------------------------------------------------------------------------------
# mSPRT: the always-valid p-value of a change


def _two_arm_looks(rng, effect, paths, looks=50, step=20):
    """Per look: the difference of two sample means (``step`` more N(0, 1) and N(effect, 1) draws
    per arm at each look) and its plug-in variance ``se_a^2 + se_b^2``, as two rows give it."""
    n_max = looks * step
    a, b = rng.normal(0.0, 1.0, (paths, n_max)), rng.normal(effect, 1.0, (paths, n_max))
    ca, ca2, cb, cb2 = np.cumsum(a, 1), np.cumsum(a * a, 1), np.cumsum(b, 1), np.cumsum(b * b, 1)
    for n in range(step, n_max + 1, step):
        ma, mb = ca[:, n - 1] / n, cb[:, n - 1] / n
        var = (ca2[:, n - 1] - n * ma * ma) / (n - 1) / n + (cb2[:, n - 1] - n * mb * mb) / (n - 1) / n
        yield mb - ma, var


def test_msprt_pvalue_keeps_its_error_rate_at_every_look():
    """Seeded simulation, no change, 2000 sequences x 50 looks (20 more queries per arm each look),
    tau = 0.2: "p_n <= 0.05 at some look" happens on 2.15% of sequences (<= 5%); the fixed-sample
    z-test at every look rejects on about a third (docs/metrics.md, "Anytime-valid intervals")."""
    rng = np.random.default_rng(1)
    p = np.ones(2000)
    z_alarm = np.zeros(2000, bool)
    for d, var in _two_arm_looks(rng, 0.0, 2000):
        p_new = stats.msprt_pvalue(d, var, 0.2, 0.0, p)
        assert (p_new <= p).all()  # a running minimum
        p = p_new
        z_alarm |= np.abs(d) / np.sqrt(var) > sst.norm.ppf(0.975)
    assert (p <= 0.05).mean() == pytest.approx(0.0215, abs=1e-12)
    assert z_alarm.mean() > 0.3


def test_msprt_detects_a_real_change():
    """A change of 0.3 standard deviations (null 0), tau = 0.2, 1000 seeded sequences of 50 looks of
    20 queries per arm: detected on 999 sequences; the delay (an undetected sequence counted as 51
    looks) has median 10 looks (200 queries per arm), 90th percentile 20."""
    rng = np.random.default_rng(5)
    p = np.ones(1000)
    first = np.full(1000, -1)
    for look, (d, var) in enumerate(_two_arm_looks(rng, 0.3, 1000), 1):
        p = stats.msprt_pvalue(d, var, 0.2, 0.0, p)
        first[(p <= 0.05) & (first < 0)] = look
    assert (first > 0).sum() == 999
    first[first < 0] = 51
    assert np.median(first) == 10 and np.percentile(first, 90) == 20


def test_msprt_lambda_against_the_closed_form_and_numerical_integration():
    """Lambda_n by hand on a small example, and against the mixture integral computed by quad:
    d = 0.1, V = 2 * 0.5^2 / 50 = 0.01, tau = 0.1, theta0 = 0: V / (V + tau^2) = 1/2, the exponent
    0.01 * 0.01 / (2 * 0.01 * 0.02) = 0.25, Lambda = exp(0.25) / sqrt(2) = 0.9079..."""
    from scipy import integrate

    assert stats.msprt_lambda(0.1, 0.01, 0.1) == pytest.approx(math.exp(0.25) / math.sqrt(2), rel=1e-14)
    # Johari et al.'s two-sample form, sigma = 0.5, n = 50
    sigma2, n = 0.25, 50
    paper = math.sqrt(2 * sigma2 / (2 * sigma2 + n * 0.01)) * math.exp(
        n * n * 0.01 * 0.1 ** 2 / (4 * sigma2 * (2 * sigma2 + n * 0.01)))
    assert stats.msprt_lambda(0.1, 2 * sigma2 / n, 0.1) == pytest.approx(paper, rel=1e-14)
    for d, var, tau, theta0 in ((0.1, 0.01, 0.1, 0.0), (0.03, 2e-4, 0.05, -0.01), (-0.2, 0.004, 0.02, 0.05)):
        num, _ = integrate.quad(lambda t: sst.norm.pdf(d, t, math.sqrt(var)) * sst.norm.pdf(t, theta0, tau),
                                theta0 - 12 * tau, theta0 + 12 * tau, points=[d], epsabs=0, epsrel=1e-12, limit=200)
        ref = num / sst.norm.pdf(d, theta0, math.sqrt(var))
        assert stats.msprt_lambda(d, var, tau, theta0) == pytest.approx(ref, rel=1e-8)
        # the p-value of one look and the confidence sequence it inverts
        lo, hi = stats.msprt_cs(d, var, tau, 0.95)
        for edge in (lo, hi):
            assert stats.msprt_lambda(d, var, tau, edge) == pytest.approx(20.0, rel=1e-9)
        assert stats.msprt_pvalue(d, var, tau, theta0) == pytest.approx(min(1.0, 1 / ref), rel=1e-8)
    assert stats.msprt_pvalue(0.1, float("nan"), 0.1, 0.0, 0.3) == 0.3  # no estimate: p unchanged
    assert stats.msprt_pvalue(0.0, 0.01, 0.1) == 1.0
