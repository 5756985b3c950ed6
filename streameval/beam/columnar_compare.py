"""Paired comparisons against a baseline system on the columnar engine (``--compare-baseline``).

The same comparison rows as :class:`~streameval.beam.stats.CompareSystems` after
:class:`~streameval.beam.transforms.ScoreRankings`: a query's requests are all in one query shard of
the engine's scoring stage, so the pairing happens there, vectorised. Per (window, slice, query)
each system's value of a metric is the mean of its requests' values (NaN skipped: the exact sum,
:func:`math.fsum`, over the count, as :func:`streameval.beam.stats._system_means`); every system
present with the baseline is paired with it (``B - A``, A the baseline), and the shard's queries of a
(window, slice, A, B) key are added to one
:class:`~streameval.accumulators.bootstrap.PairedComparison` state, merged across shards by
:class:`PairedStatesCombineFn`.
"""

from __future__ import annotations

import math

import numpy as np

from ..accumulators.bootstrap import PairedComparison
from .columnar_clean import _labels, _windows
from .columnar_columns import _encode, _group_bounds, _ordered
from .combiners import BatchedStatesMixin
from .stats import PairedCombineFn

__all__ = ["paired_states", "system_means", "PairedStatesCombineFn", "MAX_TABLE"]

#: the most weights of a shard's distinct queries kept in memory at once (int64: 256 MB); beyond, each
#: block of queries draws its own
MAX_TABLE = 1 << 25


def system_means(values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per run ``[start, end)`` of the columns of ``values`` (shape (n_metrics, n)): the mean of each
    metric over the run, NaN skipped (NaN when every value is); shape (n_metrics, n_runs). Each sum
    is the correctly rounded exact sum (:func:`math.fsum`), so the means equal a per-run fsum."""
    nan = np.isnan(values)
    counts = np.add.reduceat((~nan).astype(np.int64), starts, axis=1) if len(starts) else \
        np.zeros((len(values), 0), np.int64)
    filled = np.where(nan, 0.0, values)
    sums = filled[:, starts].copy()
    several = np.flatnonzero(ends - starts > 1)
    if len(several):
        exact, done = _run_sums(filled, starts, ends)
        pick = several[done[:, several].all(axis=0)] if len(filled) else several
        sums[:, pick] = exact[:, pick]
        rest = np.setdiff1d(several, pick)
        rows = filled.tolist() if len(rest) else []
        for i in rest.tolist():  # a run with values 2**40 apart, -0.0 or an infinity: math.fsum
            lo, hi = int(starts[i]), int(ends[i])
            for m, row in enumerate(rows):
                sums[m, i] = math.fsum(row[lo:hi])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.where(counts > 0, counts, 1), np.nan)


def _run_sums(x: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """Correctly rounded exact sums of the runs ``[start, end)`` (contiguous, covering the columns)
    of each row of ``x`` (finite or not, no NaN), vectorised: ``(sums, done)``, ``done`` false where
    the run needs :func:`math.fsum` instead. Each value is split exactly as ``v1 * 2**g1 + v2 * 2**g2``
    with integers ``|v| < 2**bits`` (``bits = 53 - ceil(log2(longest run))``) on grids taken from
    the run's largest exponent, then its residual's; the runs' sums of ``v1`` and of ``v2`` are exact
    (integers below 2**53), so their scaled values ``A``, ``B`` are exact doubles and ``A + B`` is
    the correctly rounded exact sum (one IEEE addition). Not done: runs whose values need a third
    level (values more than about 2**40 apart), with -0.0 (fsum keeps its sign) or an infinity."""
    lens = ends - starts
    bits = 53 - max(1, int(lens.max() - 1).bit_length())
    finite = np.isfinite(x)
    res = np.where(finite, x, 0.0)
    done = np.minimum.reduceat((finite & ~((res == 0) & np.signbit(res))).astype(np.int8), starts, axis=1) > 0
    total = np.zeros((len(x), len(starts)))
    for _ in range(2):
        nz = res != 0
        _, e = np.frexp(res)
        emax = np.maximum.reduceat(np.where(nz, e, -10_000), starts, axis=1)
        g = np.maximum(emax - bits, -1074)
        ge = np.repeat(g, lens, axis=1)
        v = np.trunc(np.ldexp(res, -ge))
        res = res - np.ldexp(v, ge)
        total = total + np.ldexp(np.add.reduceat(v, starts, axis=1), g)  # exact, then one rounding
    done &= ~np.logical_or.reduceat(res != 0, starts, axis=1)
    return total, done


def paired_states(pc: PairedComparison, baseline: str, min_ts, system_id, attributes: dict, query_id, values,
                  window_micros, slice_specs, all_only=None):
    """``((window_start, window_end, slice, baseline, other), PairedComparison state)`` pairs of one
    query shard's requests: ``values`` shape (n_metrics, n_requests); ``min_ts``, ``system_id``,
    ``attributes`` and ``query_id`` per request (as :func:`~streameval.beam.columnar.mean_states`);
    ``all_only``: bool per request, true for the ones that count in the slice ``all`` only (the
    empty rankings of ``complete``). Keys whose baseline scored none of the queries give nothing."""
    nreq = len(min_ts)
    if not nreq:
        return
    scode, svals = _ordered(system_id)  # codes in the order of the names: pairs as sorted(systems)
    names = svals.to_pylist()
    if baseline not in names:
        return
    base = names.index(baseline)
    S = len(names)
    qcode, qvals = _encode(query_id)
    qnames = qvals.to_pylist()
    Q = len(qnames)
    boot_table = sign_table = None
    if Q * (pc.boot.r + pc.signs.r) <= MAX_TABLE:  # each query's weights drawn once for every key it is in
        # the signs as float64 once, the type of the exact product (the table is used in place, see
        # ReplicateSums.add_many)
        boot_table, sign_table = pc.boot.weights(qnames), pc.signs.weights(qnames, np.float64)
    wcode, wkeys = _windows(min_ts, window_micros)
    for spec, (lcode, lvals) in enumerate(_labels(attributes, nreq, slice_specs)):
        group = (wcode * len(lvals) + lcode) * Q + qcode
        key = group * S + scode
        if spec and all_only is not None and all_only.any():  # not in the other slices: a key past every group
            key = np.where(all_only, -1, key)
        order, starts, ends = _group_bounds(key)
        if spec and all_only is not None and all_only.any():  # drop the run of -1 keys (sorted first)
            cut = int((key == -1).sum())
            first = int(np.searchsorted(starts, cut))
            order, starts, ends = order[cut:], starts[first:] - cut, ends[first:] - cut
        means = system_means(values[:, order], starts, ends)
        seg_key = key[order[starts]]
        seg_group, seg_sys = seg_key // S, seg_key % S
        # the baseline's segment of each (window, slice, query) group, and every other system's
        is_base = seg_sys == base
        base_seg = np.full(int(group.max()) + 1, -1, dtype=np.int64)
        base_seg[seg_group[is_base]] = np.flatnonzero(is_base)
        other = np.flatnonzero(~is_base & (base_seg[seg_group] >= 0))
        if not len(other):
            continue
        # one key per (window, slice, other system): its queries added at once
        wl = seg_group[other] // Q
        pair = wl * S + seg_sys[other]
        porder, pstarts, pends = _group_bounds(pair)
        for lo, hi in zip(pstarts.tolist(), pends.tolist()):
            segs = other[porder[lo:hi]]
            k = int(pair[porder[lo]])
            s, rest = k % S, k // S
            k = (*wkeys[rest // len(lvals)], lvals[rest % len(lvals)], baseline, names[s])
            q = seg_group[segs] % Q
            st = pc.add_many(pc.create(), means[:, base_seg[seg_group[segs]]], means[:, segs],
                             [qnames[i] for i in q.tolist()], boot_table, sign_table, q)
            yield k, pc.compact(st)


class PairedStatesCombineFn(BatchedStatesMixin, PairedCombineFn):
    """:class:`~streameval.beam.stats.PairedCombineFn` whose inputs are PairedComparison states."""

    @property
    def states_ops(self):
        return self._pc
