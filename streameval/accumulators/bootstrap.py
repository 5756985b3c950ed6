"""Mergeable resampling state: the Poisson bootstrap of a mean and the paired comparison of two
systems (mean difference, t-test, bootstrap interval, sign-flip randomization test).

Both rest on :class:`ReplicateSums`: for ``R`` replicates and each metric ``m`` the exact weighted
sums ``S[m][r] = sum_q w(q, r) x[q][m]`` (and, for the bootstrap, the weight totals
``W[m][r] = sum_q w(q, r)`` over the queries where metric ``m`` is not NaN), where the integer
weight ``w(q, r)`` is a pure function of the query's key and ``r``
(:func:`streameval.metrics.stats.poisson_weights` or :func:`~streameval.metrics.stats.sign_flips`).
Because the weights depend on nothing but the key, and the sums are exact, a state gives the same
replicates to the last bit whatever the split of the input, the merge order and the worker.

Exactness and speed: added values wait in a ``pending`` list (at most :attr:`ReplicateSums.batch`
queries). A flush of ``n`` queries splits each metric's values exactly into levels of
``bits = 53 - ceil(log2(n * w_max))`` bits (``w_max`` the largest weight: 1 for signs, 19 for
Poisson): ``x = sum_l v_l * 2**g_l`` with integers ``|v_l| < 2**bits`` on grids taken from the
largest exponent of what is left (two levels for values within 2**19 to 2**33, by n, of the column's
largest, a third below; zeros and NaN none). It multiplies the level matrix (and, for the totals,
the validity masks) by the weight matrix in float64 BLAS, exact: every partial sum is an integer
below ``n * w_max * 2**bits <= 2**53``, and adds each level's sums at its grid to a long
accumulator per replicate: integer limbs, one per 32-bit bucket ``b``, worth
``limb * 2**(32 b - 1126)`` (Kulisch's exact accumulator with 32-bit digits, every finite double
being a multiple of 2**-1074; limbs are kept below 2**52 by exact carries, so they stay int64).
Merging adds limbs. Extraction carries each replicate's limbs into 32-bit digits, reads them as one
exact integer and rounds it once. So the value of a state is the exact sum, however it was split,
merged or flushed. A table of sign weights covering most of a batch's queries is used in place
(:meth:`ReplicateSums.add_many`), 1,024 queries a product.

States are plain lists of ints, floats, strings, lists and int-keyed dicts (Beam's
FastPrimitivesCoder, no pickling), each the list of a named tuple's fields:

* ``ReplicateSums``: :class:`ReplicateState` ``(totals, limbs, pending)`` - ``totals[m]`` ``R`` ints
  as little-endian int64 bytes (empty when the weights are signs), ``limbs[m]`` a dict ``{bucket: R
  ints as little-endian int64 bytes}`` (one bytes object per row: merging and encoding do not touch
  R Python ints; a list of ints is read as well), ``pending`` a list of :class:`PendingQuery` ``(key
  text, [value per metric])``.
* ``PoissonBootstrap``: :class:`BootstrapState` ``(moments, sums)``: the MeanMoments state and the
  ReplicateSums state.
* ``PairedComparison`` (:mod:`streameval.accumulators.paired`):
  :class:`~streameval.accumulators.paired.PairedState` ``(moments, boot, signs, queries, kept)``:
  the MeanMoments state of (a, b, b - a) (the sums of squares of b - a only: the standard errors of
  a and b are not reported), the bootstrap ReplicateSums state of b - a, the sign-flip
  :class:`~streameval.accumulators.flips.FlipSums` state of b - a (float sums with an error bound,
  exact where it cannot decide), the number of queries added, and ``kept``, the
  :class:`~streameval.accumulators.paired.KeptQuery` ``(key text, [b - a per metric])`` of every
  query while there are at most ``exact_max`` of them (so the randomization test is exact on small
  inputs), ``None`` beyond.

Memory: O(R x metrics) per state (plus the pending batch), whatever the number of queries.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..metrics import stats
from .moments import MeanMoments

__all__ = [
    "DEFAULT_REPLICATES",
    "DEFAULT_FLIPS",
    "DEFAULT_EXACT_MAX",
    "MAX_REPLICATES",
    "ReplicateSums",
    "ReplicateState",
    "PendingQuery",
    "PoissonBootstrap",
    "BootstrapState",
    "replicate_means_of",
]

DEFAULT_REPLICATES = 200
DEFAULT_FLIPS = 10_000
DEFAULT_EXACT_MAX = 20
#: the most bootstrap replicates or sign flips (their weights are built in memory, a row per query)
MAX_REPLICATES = 1_000_000

class ReplicateState(NamedTuple):
    """A :class:`ReplicateSums` state's fields (see the module docstring): ``totals`` per metric the
    weight totals (int64 bytes; none for signs), ``limbs`` per metric ``{bucket: int64 bytes}``,
    ``pending`` the :class:`PendingQuery` lists not yet folded. The state: their list."""

    totals: list
    limbs: list
    pending: list


class PendingQuery(NamedTuple):
    """A query waiting in a :class:`ReplicateState`: ``key`` its stable key text, ``values`` one per
    metric. In a state: their list."""

    key: str
    values: list


#: ReplicateState's positions in a state, for the updates in place
_TOTALS, _LIMBS, _PENDING = (ReplicateState._fields.index(f) for f in ("totals", "limbs", "pending"))


class BootstrapState(NamedTuple):
    """A :class:`PoissonBootstrap` state's fields: ``moments`` the MeanMoments state, ``sums`` the
    :class:`ReplicateSums` state. The state: their list."""

    moments: list
    sums: list


_GRID = 1126  # x * 2**1126 is an integer for every finite double x (smallest subnormal 2**-1074)
_MASK32 = np.uint64(0xFFFFFFFF)
_LIMB_MAX = 1 << 52


def _level_rows(res: np.ndarray, bits: int):
    """The exact split of every row of ``res`` (shape (k, n), finite, NaN already 0) into levels:
    ``(owner, grid, levels)``, ``levels`` a list of arrays of level rows (each row a float64 integer
    vector below ``2**bits`` in magnitude), ``owner[i]`` and ``grid[i]`` the input row and grid of
    the ``i``-th of them (in the order of ``np.vstack(levels)``). Each level's grid is the
    residual's largest exponent less ``bits`` (never below 2**-1074, where every double is on the
    grid), so ``row == sum_l v_l * 2**g_l`` exactly and values within 2**(2 bits - 53) of the
    row's largest take two levels."""
    owner, grid, levels = [], [], []
    while True:
        nz = res != 0
        live = np.flatnonzero(nz.any(axis=1))
        if not len(live):
            break
        sub = res[live]
        _, e = np.frexp(sub)  # |x| < 2**e (0 for zeros: below any nonzero's, which is >= -1073)
        g = np.maximum(np.where(nz[live], e, -2000).max(axis=1) - bits, -1074)
        v = np.trunc(np.ldexp(sub, -g[:, None]))  # |v| < 2**bits, exact
        owner.append(live)
        grid.append(g)
        levels.append(v)
        res[live] = sub - np.ldexp(v, g[:, None])  # the bits below 2**g, exact
    if not levels:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), []
    return np.concatenate(owner), np.concatenate(grid).astype(np.int64), levels


def _add_scaled_rows(accs: list, owner: np.ndarray, grid: np.ndarray, prod: np.ndarray) -> None:
    """Add each row ``prod[i] * 2**grid[i]`` (int64, ``|p| < 2**53``, ``grid >= -1126``) to the limb
    accumulator ``accs[owner[i]]``: 32-bit pieces of ``|p| * 2**o`` at buckets ``b, b + 1, b + 2``
    (``32 b + o = grid + 1126``), each below 2**32, of every row computed at once, then :func:`_carry` of the buckets that changed
    (the others are below 2**52 already, and a bucket this fold made holds a few pieces below 2**32:
    the same limbs as :func:`_carry` of the whole accumulator)."""
    t = grid + _GRID
    b = t >> 5
    o = (t & 31).astype(np.uint64)[:, None]
    a = np.abs(prod).astype(np.uint64)
    neg = prod < 0
    pieces = np.stack([(a << o) & _MASK32, (a >> (np.uint64(32) - o)) & _MASK32,
                       np.where(o > 0, a >> ((np.uint64(64) - o) & np.uint64(63)), np.uint64(0))], axis=1)
    pieces = pieces.astype(np.int64)
    np.negative(pieces, out=pieces, where=neg[:, None, :])
    live = pieces.any(axis=2)  # (rows, 3)
    touched: dict = {}
    fresh: set = set()  # buckets made by this fold: a few pieces below 2**32, far below 2**52
    for i, j in zip(*np.nonzero(live)):
        m, bucket = int(owner[i]), int(b[i]) + int(j)
        acc = accs[m]
        cur = acc.get(bucket)
        if cur is None:
            acc[bucket] = pieces[i, j]
            fresh.add((m, bucket))
        else:
            acc[bucket] = _ints(cur) + pieces[i, j]
            if (m, bucket) not in fresh:
                touched.setdefault(m, set()).add(bucket)
    for m, buckets in touched.items():
        _carry_buckets(accs[m], buckets)


def _carry_buckets(acc: dict, buckets) -> None:
    """:func:`_carry` checking only ``buckets`` and the buckets their carries reach."""
    todo = sorted(buckets)
    while todo:
        bk = todo.pop(0)
        arr = _ints(acc[bk])
        if arr.size and np.abs(arr).max() >= _LIMB_MAX:
            hi = arr >> 32
            acc[bk] = arr - (hi << 32)
            nxt = acc.get(bk + 1)
            acc[bk + 1] = hi if nxt is None else _ints(nxt) + hi
            if nxt is not None and bk + 1 not in todo:
                todo.insert(0, bk + 1)


def _ints(row) -> np.ndarray:
    """A row of a state (little-endian int64 bytes, or a list of ints) as an int64 array."""
    if isinstance(row, bytes):
        return np.frombuffer(row, dtype="<i8")
    return np.asarray(row, dtype=np.int64)


def _carry(acc: dict) -> None:
    """Keep every limb below 2**52 in magnitude (exactly: the high part of a limb moves to the
    next bucket), so int64 additions of flushes (< 2**46) and of other states never overflow."""
    for b in sorted(acc):
        arr = _ints(acc[b])
        if arr.size and np.abs(arr).max() >= _LIMB_MAX:
            hi = arr >> 32  # floor, so the low part stays in [0, 2**32)
            acc[b] = arr - (hi << 32)
            nxt = acc.get(b + 1)
            acc[b + 1] = hi if nxt is None else _ints(nxt) + hi


def _add_limbs(acc: dict, b: int, values) -> None:
    """Add a row of ints to bucket ``b`` (numpy arrays while a state is being worked on; never in place)."""
    cur = acc.get(b)
    acc[b] = _ints(values).copy() if cur is None else _ints(cur) + _ints(values)


def _as_bytes(state: list) -> list:
    """The state with its totals and limbs as bytes again (little-endian int64: what Beam's coder
    gets; a row of R ints as one bytes object, not R Python ints)."""
    state[_TOTALS] = [t.astype("<i8").tobytes() if isinstance(t, np.ndarray) else t for t in state[_TOTALS]]
    for acc in state[_LIMBS]:
        for b, row in acc.items():
            if isinstance(row, np.ndarray):
                acc[b] = row.astype("<i8").tobytes()
    return state


def _limbs_value(acc: dict, r: int) -> list[float]:
    """The correctly rounded exact sum of each of ``r`` replicates of a limb accumulator."""
    if not acc or not r:
        return [0.0] * r
    # the limbs as one two's complement integer per replicate: carried to 32-bit digits in numpy
    # (the carries out of the top bucket land in two more digits, the last one 0 or -1: the sign),
    # each replicate's digits read as one Python int (int.from_bytes), then one exact division
    lo = min(int(b) for b in acc)
    span = max(int(b) for b in acc) - lo + 1
    digits = np.zeros((span + 2, r), dtype=np.int64)
    for b, row in acc.items():
        digits[int(b) - lo] += _ints(row)
    for i in range(span + 1):
        carry = digits[i] >> 32
        digits[i] -= carry << 32
        digits[i + 1] += carry
    raw = np.ascontiguousarray(digits.T).astype("<u4").tobytes()  # the sign digit -1 as 0xFFFFFFFF
    size = 4 * (span + 2)
    shift = _GRID - 32 * lo
    view = memoryview(raw)
    ints = [int.from_bytes(view[i:i + size], "little", signed=True) for i in range(0, len(raw), size)]
    if shift >= 0:
        den = 1 << shift
        return [e / den if e else 0.0 for e in ints]  # int / int is correctly rounded in Python
    return [float(e << -shift) for e in ints]



def dense_blocks(rows: int, index, x: np.ndarray, step: int) -> list | None:
    """When ``x`` (n, m) holds the values of most rows of a weight table of ``rows`` rows (its row
    ``i`` at table row ``index[i]``, each at most once, ``2 n >= rows``): the table's rows in blocks
    of ``step``, ``[(lo, hi, values of rows lo:hi)]``, NaN for the rows ``x`` does not have, so the
    table is used in place (slices of rows, no gathered copy). None otherwise."""
    idx = np.asarray(index, dtype=np.int64)
    n = len(x)
    if not (2 * n >= rows and len(np.unique(idx)) == n):
        return None
    dense = np.full((rows, x.shape[1]), np.nan)
    dense[idx] = x
    return [(lo, min(rows, lo + step), dense[lo:min(rows, lo + step)]) for lo in range(0, rows, step)]

class ReplicateSums:
    """Exact hash-weighted replicate sums of ``n_metrics`` metrics (see the module docstring).

    ``kind="poisson"``: Poisson(1) weights (stream :data:`~streameval.metrics.stats.BOOTSTRAP_STREAM`),
    with weight totals; ``kind="sign"``: +1 / -1 weights (stream
    :data:`~streameval.metrics.stats.FLIP_STREAM`), no totals. ``seed`` keys the hash.
    """

    #: queries per product when the sign weights come as a table used in place (43-bit levels)
    DENSE_ROWS = 1024

    def __init__(self, n_metrics: int, replicates: int, kind: str = "poisson", seed: int = 0):
        if kind not in ("poisson", "sign"):
            raise ValueError("kind must be 'poisson' or 'sign'")
        what = "replicates" if kind == "poisson" else "flips"
        if isinstance(replicates, bool) or not isinstance(replicates, (int, np.integer)):
            raise TypeError(f"{what} must be an int, got {replicates!r}")
        if not 0 <= replicates <= MAX_REPLICATES:
            raise ValueError(f"{what} must be between 0 and {MAX_REPLICATES}, got {replicates}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {seed!r}")
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be between 0 and 2**64 - 1 (it keys a 64-bit hash), got {seed}")
        self.n = int(n_metrics)
        self.r = int(replicates)
        self.kind = kind
        self.seed = int(seed)
        self.with_totals = kind == "poisson"
        # pending queries per flush: weight matrices stay around a million entries
        self.batch = max(1, min(512, (1 << 20) // max(self.r, 1)))

    def create(self) -> list:
        totals = [bytes(8 * self.r) for _ in range(self.n)] if self.with_totals else []
        return list(ReplicateState(totals, [{} for _ in range(self.n)], []))

    def add(self, state: list, key, values) -> list:
        """Add one query (``key`` any :func:`~streameval.metrics.stats.stable_key` key) with one value
        per metric (NaN: the query does not count for that metric). Non-finite values raise."""
        vals = [float(v) for v in values]
        if len(vals) != self.n:
            raise ValueError(f"expected {self.n} values, got {len(vals)}")
        for v in vals:
            if math.isinf(v):
                raise ValueError(f"metric value {v} is not finite")
        pending = state[_PENDING]
        pending.append(list(PendingQuery(stats.stable_key(key), vals)))
        if len(pending) >= self.batch:
            self.flush(state)
        return state

    def weights(self, keys, dtype=np.int64) -> np.ndarray:
        """(len(keys), R) of ``dtype`` (int64 by default): the weights of these keys in every replicate."""
        if self.kind == "poisson":
            w = stats.poisson_weights(stats.query_seeds(keys, stats.BOOTSTRAP_STREAM, self.seed), self.r)
            return w.astype(dtype, copy=False)
        return stats.sign_flips(stats.query_seeds(keys, stats.FLIP_STREAM, self.seed), self.r, dtype=dtype)

    def flush(self, state: list) -> list:
        """Fold the pending queries into the limbs (the state's value does not change)."""
        pending = state[_PENDING]
        if not pending:
            return state
        state[_PENDING] = []
        if self.r == 0:
            return state
        n = len(pending)
        # (a PendingQuery's fields unpacked: up to a batch of them)
        x = np.array([values for _key, values in pending], dtype=np.float64).reshape(n, self.n)
        return _as_bytes(self._fold(state, x, lambda: self.weights([key for key, _values in pending])))

    def add_many(self, state: list, matrix, keys=None, weights=None, index=None) -> list:
        """Add many queries at once, the same value as :meth:`add` one by one: ``matrix`` shape
        (n_metrics, n) (NaN: the query does not count for that metric); ``keys`` the n query keys,
        or instead ``weights``: their weights (shape (n, R), :meth:`weights`), or a table of weights
        with ``index`` (shape (n,)) its row of each query (queries sharing a key share a row).
        Raises ValueError on an infinite value or a shape that does not fit."""
        x = np.asarray(matrix, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] != self.n:
            raise ValueError(f"expected a matrix of shape ({self.n}, n), got {x.shape}")
        if np.isinf(x).any():
            raise ValueError(f"metric value {x[np.isinf(x)][0]} is not finite")
        x = x.T
        n = len(x)
        if keys is None and weights is None:
            raise ValueError("add_many needs the queries' keys or weights")
        if self.r == 0 or not n:
            return state
        if not self.with_totals and weights is not None and index is not None:
            table = weights
            blocks = dense_blocks(len(table), index, x, self.DENSE_ROWS)
            if blocks is not None:
                for lo, hi, rows in blocks:
                    self._fold(state, rows, lambda lo=lo, hi=hi: table[lo:hi])
                return _as_bytes(state)
        # float64 products of 32-bit chunks and weights (at most 18) stay exact integers below
        # 2**53 for up to 2**16 rows at once; 2**22 weights at most in memory
        step = max(1, min(4096, (1 << 22) // self.r))
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            if weights is None:
                w = lambda lo=lo, hi=hi: self.weights(list(keys[lo:hi]))  # noqa: E731
            elif index is None:
                w = lambda lo=lo, hi=hi: np.asarray(weights[lo:hi])  # noqa: E731
            else:
                w = lambda lo=lo, hi=hi: np.asarray(weights)[np.asarray(index[lo:hi])]  # noqa: E731
            self._fold(state, x[lo:hi], w)
        return _as_bytes(state)

    def _fold(self, state: list, x: np.ndarray, weights) -> list:
        """Add the rows of ``x`` (n, n_metrics; NaN: not counted) to the limbs and totals;
        ``weights()`` gives their (n, R) weights (called only when some value counts). Each
        metric's column is split exactly into levels of ``53 - ceil(log2(n * w_max))`` bits
        (:func:`_level_rows`; usually two rows a metric), the validity masks are rows too (the weight
        totals), one float64 product with the weights is exact (integers below 2**53), and each
        level's sums go to the limbs at its grid (:func:`_add_scaled_rows`)."""
        n = len(x)
        wmax = 1 if self.kind == "sign" else len(stats.POISSON_THRESHOLDS)  # the largest weight
        bits = 53 - max(1, (n * wmax - 1).bit_length())  # n * w_max * 2**bits <= 2**53
        xt = np.ascontiguousarray(x.T)  # (n_metrics, n): every metric's levels at once
        ok = ~np.isnan(xt)
        if self.with_totals:
            counted = np.flatnonzero(ok.any(axis=1))  # a metric with no value counted: no rows
            if not len(counted):
                return state
            if len(counted) < self.n:
                xt, ok = xt[counted], ok[counted]
        else:
            counted = np.arange(self.n)
        owner, grid, levels = _level_rows(np.where(ok, xt, 0.0), bits)
        if self.with_totals:
            rows = np.vstack([ok.astype(np.float64)] + levels) if levels else ok.astype(np.float64)
        elif levels:
            rows = np.vstack(levels)
        else:
            return state
        prod = (rows @ np.asarray(weights(), dtype=np.float64)).astype(np.int64)
        if self.with_totals:
            totals = state[_TOTALS]
            for m, row in zip(counted.tolist(), prod[:len(counted)]):
                totals[m] = _ints(totals[m]) + row
            prod = prod[len(counted):]
        if len(owner):
            _add_scaled_rows(state[_LIMBS], counted[owner], grid, prod)
        return state

    @staticmethod
    def expand(state: list, index) -> list:
        """The state of the metrics ``index`` (metric ``m`` of the result is metric ``index[m]`` of
        ``state``): what adding each query's values taken at ``index`` would give (copies, no row
        shared)."""
        idx = [int(i) for i in index]
        s = ReplicateState._make(state)
        return list(ReplicateState([s.totals[i] for i in idx] if s.totals else [], [dict(s.limbs[i]) for i in idx],
                                   [list(PendingQuery(k, [v[i] for i in idx])) for k, v in s.pending]))

    def merge(self, states) -> list:
        out = None
        for s in map(ReplicateState._make, states):
            if out is None:
                out = ReplicateState(list(s.totals), [dict(a) for a in s.limbs], list(s.pending))
                continue
            for m in range(self.n):
                if self.with_totals:
                    out.totals[m] = _ints(out.totals[m]) + _ints(s.totals[m])
                if s.limbs[m]:
                    acc = out.limbs[m]
                    for b, row in s.limbs[m].items():
                        _add_limbs(acc, b, row)
                    _carry(acc)
            out.pending.extend(s.pending)
        if out is None:
            return self.create()
        merged = list(out)
        if len(out.pending) >= self.batch:
            self.flush(merged)
        return _as_bytes(merged)

    def extract(self, state: list) -> tuple[np.ndarray, np.ndarray | None]:
        """(sums (n_metrics, R) float64, each the correctly rounded exact sum; weight totals
        (n_metrics, R) int64 or None for signs). Flushes the state."""
        s = ReplicateState._make(self.flush(state))
        sums = np.array([_limbs_value(acc, self.r) for acc in s.limbs], dtype=np.float64)
        sums = sums.reshape(self.n, self.r)
        totals = (np.array([_ints(t) for t in s.totals], dtype=np.int64).reshape(self.n, self.r)
                  if self.with_totals else None)
        return sums, totals


def replicate_means_of(sums: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """(n_metrics, R) replicate means from :class:`ReplicateSums`' weighted sums and total
    weights (NaN for a replicate with zero total weight)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(totals > 0, sums / np.where(totals > 0, totals, 1), np.nan)


class PoissonBootstrap:
    """Poisson bootstrap of the mean of ``n_metrics`` per-query metrics, mergeable exactly.

    Replicate ``r``'s mean of metric ``m`` is ``S[m][r] / W[m][r]`` (a replicate where every weight
    is 0 is left out; chance ``exp(-n)``). The interval is the percentile interval of those means
    (:func:`streameval.metrics.stats.percentile_interval`); fewer than two queries give NaN. The
    value, count and standard error are :class:`MeanMoments`' (the exact mean of the input).
    """

    def __init__(self, n_metrics: int, replicates: int = DEFAULT_REPLICATES, seed: int = 0):
        self.n = int(n_metrics)
        self.replicates = int(replicates)
        self.mm = MeanMoments(self.n)
        self.rs = ReplicateSums(self.n, self.replicates, "poisson", seed)

    def create(self) -> list:
        return list(BootstrapState(self.mm.create(), self.rs.create()))

    def add(self, state: list, key, values) -> list:
        vals = [float(v) for v in values]
        moments, sums = state  # a BootstrapState's fields (unpacked: one a query)
        self.mm.add(moments, vals)
        self.rs.add(sums, key, vals)
        return state

    def add_many(self, state: list, matrix, keys=None, weights=None, index=None) -> list:
        """Add many queries at once (:meth:`ReplicateSums.add_many`'s arguments; ``matrix`` shape
        (n_metrics, n)): the same value as :meth:`add` one by one."""
        s = BootstrapState._make(state)
        self.mm.add_many(s.moments, matrix)
        self.rs.add_many(s.sums, matrix, keys, weights, index)
        return state

    def merge(self, states) -> list:
        views = [BootstrapState._make(s) for s in states]
        if not views:
            return self.create()
        return list(BootstrapState(self.mm.merge([s.moments for s in views]),
                                   self.rs.merge([s.sums for s in views])))

    def compact(self, state: list) -> list:
        self.rs.flush(BootstrapState._make(state).sums)
        return state

    def replicate_means(self, state: list) -> np.ndarray:
        """(n_metrics, R) replicate means (NaN for a replicate with zero total weight)."""
        sums, totals = self.rs.extract(BootstrapState._make(state).sums)
        return replicate_means_of(sums, totals)

    def extract(self, state: list, level: float = stats.DEFAULT_LEVEL) -> list[dict]:
        """Per metric: ``{value, num_queries, stderr, ci_low, ci_high, ci_level, ci_method}``
        (``ci_method`` ``"bootstrap"``; the keys of a metric_result row)."""
        means = self.replicate_means(state)
        out = []
        for m, (mean, n, se) in enumerate(self.mm.extract(BootstrapState._make(state).moments)):
            lo, hi = stats.percentile_interval(means[m], level) if n >= 2 else (math.nan, math.nan)
            out.append({"value": mean, "num_queries": n, "stderr": se, "ci_low": lo, "ci_high": hi,
                        "ci_level": level, "ci_method": "bootstrap"})
        return out
