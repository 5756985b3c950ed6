"""MeanMoments.merge without a Python loop per partial: the partials of the inputs one after the
other, compacted (partials_compact, repeated math.fsum) past MAX_PARTIALS. The merged states give
the same extracted values as the per-partial merge (partials_merge, f81e753's) and the exact sums,
whatever the merge tree, on adversarial inputs."""

import math
import random
from fractions import Fraction

import numpy as np
import pytest

from streameval.accumulators.moments import (MAX_PARTIALS, MeanMoments, partials_add, partials_compact,
                                             partials_merge)


def _old_merge(mm, states):
    out = None
    for s in states:
        if out is None:
            out = [list(s[0]), [list(p) for p in s[1]], [list(p) for p in s[2]]]
            continue
        for m in range(mm.n):
            out[0][m] += s[0][m]
            partials_merge(out[1][m], s[1][m])
            partials_merge(out[2][m], s[2][m])
    return out if out is not None else mm.create()


def _exact(p):
    return sum((Fraction(x) for x in p), Fraction(0))


def _values(rng, k, n):
    x = rng.standard_normal((k, n)) * 2.0 ** rng.integers(-300, 300, size=(k, n))
    x[0] = 1.0 / 3.0  # ties
    x[1, ::2] = -0.0
    x[1, 1::2] = 0.0
    x[2, ::3] = 5e-324
    x[3] = np.where(rng.random(n) < 0.5, 2.0 ** 400, -(2.0 ** 400))  # cancellation to 0 or near
    x[rng.random((k, n)) < 0.1] = np.nan
    return x


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_merge_tree_same_values(seed):
    rng = np.random.default_rng(seed)
    k = 6
    mm = MeanMoments(k)
    parts = [mm.add_many(mm.create(), _values(rng, k, int(rng.integers(1, 30)))) for _ in range(40)]
    want = _old_merge(mm, parts)
    order = list(range(len(parts)))
    random.Random(seed).shuffle(order)
    states = [parts[i] for i in order]
    while len(states) > 1:  # a random tree of merges of 2 and 3
        j = random.Random(len(states) + seed).choice([2, 3])
        states = [mm.merge(states[:j])] + states[j:]
    got = states[0]
    assert got[0] == want[0]
    for g, w in zip(got[1] + got[2], want[1] + want[2]):
        assert _exact(g) == _exact(w)
        assert math.fsum(g) == math.fsum(w)
        assert len(g) <= MAX_PARTIALS or g == partials_compact(g)  # short, or as short as it gets
    assert mm.extract(got) == mm.extract(want) or all(
        all((a == b) or (math.isnan(a) and math.isnan(b)) for a, b in zip(x, y))
        for x, y in zip(mm.extract(got), mm.extract(want)))
    assert mm.merge([]) == mm.create()


@pytest.mark.parametrize("seed", range(5))
def test_partials_compact_exact(seed):
    rng = random.Random(seed)
    for _ in range(300):
        xs = [rng.choice([1.0, -1.0, 1e-300, 5e-324, -5e-324, 1e300, -1e300, 0.1, 2.0 ** 52, -0.0])
              * rng.choice([1, 3, 0.5]) for _ in range(rng.randint(0, 20))]
        c = partials_compact(xs)
        assert _exact(c) == _exact(xs)
        assert all(c) and all(abs(a) > abs(b) for a, b in zip(c, c[1:]))
        assert math.fsum(c) == math.fsum(xs)


def test_partials_compact_overflowing_fsum():
    """Partial sums beyond the double range: one by one, as before."""
    xs = [1.7e308, 1.7e308, -1.7e308, 1.0]
    p = []
    for x in xs:
        partials_add(p, x)
    assert repr(partials_compact(xs)) == repr(p)  # (nan and inf partials, as the old merge made)


def test_merge_compacts_long_lists():
    mm = MeanMoments(1)
    states = []
    for i in range(30):
        st = mm.create()
        st[0][0] = 1
        st[1][0] = [1.0 / 3.0, 1e-20 * (i + 1)]  # 60 partials in all, whose exact sum takes a few floats
        st[2][0] = [0.1 * i]
        states.append(st)
    out = mm.merge(states)
    assert len(out[1][0]) <= MAX_PARTIALS
    assert _exact(out[1][0]) == sum((_exact(s[1][0]) for s in states), Fraction(0))
    assert _exact(out[2][0]) == sum((_exact(s[2][0]) for s in states), Fraction(0))
