"""ReplicateSums' vectorised fold (every metric's levels and limbs at once) against the per-metric
construction it replaces (``_levels`` and ``_add_scaled`` below, the module's :func:`_carry`),
state for state, and against exact rational sums, on adversarial inputs."""

from fractions import Fraction

import numpy as np
import pytest

from streameval.accumulators import bootstrap as bs
from streameval.accumulators.bootstrap import _GRID, _MASK32, ReplicateSums, _add_limbs, _carry, _ints
from streameval.metrics import stats


def _levels(col: np.ndarray, bits: int):
    """Exact split of finite doubles (NaN: 0) on grids of ``bits`` bits: a list of ``(g, v)`` with
    ``v`` float64 integers below ``2**bits`` in magnitude and ``col == sum_l v_l * 2**g_l`` exactly.
    Each level's grid is the residual's largest exponent less ``bits`` (never below 2**-1074, where
    every double is on the grid), so values within 2**(2 bits - 53) of the largest take two levels."""
    res = np.where(np.isnan(col), 0.0, col)
    out = []
    while True:
        nz = res != 0
        if not nz.any():
            return out
        _, e = np.frexp(res[nz])  # |x| < 2**e
        g = max(int(e.max()) - bits, -1074)
        v = np.trunc(np.ldexp(res, -g))  # |v| < 2**bits, exact (a power-of-two scaling of a double)
        out.append((g, v))
        res = res - np.ldexp(v, g)  # the bits below 2**g, exact


def _add_scaled(acc: dict, p: np.ndarray, g: int) -> None:
    """Add ``p * 2**g`` (int64 row, ``|p| < 2**53``, ``g >= -1126``) to a limb accumulator: 32-bit
    pieces of ``|p| * 2**o`` at buckets ``b, b + 1, b + 2`` (``32 b + o = g + 1126``), each below 2**32."""
    t = g + _GRID
    b, o = t >> 5, np.uint64(t & 31)
    a = np.abs(p).astype(np.uint64)
    neg = p < 0
    pieces = [(a << o) & _MASK32, (a >> (np.uint64(32) - o)) & _MASK32,
              (a >> (np.uint64(64) - o)) if int(o) else np.zeros_like(a)]
    for j, c in enumerate(pieces):
        if c.any():
            c = c.astype(np.int64)
            _add_limbs(acc, b + j, np.where(neg, -c, c))


def _fold_per_metric(rs: ReplicateSums, state: list, x: np.ndarray, w: np.ndarray) -> list:
    """The per-metric fold of f81e753 (one metric at a time), the executable reference."""
    n = len(x)
    wmax = 1 if rs.kind == "sign" else len(stats.POISSON_THRESHOLDS)
    bits = 53 - max(1, (n * wmax - 1).bit_length())
    rows, owners = [], []
    for m in range(rs.n):
        col = x[:, m]
        if rs.with_totals:
            ok = np.isfinite(col)
            if not ok.any():
                continue
            rows.append(ok.astype(np.float64))
            owners.append((m, None))
        for g, v in _levels(col, bits):
            rows.append(v)
            owners.append((m, g))
    if not rows:
        return state
    prod = (np.vstack(rows) @ w.astype(np.float64)).astype(np.int64)
    touched = set()
    for (m, g), row in zip(owners, prod):
        if g is None:
            state[0][m] = _ints(state[0][m]) + row
        elif row.any():
            _add_scaled(state[1][m], row, g)
            touched.add(m)
    for m in touched:
        _carry(state[1][m])
    return state


def _canon(state: list):
    return ([_ints(t).tolist() for t in state[0]],
            [{int(b): _ints(r).tolist() for b, r in sorted(acc.items())} for acc in state[1]])


def _adversarial(rng, n: int, k: int) -> np.ndarray:
    x = rng.standard_normal((n, k)) * 2.0 ** rng.integers(-60, 60, size=(n, k))
    x[rng.random((n, k)) < 0.1] = np.nan
    x[rng.random((n, k)) < 0.05] = 0.0
    x[rng.random((n, k)) < 0.05] = -0.0
    x[:, 0] = np.nan  # a metric with no value
    x[:, 1] = 0.25  # ties
    x[::3, 2] = 5e-324  # subnormals next to normal values
    x[1::3, 2] = -2.0 ** 990
    x[:, 3] = rng.choice([1e300, -1e-300, 3.0, 2.0 ** -1074], size=n)
    return x


@pytest.mark.parametrize("kind", ["poisson", "sign"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fold_same_state_as_per_metric(kind, seed):
    rng = np.random.default_rng(seed)
    k, r = 7, 37
    rs = ReplicateSums(k, r, kind, seed)
    new, old = rs.create(), rs.create()
    for st in (new, old):  # limbs just below the carry bound: chains of carries, into existing buckets
        for acc in st[1]:
            for b in range(20, 41):
                acc[b] = np.full(r, (1 << 52) - 3 - b, dtype=np.int64)
    for n in (1, 5, 300, 64):  # several folds into the same state: the carries of existing limbs
        x = _adversarial(rng, n, k)
        keys = [f"q{seed}-{n}-{i}" for i in range(n)]
        w = rs.weights(keys)
        rs._fold(new, x, lambda w=w: w)
        _fold_per_metric(rs, old, x, w)
        assert _canon(new) == _canon(old)
    sums, _ = rs.extract(bs._as_bytes(new))
    assert np.array_equal(sums.view(np.int64), rs.extract(bs._as_bytes(old))[0].view(np.int64))


def test_fold_exact_sums_and_carries():
    """Big limbs: many folds of huge values of one sign make the carries run; the extracted sums
    are the correctly rounded exact weighted sums (Fractions)."""
    rng = np.random.default_rng(5)
    k, r = 3, 11
    rs = ReplicateSums(k, r, "poisson", 3)
    st = rs.create()
    exact = [[Fraction(0)] * r for _ in range(k)]
    for step in range(40):
        n = 50
        x = np.abs(rng.standard_normal((n, k))) * 2.0 ** 900
        x[:, 1] = -x[:, 1] * 2.0 ** -1800  # tiny, negative
        x[rng.random((n, k)) < 0.2] = np.nan
        keys = [f"k{step}-{i}" for i in range(n)]
        w = rs.weights(keys)
        rs._fold(st, x, lambda w=w: w)
        for m in range(k):
            for q in range(n):
                if not np.isnan(x[q, m]):
                    for j in range(r):
                        exact[m][j] += Fraction(float(x[q, m])) * int(w[q, j])
    sums, _ = rs.extract(bs._as_bytes(st))
    for m in range(k):
        assert sums[m].tolist() == [float(e) for e in exact[m]]
    assert any(max(abs(v) for v in _ints(row).tolist()) >= 1 << 32 for acc in st[1] for row in acc.values())
