"""Mergeable state of the Monte Carlo sign-flip (randomization) test: how many of ``R`` hash-seeded
sign patterns give a sum at least as far from 0 as the observed one, decided from float sums with a
proven error bound, exactly where the bound cannot decide.

For metric ``m`` and flip ``r`` the test needs ``T_r = sum_q s(q, r) d_q`` (``s`` = +1 / -1,
:func:`streameval.metrics.stats.sign_flips`, a pure function of the query's key) rounded once, and
counts the flips with ``|round(T_r)| >= |round(T)|``, ``T = sum_q d_q``. :class:`ReplicateSums`
(``kind="sign"``) keeps every ``T_r`` exact (two exact BLAS products of a level split and integer
limbs); :class:`FlipSums` keeps instead:

* ``approx``: the float64 sums ``fl(T_r)`` per metric and flip (one float64 product of the
  differences, NaN as 0, with the signs; merged by adding),
* ``absum``: per metric the float sum of ``|d_q|``, and ``terms``: how many terms (rows, NaN rows
  included as zeros) every sum of the state was added from,
* ``rows``: the differences themselves, with their keys' flip-stream seeds, while the state holds
  at most :attr:`FlipSums.keep_max` rows.

Every entry of ``approx`` is a floating-point sum of ``N = terms`` exact terms ``s d`` in some order
(BLAS's dot products, the additions of blocks and of merged states: a summation tree whose
additions each round once; no Strassen-like product), so ``|fl(T_r) - T_r| <= gamma_{N-1} sum|d_q|``
with ``gamma_k = k u / (1 - k u)``, ``u = 2**-53`` (Higham, Accuracy and Stability of Numerical
Algorithms, 2nd ed., section 4.2, eq. 4.4); the computed ``absum`` ``A'`` satisfies ``sum|d_q| <= A'
/ (1 - gamma_N)`` by the same bound. The state's bound ``E = gamma_N A' / (1 - gamma_N) + 2 N
2**-1022`` (the last term covers a flush-to-zero mode of the BLAS, where the relative bound does not
hold for results below 2**-1022) is computed in exact rationals and rounded up. With ``t =
|round(T)|`` a flip counts when ``|fl(T_r)| >= t + E`` (then ``|T_r| >= t``, so ``|round(T_r)| >=
t``), does not when ``|fl(T_r)| + E < prev(t)``, the double below ``t`` (then ``|round(T_r)| <=
prev(t)``), and otherwise (a near-tie: within ``E`` of the threshold, e.g. the exact ties of
discrete metrics) its ``round(T_r)`` is computed exactly from the kept rows (:class:`ReplicateSums`
on those flips' signs only). So the count is the count of the exact sums, not an approximation.

Beyond ``keep_max`` rows the state folds its rows into a :class:`ReplicateSums` state (exact for
every flip, the cost of the limbs) and keeps no rows: memory stays O(flips x metrics) whatever the
number of queries. The two kinds merge (the rows of the other are folded).

State (Beam's FastPrimitivesCoder, no pickling): the list of a :class:`FlipState`'s fields
``(approx, absum, terms, seeds, rows, pending, exact)`` - ``approx`` bytes of (n_metrics, R) float64
(empty before the first product); ``absum`` a list of n_metrics floats; ``terms`` an int; ``seeds``
bytes of the kept rows' uint64 seeds (stream :data:`~streameval.metrics.stats.FLIP_STREAM`);
``rows`` bytes of (n_rows, n_metrics) float64 (NaN: not counted); ``pending`` how many of the last
rows are not yet in ``approx``; ``exact`` None, or the :class:`ReplicateSums` state everything was
folded into (then ``approx``, ``absum``, ``rows`` are empty).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from ..metrics import stats
from .bootstrap import ReplicateSums, dense_blocks

__all__ = ["FlipSums", "FlipState", "error_bound"]

_U = Fraction(1, 1 << 53)
_TINY = Fraction(1, 1 << 1022)


def error_bound(absum: float, terms: int) -> float:
    """A double ``E`` with ``|fl(T) - T| <= E`` for a floating-point sum ``fl(T)`` of ``terms``
    exact terms, in any order, whose absolute values the same kind of sum gave as ``absum``:
    ``gamma_N absum / (1 - gamma_N) + 2 N 2**-1022`` (``N = terms``), in exact rationals, rounded up.
    ``inf`` when ``absum`` is not finite or ``N u >= 1/2``."""
    if not math.isfinite(absum) or terms * _U >= Fraction(1, 2):
        return math.inf
    g = terms * _U
    gamma = g / (1 - g)
    e = gamma * Fraction(abs(absum)) / (1 - gamma) + 2 * terms * _TINY
    f = float(e)  # to nearest: one step up is above e
    return float(np.nextafter(f, math.inf)) if Fraction(f) < e else f


def _sign_columns(seeds: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(len(seeds), len(cols)) float64 +1 / -1: the signs of flips ``cols`` (as
    :func:`~streameval.metrics.stats.sign_flips`: bit ``r % 64`` of splitmix64 output ``r // 64 + 1``)."""
    words, inv = np.unique(cols // 64, return_inverse=True)
    bits = np.empty((len(seeds), len(words)), dtype=np.uint64)
    for i, w in enumerate(words.tolist()):
        bits[:, i] = stats.replicate_bits(seeds, 1, w)[:, 0]
    b = (bits[:, inv] >> (cols % 64).astype(np.uint64)) & np.uint64(1)
    return 1.0 - 2.0 * b.astype(np.float64)


class FlipState(NamedTuple):
    """A :class:`FlipSums` state's fields (see the module docstring): ``approx`` bytes of the float
    sums, (n_metrics, R) float64; ``absum`` per metric the float sum of ``|d|``; ``terms`` the rows
    every sum was added from; ``seeds`` and ``rows`` bytes of the kept rows' seeds (uint64) and
    differences ((n_rows, n_metrics) float64); ``pending`` the last rows not yet in ``approx``;
    ``exact`` None or the :class:`ReplicateSums` state everything was folded into. The state: their
    list."""

    approx: bytes
    absum: list
    terms: int
    seeds: bytes
    rows: bytes
    pending: int
    exact: list | None


#: FlipState's positions in a state, for the updates in place
_ABSUM, _TERMS, _SEEDS, _ROWS, _PENDING, _EXACT, _APPROX = (
    FlipState._fields.index(f) for f in ("absum", "terms", "seeds", "rows", "pending", "exact", "approx"))


class FlipSums:
    """The sign-flip counts of ``n_metrics`` metrics over ``flips`` hash-seeded sign patterns (see
    the module docstring): :meth:`add`, :meth:`add_many`, :meth:`merge`, then :meth:`counts` with the
    observed sums. ``seed`` keys the hash (as :class:`ReplicateSums`)."""

    #: queries per float product when the rows' signs are drawn here
    STEP = 1024
    #: rows of a sign table made float64 at once by :meth:`add_many_keys` (20 MB for 10,000 flips:
    #: below glibc's mmap threshold as the local job sets it, so the blocks reuse the heap)
    BLOCK = 256
    #: the most metric rows of states stacked in one product (their sums: 1,024 x R float64, 80 MB for
    #: 10,000 flips)
    STACK = 1024

    def __init__(self, n_metrics: int, flips: int, seed: int = 0, keep_max: int | None = None):
        self.exact = ReplicateSums(n_metrics, flips, "sign", seed)  # validates the arguments
        self.n = int(n_metrics)
        self.r = int(flips)
        self.seed = int(seed)
        self.kind = "sign"
        #: the most rows a state keeps (about the size of the exact limbs: 2 x flips); beyond, exact limbs
        self.keep_max = max(1024, 2 * self.r) if keep_max is None else int(keep_max)
        self.batch = self.exact.batch

    # ---------------------------------------------------------------- state
    def create(self, exact: list | None = None) -> list:
        """An empty state, or (``exact``) one whose sums were all folded into that
        :class:`ReplicateSums` state."""
        return list(FlipState(b"", [0.0] * self.n, 0, b"", b"", 0, exact))

    def weights(self, keys, dtype=np.int64) -> np.ndarray:
        """(len(keys), R) of ``dtype``: the signs of these keys in every flip."""
        return self.exact.weights(keys, dtype)

    def seeds(self, keys) -> np.ndarray:
        return stats.query_seeds(keys, stats.FLIP_STREAM, self.seed)

    def _rows(self, state):
        s = FlipState._make(state)
        seeds = np.frombuffer(s.seeds, dtype="<u8")
        return seeds, np.frombuffer(s.rows, dtype="<f8").reshape(len(seeds), self.n)

    @staticmethod
    def _n_rows(state) -> int:
        """How many rows a state (or its FlipState) keeps."""
        return len(state[_SEEDS]) // 8

    def _approx_add(self, state: list, x: np.ndarray, signs: np.ndarray) -> None:
        """Add the float products of rows ``x`` (n, n_metrics; NaN as 0) with their signs (n, R)."""
        if not len(x) or not self.r:
            return
        z = np.where(np.isnan(x), 0.0, x)
        prod = z.T @ np.asarray(signs, dtype=np.float64)
        self._sums_add(state, prod, np.abs(z).sum(axis=0), len(x))

    def _sums_add(self, state: list, prod: np.ndarray, absum: np.ndarray, terms: int) -> None:
        """Add to the float sums ``prod`` (n_metrics, R), the sums of ``|d|`` ``absum`` (n_metrics,),
        from ``terms`` more rows."""
        approx = state[_APPROX]
        state[_APPROX] = (prod if not approx else np.frombuffer(approx, dtype="<f8").reshape(self.n, self.r) + prod
                          ).astype("<f8").tobytes()
        state[_ABSUM] = (np.asarray(state[_ABSUM], dtype=np.float64) + absum).tolist()
        state[_TERMS] += terms

    @staticmethod
    def _keep(state: list, seeds: np.ndarray, x: np.ndarray) -> None:
        state[_SEEDS] += np.asarray(seeds, dtype="<u8").tobytes()
        state[_ROWS] += np.ascontiguousarray(x, dtype="<f8").tobytes()

    def _fold(self, state: list) -> list:
        """Everything to exact limbs: the kept rows folded (their signs drawn from the seeds)."""
        ex = FlipState._make(state).exact
        ex = self.exact.create() if ex is None else ex
        seeds, x = self._rows(state)
        for lo in range(0, len(x), self.STEP):
            hi = min(len(x), lo + self.STEP)
            self.exact.add_many(ex, x[lo:hi].T, weights=stats.sign_flips(seeds[lo:hi], self.r, dtype=np.float64))
        return self.create(ex)

    def flush(self, state: list) -> list:
        """Add the pending rows to the float sums (the state's value does not change)."""
        p = FlipState._make(state).pending
        if p:
            seeds, x = self._rows(state)
            for lo in range(len(x) - p, len(x), self.STEP):
                hi = min(len(x), lo + self.STEP)
                self._approx_add(state, x[lo:hi], stats.sign_flips(seeds[lo:hi], self.r, dtype=np.float64))
            state[_PENDING] = 0
        return state

    def add(self, state: list, key, values) -> list:
        """One query (its key, one difference per metric; NaN: not counted). Infinite values raise."""
        vals = [float(v) for v in values]
        if len(vals) != self.n:
            raise ValueError(f"expected {self.n} values, got {len(vals)}")
        if any(math.isinf(v) for v in vals):
            raise ValueError(f"metric value {next(v for v in vals if math.isinf(v))} is not finite")
        ex = state[_EXACT]
        if ex is not None:
            self.exact.add(ex, key, vals)
            return state
        self._keep(state, self.seeds([key]), np.array([vals], dtype=np.float64))
        state[_PENDING] += 1
        if state[_PENDING] >= self.batch:
            self.flush(state)
        if self._n_rows(state) > self.keep_max:
            return self._replace(state, self._fold(state))
        return state

    @staticmethod
    def _replace(state: list, new: list) -> list:
        state[:] = new
        return state

    def add_many(self, state: list, matrix, keys=None, weights=None, index=None) -> list:
        """Many queries at once (the arguments of :meth:`ReplicateSums.add_many`: ``matrix`` shape
        (n_metrics, n); the queries' ``keys``, or ``weights`` (n, R) of their signs, or a table of
        signs with ``index``, each query's row; with a table, ``keys`` are needed too, for the seeds
        of the kept rows). The same value as :meth:`add` one by one."""
        x = np.asarray(matrix, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] != self.n:
            raise ValueError(f"expected a matrix of shape ({self.n}, n), got {x.shape}")
        if np.isinf(x).any():
            raise ValueError(f"metric value {x[np.isinf(x)][0]} is not finite")
        n = x.shape[1]
        if keys is None and weights is None:
            raise ValueError("add_many needs the queries' keys or weights")
        if self.r == 0 or not n:
            return state
        s = FlipState._make(state)
        if s.exact is not None or (keys is None) or self._n_rows(s) + n > self.keep_max:
            if s.exact is None:
                self._replace(state, self._fold(self.flush(state)))
            ex = FlipState._make(state).exact
            assert ex is not None  # folded above
            self.exact.add_many(ex, x, keys, weights, index)
            return state
        self.flush(state)
        seeds = self.seeds(list(keys))
        xt = np.ascontiguousarray(x.T)
        if weights is not None and index is not None:
            idx = np.asarray(index, dtype=np.int64)
            table = weights
            blocks = dense_blocks(len(table), idx, xt, self.STEP)
            if blocks is not None:
                for lo, hi, rows in blocks:
                    self._approx_add(state, rows, table[lo:hi])
            else:
                for lo in range(0, n, self.STEP):
                    hi = min(n, lo + self.STEP)
                    self._approx_add(state, xt[lo:hi], np.asarray(table)[idx[lo:hi]])
        else:
            for lo in range(0, n, self.STEP):
                hi = min(n, lo + self.STEP)
                w = (stats.sign_flips(seeds[lo:hi], self.r, dtype=np.float64) if weights is None
                     else np.asarray(weights[lo:hi]))
                self._approx_add(state, xt[lo:hi], w)
        self._keep(state, seeds, xt)
        return state

    def expand(self, state: list, index, k: int) -> list:
        """A state of this FlipSums from ``state``, one of ``k`` metrics: metric ``m`` is metric
        ``index[m]`` of ``state`` (as :meth:`ReplicateSums.expand`)."""
        idx = np.asarray(index, dtype=np.int64)
        s = FlipState._make(state)
        if s.exact is not None:
            return self.create(ReplicateSums.expand(s.exact, idx))
        approx = (np.frombuffer(s.approx, dtype="<f8").reshape(k, self.r)[idx].tobytes() if s.approx else b"")
        rows = np.frombuffer(s.rows, dtype="<f8").reshape(self._n_rows(s), k)[:, idx]
        return list(s._replace(approx=approx, absum=[s.absum[i] for i in idx.tolist()],
                               rows=np.ascontiguousarray(rows).tobytes()))

    def add_many_keys(self, states: list, matrices: list, keys: list, table, indices: list) -> None:
        """Add to each of ``states`` its queries (``matrices[i]`` shape (n_metrics, n_i), ``keys[i]``,
        their rows ``indices[i]`` of the sign ``table``, shape (n_queries, R), any numeric type):
        the same as :meth:`add_many` state by state, with one pass over the table for all of them
        (blocks of :attr:`BLOCK` rows made float64 once; the rows of every state stacked in one product,
        their values at the queries' rows, 0 elsewhere)."""
        live = []
        for st, x, k, idx in zip(states, matrices, keys, indices):
            x = np.asarray(x, dtype=np.float64)
            if x.ndim != 2 or x.shape[0] != self.n or x.shape[1] != len(k):
                raise ValueError(f"expected a matrix of shape ({self.n}, {len(k)}), got {x.shape}")
            if self.r == 0 or not len(k):
                continue
            idx = np.asarray(idx, dtype=np.int64)
            s = FlipState._make(st)
            if (s.exact is not None or self._n_rows(s) + len(k) > self.keep_max
                    or 2 * len(idx) < len(table) or len(np.unique(idx)) != len(idx)):
                # the exact limbs; a few of the table's queries (gathered); queries sharing a row
                self.add_many(st, x, k, table, idx)
                continue
            if np.isinf(x).any():
                raise ValueError(f"metric value {x[np.isinf(x)][0]} is not finite")
            live.append((st, x, k, idx))
        rows = max(1, self.STACK // max(self.n, 1))  # states per product: (rows x n_metrics, R) float64
        for lo in range(0, len(live), rows):
            self._add_stacked(live[lo:lo + rows], table)

    def _add_stacked(self, live: list, table) -> None:
        q = len(table)
        z = np.zeros((len(live) * self.n, q))
        for i, (st, x, k, idx) in enumerate(live):
            self.flush(st)
            z[i * self.n:(i + 1) * self.n, idx] = np.where(np.isnan(x), 0.0, x)
        prod = np.zeros((len(z), self.r))
        for lo in range(0, q, self.BLOCK):
            hi = min(q, lo + self.BLOCK)
            prod += z[:, lo:hi] @ np.asarray(table[lo:hi], dtype=np.float64)
        for i, (st, x, k, idx) in enumerate(live):
            rows = slice(i * self.n, (i + 1) * self.n)
            self._sums_add(st, prod[rows], np.abs(z[rows]).sum(axis=1), q)
            self._keep(st, self.seeds(list(k)), x.T)

    def merge(self, states) -> list:
        states = list(states)
        if not states:
            return self.create()
        views = [FlipState._make(s) for s in states]
        if any(s.exact is not None for s in views) or sum(map(self._n_rows, views)) > self.keep_max:
            folded = [s.exact if s.exact is not None else FlipState._make(self._fold(self.flush(list(s)))).exact
                      for s in views]
            return self.create(self.exact.merge(folded))
        approx = None
        absum, terms, seeds, rows = [0.0] * self.n, 0, b"", b""
        for s in views:
            s = FlipState._make(self.flush(list(s)))
            if s.approx:
                a = np.frombuffer(s.approx, dtype="<f8")
                approx = a.copy() if approx is None else approx + a
            absum = [u + v for u, v in zip(absum, s.absum)]
            terms += s.terms
            seeds += s.seeds
            rows += s.rows
        return list(FlipState(approx.astype("<f8").tobytes() if approx is not None else b"", absum, terms, seeds, rows,
                              0, None))

    def compact(self, state: list) -> list:
        ex = FlipState._make(state).exact
        if ex is not None:
            self.exact.flush(ex)
            return state
        return self.flush(state)

    # ---------------------------------------------------------------- extraction
    def counts(self, state: list, observed) -> list[int]:
        """Per metric ``#{r : |round(T_r)| >= |observed[m]|}`` (``observed[m]`` a finite double,
        :func:`~streameval.metrics.stats.sign_flip_pvalue_mc`'s comparison), exact: decided from the
        float sums where their bound allows, from exact sums of the kept rows elsewhere."""
        ex = FlipState._make(state).exact
        if ex is not None:
            sums, _ = self.exact.extract(ex)
            return [int(np.count_nonzero(np.abs(sums[m]) >= abs(float(observed[m])))) for m in range(self.n)]
        s = FlipState._make(self.flush(state))
        if not s.approx:  # no rows: every sum is 0
            return [self.r if float(observed[m]) == 0.0 else 0 for m in range(self.n)]
        approx = np.abs(np.frombuffer(s.approx, dtype="<f8").reshape(self.n, self.r))
        seeds, x = self._rows(state)
        out = []
        for m in range(self.n):
            t = abs(float(observed[m]))
            if t == 0.0:
                out.append(self.r)
                continue
            e = error_bound(s.absum[m], s.terms)
            a = approx[m]
            if math.isfinite(e) and np.isfinite(a).all():
                hi = np.nextafter(t + e, math.inf)  # a >= hi: |T_r| >= a - e >= t
                lo = np.nextafter(np.nextafter(t, 0.0) - e, -math.inf)  # a < lo: |T_r| < prev(t)
                yes = a >= hi
                near = np.flatnonzero(~yes & (a >= lo))
                count = int(np.count_nonzero(yes))
            else:
                near, count = np.arange(self.r), 0
            if len(near):
                count += self._exact_count(seeds, x[:, m], near, t)
            out.append(count)
        return out

    def _exact_count(self, seeds: np.ndarray, d: np.ndarray, flips: np.ndarray, t: float) -> int:
        """``#{r in flips : |round(T_r)| >= t}`` from the exact sums of the kept rows (one metric)."""
        count = 0
        for lo in range(0, len(flips), 4096):
            cols = flips[lo:lo + 4096]
            rs = ReplicateSums(1, len(cols), "sign", self.seed)
            st = rs.create()
            for qlo in range(0, len(d), self.STEP):
                qhi = min(len(d), qlo + self.STEP)
                rs.add_many(st, d[None, qlo:qhi], weights=_sign_columns(seeds[qlo:qhi], cols))
            (metric,), _ = rs.extract(st)  # the one metric's sums
            count += int(np.count_nonzero(np.abs(metric) >= t))
        return count
