"""Property tests: for random inputs, random splits and random merge trees give results identical to
one pass, and equal to the library function on the whole input."""

import math
import random
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streameval.accumulators.clicks import ctr_add, ctr_create, ctr_extract, ctr_merge, ctr_pos_add, \
    ctr_pos_create, ctr_pos_extract, ctr_pos_merge
from streameval.accumulators.moments import MeanMoments
from streameval.accumulators.ranking import RankingOps, keep_for
from streameval.api import aggregate, score_queries
from streameval.metrics.names import parse_metrics


def random_tree_merge(states, merge, rnd):
    """Merge states in a random binary tree (sometimes via an empty merge)."""
    states = list(states)
    while len(states) > 1:
        i = rnd.randrange(len(states) - 1)
        a, b = states[i], states[i + 1]
        parts = [b, a] if rnd.random() < 0.5 else [a, b]
        if rnd.random() < 0.2:
            parts.append(merge([]))
        states[i:i + 2] = [merge(parts)]
    return states[0] if states else merge([])


def split(seq, rnd):
    seq = list(seq)
    rnd.shuffle(seq)
    cuts = sorted(rnd.sample(range(len(seq) + 1), min(len(seq) + 1, rnd.randint(1, 6))))
    return [seq[a:b] for a, b in zip([0] + cuts, cuts + [len(seq)])]


finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(finite, st.floats(0, 1)), max_size=60), st.integers(0, 2**32))
def test_mean_moments_merge_order_is_exact(rows, seed):
    rnd = random.Random(seed)
    mm = MeanMoments(2)
    one = mm.create()
    for r in rows:
        mm.add(one, r)
    pieces = []
    for part in split(rows, rnd):
        s = mm.create()
        for r in part:
            mm.add(s, r)
        pieces.append(s)
    merged = random_tree_merge(pieces, mm.merge, rnd)
    got, want = mm.extract(merged), mm.extract(one)
    for (m1, n1, e1), (m2, n2, e2) in zip(got, want):
        assert n1 == n2 == len(rows)
        assert (m1 == m2) or (math.isnan(m1) and math.isnan(m2))
        assert (e1 == e2) or (math.isnan(e1) and math.isnan(e2))
    if rows:
        xs = [r[0] for r in rows]
        assert got[0][0] == math.fsum(xs) / len(xs)
    if len(rows) >= 2:
        ys = [r[1] for r in rows]
        assert math.isclose(got[1][2], statistics.stdev(ys) / math.sqrt(len(ys)), rel_tol=1e-9, abs_tol=1e-15)


def test_mean_moments_empty_and_single():
    mm = MeanMoments(1)
    (m, n, e), = mm.extract(mm.merge([]))
    assert math.isnan(m) and n == 0 and math.isnan(e)
    (m, n, e), = mm.extract(mm.add(mm.create(), [0.25]))
    assert (m, n) == (0.25, 1) and math.isnan(e)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.booleans()), max_size=80), st.integers(0, 2**32))
def test_ctr_states_merge(rows, seed):
    rnd = random.Random(seed)
    pieces, ppieces = [], []
    for part in split(rows, rnd):
        s, p = ctr_create(), ctr_pos_create()
        for pos, c in part:
            ctr_add(s, c)
            ctr_pos_add(p, pos, c)
        pieces.append(s)
        ppieces.append(p)
    s = random_tree_merge(pieces, ctr_merge, rnd)
    p = random_tree_merge(ppieces, ctr_pos_merge, rnd)
    clicks = sum(c for _, c in rows)
    if rows:
        assert ctr_extract(s)[:2] == (clicks / len(rows), len(rows))
    else:
        assert math.isnan(ctr_extract(s)[0]) and ctr_extract(s)[1] == 0
    for pos, (rate, n, _) in ctr_pos_extract(p).items():
        sub = [c for q, c in rows if q == pos]
        assert (rate, n) == (sum(sub) / len(sub), len(sub))


METRIC_SETS = [
    ["ndcg@5", "P@3", "mrr@5", "err@5", "recall@5", "map@5", "success@1", "dcg@3"],  # all cut: bounded state
    ["map", "ndcg", "bpref", "Rprec", "recip_rank", "num_ret", "num_rel", "num_rel_ret", "P@5"],
]


@settings(max_examples=120, deadline=None)
@given(
    n_items=st.integers(0, 25),
    n_judged=st.integers(0, 30),
    seed=st.integers(0, 2**32),
    metric_set=st.sampled_from(range(len(METRIC_SETS))),
    level=st.sampled_from([1, 2]),
)
def test_ranking_state_pieces_equal_library(n_items, n_judged, seed, metric_set, level):
    rnd = random.Random(seed)
    specs = parse_metrics(METRIC_SETS[metric_set])
    items = [f"d{i:02d}" for i in rnd.sample(range(40), n_items)]
    scores = {it: round(rnd.gauss(0, 1), 1) for it in items}  # ties
    pool = [f"d{i:02d}" for i in range(40)]
    judged = {d: rnd.randint(-1, 4) for d in rnd.sample(pool, n_judged)}
    if not judged:
        judged = {"zz": 0}
    events = [("i", it, scores[it], k + 1) for k, it in enumerate(items)] + [("j", d, g, 0) for d, g in judged.items()]
    # the same event delivered twice must not change anything
    events += rnd.sample(events, min(3, len(events)))
    ops = RankingOps(keep=keep_for(specs))
    pieces = []
    for part in split(events, rnd):
        s = ops.create()
        for kind, it, v, pos in part:
            if kind == "i":
                ops.add_impression(s, it, v, pos, False)
            else:
                ops.add_judgment(s, it, v)
        pieces.append(s)
    state = random_tree_merge(pieces, ops.merge, rnd)
    assert state[2] == 0  # no conflicts: duplicates are identical
    from streameval.metrics.kernel import MetricOptions, compute

    got = compute(ops.to_lists([state]), specs, MetricOptions(relevance_level=level))[:, 0]
    run = {"q": {it: scores[it] for it in items}} if items else {}
    _, prep, want = score_queries({"q": judged}, run, specs, relevance_level=level, complete=True, warn=False)
    np.testing.assert_array_equal(got, want[:, 0])
    if specs and all(s.k is not None for s in specs):
        assert len(state[0]) <= 2 * max(s.k for s in specs)


def test_aggregate_is_fsum_mean_and_total_for_counts():
    specs = parse_metrics(["map", "num_rel"])
    v = np.array([0.1, 0.2, 0.3, 1e-17])
    assert aggregate(v, specs[0]) == math.fsum(v.tolist()) / 4
    assert aggregate(np.array([3.0, 4.0]), specs[1]) == 7.0


_VALUES = st.one_of(st.floats(allow_infinity=False, min_value=-1e12, max_value=1e12),
                    st.sampled_from([math.nan, 0.0, 1.0 / 3, 1e-300, 2.0 ** -1074, 0.1]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_VALUES, min_size=2, max_size=2), min_size=1, max_size=40))
def test_vectorised_add_many_equals_one_by_one(rows):
    """MeanMoments.add_many (fsum rounds, vectorised Veltkamp squares) and the buffered MeanCombineFn
    give the same means and standard errors, to the bit, as adding each value alone, and as the exact
    rational statistics."""
    from fractions import Fraction

    from streameval.beam.combiners import MeanCombineFn

    mm = MeanMoments(2)
    one = mm.create()
    for r in rows:
        mm.add(one, r)
    many = mm.add_many(mm.create(), np.array(rows).T)
    fn = MeanCombineFn(2)
    fn.BUFFER = 7
    acc = fn.add_inputs(fn.create_accumulator(), rows)
    got = [mm.extract(one), mm.extract(many), fn.extract_output(acc)]
    for m in range(2):
        vals = [Fraction(r[m]) for r in rows if not math.isnan(r[m])]
        for res in got:
            mean, n, se = res[m]
            assert n == len(vals)
            if vals:  # the correctly rounded exact sum over n
                assert mean == float(sum(vals)) / n
        assert all(str(res[m]) == str(got[0][m]) for res in got)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                          st.sampled_from([0.0, -0.0, 2.0 ** -1074, -(2.0 ** -1074), 1.7976931348623157e308, 0.1])),
                min_size=0, max_size=60))
def test_exact_sum_is_the_rational_sum(values):
    """moments.exact_sum (frexp, 27/26-bit halves summed per exponent) equals the sum of the values as
    fractions, from subnormals to the largest doubles; exact_sum_floats' floats add up to it."""
    from fractions import Fraction

    from streameval.accumulators.moments import exact_sum, exact_sum_floats

    ref = sum((Fraction(v) for v in values), Fraction(0))
    x = np.array(values, dtype=np.float64)
    assert exact_sum(x) == ref
    try:
        floats = exact_sum_floats(x)
    except OverflowError:
        assert abs(ref) > Fraction(1.7976931348623157e308)
        return
    assert sum((Fraction(f) for f in floats), Fraction(0)) == ref
    assert (floats[0] if floats else 0.0) == (float(ref) if ref else 0.0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300),
                         min_size=3, max_size=3), min_size=0, max_size=30))
def test_exact_row_sums_are_the_rational_sums(rows):
    from fractions import Fraction

    from streameval.accumulators.moments import exact_row_sums

    x = np.array(rows, dtype=np.float64).reshape(-1, 3).T
    got = exact_row_sums(x)
    assert got == [sum((Fraction(v) for v in r), Fraction(0)) for r in x.tolist()]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e150, max_value=1e150),
                                   st.sampled_from([0.0, -0.0, 2.0 ** -1074, -(2.0 ** -600), 2.0 ** -480,
                                                    1.1 * 2.0 ** -490, 2.0 ** 499, -1.1 * 2.0 ** 505, 0.1, 3.0])),
                         min_size=2, max_size=2), min_size=1, max_size=25),
       st.sampled_from([1, 2, 64]))
def test_scaled_sums_are_the_rational_sums_of_values_and_squares(rows, chunk):
    """moments._scaled_sums (IEEE bits, per-exponent bincounts of 27/26-bit and 17/18/18-bit pieces,
    in lanes and in chunks of columns) gives each row's sum and sum of squares exactly, as fractions;
    the values whose squares it leaves to the caller are exactly those below 2**-480 or from 2**500."""
    from fractions import Fraction

    from streameval.accumulators import moments

    x = np.array(rows, dtype=np.float64).T  # 2 rows
    before = moments._CHUNK
    moments._CHUNK = chunk  # several bincount calls per term when the rows are longer than 4 * chunk
    try:
        t, s, t2, s2, odd = moments._scaled_sums(x, squares=True)
    finally:
        moments._CHUNK = before
    small_or_big = (x != 0) & ((np.abs(x) < 2.0 ** -480) | (np.abs(x) >= 2.0 ** 500))
    assert (odd if odd is not None else np.zeros_like(small_or_big)).tolist() == small_or_big.tolist()
    for r, values in enumerate(x.tolist()):
        assert Fraction(t[r]) * Fraction(2) ** s == sum((Fraction(v) for v in values), Fraction(0))
        kept = [v for v, o in zip(values, small_or_big[r].tolist()) if not o]
        assert Fraction(t2[r]) * Fraction(2) ** s2 == sum((Fraction(v) ** 2 for v in kept), Fraction(0))


def test_add_many_over_several_bincount_calls_equals_one_by_one():
    """A matrix longer than one bincount call per term (chunk of 2 columns per lane, 8 per call):
    the same state values as adding the columns one by one."""
    from streameval.accumulators import moments

    rng = np.random.default_rng(5)
    x = rng.random((3, 101))
    x[0] = np.round(x[0] * 10) / 10
    x[1, ::7] = np.nan
    x[2] *= -1e5
    mm = MeanMoments(3)
    one = mm.create()
    for col in x.T:
        mm.add(one, col)
    before = moments._CHUNK
    moments._CHUNK = 2
    try:
        many = mm.add_many(mm.create(), x)
    finally:
        moments._CHUNK = before
    assert many[0] == one[0] == [101, 101 - 15, 101]
    for m in range(3):
        assert moments._exact(many[1][m]) == moments._exact(one[1][m])
        assert moments._exact(many[2][m]) == moments._exact(one[2][m])
    assert str(mm.extract(many)) == str(mm.extract(one))


def test_pruned_state_keeps_what_ideal_served_needs():
    """With ``ideal="served"`` the ideal DCG of ndcg@2 comes from every served item's grade, so the
    state must not be pruned to the top 2 (issue 17: a request of 6 served items with its grade-3
    item at position 5 gave ndcg@2 = 1.0 through ScoreRankings' ops instead of evaluate()'s value)."""
    from streameval.api import evaluate
    from streameval.beam.transforms import ScoreRankings
    from streameval.metrics.kernel import MetricOptions, compute

    items = [f"d{i}" for i in range(1, 7)]
    scores = {it: float(10 - i) for i, it in enumerate(items)}  # served in this order, d5 at position 5
    grades = {"d1": 1, "d2": 0, "d3": 0, "d4": 0, "d5": 3, "d6": 0}
    for ideal in ("judgments", "served"):
        want = evaluate({"q": grades}, {"q": scores}, ["ndcg@2"], ideal=ideal).means["ndcg@2"]
        ops = ScoreRankings(None, ["ndcg@2"], ideal=ideal).ops
        s = ops.create()
        for g_item, g in grades.items():
            ops.add_judgment(s, g_item, g)
        for pos, it in enumerate(items, 1):
            ops.add_impression(s, it, scores[it], pos, False)
        got = compute(ops.to_lists([s]), parse_metrics(["ndcg@2"]), MetricOptions(ideal=ideal))[0, 0]
        assert got == want, ideal
    assert round(want, 4) == 0.2754  # the value: DCG@2 = 1, ideal DCG@2 = 3 + 1/log2(3)
    assert ScoreRankings(None, ["ndcg@2", "P@2"], ideal="served").ops.keep is None
    assert ScoreRankings(None, ["ndcg@2", "P@2"]).ops.keep == 2  # trec_eval's ideal: the top K suffices


def test_bootstrap_add_many_equals_adding_query_by_query():
    """PoissonBootstrap.add_many (the columnar engine's path: a batch of requests, the weights of each
    distinct query drawn once) gives the state add() gives one query at a time: the same mean, the
    same replicate means to the last bit, whatever the split and the merge."""
    from streameval.accumulators.bootstrap import PoissonBootstrap

    rng = np.random.default_rng(1)
    boot = PoissonBootstrap(3, 50, seed=7)
    x = rng.random((3, 5000)) * 10.0 ** rng.integers(-100, 100, (3, 5000))
    x[0, ::7] = np.nan
    x[1, ::3] *= -1
    x[2] = rng.random(5000)
    keys = [f"q{i % 321}" for i in range(5000)]
    one = boot.create()
    for i in range(5000):
        boot.add(one, keys[i], x[:, i])
    distinct = sorted(set(keys))
    index = np.array([distinct.index(k) for k in keys])
    table = boot.rs.weights(distinct)
    states = [boot.add_many(boot.create(), x, keys=keys),
              boot.add_many(boot.create(), x, weights=table, index=index),
              boot.merge([boot.add_many(boot.create(), x[:, :1234], keys=keys[:1234]),
                          boot.add_many(boot.create(), x[:, 1234:], weights=table[index[1234:]])])]
    want = boot.extract(one)
    assert want[0]["num_queries"] == 5000 - len(range(0, 5000, 7))
    for state in states:
        assert boot.extract(state) == want
        assert np.array_equal(boot.replicate_means(state), boot.replicate_means(one), equal_nan=True)
    with pytest.raises(ValueError, match="not finite"):
        boot.add_many(boot.create(), np.full((3, 2), np.inf), keys=["a", "b"])


@pytest.mark.parametrize("kind", ["sign", "poisson"])
@pytest.mark.parametrize("n,m,r", [(3, 5, 200), (50, 3, 64), (1500, 3, 70)])
def test_replicate_sums_are_exact_on_every_path(kind, n, m, r):
    """Replicate sums (ReplicateSums: the level split of _fold) equal the exact rational sums
    sum_q w(q, r) x[q] (fractions.Fraction, rounded once) bit for bit, and the Poisson weight totals
    the sums of the weights of the non-NaN values, whether added one by one, with add_many by keys,
    with a weight table (int or float, rows of other queries in it; for signs used in place, 1500
    queries spanning two 1024-row products) or merged from halves; the values mix zeros, NaN,
    subnormals, 1e-300 and numbers near 0.5 that differ in their last bits (three levels)."""
    from fractions import Fraction

    from streameval.accumulators.bootstrap import ReplicateSums

    rng = np.random.default_rng(n)
    x = rng.random((m, n)) * 2 - 1
    x[0, ::7] = 0.0
    x[1, ::5] = np.nan
    x[1, 1::9] *= 1e-300
    x[m - 1, ::3] = rng.random(len(x[m - 1, ::3])) * 1e-14 + 0.5
    x[m - 1, 1::4] = 5e-324
    keys = [f"q{i}" for i in range(n)]
    rs = ReplicateSums(m, r, kind, seed=3)
    w = rs.weights(keys)
    exact = np.array([[float(sum((Fraction(float(v)) * int(w[i, j]) for i, v in enumerate(x[k]) if not math.isnan(v)),
                                 Fraction(0))) for j in range(r)] for k in range(m)])
    one = rs.create()
    for i in range(n):
        rs.add(one, keys[i], x[:, i])
    perm = rng.permutation(n + 5)[:n]
    table = np.zeros((n + 5, r), dtype=np.int64)
    table[perm] = w
    half = n // 2
    states = [one, rs.add_many(rs.create(), x, keys=keys),
              rs.add_many(rs.create(), x, weights=table, index=perm),
              rs.add_many(rs.create(), x, weights=table.astype(np.float64), index=perm),
              rs.merge([rs.add_many(rs.create(), x[:, :half], keys=keys[:half]),
                        rs.add_many(rs.create(), x[:, half:], keys=keys[half:])])]
    totals = np.array([[sum(int(w[i, j]) for i, v in enumerate(x[k]) if not math.isnan(v)) for j in range(r)]
                       for k in range(m)])
    for s in states:
        sums, tot = rs.extract(s)
        assert np.array_equal(sums.view(np.int64), exact.view(np.int64))
        assert (tot is None) == (kind == "sign") and (tot is None or np.array_equal(tot, totals))
