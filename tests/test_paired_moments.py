"""PairedComparison keeps the sums of squares of b - a only (the standard errors of a and b are not
reported): the same extracted comparison as with every square kept (the MeanMoments state of
f81e753), from add_many and from add one by one, on adversarial inputs."""

import math

import numpy as np
import pytest

from streameval.accumulators.paired import PairedComparison
from streameval.accumulators.moments import MeanMoments, partials_value


def _inputs(rng, m, n):
    a = rng.standard_normal((m, n)) * 2.0 ** rng.integers(-40, 40, size=(m, n))
    b = a + rng.standard_normal((m, n)) * 2.0 ** rng.integers(-60, 10, size=(m, n))
    b[3] = a[3]  # ties: every difference 0
    a[1, ::2] = -0.0
    b[1, ::4] = 0.0
    a[2, ::3] = 2.0 ** -1060  # subnormal and huge values: the odd squares
    b[2, 1::3] = 2.0 ** 505
    a[rng.random((m, n)) < 0.1] = np.nan
    b[rng.random((m, n)) < 0.1] = np.nan
    return a, b


def _same(x, y):
    return (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)) or x == y


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paired_extract_same_as_all_squares(seed):
    rng = np.random.default_rng(seed)
    m, n = 5, 60
    a, b = _inputs(rng, m, n)
    keys = [f"q{i}" for i in range(n)]
    pc = PairedComparison(m, replicates=20, flips=50, exact_max=0, seed=seed)
    st = pc.add_many(pc.create(), a, b, keys)
    one = pc.create()
    for i in range(n):
        pc.add(one, keys[i], a[:, i], b[:, i])
    # the reference: the moments of a, b and b - a with every square, as f81e753 kept them
    nan = np.isnan(a) | np.isnan(b)
    aa, bb = np.where(nan, np.nan, a), np.where(nan, np.nan, b)
    ref = list(st)
    ref[0] = MeanMoments(3 * m).add_many(MeanMoments(3 * m).create(), np.vstack([aa, bb, bb - aa]))
    want = pc.extract(ref)
    for got in (pc.extract(st), pc.extract(one), pc.extract(pc.merge([st]))):
        for g, w in zip(got, want):
            assert g.keys() == w.keys()
            assert all(_same(g[k], w[k]) for k in g), (g, w)
    for s in (st, one):
        assert all(not p for p in s[0][2][:2 * m])  # no squares of a and b
        assert [partials_value(p) for p in s[0][2][2 * m:]] == [partials_value(p) for p in ref[0][2][2 * m:]]
        assert s[0][0] == ref[0][0]
        assert [partials_value(p) for p in s[0][1]] == [partials_value(p) for p in ref[0][1]]


def test_moments_squares_from_exact():
    """MeanMoments.add_many(squares_from=k): the sums of every row and the squares of rows k on are
    those of adding one by one (exact; adversarial magnitudes, ties, -0.0, NaN)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 80)) * 2.0 ** rng.integers(-500, 500, size=(6, 80))
    x[0] = 0.75
    x[1, ::3] = -0.0
    x[rng.random((6, 80)) < 0.2] = np.nan
    mm = MeanMoments(6)
    for k in (0, 1, 3, 6):
        many = mm.add_many(mm.create(), x, squares_from=k)
        one = mm.create()
        for i in range(80):
            mm.add(one, x[:, i], squares_from=k)
        assert many[0] == one[0]
        assert [math.fsum(p) for p in many[1]] == [math.fsum(p) for p in one[1]]
        assert [math.fsum(p) for p in many[2]] == [math.fsum(p) for p in one[2]]
        assert all(not p for p in many[2][:k]) and all(p for p in many[2][k:])
