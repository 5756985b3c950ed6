"""Paired comparison of two systems over the same queries, as one mergeable state per metric set:
means, the mean difference with its t and Poisson bootstrap intervals, the paired t-test and the
sign-flip randomization test (exact on few queries). Its state is described in
:mod:`streameval.accumulators.bootstrap` (``PairedComparison``), on whose :class:`ReplicateSums` it
builds, as :class:`~streameval.accumulators.flips.FlipSums` does; its fields are named by
:class:`PairedState`."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from ..metrics import stats
from .bootstrap import DEFAULT_EXACT_MAX, DEFAULT_FLIPS, DEFAULT_REPLICATES, ReplicateSums, replicate_means_of
from .flips import FlipSums
from .moments import MeanMoments, MomentsState, partials_value

__all__ = ["PairedComparison", "PairedState", "KeptQuery"]


class PairedState(NamedTuple):
    """A :class:`PairedComparison` state's fields: ``moments`` the MeanMoments state
    (:class:`~.moments.MomentsState`) of A's values, B's values and the differences b - a (3 x
    n_metrics metrics, in that order), ``boot`` the Poisson bootstrap :class:`ReplicateSums` state
    and ``signs`` the :class:`~.flips.FlipSums` state of the differences, ``queries`` the queries
    added, ``kept`` None or the queries' differences (:class:`KeptQuery` lists) while ``queries`` is at
    most ``exact_max``. The state: their list."""

    moments: list
    boot: list
    signs: list
    queries: int
    kept: list | None


class KeptQuery(NamedTuple):
    """A query kept for the exact sign-flip test: ``key`` its stable key
    (:func:`~streameval.metrics.stats.stable_key`), ``diffs`` its differences, one per metric. In a
    state: their list."""

    key: str
    diffs: list


def _kept_key(kept) -> Any:
    return KeptQuery._make(kept).key


#: PairedState's positions in a state, for the updates in place (one a query)
_QUERIES, _KEPT = (PairedState._fields.index(f) for f in ("queries", "kept"))


class PairedComparison:
    """Paired comparison of systems A and B over the same queries, for ``n_metrics`` metrics.

    Input per query: its key, A's and B's values (a NaN on either side leaves the query out for
    that metric). The difference is ``b - a``. Extraction gives, per metric: both means, the mean
    difference, its standard error, its t interval and Poisson bootstrap percentile interval (the
    same hash-seeded weights as :class:`PoissonBootstrap`, so the resampling is paired), the paired
    t-test, and the two-sided sign-flip randomization test of the mean difference: exact (all
    ``2**n`` sign patterns) while at most ``exact_max`` queries were added, else Monte Carlo over
    ``flips`` hash-seeded sign patterns, ``p = (1 + #{|T_r| >= |T|}) / (flips + 1)``.
    """

    def __init__(self, n_metrics: int, replicates: int = DEFAULT_REPLICATES, flips: int = DEFAULT_FLIPS,
                 exact_max: int = DEFAULT_EXACT_MAX, seed: int = 0):
        self.n = int(n_metrics)
        self.replicates = int(replicates)
        self.flips = int(flips)
        self.exact_max = int(exact_max)
        self.seed = int(seed)
        if not 0 <= self.exact_max <= 30:
            raise ValueError("exact_max must be between 0 and 30 (the exact test enumerates 2**n sign patterns)")
        self.mm = MeanMoments(3 * self.n)
        self.boot = ReplicateSums(self.n, self.replicates, "poisson", seed)
        self.signs = FlipSums(self.n, self.flips, seed)

    def create(self) -> list:
        return list(PairedState(self.mm.create(), self.boot.create(), self.signs.create(), 0,
                                [] if self.exact_max > 0 else None))

    def add(self, state: list, key, a_values, b_values) -> list:
        a = [float(v) for v in a_values]
        b = [float(v) for v in b_values]
        if len(a) != self.n or len(b) != self.n:
            raise ValueError(f"expected {self.n} values per system")
        d = []
        for m in range(self.n):
            if math.isnan(a[m]) or math.isnan(b[m]):
                a[m] = b[m] = math.nan
            d.append(b[m] - a[m])
        s = PairedState._make(state)
        self.mm.add(s.moments, a + b + d, squares_from=2 * self.n)  # b - a's squares only
        self.boot.add(s.boot, key, d)
        self.signs.add(s.signs, key, d)
        state[_QUERIES] += 1
        if s.kept is not None:
            if state[_QUERIES] <= self.exact_max:
                s.kept.append(list(KeptQuery(stats.stable_key(key), d)))
            else:
                state[_KEPT] = None
        return state

    def add_many(self, state: list, a_values, b_values, keys, boot_weights=None, sign_weights=None,
                 index=None) -> list:
        """Add n queries at once, the same value as :meth:`add` one by one: ``a_values``,
        ``b_values`` shape (n_metrics, n); ``keys`` the n query keys; ``boot_weights`` /
        ``sign_weights`` with ``index``: tables of the queries' bootstrap and sign weights
        (:meth:`ReplicateSums.weights` of the distinct keys) and each query's row in them, so
        queries sharing a key draw their weights once (see :meth:`ReplicateSums.add_many`)."""
        d = self._add_moments(state, a_values, b_values, keys, boot_weights, index)
        signs = PairedState._make(state).signs
        if boot_weights is None:
            self.signs.add_many(signs, d, keys=keys)
        else:
            self.signs.add_many(signs, d, keys=keys, weights=sign_weights, index=index)
        return state

    def add_many_keys(self, parts, boot_weights, sign_weights) -> list:
        """New states, one per part ``(a_values, b_values, keys, index)`` (as :meth:`add_many`), whose
        queries' weights are rows ``index`` of the tables ``boot_weights`` and ``sign_weights`` (int8
        signs will do): the same states as :meth:`add_many` part by part, the sign-flip sums of every
        part from one pass over the sign table (:meth:`FlipSums.add_many_keys`)."""
        states, ds, keys, indices = [], [], [], []
        for a_values, b_values, part_keys, index in parts:
            st = self.create()
            ds.append(self._add_moments(st, a_values, b_values, part_keys, boot_weights, index))
            states.append(st)
            keys.append(part_keys)
            indices.append(index)
        self.signs.add_many_keys([PairedState._make(s).signs for s in states], ds, keys, sign_weights, indices)
        return states

    def _add_moments(self, state: list, a_values, b_values, keys, boot_weights, index) -> np.ndarray:
        """:meth:`add_many` but for the sign flips; returns the differences (n_metrics, n)."""
        a = np.array(a_values, dtype=np.float64, ndmin=2)
        b = np.array(b_values, dtype=np.float64, ndmin=2)
        if a.shape != b.shape or a.shape[0] != self.n or a.shape[1] != len(keys):
            raise ValueError(f"expected ({self.n}, {len(keys)}) values per system, got {a.shape} and {b.shape}")
        nan = np.isnan(a) | np.isnan(b)
        a[nan] = np.nan
        b[nan] = np.nan
        d = b - a
        n = len(keys)
        s = PairedState._make(state)
        self.mm.add_many(s.moments, np.vstack([a, b, d]), squares_from=2 * self.n)  # b - a's squares only
        if boot_weights is None:
            self.boot.add_many(s.boot, d, keys=keys)
        else:
            self.boot.add_many(s.boot, d, weights=boot_weights, index=index)
        if s.kept is not None:
            if s.queries + n <= self.exact_max:
                s.kept.extend(list(KeptQuery(stats.stable_key(k), d[:, i].tolist())) for i, k in enumerate(keys))
            else:
                state[_KEPT] = None
        state[_QUERIES] += n
        return d

    def expand(self, state: list, index) -> list:
        """A state of this comparison (``len(index)`` metrics) from ``state``, a state of a
        PairedComparison of the same options over fewer metrics: metric ``m`` is metric ``index[m]``
        of ``state`` (the same value as adding the queries' values taken at ``index``). So identical
        metric columns (e.g. ``recall@k`` for every ``k`` past the rankings' length) are computed once."""
        idx = [int(i) for i in index]
        if len(idx) != self.n:
            raise ValueError(f"expected {self.n} indices, got {len(idx)}")
        s = PairedState._make(state)
        old = MomentsState._make(s.moments)
        k = len(old.counts) // 3
        mm_idx = idx + [k + i for i in idx] + [2 * k + i for i in idx]
        mm = MomentsState([old.counts[i] for i in mm_idx], [list(old.sums[i]) for i in mm_idx],
                          [list(old.squares[i]) for i in mm_idx])
        kept = None if s.kept is None else [list(KeptQuery(key, [d[i] for i in idx])) for key, d in s.kept]
        return list(s._replace(moments=list(mm), boot=ReplicateSums.expand(s.boot, idx),
                               signs=self.signs.expand(s.signs, idx, k), kept=kept))

    def merge(self, states) -> list:
        views = [PairedState._make(s) for s in states]
        if not views:
            return self.create()
        count = sum(s.queries for s in views)
        kept = None
        if count <= self.exact_max and all(s.kept is not None for s in views):
            kept = [list(k) for s in views for k in s.kept or ()]
        return list(PairedState(self.mm.merge([s.moments for s in views]), self.boot.merge([s.boot for s in views]),
                                self.signs.merge([s.signs for s in views]), count, kept))

    def compact(self, state: list) -> list:
        s = PairedState._make(state)
        self.boot.flush(s.boot)
        self.signs.compact(s.signs)
        return state

    def extract(self, state: list, level: float = stats.DEFAULT_LEVEL) -> list[dict]:
        """Per metric a dict: ``num_queries, mean_a, mean_b, diff, stderr, ci_level, t_low, t_high,
        boot_low, boot_high, t, p_t, p_perm, perm_method ("exact" | "monte-carlo" | None),
        perm_samples`` (sign patterns behind p_perm)."""
        s = PairedState._make(state)
        moments = self.mm.extract(s.moments)
        boot_sums, boot_tot = self.boot.extract(s.boot)
        assert boot_tot is not None  # Poisson weights carry their totals (only sign flips have none)
        boot_means = replicate_means_of(boot_sums, boot_tot)
        kept = ([KeptQuery._make(k) for k in sorted(s.kept, key=_kept_key)] if s.kept is not None else None)
        diff_sums = MomentsState._make(s.moments).sums[2 * self.n:]
        totals = [partials_value(diff_sums[m]) for m in range(self.n)]
        hits = None
        if kept is None and self.flips > 0:  # #{r : |T_r| >= |T|} per metric (FlipSums.counts: exact)
            hits = self.signs.counts(s.signs, [t if math.isfinite(t) else 0.0 for t in totals])
        out = []
        for m in range(self.n):
            mean_a, n, _ = moments[m]
            mean_b = moments[self.n + m][0]
            diff, _, se = moments[2 * self.n + m]
            t_low, t_high = stats.t_interval(diff, n, se, level)
            b_low, b_high = stats.percentile_interval(boot_means[m], level) if n >= 2 else (math.nan, math.nan)
            t, p_t = stats.t_test(diff, n, se)
            if n == 0:
                p_perm, method, samples = math.nan, None, 0
            elif kept is not None:
                p_perm, method, samples = stats.sign_flip_pvalue_exact([k.diffs[m] for k in kept]), "exact", 2 ** n
            elif self.flips > 0:
                assert hits is not None  # counted above for this very case
                p_perm = (1 + hits[m]) / (self.flips + 1) if math.isfinite(totals[m]) else math.nan
                method, samples = "monte-carlo", self.flips
            else:
                p_perm, method, samples = math.nan, None, 0
            out.append({"num_queries": n, "mean_a": mean_a, "mean_b": mean_b, "diff": diff, "stderr": se,
                        "ci_level": level, "t_low": t_low, "t_high": t_high, "boot_low": b_low,
                        "boot_high": b_high, "t": t, "p_t": p_t, "p_perm": p_perm, "perm_method": method,
                        "perm_samples": samples})
        return out
