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

State (a plain list, so Beam's FastPrimitivesCoder encodes it without pickling): the list of a
:class:`MomentsState`'s fields ``(counts, sums, squares)`` with one entry per metric: ``counts[m]`` an
int, ``sums[m]`` and ``squares[m]`` lists of float partials. Non-finite values are refused with
``ValueError``.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import numpy as np

__all__ = [
    "partials_add",
    "partials_add_square",
    "partials_add_product",
    "product_terms",
    "partials_merge",
    "partials_value",
    "partials_compact",
    "MAX_PARTIALS",
    "exact_sum",
    "exact_sum_floats",
    "exact_row_sums",
    "MeanMoments",
    "MomentsState",
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


def partials_add_product(partials: list, x: float, y: float) -> None:
    """Add ``x*y`` exactly (Dekker's product): with Veltkamp's splits x = xh + xl and
    y = yh + yl, the four products xh*yh, xh*yl, xl*yh, xl*yl are exact doubles whose sum is x*y
    (as :func:`partials_add_square`, barring underflow of the smallest term or overflow beyond
    2**996)."""
    for t in _product_pieces(x, y):
        partials_add(partials, t)


def _product_pieces(x, y) -> tuple:
    c = _SPLIT * x
    xh = c - (c - x)
    xl = x - xh
    c = _SPLIT * y
    yh = c - (c - y)
    yl = y - yh
    return xh * yh, xh * yl, xl * yh, xl * yl


def product_terms(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The four terms of :func:`partials_add_product` for each pair (elementwise, no fused
    operations), one after the other: their exact sum is exactly ``sum(x * y)`` (the real products)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    return np.concatenate(_product_pieces(x, y))


def partials_merge(into: list, other: list) -> None:
    """Add every partial of ``other`` into ``into`` (exact)."""
    for x in other:
        partials_add(into, x)


#: the longest list of partials a merge leaves as it is (see :meth:`MeanMoments.merge`)
MAX_PARTIALS = 8


def partials_compact(partials: list) -> list:
    """Floats, largest first, whose exact sum is the exact sum of ``partials`` (any finite floats):
    the correctly rounded sum (:func:`math.fsum`), then the correctly rounded rest, until the rest is
    exactly 0 (a rest is a multiple of 2**-1074, so a nonzero one never rounds to 0; each is at most
    half an ulp of the one before, so there are few). When :func:`math.fsum` overflows (partial sums
    beyond the double range), the partials are added one by one (:func:`partials_add`) instead."""
    out: list = []
    rest = list(partials)
    try:
        while True:
            f = math.fsum(rest)
            if not f:
                return out
            if math.isinf(f):
                raise OverflowError
            out.append(f)
            rest.append(-f)
    except OverflowError:
        out = []
        for x in partials:
            partials_add(out, x)
        return out


def partials_value(partials: list) -> float:
    """The correctly rounded value of the exact sum."""
    return math.fsum(partials)


_MASK52 = (1 << 52) - 1
_SQ_EMIN, _SQ_EMAX = 1023 - 480, 1023 + 499  # biased exponents of 2**-480 and of the largest below 2**500
_LANES = 4  # each (row, exponent) bin is summed in 4 lanes by column: runs of one bin do not chain additions
_CHUNK = 1 << 16  # columns per lane and bincount call: the 37-bit square terms sum exactly (below 2**53)


def _scaled_sums(x: np.ndarray, squares: bool) -> tuple:
    """Exact integer sums of each row of a 2-D float64 array of finite values (NaN not allowed),
    and of their squares when ``squares``: ``(T, s, T2, s2, odd)``, ``T`` and ``T2`` lists of
    Python ints such that row ``r`` sums to ``T[r] * 2**s`` and its squares to ``T2[r] * 2**s2``
    (``T2`` None without ``squares``). ``odd``: None, or the bool mask of the values whose squares
    were left out of ``T2``: those below 2**-480 or from 2**500 in magnitude, whose Veltkamp terms
    (:func:`partials_add_square`, what adding one by one keeps) underflow or overflow, so that their
    exact square is not what the state holds; the caller adds those terms itself.

    Each value is ``±M * 2**(E - 1075)`` with the integer ``M < 2**53`` and the biased exponent
    ``E`` read off its IEEE bits (subnormals: ``E = 1`` without the hidden bit). ``M`` is split into
    27 + 26 bits for the sum, and into 17 + 18 + 18 bits ``a, b, c`` for the square (``M**2`` is
    ``a²·2**72 + 2ab·2**54 + (2ac + b²)·2**36 + 2bc·2**18 + c²``, five terms below 2**37); each
    term is summed per (row, E) with ``np.bincount``, whose float64 sums of integers stay exact
    (at most 2**16 terms per bin and call), and the per-exponent sums are shifted and added as
    Python integers."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    rows, cols = x.shape
    zero = [0] * rows
    if x.size == 0:
        return zero, 0, (list(zero) if squares else None), 0, None
    bits = x.view(np.int64)
    e = (bits >> 52) & 0x7FF
    m = bits & _MASK52
    normal = e != 0
    m |= normal.astype(np.int64) << 52
    np.maximum(e, 1, out=e)  # subnormals: the scale of the smallest normal exponent
    nonzero = m != 0
    if not nonzero.any():
        return zero, 0, (list(zero) if squares else None), 0, None
    emin = int(np.min(e, where=nonzero, initial=0x7FF))
    emax = int(e.max())
    span = emax - emin + 1
    odd = None
    if squares and (emin < _SQ_EMIN or emax > _SQ_EMAX):
        odd = nonzero & ((e < _SQ_EMIN) | (e > _SQ_EMAX))
        if not odd.any():
            odd = None
    np.maximum(e, emin, out=e)  # zeros (exponent 1) into the first bin: they add nothing
    e -= emin
    e += (np.arange(rows, dtype=np.int64) * span)[:, None]
    e *= _LANES
    e += (np.arange(cols, dtype=np.int64) % _LANES)[None, :]
    nb = rows * span * _LANES
    neg = bits < 0
    if neg.any():
        sign = np.where(neg, -1, 1)
        signed = [(m >> 26) * sign, (m & ((1 << 26) - 1)) * sign]
    else:
        signed = [m >> 26, m & ((1 << 26) - 1)]
    terms = [signed]
    if squares:
        ms = m if odd is None else np.where(odd, 0, m)
        # the pieces as doubles: their products (below 2**37) are exact
        a, b, c = (ms >> 36).astype(np.float64), ((ms >> 18) & 0x3FFFF).astype(np.float64), \
            (ms & 0x3FFFF).astype(np.float64)
        a2 = a + a
        ac = a2 * c
        ac += b * b
        b2 = b + b
        terms.append([a * a, a2 * b, ac, b2 * c, c * c])
    step = _CHUNK * _LANES
    out = []
    # (terms, their shifts within a bin, bin k's shift: k for the values, 2k for their squares)
    groups = [(terms[0], (26, 0), 1)] + ([(terms[1], (72, 54, 36, 18, 0), 2)] if squares else [])
    for group, shifts, bin_shift in groups:
        per_term = []
        for w in group:
            total = None
            for first in range(0, cols, step):
                cut = slice(first, first + step)
                sums = np.bincount(e[:, cut].ravel(), minlength=nb,
                                   weights=np.asarray(w[:, cut], dtype=np.float64).ravel())
                # the lanes added as int64 (each below 2**53); the calls' totals as Python ints
                part = sums.astype(np.int64).reshape(rows * span, _LANES).sum(axis=1)
                total = part if total is None else total.astype(object) + part.astype(object)
            per_term.append(total)
        # as Python ints: each bin's terms shifted into place, then each bin shifted by its exponent
        binned = None
        for t, sh in zip(per_term, shifts):
            o = t.astype(object).reshape(rows, span) << sh
            binned = o if binned is None else binned + o
        totals = (binned << np.array([bin_shift * k for k in range(span)], dtype=object)).sum(axis=1).tolist()
        out.append(totals)
    s1 = emin - 1075
    return out[0], s1, (out[1] if squares else None), 2 * s1, odd


def exact_sum(x: np.ndarray) -> Fraction:
    """The exact sum of a float64 array of finite values, vectorised (:func:`_scaled_sums`).
    Raises ValueError on a non-finite value."""
    return exact_row_sums(np.asarray(x, dtype=np.float64).reshape(1, -1))[0]


def exact_row_sums(matrix: np.ndarray) -> list:
    """:func:`exact_sum` of each row of a 2-D float64 array of finite values, in one pass
    (:func:`_scaled_sums`). Returns a list of Fractions, one per row. Raises ValueError on a
    non-finite value or an array that is not 2-D."""
    x = np.asarray(matrix, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("exact sums need finite values")
    totals, shift, _, _, _ = _scaled_sums(x, squares=False)
    scale = Fraction(2) ** shift
    return [Fraction(t) * scale for t in totals]


def _floats_of(r: Fraction) -> list:
    found: list = []
    while r:
        f = float(r)
        if not f:
            raise ValueError(f"{r} is not a sum of doubles")
        found.append(f)
        r -= Fraction(f)
    return found


def _floats_of_scaled(t: int, s: int) -> list:
    """:func:`_floats_of` of ``t * 2**s`` (Python ints): ``float(t)`` is correctly rounded and
    scaling by a power of two is exact while the value stays a normal double; outside that range
    the rest goes through Fractions. Raises OverflowError when the value exceeds the double range."""
    found: list = []
    while t:
        bl = abs(t).bit_length()
        if not (-1021 <= s + bl <= 1023 and bl <= 1023):
            return found + _floats_of(Fraction(t) * Fraction(2) ** s if s < 0 else Fraction(t << s))
        g = float(t)  # an integer-valued double: the correctly rounded t
        found.append(math.ldexp(g, s))
        t -= int(g)
    return found


def exact_sum_floats(x: np.ndarray) -> list:
    """Floats whose exact sum is the exact sum of ``x`` (float64, finite): the correctly rounded
    exact sum (what :func:`math.fsum` returns), then the correctly rounded remainder, until nothing
    remains. Raises OverflowError when the sum exceeds the double range, as :func:`math.fsum` does."""
    return _floats_of(exact_sum(x))


def _square_terms(x: np.ndarray) -> np.ndarray:
    """The Veltkamp terms hi*hi, 2*hi*lo, lo*lo of each x (elementwise, no fused operations), whose
    exact sum is exactly sum(x**2) unless a term underflows or overflows: the vectorised
    :func:`partials_add_square`."""
    c = _SPLIT * x
    hi = c - (c - x)
    lo = x - hi
    return np.concatenate([hi * hi, 2.0 * hi * lo, lo * lo])


def _exact(partials: list) -> Fraction:
    return sum((Fraction(p) for p in partials), Fraction(0))


class MomentsState(NamedTuple):
    """A :class:`MeanMoments` state's fields, one entry per metric each: ``counts`` ints, ``sums``
    and ``squares`` lists of Shewchuk partials (a metric's sum of squares stays empty when it is not
    wanted). The state: their list (every field is updated in place)."""

    counts: list
    sums: list
    squares: list

    @classmethod
    def of(cls, state) -> "MomentsState":
        """The fields of ``state``, a MeanMoments state whose list may go on past them (e.g.
        :class:`~streameval.beam.combiners.MeanCombineFn`'s buffer of pending inputs)."""
        return cls._make(state[:_MOMENTS_FIELDS])


_MOMENTS_FIELDS = len(MomentsState._fields)


class MeanMoments:
    """Operations on the mergeable mean state of ``n_metrics`` metrics (see module docstring)."""

    def __init__(self, n_metrics: int):
        self.n = n_metrics

    def create(self) -> list:
        return list(MomentsState([0] * self.n, [[] for _ in range(self.n)], [[] for _ in range(self.n)]))

    def add(self, state: list, values, squares_from: int = 0) -> list:
        """Add one observation per metric (``values`` has ``n_metrics`` floats; NaN skips a metric).
        ``squares_from``: the metrics before it get no sum of squares (their standard error is not
        wanted: :meth:`extract` gives 0 for it), as :meth:`add_many`."""
        counts, sums, squares = state[:_MOMENTS_FIELDS]  # a MomentsState's (unpacked: one a record)
        for m, x in enumerate(values):
            x = float(x)
            if math.isnan(x):
                continue
            if math.isinf(x):
                raise ValueError(f"metric value {x} is not finite")
            counts[m] += 1
            partials_add(sums[m], x)
            if m >= squares_from:
                partials_add_square(squares[m], x)
        return state

    def add_many(self, state: list, matrix, squares_from: int = 0) -> list:
        """Add a batch: ``matrix`` has shape (n_metrics, n_observations); NaN skips a value.

        Vectorised and exact (:func:`_scaled_sums` of the values and of their squares), so the
        state's value equals that of adding them one by one. ``squares_from``: the metrics before it
        get no sum of squares (as :meth:`add`; the values of those rows are not squared at all).
        Raises ValueError on an infinite value, OverflowError when a sum of squares exceeds the
        double range."""
        matrix = np.asarray(matrix, dtype=np.float64)
        if matrix.ndim != 2 or matrix.shape[0] != self.n:
            raise ValueError(f"expected a matrix of shape ({self.n}, n), got {matrix.shape}")
        if np.isinf(matrix).any():
            raise ValueError(f"metric value {matrix[np.isinf(matrix)][0]} is not finite")
        nan = np.isnan(matrix)
        counts = (~nan).sum(axis=1).tolist()
        x = np.where(nan, 0.0, matrix) if nan.any() else matrix
        k = min(max(int(squares_from), 0), self.n)
        sq = x[k:]
        sums, s1, sqs, s2, odd = _scaled_sums(sq, squares=True)
        shift = [s1] * (self.n - k)
        if k:  # the rows without squares: their sums alone (two terms a value instead of seven)
            head, h1, _, _, _ = _scaled_sums(x[:k], squares=False)
            sums, shift = head + sums, [h1] * k + shift
        if odd is not None:  # tiny or huge values: the Veltkamp terms of their squares, as one by one
            rows = self.n - k
            rest = exact_row_sums(_square_terms(np.where(odd, sq, 0.0).ravel()).reshape(3, rows, -1)
                                  .transpose(1, 0, 2).reshape(rows, -1))
            scale = Fraction(2) ** s2
        st = MomentsState.of(state)
        for m in range(self.n):
            if not counts[m]:
                continue
            st.counts[m] += counts[m]
            for f in _floats_of_scaled(sums[m], shift[m]):
                partials_add(st.sums[m], f)
            if m < k:
                continue
            j = m - k
            fs = _floats_of_scaled(sqs[j], s2) if odd is None or not rest[j] else \
                _floats_of(sqs[j] * scale + rest[j])
            for f in fs:
                partials_add(st.squares[m], f)
        return state

    def merge(self, states) -> list:
        """The state of the union of the inputs of ``states`` (none: an empty state). A metric's
        partials are the inputs' partials one after the other (their exact sum is the exact sum
        of the union; no Python loop per partial), made short again by :func:`partials_compact`
        when a list passes :data:`MAX_PARTIALS`."""
        out = None
        for s in map(MomentsState.of, states):
            if out is None:
                out = MomentsState(list(s.counts), [list(p) for p in s.sums], [list(p) for p in s.squares])
                continue
            for m, (c, p, q) in enumerate(zip(s.counts, s.sums, s.squares)):
                out.counts[m] += c
                out.sums[m] += p
                out.squares[m] += q
        if out is None:
            return self.create()
        for group in (out.sums, out.squares):
            for m, p in enumerate(group):
                if len(p) > MAX_PARTIALS:
                    group[m] = partials_compact(p)
        return list(out)

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
