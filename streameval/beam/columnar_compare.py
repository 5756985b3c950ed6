"""Paired comparisons against a baseline system on the columnar engine (``--compare-baseline``).

The same comparison rows as :class:`~streameval.beam.stats.CompareSystems` after
:class:`~streameval.beam.transforms.ScoreRankings`: a query's requests are all in one query shard of
the engine's scoring stage, so the pairing happens there, vectorised. Per (window, slice, query)
each system's value of a metric is the mean of its requests' values (NaN skipped: the exact sum,
:func:`math.fsum`, over the count, as :func:`streameval.beam.stats._system_means`); every system
present with the baseline is paired with it (``B - A``, A the baseline), and the shard's queries of a
(window, slice, A, B) key are added to one
:class:`~streameval.accumulators.paired.PairedComparison` state, merged across shards by
:class:`PairedStatesCombineFn`.
"""

from __future__ import annotations

import math

import numpy as np

from ..accumulators.paired import PairedComparison
from .columnar_clean import _labels, _windows
from .columnar_columns import _encode, _group_bounds, _ordered
from .combiners import BatchedStatesMixin
from .stats import PairedCombineFn

__all__ = ["paired_states", "system_means", "nested_means", "distinct_rows", "PairedStatesCombineFn", "MAX_TABLE"]

#: the most weights of a shard's distinct queries kept in memory at once (int64: 256 MB); beyond, each
#: block of queries draws its own
MAX_TABLE = 1 << 25


def system_means(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, order=None) -> np.ndarray:
    """Per run ``[start, end)`` of the columns of ``values`` (shape (n_metrics, n); with ``order``,
    shape (n_metrics, N) and the runs are of ``values[:, order]``, gathered here): the mean of each
    metric over the run, NaN skipped (NaN when every value is); shape (n_metrics, n_runs). Each sum
    is the correctly rounded exact sum (:func:`math.fsum`), so the means equal a per-run fsum.

    The work is on the metric columns as given (one row of n values per metric): numpy's
    ``reduceat`` over the last axis of a C-ordered array is several times faster than over the
    first, so the runs are gathered per metric and reduced along each metric's row."""
    return nested_means(values, starts, ends, order)[0]


def nested_means(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, order=None, first=None, last=None):
    """``(means, coarse)``: :func:`system_means` of the runs ``[start, end)`` and, with ``first`` and
    ``last``, of the coarser runs each made of the consecutive runs ``first[j]`` to ``last[j] - 1``
    (rows ``starts[first[j]]`` to ``ends[last[j] - 1]``; covering every run), shape (n_metrics,
    len(first)) (else None), from the same pass over the rows: each value is split once on its
    coarse run's grid (:func:`_run_sums`), so a coarse run's exact sum is the sum of its runs'
    exact partial sums. The same means, bit for bit, as :func:`system_means` of either runs."""
    x = np.asarray(values, dtype=np.float64)
    x = np.ascontiguousarray(x) if order is None else np.take(x, order, axis=1)  # (n_metrics, n)
    n_metrics = x.shape[0]
    nan = np.isnan(x)
    lens = ends - starts
    counts = np.repeat(lens[None, :], n_metrics, axis=0)
    filled = x
    if len(starts) and nan.any():
        rows = np.flatnonzero(nan.any(axis=1))  # NaN counts of the metrics with NaN (float32: exact below 2**24)
        exact = np.float32 if lens.max() < 1 << 24 else np.float64
        counts[rows] -= np.add.reduceat(nan[rows].astype(exact), starts, axis=1).astype(np.int64)
        filled = np.where(nan, 0.0, x)
    runs = [(starts, ends, counts)]
    if first is not None:
        runs.append((starts[first], ends[last - 1], np.add.reduceat(counts, first, axis=1)))
    longest = max((int((hi - lo).max()) for lo, hi, _ in runs if len(lo)), default=0)
    exact = _run_sums(filled, starts, ends, first, last) if longest > 1 else None
    out = []
    for i, (lo, hi, cnt) in enumerate(runs):
        sums = filled[:, lo]  # a run of one value: the value
        several = np.flatnonzero(hi - lo > 1)
        if len(several):
            total, done = exact[i]
            pick = several[done[:, several].all(axis=0)] if n_metrics else several
            sums[:, pick] = total[:, pick]
            rest = np.setdiff1d(several, pick)
            cols = filled.tolist() if len(rest) else []
            for r in rest.tolist():  # a run with values 2**40 apart, -0.0 or an infinity: math.fsum
                a, b = int(lo[r]), int(hi[r])
                for m, col in enumerate(cols):
                    sums[m, r] = math.fsum(col[a:b])
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append(np.where(cnt > 0, sums / np.where(cnt > 0, cnt, 1), np.nan))
    return out[0], (out[1] if first is not None else None)


def _ceil_log2(lens: np.ndarray) -> np.ndarray:
    """ceil(log2(len)) per run (0 for runs of one value)."""
    need = np.maximum(lens - 1, 0)
    out = np.zeros(len(lens), dtype=np.int64)
    while (need >> out).any():
        out += (need >> out) > 0
    return out


def _run_sums(x: np.ndarray, starts: np.ndarray, ends: np.ndarray, first=None, last=None):
    """Correctly rounded exact sums of the runs ``[start, end)`` (contiguous, covering the rows) of
    each row of ``x`` (shape (n_metrics, n), finite or not, no NaN), vectorised: a list of
    ``(sums, done)`` of shape (n_metrics, n_runs), ``done`` false where the run needs
    :func:`math.fsum` instead; with ``first`` / ``last`` (coarse runs of consecutive runs, as
    :func:`nested_means`) a second ``(sums, done)`` of the coarse runs.

    Each value is split exactly as ``v1 * 2**g + r`` with an integer ``|v1| < 2**bits`` (``bits =
    53 - ceil(log2(longest coarse run))``) on a grid ``2**g`` taken from its coarse run's largest
    exponent (read from the bits of the doubles; a run is its own coarse run without ``first``); the
    scalings by powers of two are exact products. Any run's (fine or coarse) sum of ``v1`` is an
    exact integer below 2**53 (a coarse run's: the sum of its runs'), so its scaled value ``A`` is
    exact; every residual ``r`` is a multiple of 2**(bmin - 1075) (bmin: the least biased exponent
    of the run's values) with ``|r| < 2**g``, so any float sum of the residuals of a subset of a run
    is exact while ``len * 2**g <= 2**53 * 2**(bmin - 1075)`` (checked per run; a coarse run that
    passes passes for each of its runs): ``B``, the residuals' sum (a coarse run's: the sum of its
    runs' ``B``), is exact and ``A + B`` is the correctly rounded exact sum (one IEEE addition). Not
    done: runs whose values need a third level (values more than about 2**40 apart), with -0.0 (fsum
    keeps its sign) or an infinity. The sum being the exact sum correctly rounded, it does not
    depend on how the values were split."""
    lens = ends - starts
    coarse = first is not None
    if not coarse:
        first, last = np.arange(len(starts)), np.arange(1, len(starts) + 1)
    clens = np.add.reduceat(lens, first) if coarse else lens
    bits = 53 - max(1, int(clens.max() - 1).bit_length())
    # the sign and biased exponent of each double: its top 16 bits (little-endian), shifted
    top = np.right_shift(x.view(np.uint16)[:, 3::4], 4)
    small = np.bitwise_and(top, 0x7FF, dtype=np.int16)  # |v| < 2**(small - 1022) but inf / nan (2047)
    zero = x == 0  # either sign
    inf = small == 2047
    bad = inf | (zero & (top > 0x7FF))  # an infinity, -0.0
    if bad.any():
        done = ~np.logical_or.reduceat(bad, starts, axis=1)
        res = np.where(inf, 0.0, x)
        small[inf] = 0
    else:
        done = np.ones((x.shape[0], len(starts)), dtype=bool)
        res = x
    cdone = np.logical_and.reduceat(done, first, axis=1) if coarse else None
    bmax = np.maximum.reduceat(small, starts, axis=1)
    if coarse:
        bmax = np.maximum.reduceat(bmax, first, axis=1)
    bmax = bmax.astype(np.int64)
    # a run of zeros (and subnormals, left to the residual, then to fsum) on the grid 1
    cg = np.where(bmax > 0, np.maximum(bmax - 1022 - bits, -1074), 0)  # per coarse run
    g = np.repeat(cg, last - first, axis=1) if coarse else cg  # per run
    with np.errstate(over="ignore"):  # up is inf for runs below 2**-970: see below
        up, down = np.ldexp(1.0, -g), np.ldexp(1.0, g)  # exact powers of two (down may be subnormal)
    if np.isinf(up).any():  # a run of values below 2**-970: scale with ldexp
        ge = np.repeat(g, lens, axis=1)
        v = np.trunc(np.ldexp(res, -ge))
        res = res - np.ldexp(v, ge)
    else:
        # (in place: every full-size temporary is fresh memory, its page faults cost as much as the arithmetic)
        v = np.repeat(up, lens, axis=1)
        np.trunc(np.multiply(res, v, out=v), out=v)  # |v| < 2**bits, exact (a power-of-two scaling)
        vd = np.repeat(down, lens, axis=1)
        np.multiply(v, vd, out=vd)
        res = np.subtract(res, vd, out=vd)  # the bits below 2**g, exact
    vsum = np.add.reduceat(v, starts, axis=1)  # exact integers
    total = vsum * down  # exact
    ctotal = np.add.reduceat(vsum, first, axis=1) * np.ldexp(1.0, cg) if coarse else None  # exact
    if res.any():
        small[zero] = 2047  # zeros (either sign): no grid
        np.maximum(small, 1, out=small)
        bmin = np.minimum.reduceat(small, starts, axis=1).astype(np.int64)
        done &= (g + _ceil_log2(lens)[None, :] <= bmin - 1022)
        rsum = np.add.reduceat(res, starts, axis=1)  # exact where done
        total = total + rsum  # one rounding
        if coarse:
            cdone &= (cg + _ceil_log2(clens)[None, :] <= np.minimum.reduceat(bmin, first, axis=1) - 1022)
            ctotal = ctotal + np.add.reduceat(rsum, first, axis=1)  # exact where cdone, then one rounding
    return [(total, done)] + ([(ctotal, cdone)] if coarse else [])


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


def _slice_means(values, wcode, qcode, Q, scode, S, attributes, nreq, slice_specs, all_only):
    """Per slice specification (``all`` first): ``(spec, label texts, means, seg_key)``, the means
    (shape (n_metrics, n_segments)) of the requests of each (window, label, query, system) segment,
    ``seg_key = ((window * n_labels + label) * Q + query) * S + system``, ascending. The first other
    specification's labels partition the requests (an absent attribute is a label; the ``all_only``
    requests are put in a label of their own, left out of its output): its segments are summed
    from the requests, sorted by (window, query, system, label), and the ``all`` segments are the
    sums of consecutive ones, from the same pass over the requests (:func:`nested_means`)."""
    labels = _labels(attributes, nreq, slice_specs)
    wq = (wcode * Q + qcode) * S + scode  # the key of the slice all
    drop = all_only is not None and all_only.any()
    if len(labels) > 1:  # the finer slice first, then all from its sums
        lcode, lvals = labels[1]
        L = len(lvals) + 1  # + the label of the all_only requests
        fine_key = wq * L + (np.where(all_only, L - 1, lcode) if drop else lcode)
        order, starts, ends = _group_bounds(fine_key)
        seg = fine_key[order[starts]]
        coarse = seg // L
        first = np.concatenate(([0], np.flatnonzero(coarse[1:] != coarse[:-1]) + 1))
        last = np.append(first[1:], len(seg))
        fine_means, all_means = nested_means(values, starts, ends, order, first, last)
        keep = np.flatnonzero(seg % L != L - 1) if drop else np.arange(len(seg))
        lab, rest = seg[keep] % L, seg[keep] // L
        key = ((rest // S // Q * (L - 1) + lab) * Q + rest // S % Q) * S + rest % S
        perm = np.argsort(key, kind="stable")  # the segments in the order of the direct computation's keys
        fine_means = fine_means[:, keep[perm]]
        yield 0, labels[0][1], all_means, coarse[first]
        yield 1, lvals, fine_means, key[perm]
        specs = range(2, len(labels))
    else:
        specs = range(len(labels))
    for spec in specs:
        lcode, lvals = labels[spec]
        group = (wcode * len(lvals) + lcode) * Q + qcode
        key = group * S + scode
        if spec and drop:  # not in the other slices: a key past every group
            key = np.where(all_only, -1, key)
        order, starts, ends = _group_bounds(key)
        if spec and drop:  # drop the run of -1 keys (sorted first)
            cut = int((key == -1).sum())
            first = int(np.searchsorted(starts, cut))
            order, starts, ends = order[cut:], starts[first:] - cut, ends[first:] - cut
        yield spec, lvals, system_means(values, starts, ends, order), key[order[starts]]


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
    for spec, lvals, means, seg_key in _slice_means(values, wcode, qcode, Q, scode, S, attributes, nreq, slice_specs,
                                                    all_only):
        seg_group, seg_sys = seg_key // S, seg_key % S
        # the baseline's segment of each (window, slice, query) group, and every other system's
        is_base = seg_sys == base
        base_seg = np.full(int(seg_group.max()) + 1, -1, dtype=np.int64)
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
