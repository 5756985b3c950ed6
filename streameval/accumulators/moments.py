"""Mean and second moment of per-query scores, mergeable exactly.

The sum and the sum of squares are kept as Shewchuk partials (non-overlapping floats whose exact
sum is the exact sum of the inputs; the algorithm behind :func:`math.fsum`). Adding, merging in
any order and in any split gives the same partials' *value*, so the extracted mean (the correctly
rounded exact sum divided by the count) is identical to the last bit whatever the order.
The squares are added exactly too (Veltkamp split), and the variance is computed at extraction
from the exact sums in rational arithmetic, ``M2 = S2 - S**2 / n`` (the quantity Chan et al.'s
pairwise update maintains, here with no rounding anywhere), so the standard error is the correctly
rounded value of the exact sample statistic, order-independent, with no cancellation even when the
variance is tiny next to the mean.

State (a plain list, so Beam's FastPrimitivesCoder encodes it without pickling):
``[counts, sums, sumsqs]`` with one entry per metric: ``counts[m]`` an int, ``sums[m]`` and
``sumsqs[m]`` lists of float partials. Non-finite values are refused with ``ValueError``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = [
    "partials_add",
    "partials_add_square",
    "partials_merge",
    "partials_value",
    "exact_sum",
    "exact_sum_floats",
    "exact_row_sums",
    "MeanMoments",
]


def partials_add(partials: list, x: float) -> None:
    """Add ``x`` to Shewchuk partials in place (exact)."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


_SPLIT = 134217729.0  # 2**27 + 1, Veltkamp's splitter


def partials_add_square(partials: list, x: float) -> None:
    """Add ``x*x`` exactly: Veltkamp's split x = hi + lo (26 and 27 significant bits) makes
    hi*hi, 2*hi*lo and lo*lo exact doubles, whose sum is exactly x**2."""
    c = _SPLIT * x
    hi = c - (c - x)
    lo = x - hi
    partials_add(partials, hi * hi)
    partials_add(partials, 2.0 * hi * lo)
    partials_add(partials, lo * lo)


def partials_merge(into: list, other: list) -> None:
    """Add every partial of ``other`` into ``into`` (exact)."""
    for x in other:
        partials_add(into, x)


def partials_value(partials: list) -> float:
    """The correctly rounded value of the exact sum."""
    return math.fsum(partials)


_TWO53 = 9007199254740992.0  # 2**53
_TWO26 = 67108864.0  # 2**26
_BINCOUNT_ROWS = 1 << 25  # float64 bincount sums of integers below 2**27 stay exact up to 2**26 terms


def exact_sum(x: np.ndarray) -> Fraction:
    """The exact sum of a float64 array of finite values, vectorised.

    Each value is ``M * 2**(e - 53)`` with an integer ``|M| < 2**53`` (``np.frexp``); ``M`` is split
    into 27 and 26 bits, whose sums per exponent are exact in float64 (``np.bincount``, at most
    2**25 values at a time); the per-exponent sums are then shifted and added as Python integers.
    Raises ValueError on a non-finite value."""
    return exact_row_sums(np.asarray(x, dtype=np.float64).reshape(1, -1))[0]


def exact_row_sums(matrix: np.ndarray) -> list:
    """:func:`exact_sum` of each row of a 2-D float64 array of finite values, in one pass: the
    exponents of all rows are counted with one ``np.bincount`` over (row, exponent); zeros add
    nothing (their exponent is 0 and both halves are 0). Returns a list of Fractions, one per row."""
    x = np.asarray(matrix, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {x.shape}")
    rows = x.shape[0]
    if not np.isfinite(x).all():
        raise ValueError("exact sums need finite values")
    if x.size == 0:
        return [Fraction(0)] * rows
    m, e = np.frexp(x)
    a = m * _TWO53  # integers below 2**53 in magnitude: exact
    hi = np.trunc(a * (1.0 / _TWO26))  # exact (a power of two), toward zero
    lo = a - hi * _TWO26  # exact, below 2**26 in magnitude, with the sign of a
    e = e.astype(np.int64)
    emin = int(e.min())
    span = int(e.max()) - emin + 1
    idx = (np.arange(rows, dtype=np.int64)[:, None] * span + (e - emin)).ravel()
    hi = hi.ravel()
    lo = lo.ravel()
    totals = [0] * rows
    for start in range(0, len(idx), _BINCOUNT_ROWS):
        sl = slice(start, start + _BINCOUNT_ROWS)
        hs = np.bincount(idx[sl], weights=hi[sl], minlength=rows * span)
        ls = np.bincount(idx[sl], weights=lo[sl], minlength=rows * span)
        for k in np.flatnonzero((hs != 0) | (ls != 0)).tolist():
            row, b = divmod(k, span)
            totals[row] += ((int(hs[k]) << 26) + int(ls[k])) << b
    scale = Fraction(2) ** (emin - 53)
    return [Fraction(t) * scale for t in totals]


def _floats_of(r: Fraction) -> list:
    found: list = []
    while r:
        f = float(r)
        found.append(f)
        r -= Fraction(f)
    return found


def exact_sum_floats(x: np.ndarray) -> list:
    """Floats whose exact sum is the exact sum of ``x`` (float64, finite): the correctly rounded
    exact sum (what :func:`math.fsum` returns), then the correctly rounded remainder, until nothing
    remains. Raises OverflowError when the sum exceeds the double range, as :func:`math.fsum` does."""
    return _floats_of(exact_sum(x))


def _square_terms(x: np.ndarray) -> np.ndarray:
    """The Veltkamp terms hi*hi, 2*hi*lo, lo*lo of each x (elementwise, no fused operations), whose
    exact sum is exactly sum(x**2): the vectorised :func:`partials_add_square`."""
    c = _SPLIT * x
    hi = c - (c - x)
    lo = x - hi
    return np.concatenate([hi * hi, 2.0 * hi * lo, lo * lo])


def _exact(partials: list) -> Fraction:
    return sum((Fraction(p) for p in partials), Fraction(0))


class MeanMoments:
    """Operations on the mergeable mean state of ``n_metrics`` metrics (see module docstring)."""

    def __init__(self, n_metrics: int):
        self.n = n_metrics

    def create(self) -> list:
        return [[0] * self.n, [[] for _ in range(self.n)], [[] for _ in range(self.n)]]

    @staticmethod
    def _add_value(state: list, m: int, x) -> None:
        x = float(x)
        if math.isnan(x):
            return
        if math.isinf(x):
            raise ValueError(f"metric value {x} is not finite")
        state[0][m] += 1
        partials_add(state[1][m], x)
        partials_add_square(state[2][m], x)

    def add(self, state: list, values) -> list:
        """Add one observation per metric (``values`` has ``n_metrics`` floats; NaN skips a metric)."""
        for m, x in enumerate(values):
            self._add_value(state, m, x)
        return state

    def add_many(self, state: list, matrix) -> list:
        """Add a batch: ``matrix`` has shape (n_metrics, n_observations); NaN skips a value.

        Vectorised and exact (:func:`exact_sum_floats` of the values and of the Veltkamp terms of
        their squares), so the state's value equals that of adding them one by one."""
        matrix = np.asarray(matrix, dtype=np.float64)
        if matrix.ndim != 2 or matrix.shape[0] != self.n:
            raise ValueError(f"expected a matrix of shape ({self.n}, n), got {matrix.shape}")
        if np.isinf(matrix).any():
            raise ValueError(f"metric value {matrix[np.isinf(matrix)][0]} is not finite")
        nan = np.isnan(matrix)
        counts = (~nan).sum(axis=1).tolist()
        x = np.where(nan, 0.0, matrix)
        sums = exact_row_sums(x)
        # per metric, the Veltkamp terms of its values' squares side by side: (n_metrics, 3 n)
        sqs = exact_row_sums(_square_terms(x.ravel()).reshape(3, self.n, -1).transpose(1, 0, 2)
                             .reshape(self.n, -1)) if x.size else [Fraction(0)] * self.n
        for m in range(self.n):
            if not counts[m]:
                continue
            state[0][m] += counts[m]
            for f in _floats_of(sums[m]):
                partials_add(state[1][m], f)
            for f in _floats_of(sqs[m]):
                partials_add(state[2][m], f)
        return state

    def merge(self, states) -> list:
        out = None
        for s in states:
            if out is None:
                out = [list(s[0]), [list(p) for p in s[1]], [list(p) for p in s[2]]]
                continue
            for m in range(self.n):
                out[0][m] += s[0][m]
                partials_merge(out[1][m], s[1][m])
                partials_merge(out[2][m], s[2][m])
        return out if out is not None else self.create()

    def extract(self, state: list) -> list[tuple[float, int, float]]:
        """Per metric: (mean, count, standard error of the mean). Empty: (NaN, 0, NaN);
        one observation: standard error NaN."""
        out = []
        counts, sums, sqs = state
        for m in range(self.n):
            n = counts[m]
            if n == 0:
                out.append((math.nan, 0, math.nan))
                continue
            mean = partials_value(sums[m]) / n
            if n < 2:
                out.append((mean, n, math.nan))
                continue
            S, S2 = _exact(sums[m]), _exact(sqs[m])
            m2 = S2 - S * S / n
            var = max(m2, Fraction(0)) / (n - 1)
            out.append((mean, n, math.sqrt(float(var) / n)))
        return out
