"""Vectorised definitions of the trec_eval 10 measures of :mod:`streameval.metrics.trec_names`.

Each function scores a batch (:class:`streameval.metrics.kernel._Batch`: its running counts, per
query sums and judgment histograms) on one :class:`~streameval.metrics.names.MetricSpec`, with the
arithmetic of the trec_eval file named in its docstring (same operations in the same order, so
the same doubles).  Conventions as in :mod:`streameval.metrics.kernel`: ``NaN`` grade = not in the
qrels (trec_eval's RELVALUE_NONPOOL), negative = in the pool but unjudged (RELVALUE_UNJUDGED).
A list without items (a judged query without results under ``complete=True``, trec_eval ``-c``)
scores 0 on every measure, as trec_eval, which does not evaluate such a query, counts it; for the
geometric means it scores :data:`~streameval.metrics.trec_names.MIN_GEO_MEAN` (trec_eval's
``te_calc_avg_meas_s_gm`` patch-up).
"""

from __future__ import annotations

import numpy as np

from . import trec_names
from .trec_names import MIN_GEO_MEAN

__all__ = ["FUNCS", "WITHOUT_RESULTS", "relstrings", "without_results"]

#: trec_eval.h
INFAP_EPSILON = 0.00001


def _nrr(b):
    return b.count_top("cum_rel", b.rel)


def _gm_map(b, spec):
    """trec_eval m_gm_map.c: AP floored at MIN_GEO_MEAN (the summary is exp of the mean log)."""
    from .kernel import _ap

    return np.maximum(_ap(b, None), MIN_GEO_MEAN)


def _gm_bpref(b, spec):
    """trec_eval m_gm_bpref.c: bpref floored at MIN_GEO_MEAN (the summary is exp of the mean log)."""
    from .kernel import _bpref

    return np.maximum(_bpref(b, None), MIN_GEO_MEAN)


def _rel_precisions(b):
    """Precision at each relevant ranked item (queries in order), a 0 appended, the index of each
    query's first one and how many each query has."""
    def make():
        ridx = np.flatnonzero(b.rel)
        prec = b.cum_rel[ridx] / b.rank[ridx]
        counts = np.bincount(b.qidx[ridx], minlength=b.n).astype(np.int64)
        start = np.zeros(b.n + 1, dtype=np.int64)
        np.cumsum(counts, out=start[1:])
        return np.append(prec, 0.0), start[:-1], counts
    return b.cached("relprec", make)


def _recall_count(x, trec_eval_9: bool = False):
    """A recall level times num_rel (``x``, float array) as a count of relevant items: trec_eval 10's
    lround (half away from zero), or trec_eval 9's (long) (x + 0.9) (m_iprec_at_recall.c's comment;
    pytrec_eval keeps it)."""
    if trec_eval_9:
        return np.trunc(x + 0.9)
    fl = np.floor(np.abs(x))
    return np.sign(x) * np.where(np.abs(x) - fl >= 0.5, fl + 1.0, fl)


def _iprec(b, p, trec_eval_9: bool = False):
    """trec_eval m_iprec_at_recall.c at recall level p: the cutoff c = lround(p * num_rel) relevant
    items (``trec_eval_9``: (long) (p * num_rel + 0.9)); 0 when c > num_rel_ret, else the largest
    precision at or after the c-th relevant item (c <= 0: after the first), which is the largest
    precision at a relevant item from the c-th on."""
    ext, start, nrr = _rel_precisions(b)
    if b.n == 0:
        return np.zeros(0)
    c = _recall_count(p * b.num_rel.astype(np.float64), trec_eval_9)
    c1 = np.maximum(c, 1.0).astype(np.int64)
    ok = c1 <= nrr
    idx = np.empty(2 * b.n, dtype=np.int64)
    idx[0::2] = np.where(ok, start + c1 - 1, 0)
    idx[1::2] = np.where(ok, start + nrr, 0)
    best = np.maximum.reduceat(ext, idx)[0::2]
    return np.where(ok, best, 0.0)


def _iprec_at_recall(b, spec):
    """trec_eval m_iprec_at_recall.c (see :func:`_iprec`); ``rounding=trec_eval_9`` in ``spec.opts``:
    trec_eval 9's count of relevant items."""
    return _iprec(b, trec_names.values(spec)[0], "rounding=trec_eval_9" in spec.opts.split(";"))


def _11pt_avg(b, spec):
    """trec_eval m_11pt_avg.c: interpolated precision at each recall level, summed from the highest
    level down, divided by the number of levels."""
    levels = trec_names.values(spec)
    total = np.zeros(b.n)
    for p in reversed(levels):
        total = total + _iprec(b, p)
    return total / float(len(levels))


def _rprec_mult(b, spec):
    """trec_eval m_Rprec_mult.c: precision at c = (long) (m * num_rel + 0.9) items (relevant in the top
    c / c, even when fewer are ranked); 0 when c <= 0."""
    m = trec_names.values(spec)[0]
    c = np.trunc(m * b.num_rel.astype(np.float64) + 0.9)
    cut = np.maximum(c, 0).astype(np.int64)
    out = np.zeros(b.n)
    np.divide(b.count_top("cum_rel", b.rel, cut), c, out=out, where=c > 0)
    return out


def _infap(b, spec):
    """trec_eval m_infap.c (Yilmaz and Aslam, CIKM 2006): over the relevant ranked items at 0-based
    rank j, 1 if j = 0, else 1/(j+1) + j/(j+1) * ((rel-1 + nonrel + unjudged) / j) *
    ((rel-1 + eps) / (rel-1 + nonrel + 2 eps)) with the counts of the items at ranks <= j (items not
    in the pool skipped), summed and divided by num_rel."""
    with np.errstate(invalid="ignore"):
        pooled_unjudged = b.g < 0
    nonrel = b.within("cum_nonrel", b.judged & ~b.rel)
    unj = b.within("cum_pool_unjudged", pooled_unjudged)
    rel_before = b.cum_rel - 1.0
    fj = (b.rank - 1).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        term = (1.0 / (fj + 1.0) + (fj / (fj + 1.0)) * ((rel_before + nonrel + unj) / fj)
                * ((rel_before + INFAP_EPSILON) / ((rel_before + nonrel) + 2 * INFAP_EPSILON)))
    term = np.where(fj == 0, 1.0, term)
    return b.per_rel(b.segsum(np.where(b.rel, term, 0.0)))


def _bin_g(b, spec):
    """trec_eval m_binG.c: over the relevant ranked items, 1 / log2(2 + rank - relevant so far
    (inclusive)), summed and divided by num_rel."""
    with np.errstate(divide="ignore"):
        term = 1.0 / np.log2(2.0 + b.rank - b.cum_rel)
    return b.per_rel(b.segsum(np.where(b.rel, term, 0.0)))


def _relative_p(b, spec):
    """trec_eval m_rel_P.c: relevant in the top k / min(k, num_rel); 0 when num_rel is 0."""
    k = spec.k
    denom = np.minimum(float(k), b.num_rel)
    out = np.zeros(b.n)
    np.divide(b.count_top("cum_rel", b.rel, k), denom, out=out, where=b.num_rel > 0)
    return out


def _unj(b, spec):
    """trec_eval m_unjudged.c: items not judged (not in the qrels, or in the pool but unjudged) in
    the top k / k."""
    return b.count_top("cum_unjudged", ~b.judged, spec.k) / float(spec.k)


def _set_p(b, spec):
    """trec_eval m_set_P.c: num_rel_ret / num_ret."""
    out = np.zeros(b.n)
    np.divide(_nrr(b), b.lengths.astype(np.float64), out=out, where=b.lengths > 0)
    return out


def _set_recall(b, spec):
    """trec_eval m_set_recall.c: num_rel_ret / num_rel."""
    return b.per_rel(_nrr(b))


def _set_map(b, spec):
    """trec_eval m_set_map.c: num_rel_ret**2 / (num_ret * num_rel)."""
    nrr = _nrr(b)
    denom = b.lengths.astype(np.float64) * b.num_rel
    out = np.zeros(b.n)
    np.divide(nrr * nrr, denom, out=out, where=(b.lengths > 0) & (b.num_rel > 0))
    return out


def _set_relative_p(b, spec):
    """trec_eval m_set_rel_P.c: num_rel_ret / min(num_ret, num_rel)."""
    denom = np.minimum(b.lengths.astype(np.float64), b.num_rel)
    out = np.zeros(b.n)
    np.divide(_nrr(b), denom, out=out, where=(b.lengths > 0) & (b.num_rel > 0))
    return out


def _set_f(b, spec):
    """trec_eval m_set_F.c: (x+1) P R / (x P + R), set precision P and recall R, x the parameter
    (default 1); 0 when nothing relevant is ranked."""
    x = trec_names.values(spec)[0]
    nrr = _nrr(b)
    ok = nrr > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        P = nrr / b.lengths.astype(np.float64)
        R = nrr / b.num_rel
        f = (x + 1.0) * P * R / (x * P + R)
    return np.where(ok, f, 0.0)


def _utility(b, spec):
    """trec_eval m_utility.c: p1 * relevant ranked + p2 * non-relevant ranked + p3 * relevant not ranked
    + p4 * (num_docs_in_coll + num_rel_ret - num_ret - num_rel), num_docs_in_coll from
    ``MetricOptions.num_docs_in_coll`` (trec_eval -N; 0 by default). A list without items scores 0
    (trec_eval's -c clean-up of a query without results); :func:`without_results` gives the value of a
    query whose results were all removed (-J)."""
    p1, p2, p3, p4 = trec_names.values(spec)
    nrr = _nrr(b)
    ret = b.lengths.astype(np.float64)
    R = b.num_rel
    u = p1 * nrr + p2 * (ret - nrr) + p3 * (R - nrr) + p4 * (b.opts.num_docs_in_coll + nrr - ret - R)
    return np.where(b.lengths > 0, u, 0.0)


#: families whose value for a query without ranked items is not always the kernel's 0
WITHOUT_RESULTS = frozenset({"utility", "rbp_resid", "iprec_at_recall", "11pt_avg", "yaap"})


def without_results(spec, num_rel, stand_in, judged_only: bool = False, num_docs_in_coll: int = 0) -> np.ndarray:
    """trec_eval's value of ``spec`` (a family of :data:`WITHOUT_RESULTS`) for queries whose list is
    empty here. ``num_rel``: float array, the queries' relevant documents; ``stand_in``: bool array,
    True for a judged query without results scored under -c, False for a query whose retrieved
    documents trec_eval -J (``judged_only``) all removed.

    trec_eval scores a -c query on a stand-in ranking of one document outside the qrels (removed
    by -J), then sets num_ret, unj*, and the measures named exactly ``utility`` and ``rbp_resid``
    (default parameters) to 0; one named with its parameters (``utility_2,-1,0,0``,
    ``rbp_resid_p=0.5``) keeps the stand-in's value. With r documents ranked (1 for a stand-in, 0
    under -J), none relevant:

    * utility (m_utility.c): p2 * r + p3 * num_rel + p4 * (num_docs_in_coll - r - num_rel);
    * rbp_resid (m_rbp_resid.c): p + (1 - p) * 1 for the stand-in (r = 1, unjudged), else 0;
    * iprec_at_recall (m_iprec_at_recall.c): with r = 0, trec_eval's precision 0 / 0, NaN (printed
      ``-nan``), at every level p with lround(p * num_rel) <= 0, else 0;
    * 11pt_avg (m_11pt_avg.c): with r = 0, NaN when one of its levels is such a level, else 0;
    * yaap (m_yaap.c): no relevant item ranked, log(1 / (1 + num_rel)).
    """
    R = np.asarray(num_rel, dtype=np.float64)
    stand_in = np.asarray(stand_in, dtype=bool)
    f = spec.family
    if f == "yaap":
        return np.log((1.0 + 0.0) / (1.0 + R - 0.0))
    r = np.where(stand_in & (not judged_only), 1.0, 0.0)
    if f == "utility":
        p1, p2, p3, p4 = trec_names.values(spec)
        u = p1 * 0.0 + p2 * (r - 0.0) + p3 * (R - 0.0) + p4 * (num_docs_in_coll + 0.0 - r - R)
        return np.where(stand_in & (not spec.param), 0.0, u)
    if f == "rbp_resid":
        p = trec_names.values(spec)[0]
        return np.where(stand_in & bool(spec.param) & (r > 0), p + (1 - p) * 1.0, 0.0)
    if f not in ("iprec_at_recall", "11pt_avg"):
        raise ValueError(f"{spec.name}: not a family of WITHOUT_RESULTS")
    nan = np.zeros(len(R), dtype=bool)
    v9 = "rounding=trec_eval_9" in spec.opts.split(";")
    for p in trec_names.values(spec):
        nan |= _recall_count(p * R, v9) <= 0
    return np.where(nan & (r == 0), np.nan, 0.0)


def _yaap(b, spec):
    """trec_eval m_yaap.c (Robertson, 'On Smoothing Average Precision', ECIR 2012): with S the sum of
    the precisions at the relevant ranked items (map's numerator), log((1 + S) / (1 + num_rel - S))."""
    terms = b.cached("ap", lambda: np.where(b.rel, b.cum_rel / b.rank, 0.0))
    s = b.sum_top("ap", terms, None)
    return np.log((1.0 + s) / (1.0 + b.num_rel - s))


def gain_pairs(param: str) -> list:
    """trec_eval's ``rel_level=gain`` parameters of ndcg (``-m ndcg.1=3,2=9,4=4.5``): [(name,
    gain)] in the order given; ValueError (one line) when a part is not ``name=number``."""
    out = []
    for part in param.split(","):
        name, eq, value = part.partition("=")
        try:
            gain = float(value)
        except ValueError:
            gain = None
        if not eq or not name or gain is None or gain != gain or abs(gain) == float("inf"):
            raise ValueError(f"ndcg.{param}: parameters are rel_level=gain pairs (e.g. ndcg.1=3,2=9), got {part!r}")
        out.append((name, gain))
    return out


def _valid_int(text: str) -> bool:
    """gain_init.c valid_int: an optional sign and digits."""
    t = text[1:] if text[:1] in "+-" else text
    return bool(t) and all("0" <= c <= "9" for c in t)


def _gain_table(pairs, levels, counts):
    """gain_init.c setup_gains: (rel_level, gain, number judged at it) for the valid pairs in the
    order given, then every level 0 .. max judged level not among them at gain = level; sorted by
    increasing gain with trec_eval's comparator, which truncates the difference to an int (gains
    less than 1 apart compare equal; the sort is stable as glibc's merge sort)."""
    import functools

    table = [[int(n), g, 0] for n, g in pairs if _valid_int(n)]
    top = int(max(levels)) + 1 if len(levels) else 0
    have = dict(zip((int(v) for v in levels), (int(c) for c in counts)))
    for i in range(top):
        row = next((r for r in table if r[0] == i), None)
        if row is not None:
            row[2] = have.get(i, 0)
        else:
            table.append([i, float(i), have.get(i, 0)])
    table.sort(key=functools.cmp_to_key(lambda a, b: int(a[1] - b[1])))
    return table


def _ndcg_gains(b, spec):
    """trec_eval m_ndcg.c with ``rel_level=gain`` parameters (gain_init.c): a ranked document's gain
    is its level's (a level not given: the level itself; not judged or unjudged: 0 unless a pair
    names level -1 or -2); the ideal DCG walks the query's judged documents from the largest gain
    down, stopping at the first gain <= 0; ndcg = DCG / ideal DCG, 0 when the ideal is 0."""
    pairs = gain_pairs(spec.param)
    given = {}
    for n, g in pairs:
        if _valid_int(n):
            given.setdefault(int(n), g)
    g = b.g
    with np.errstate(invalid="ignore"):
        level = np.where(np.isnan(g), -1.0, np.where(g < 0, -2.0, g))
    gain = np.array([given.get(int(x), float(x) if x >= 0 else 0.0) for x in level.tolist()], dtype=np.float64)
    w = gain / np.log2(b.rank + 1.0)
    dcg = b.sum_top("dg_gains:" + spec.param, np.where(w == 0, 0.0, w), None)
    ideal = _ideal_gains(b, pairs)
    out = np.zeros(b.n)
    np.divide(dcg, ideal, out=out, where=ideal > 0)
    return out


def _ideal_gains(b, pairs):
    """gain_init.c's ideal DCG per ranked list with ``rel_level=gain`` pairs: the query's judged
    documents from the largest gain down, stopping at the first gain <= 0 (m_ndcg.c)."""
    ideal_h = np.zeros(b.ng)
    for h in range(b.ng):
        lo, hi = int(b.joff[h]), int(b.joff[h + 1])
        table = _gain_table(pairs, b.hv[lo:hi], b.hc[lo:hi])
        total, i = 0.0, 0
        for _, gl, count in reversed(table):
            if gl <= 0.0:
                break
            for _ in range(count):
                total += gl / np.log2(i + 2.0)
                i += 1
        ideal_h[h] = total
    return b.per_list(ideal_h)


def _ideal_dcg(b, spec):
    """trec_eval 10 m_ndcg.c's ``ideal_dcg``: the denominator of ndcg, the DCG of the query's
    judged documents sorted by decreasing gain (gain / log2(rank + 1) over ranks 1, 2, ... while the
    gain is positive), whatever the run ranks; 0 when the query has no positive gain. Gains: the
    grades by default (the kernel's ideal over the judgments, as plain ``ndcg`` divides by), or
    trec_eval's ``rel_level=gain`` pairs of ``spec.param`` (``ideal_dcg.1=3,2=9``, gain_init.c).
    Shape (b.n,), one value per ranked list."""
    if spec.param:
        return _ideal_gains(b, gain_pairs(spec.param))
    return b.ideal(None).copy()


def _num_nonrel_judged_ret(b, spec):
    """trec_eval m_num_nonrel_judged_ret.c: judged non-relevant ranked items."""
    return b.count_top("cum_nonrel", b.judged & ~b.rel)


def _powers(b, p):
    """p**i for i = 0..longest list, by repeated multiplication as trec_eval's ``cur_p *= p``."""
    longest = int(b.lengths.max()) if b.n else 0
    return np.cumprod(np.concatenate(([1.0], np.full(longest, p))))


def _rbp(b, spec):
    """trec_eval m_rbp.c (Moffat and Zobel, TOIS 2008): (1 - p) * sum over ranks i (from 0) of
    gain * p**i, the gain of a judged grade g its value, divided by the query's largest judged grade
    when that is above 1 (setup_gains, normalised to [0, 1]); other items gain 0. The relevance
    level is not used."""
    p = trec_names.values(spec)[0]
    pw = _powers(b, p)
    if "binary" in spec.opts.split(";"):
        # ir_measures' RBP(rel=r) through cwl_eval (ir_measures/providers/cwl_eval.py, IrmQrelHandler):
        # gain 1 for a grade at or above r, else 0, over the first 1000 ranks (cwl_eval's max_n)
        with np.errstate(invalid="ignore"):
            hit = (b.g >= b.opts.relevance_level) & (b.rank <= 1000)
        return (1.0 - p) * b.segsum(np.where(hit, pw[b.rank - 1], 0.0))
    if "ranx" in spec.opts.split(";"):
        # ranx's rbp.95 (ranx/metrics/rank_biased_precision.py, 0.3.21): the gain is the grade itself
        # for the judgments at or above its relevance level (rel_lvl, the -lN suffix; default 1), 0
        # for the others; not divided by the largest grade
        with np.errstate(invalid="ignore"):
            gain = np.where(b.g >= b.opts.relevance_level, b.g, 0.0)
        return (1.0 - p) * b.segsum(np.where(gain != 0, gain * pw[b.rank - 1], 0.0))
    has = np.diff(b.joff) > 0
    top = np.zeros(b.ng)
    top[has] = b.hv[b.joff[:-1][has]]  # histograms are in descending grade order
    top_item = b.per_list(top)[b.qidx]
    with np.errstate(invalid="ignore"):
        judged = b.g >= 0
    g = np.where(judged, b.g, 0.0)
    gain = np.where(top_item > 1, g / np.where(top_item > 1, top_item, 1.0), g)
    total = b.segsum(np.where(gain != 0, gain * pw[b.rank - 1], 0.0))
    return (1.0 - p) * total


def _rbp_resid(b, spec):
    """trec_eval m_rbp_resid.c: when some ranked items are not judged, p**num_ret + (1 - p) * sum of
    p**i over those items' ranks i (from 0): the most RBP could rise; else 0."""
    p = trec_names.values(spec)[0]
    pw = _powers(b, p)
    unj = ~b.judged
    total = b.segsum(np.where(unj, pw[b.rank - 1], 0.0))
    count = b.count_top("cum_unjudged", unj)
    return np.where(count > 0, pw[b.lengths] + (1 - p) * total, 0.0)


# ---- gains per relevance level: G, ndcg_rel, Rndcg ------------------------------------------------
# trec_eval's setup_gains (gain_init.c) with no parameters: the gain of a judged grade is the grade;
# the ideal ranking lists the query's positive judged grades in decreasing order (trec_eval walks
# its levels from the largest gain down, skipping empty ones). MetricOptions.gain does not apply.

def _seg_cumsum(values, lengths):
    """Running sums of ``values`` within each segment (``lengths``), each added one after the other
    from the segment's start, as trec_eval's loops add them."""
    n, total = len(lengths), len(values)
    out = np.zeros(total)
    if total == 0:
        return out
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    longest = int(lengths.max())
    if n * longest <= 4 * total + 1024:
        rows = np.repeat(np.arange(n), lengths)
        cols = np.arange(total) - np.repeat(starts, lengths)
        m = np.zeros((n, longest))
        m[rows, cols] = values
        return np.cumsum(m, axis=1)[rows, cols]
    for s, k in zip(starts.tolist(), lengths.tolist()):
        if k:
            out[s:s + k] = np.cumsum(values[s:s + k])
    return out


def _ideal(b):
    """Per histogram: the positive judged grades in decreasing order, expanded (``E``), each
    histogram's start in it and length (I), the running ideal DCG along it (``Ecum``), and per
    histogram the start and number of its distinct positive grades in ``b.hv``."""
    def make():
        pos = b.hv > 0
        counts = np.where(pos, b.hc, 0)
        I = np.bincount(b.hq, weights=counts, minlength=b.ng).astype(np.int64)
        E = np.repeat(b.hv[pos], b.hc[pos])
        estart = np.zeros(b.ng, dtype=np.int64)
        np.cumsum(I[:-1], out=estart[1:])
        j = np.arange(len(E)) - np.repeat(estart, I)
        Ecum = _seg_cumsum(E / np.log2(j + 2.0), I)
        ndist = np.bincount(b.hq, weights=pos, minlength=b.ng).astype(np.int64)
        return E, estart, I, Ecum, b.joff[:-1], ndist
    return b.cached("trec_ideal", make)


def _hist_of_lists(b):
    return np.arange(b.n) if b.gidx is None else b.gidx


def _level_gains(b):
    with np.errstate(invalid="ignore"):
        return np.where(b.g >= 0, b.g, 0.0)


def _run_dcg(b):
    """Running DCG at each ranked item with trec_eval's level gains (m_ndcg_rel.c, m_Rndcg.c)."""
    return b.cached("trec_rdcg", lambda: _seg_cumsum(_level_gains(b) / np.log2(b.rank + 1.0), b.lengths))


def _last_of_list(b, running):
    """The last running value of each list (0 for an empty one)."""
    last, has = b._last(None)
    return np.where(has, running[last] if len(running) else 0.0, 0.0)


def _g(b, spec):
    """trec_eval m_G.c: sum over ranked items of gain / log2(2 + cost so far - gain so far), the cost
    of rank j the ideal gain there (at least 1; 1 past the ideal list), divided by the sum of the
    positive judged grades."""
    E, estart, I, _, _, _ = _ideal(b)
    h = _hist_of_lists(b)[b.qidx]
    j = b.rank - 1
    inside = j < I[h]
    ideal = np.where(inside, E[np.where(inside, estart[h] + j, 0)] if len(E) else 0.0, 0.0)
    cost = np.where(ideal >= 1.0, ideal, 1.0)
    rg = _level_gains(b)
    so_far = (2.0 + b.within("trec_cost", cost)) - b.within("trec_gain", rg)
    with np.errstate(divide="ignore", invalid="ignore"):
        term = np.where(rg != 0, rg / np.log2(so_far), 0.0)
    total_ideal = b.per_list(np.bincount(b.hq, weights=np.where(b.hv > 0, b.hv * b.hc, 0.0), minlength=b.ng))
    out = np.zeros(b.n)
    np.divide(b.segsum(term), total_ideal, out=out, where=total_ideal > 0)
    return out


def _ndcg_rel(b, spec):
    """trec_eval m_ndcg_rel.c: nDCG at each ranked item of positive gain (the ideal cut at the
    ideal list's end), plus the final nDCG once for each positive judgment not ranked, divided by
    the number of positive judgments."""
    E, estart, I, Ecum, _, _ = _ideal(b)
    hl = _hist_of_lists(b)
    h = hl[b.qidx]
    rdcg = _run_dcg(b)
    gained = _level_gains(b) > 0  # implies I[h] >= 1
    at = np.where(gained, estart[h] + np.minimum(b.rank, I[h]) - 1, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        term = np.where(gained, rdcg / (Ecum[at] if len(Ecum) else 1.0), 0.0)
        Iq = I[hl]
        itotal = np.where(Iq > 0, Ecum[np.maximum(estart[hl] + Iq - 1, 0)] if len(Ecum) else 0.0, 0.0)
        missing = (Iq - b.count_top("trec_gained", gained)).astype(np.float64)
        total = b.segsum(term) + missing * _last_of_list(b, rdcg) / itotal
        out = np.where(total > 0, total / Iq, 0.0)
    return out


def _rndcg(b, spec):
    """trec_eval m_Rndcg.c: the mean of nDCG at each change of the ideal gain (after the last item of
    each positive grade of the ideal list, the run's DCG cut at the ranked items), plus the nDCG at
    the end of the ranking when it runs at least two items past the ideal list; 0 without relevant
    judgments (at the relevance level)."""
    if b.n == 0:  # no ranked list (no query with both results and judgments)
        return np.zeros(0)
    E, estart, I, Ecum, hstart, ndist = _ideal(b)
    hl = _hist_of_lists(b)
    rdcg = _run_dcg(b)
    nd = ndist[hl]
    rep = np.repeat(np.arange(b.n), nd)
    k = np.arange(len(rep)) - np.repeat(np.concatenate(([0], np.cumsum(nd)[:-1])), nd)
    hr = hl[rep]
    # transition t: the number of ideal positions before the next grade (cumulative counts)
    cum_counts = np.zeros(len(rep))
    if len(rep):
        cum_counts = _seg_cumsum(b.hc[hstart[hr] + k].astype(np.float64), nd)
    t = cum_counts.astype(np.int64)
    ret = b.lengths[rep]
    upto = np.minimum(t, ret)
    run_at = np.where(upto > 0, rdcg[np.maximum(b.off[:-1][rep] + upto - 1, 0)] if len(rdcg) else 0.0, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        term = run_at / Ecum[estart[hr] + t - 1] if len(rep) else np.zeros(0)
        total = np.bincount(rep, weights=term, minlength=b.n)
        Iq = I[hl]
        extra = b.lengths >= Iq + 2
        itotal = np.where(Iq > 0, Ecum[np.maximum(estart[hl] + Iq - 1, 0)] if len(Ecum) else 0.0, 0.0)
        total = np.where(extra & (itotal > 0), total + _last_of_list(b, rdcg) / itotal, total)
        count = nd + (extra & (itotal > 0))
        out = np.where((b.num_rel > 0) & (count > 0), total / count, 0.0)
    return out


FUNCS = {
    "gm_map": _gm_map,
    "gm_bpref": _gm_bpref,
    "iprec_at_recall": _iprec_at_recall,
    "11pt_avg": _11pt_avg,
    "Rprec_mult": _rprec_mult,
    "infAP": _infap,
    "binG": _bin_g,
    "relative_P": _relative_p,
    "unj": _unj,
    "set_P": _set_p,
    "set_recall": _set_recall,
    "set_map": _set_map,
    "set_relative_P": _set_relative_p,
    "set_F": _set_f,
    "utility": _utility,
    "num_nonrel_judged_ret": _num_nonrel_judged_ret,
    "rbp": _rbp,
    "rbp_resid": _rbp_resid,
    "yaap": _yaap,
    "ndcg": _ndcg_gains,  # with rel_level=gain parameters (spec.param); plain ndcg is the kernel's
    "ideal_dcg": _ideal_dcg,
    "G": _g,
    "ndcg_rel": _ndcg_rel,
    "Rndcg": _rndcg,
}


def relstrings(lists, length: int) -> list[str]:
    """trec_eval m_relstring.c: each query's relevance values of its first ``length`` ranked items
    (fewer when it ranks fewer; none when ``length`` <= 0), one character an item: the grade when it
    is 0 to 9, ``>`` above 9, ``-`` not in the qrels (NaN), ``.`` in the pool but unjudged (a
    negative grade). ``lists``: a :class:`~streameval.metrics.kernel.RankedLists`; returns one str
    per query. trec_eval prints it for single queries only (``-q``), quoted; a -c query without
    results gives ``''``."""
    off = np.asarray(lists.offsets, dtype=np.int64)
    grades = np.asarray(lists.grades, dtype=np.float64)
    n = max(int(length), 0)
    out = []
    for a, b in zip(off[:-1].tolist(), off[1:].tolist()):
        chars = []
        for g in grades[a:min(b, a + n)].tolist():
            if g != g:
                chars.append("-")
            elif g < 0:
                chars.append(".")
            elif g > 9:
                chars.append(">")
            else:
                chars.append(chr(ord("0") + int(g)))
        out.append("".join(chars))
    return out
