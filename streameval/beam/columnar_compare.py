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

__all__ = ["paired_states", "system_means", "distinct_rows", "PairedStatesCombineFn", "MAX_TABLE"]

#: the most weights of a shard's distinct queries kept in memory at once (int64: 256 MB); beyond, each
#: block of queries draws its own
MAX_TABLE = 1 << 25


def system_means(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, order=None) -> np.ndarray:
    """Per run ``[start, end)`` of the columns of ``values`` (shape (n_metrics, n); with ``order``,
    shape (n_metrics, N) and the runs are of ``values[:, order]``, gathered here): the mean of each
    metric over the run, NaN skipped (NaN when every value is); shape (n_metrics, n_runs). Each sum
    is the correctly rounded exact sum (:func:`math.fsum`), so the means equal a per-run fsum.

    The work is on the transposed columns (one row of n_metrics values per request), so every
    reduction over a run adds contiguous rows."""
    x = np.ascontiguousarray(values.T)  # (n, n_metrics): a transposition, then a gather of rows
    if order is not None:
        x = x[order]
    n_runs, n_metrics = len(starts), x.shape[1]
    nan = np.isnan(x)
    lens = ends - starts
    counts = np.repeat(lens[:, None], n_metrics, axis=1)
    filled = x
    if n_runs and nan.any():
        cols = np.flatnonzero(nan.any(axis=0))  # NaN counts of the metrics with NaN (float32: exact below 2**24)
        exact = np.float32 if lens.max() < 1 << 24 else np.float64
        counts[:, cols] -= np.add.reduceat(nan[:, cols].astype(exact), starts, axis=0).astype(np.int64)
        filled = np.where(nan, 0.0, x)
    sums = filled[starts]
    several = np.flatnonzero(lens > 1)
    if len(several):
        exact, done = _run_sums(filled, starts, ends)
        pick = several[done[several].all(axis=1)] if n_metrics else several
        sums[pick] = exact[pick]
        rest = np.setdiff1d(several, pick)
        cols = filled.T.tolist() if len(rest) else []
        for i in rest.tolist():  # a run with values 2**40 apart, -0.0 or an infinity: math.fsum
            lo, hi = int(starts[i]), int(ends[i])
            for m, col in enumerate(cols):
                sums[i, m] = math.fsum(col[lo:hi])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.where(counts > 0, counts, 1), np.nan).T


_EXP = np.int64(0x7FF)


def _run_sums(x: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """Correctly rounded exact sums of the runs ``[start, end)`` (contiguous, covering the rows) of
    each column of ``x`` (shape (n, n_metrics), finite or not, no NaN), vectorised: ``(sums, done)``
    of shape (n_runs, n_metrics), ``done`` false where the run needs :func:`math.fsum` instead. Each
    value is split exactly as ``v1 * 2**g1 + v2 * 2**g2`` with integers ``|v| < 2**bits`` (``bits =
    53 - ceil(log2(longest run))``) on grids taken from the run's largest exponent (read from the
    bits of the doubles), then its residual's; the scalings by powers of two are exact products; the
    runs' sums of ``v1`` and of ``v2`` are exact (integers below 2**53), so their scaled values
    ``A``, ``B`` are exact doubles and ``A + B`` is the correctly rounded exact sum (one IEEE
    addition). Not done: runs whose values need a third level (values more than about 2**40 apart),
    with -0.0 (fsum keeps its sign) or an infinity. The sum being the exact sum correctly rounded,
    it does not depend on how the values were split."""
    lens = ends - starts
    bits = 53 - max(1, int(lens.max() - 1).bit_length())
    raw = x.view(np.int64)
    biased = (raw >> 52) & _EXP  # |v| < 2**(biased - 1022) for every double but inf / nan (biased 2047)
    bad = (biased == _EXP) | (raw == np.iinfo(np.int64).min)  # an infinity, -0.0
    if bad.any():
        done = ~np.logical_or.reduceat(bad, starts, axis=0)
        res = np.where(biased == _EXP, 0.0, x)
        biased = np.where(biased == _EXP, 0, biased)
    else:
        done = np.ones((len(starts), x.shape[1]), dtype=bool)
        res = x
    run = np.repeat(np.arange(len(starts)), lens)
    small = biased.astype(np.int16)
    bmax = np.maximum.reduceat(small, starts, axis=0).astype(np.int64)
    # a run of zeros (and subnormals, left to the residual, then to fsum) on the grid 1
    g = np.where(bmax > 0, np.maximum(bmax - 1022 - bits, -1074), 0)
    with np.errstate(over="ignore"):  # up is inf for runs below 2**-970: see below
        up, down = np.ldexp(1.0, -g), np.ldexp(1.0, g)  # exact powers of two (down may be subnormal)
    if np.isinf(up).any():  # a run of values below 2**-970: scale with ldexp
        ge = g[run]
        v = np.trunc(np.ldexp(res, -ge))
        res = res - np.ldexp(v, ge)
    else:
        v = np.trunc(res * up[run])  # |v| < 2**bits, exact (a power-of-two scaling of a double)
        res = res - v * down[run]  # the bits below 2**g, exact
    total = np.add.reduceat(v, starts, axis=0) * down  # exact
    if res.any():
        # every value of a run is a multiple of 2**(bmin - 1075) (bmin: its least biased exponent, zeros
        # left out, subnormals 1), so are the residuals (2**g is a coarser grid), and |residual| < 2**g:
        # any float sum of them is exact while len * 2**g <= 2**53 * 2**(bmin - 1075)
        small[(raw << 1) == 0] = 2047  # zeros (either sign): no grid
        np.maximum(small, 1, out=small)
        bmin = np.minimum.reduceat(small, starts, axis=0).astype(np.int64)
        need = np.maximum(lens - 1, 0)
        ceil_log = np.zeros(len(lens), dtype=np.int64)
        while (need >> ceil_log).any():  # ceil(log2(len)) per run
            ceil_log += (need >> ceil_log) > 0
        done &= (g + ceil_log[:, None] <= bmin - 1022)
        total = total + np.add.reduceat(res, starts, axis=0)  # exact, then one rounding
    return total, done


def distinct_rows(values: np.ndarray):
    """``(first, index)`` of the rows of ``values`` (shape (n_metrics, n)) that are identical bit for
    bit (NaN payloads and the sign of zero included): ``values[first]`` are the distinct rows in
    order of first appearance and ``values[first][index]`` is ``values``. Rows are grouped by a sum
    of their 64-bit patterns (wrapping), then compared whole."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    prints = bits.sum(axis=1, dtype=np.uint64).tolist() if bits.shape[1] else [0] * len(bits)
    first: list[int] = []
    index = np.empty(len(bits), dtype=np.int64)
    by_print: dict = {}
    for m, p in enumerate(prints):
        for j in by_print.get(p, ()):
            if np.array_equal(bits[first[j]], bits[m]):
                index[m] = j
                break
        else:
            by_print.setdefault(p, []).append(len(first))
            index[m] = len(first)
            first.append(m)
    return np.array(first, dtype=np.int64), index


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
    first, index = distinct_rows(values)
    if len(first) < len(values):  # identical metric columns (cutoffs past the rankings' length): once
        full, values = pc, np.asarray(values)[first]
        pc = PairedComparison(len(first), full.replicates, full.flips, full.exact_max, full.seed)
        for k, st in paired_states(pc, baseline, min_ts, system_id, attributes, query_id, values, window_micros,
                                   slice_specs, all_only):
            yield k, full.expand(st, index)
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
        # the signs as int8 (made float64 by blocks of rows for every key at once: FlipSums.add_many_keys)
        boot_table, sign_table = pc.boot.weights(qnames), pc.signs.weights(qnames, np.int8)
    wcode, wkeys = _windows(min_ts, window_micros)
    parts = []
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
        means = system_means(values, starts, ends, order)
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
            part = (means[:, base_seg[seg_group[segs]]], means[:, segs], [qnames[i] for i in q.tolist()], q)
            if sign_table is None:
                yield k, pc.compact(pc.add_many(pc.create(), *part[:3]))
            else:
                parts.append((k, part))
    if parts:  # every key's sign-flip sums in one pass over the shard's sign table
        for (k, _), st in zip(parts, pc.add_many_keys([p for _, p in parts], boot_table, sign_table)):
            yield k, pc.compact(st)


class PairedStatesCombineFn(BatchedStatesMixin, PairedCombineFn):
    """:class:`~streameval.beam.stats.PairedCombineFn` whose inputs are PairedComparison states.

    A state holds ``flips`` sign-flip sums per metric as rows of int64 limbs (about 30 MB for 95
    metrics and 10,000 flips), and the runner's lifted combine keeps the accumulators of every key
    of a bundle: so they are merged 2 at a time, not 16 (the peak memory of a job holds 2 states a
    key instead of one per shard; a merge adds rows, cheap next to the products that made them)."""

    BATCH = 2

    @property
    def states_ops(self):
        return self._pc
