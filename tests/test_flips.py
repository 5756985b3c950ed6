"""FlipSums (streameval/accumulators/flips.py): the sign-flip counts decided from float sums with an
error bound equal the counts of the exact sums (ReplicateSums, itself checked against Fraction sums
in test_accumulators.py), at thresholds placed on the exact sums themselves and on their neighbouring
doubles, so a bound too small by one rounding changes a count."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest

from streameval.accumulators.bootstrap import ReplicateSums
from streameval.accumulators.flips import FlipSums, error_bound
from .test_accumulators import random_tree_merge, split
from .test_stats import coder_round_trip


def _data(kind: str, n: int, m: int, rng):
    if kind == "ties":  # discrete differences: many flips tie exactly, at 0 and at the observed sum
        x = rng.integers(-3, 4, size=(m, n)) / 10.0
    elif kind == "magnitudes":  # huge and tiny values in one column: the bound is wide, most flips go exact
        x = rng.normal(size=(m, n)) * 10.0 ** rng.integers(-300, 300, size=(m, n))
        x[0, ::3] = 5e-324
        x[0, 1::3] = 1e300
    else:  # near 0.5, differing in the last bits: sums cancel to a few ulps
        x = 0.5 + rng.integers(-4, 5, size=(m, n)) * 2.0 ** -52
        x[:, ::2] *= -1
    x[m - 1, ::5] = np.nan
    return x


def _thresholds(exact: np.ndarray, rng) -> list[float]:
    """Thresholds on the exact |T_r| of some flips, one double either side, 0 and the median."""
    a = np.abs(exact)
    picks = a[rng.integers(0, len(a), size=4)].tolist()
    out = [0.0, float(np.median(a))]
    for t in picks:
        out += [t, float(np.nextafter(t, math.inf)), float(np.nextafter(t, 0.0))]
    return [t for t in out if math.isfinite(t)]


@pytest.mark.parametrize("kind,n,m,r", [("ties", 3000, 3, 500), ("ties", 40, 2, 300),
                                         ("magnitudes", 700, 2, 200), ("cancel", 2500, 2, 256)])
def test_flip_counts_equal_the_exact_counts(kind, n, m, r):
    rng = np.random.default_rng(len(kind) + n)
    x = _data(kind, n, m, rng)
    keys = [f"q{i}" for i in range(n)]
    rs = ReplicateSums(m, r, "sign", seed=5)
    exact, _ = rs.extract(rs.add_many(rs.create(), x, keys=keys))
    fs = FlipSums(m, r, seed=5, keep_max=10 ** 6)  # the float sums and rows throughout
    table = fs.weights(keys, np.float64)
    rnd = random.Random(n)
    parts = []
    for part in split(range(n), rnd):  # shards, merged in a random tree after a coder round trip
        idx = np.array(sorted(part), dtype=np.int64)
        s = fs.add_many(fs.create(), x[:, idx], keys=[keys[i] for i in idx], weights=table, index=idx)
        parts.append(coder_round_trip(s))
    one = fs.create()
    for i in range(n):
        fs.add(one, keys[i], x[:, i])
    states = [one, random_tree_merge(parts, fs.merge, rnd), fs.add_many(fs.create(), x, keys=keys)]
    small = FlipSums(m, r, seed=5, keep_max=n // 3)  # rows beyond keep_max: the exact limbs
    states.append(small.merge([small.add_many(small.create(), x[:, :n // 2], keys=keys[:n // 2]),
                               small.add_many(small.create(), x[:, n // 2:], keys=keys[n // 2:])]))
    assert states[-1][6] is not None and states[0][6] is None
    decided = 0
    for mi in range(m):
        for t in _thresholds(exact[mi], rng):
            want = int(np.count_nonzero(np.abs(exact[mi]) >= t))
            obs = [t] * m
            for s in states[:-1]:
                assert fs.counts(s, obs)[mi] == want, (kind, mi, t)
            assert small.counts(states[-1], obs)[mi] == want
            # how many flips the bound decided alone (not all near: the float path is exercised)
            a = np.abs(np.frombuffer(states[1][0], dtype="<f8").reshape(m, r)[mi])
            e = error_bound(states[1][1][mi], states[1][2])
            decided += int(np.count_nonzero((a >= t + 2 * e) | (a + 2 * e < t)))
    assert decided > 0


def test_error_bound_holds_on_sums_in_any_order():
    """error_bound covers the error of float sums of many terms in orders numpy and BLAS pick, and
    rounds up (against Fraction sums)."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(2, 5000))
        v = rng.normal(size=n) * 10.0 ** rng.integers(-20, 20, size=n)
        s = rng.choice([-1.0, 1.0], size=(n, 3))
        got = v @ s
        absum = float(np.abs(v).sum())
        e = error_bound(absum, n)
        for j in range(3):
            exact = sum((Fraction(float(a)) * int(b) for a, b in zip(v, s[:, j])), Fraction(0))
            assert abs(Fraction(float(got[j])) - exact) <= Fraction(e)
    assert error_bound(math.inf, 3) == math.inf and error_bound(1.0, 1 << 52) == math.inf
    # exact rationals rounded up: never below gamma_N * absum
    for absum, n in [(1.0, 1), (3.0, 7), (1e-300, 10), (5e-324, 2)]:
        g = Fraction(n, 1 << 53)
        assert Fraction(error_bound(absum, n)) >= g / (1 - g) * Fraction(absum)


def test_identical_metric_columns_are_computed_once():
    """distinct_rows groups bit-identical rows only (-0.0 and NaN payloads apart), and a comparison
    computed on the distinct rows then expanded (PairedComparison.expand) extracts the same as the
    comparison of every row, whether its flips are kept as float sums or folded into exact limbs."""
    from streameval.accumulators.paired import PairedComparison
    from streameval.beam.columnar_compare import distinct_rows

    rng = np.random.default_rng(11)
    n = 300
    base = rng.integers(0, 5, size=(4, n)) / 7.0
    base[2, ::4] = np.nan
    rows = np.vstack([base[0], base[1], base[0], base[2], np.zeros(n), -np.zeros(n), base[2], base[3],
                      base[1] * 2.0])  # the last: a multiple, not identical
    first, index = distinct_rows(rows)
    assert first.tolist() == [0, 1, 3, 4, 5, 7, 8] and index.tolist() == [0, 1, 0, 2, 3, 4, 2, 5, 6]
    assert np.array_equal(rows[first][index], rows, equal_nan=True)
    payload = rows.copy()
    payload[3, 0] = np.frombuffer(np.uint64(0x7FF8000000000001).tobytes(), dtype=np.float64)[0]
    assert len(distinct_rows(payload)[0]) == len(first) + 1
    a = rows * 0.5
    b = rows * 0.25 + rng.integers(0, 3, size=(1, n)) / 9.0
    keys = [f"q{i}" for i in range(n)]
    for keep_max in (None, 50):  # float sums and rows; exact limbs
        full = PairedComparison(len(rows), replicates=30, flips=400, exact_max=5, seed=2)
        part = PairedComparison(len(first), replicates=30, flips=400, exact_max=5, seed=2)
        if keep_max:
            full.signs.keep_max = part.signs.keep_max = keep_max
        want = full.extract(full.add_many(full.create(), a, b, keys))
        halves = [part.add_many(part.create(), a[first][:, s], b[first][:, s], keys[s])
                  for s in (slice(0, n // 2), slice(n // 2, n))]
        got = full.extract(full.merge([coder_round_trip(full.expand(h, index)) for h in halves]))
        assert (full.merge([full.expand(h, index) for h in halves])[2][6] is None) == (keep_max is None)
        for g, w in zip(got, want):
            assert all(g[k] == w[k] or (g[k] != g[k] and w[k] != w[k]) for k in w), (g, w)


def test_states_from_one_pass_over_the_sign_table_equal_the_states_key_by_key():
    """PairedComparison.add_many_keys (every part's flip sums in one pass over an int8 sign table)
    extracts the same as add_many part by part: dense parts, a part with few of the table's queries
    (gathered), and parts folded into the exact limbs (keep_max)."""
    from streameval.accumulators.paired import PairedComparison

    rng = np.random.default_rng(5)
    nq, m = 400, 3
    keys = [f"q{i}" for i in range(nq)]
    for keep_max in (None, 250):
        pc = PairedComparison(m, replicates=20, flips=700, exact_max=4, seed=9)
        if keep_max:
            pc.signs.keep_max = keep_max
        boot, signs = pc.boot.weights(keys), pc.signs.weights(keys, np.int8)
        parts = []
        for size in (nq, 300, 260, 30):
            idx = np.sort(rng.permutation(nq)[:size])
            a = rng.integers(0, 4, size=(m, size)) / 3.0
            b = a + rng.normal(0, 0.2, size=(m, size))
            a[1, ::6] = np.nan
            parts.append((a, b, [keys[i] for i in idx], idx))
        got = pc.add_many_keys(parts, boot, signs)
        assert [s[2][6] is None for s in got] == [keep_max is None] * 3 + [True]
        for st, (a, b, k, idx) in zip(got, parts):
            want = pc.extract(pc.add_many(pc.create(), a, b, k))
            res = pc.extract(coder_round_trip(st))
            assert res == want or all(all(g[x] == w[x] or (g[x] != g[x] and w[x] != w[x]) for x in w)
                                      for g, w in zip(res, want))
