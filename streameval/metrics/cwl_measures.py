"""C/W/L measures (INST, INSQ, BPM, SDCG, NERR8-11), Compat and Accuracy, as ir_measures' providers compute them.

C/W/L framework (Moffat, Bailey, Scholer and Thomas, TOIS 2017; cwl_eval: Azzopardi, Thomas and
Moffat, SIGIR 2019): a user reads rank i, then continues to rank i+1 with probability C(i); the
weight of rank i is W(i) = prod_{j<i} C(j) / sum_k prod_{j<k} C(j) and a measure is the expected
utility per item, sum_i W(i) g(i). As ir_measures' cwl_eval provider runs it
(``ir_measures/providers/cwl_eval.py``, cwl-eval 1.0.12 ``cwl/ruler``):

* the gain of a judged document: its grade g, negative grades as 0, clipped to [min_rel, max_rel]
  and scaled to (g - min_rel) / (max_rel - min_rel); a document outside the qrels gains 0;
* the ranking is read to cwl_eval's ``max_n`` = 1000 ranks: ranks past the ranked items gain 0
  and the C vector runs over all 1000 (W's normaliser sums over all of them);
* every document costs 1.

Compat (Clarke, Vtyurina and Smucker, TOIS 2021) as ir_measures' compat provider: the rank-biased
overlap of the run with an ideal ranking (the positive judgments by decreasing grade), to the
depth max(ranked items, positive judgments), normalised by the ideal's own overlap.

Accuracy as ir_measures' accuracy provider (``ir_measures/providers/accuracy_provider.py``): among the
top k, 1 - the mean over the relevant documents of the non-relevant ones ranked above each, divided by
the non-relevant ones in the top k.

Each function scores a :class:`streameval.metrics.kernel._Batch` on one MetricSpec (its parameters
in ``spec.opts``: ``T=1.0;min_rel=0;max_rel=3``), one value per ranked list. Pure numpy.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FUNCS", "CWL_DEPTH", "params_of"]

#: cwl_eval's max_n: ranks read (ir_measures passes max_n=1000)
CWL_DEPTH = 1000
# ranked lists scored at a time (a (rows, 1000) matrix per step)
_BLOCK = 2048


def params_of(spec) -> dict:
    """The parameters of ``spec`` (``spec.opts``: ``key=value`` parts) as numbers / booleans."""
    out = {}
    for part in spec.opts.split(";") if spec.opts else ():
        key, _, value = part.partition("=")
        if value in ("True", "False"):
            out[key] = value == "True"
        else:
            out[key] = float(value)
    return out


def _scaled_gains(b, prm):
    """Per ranked item, cwl_eval's gain: the grade (negative: 0) clipped to [min_rel, max_rel] and
    scaled to [0, 1]; 0 for an item outside the qrels (NaN grade)."""
    lo, hi = prm["min_rel"], prm["max_rel"]
    g = np.where(np.isnan(b.g), 0.0, b.g)
    rel = np.minimum(np.maximum(np.maximum(g, 0.0), lo), hi)
    return np.where(np.isnan(b.g), 0.0, (rel - lo) / (hi - lo))


def _expected_utility(b, spec, continuation):
    """sum_i W(i) g(i) per ranked list, W from ``continuation(G, r)`` (C per rank, G the gains
    (rows, CWL_DEPTH), r the ranks 1..CWL_DEPTH), as cwl_metrics.CWLMetric.w_vector."""
    prm = params_of(spec)
    gains = _scaled_gains(b, prm)
    out = np.zeros(b.n)
    r = np.arange(1, CWL_DEPTH + 1, dtype=np.float64)
    for lo in range(0, b.n, _BLOCK):
        hi = min(b.n, lo + _BLOCK)
        items = slice(int(b.off[lo]), int(b.off[hi]))
        rank = b.rank[items]
        keep = rank <= CWL_DEPTH
        G = np.zeros((hi - lo, CWL_DEPTH))
        G[b.qidx[items][keep] - lo, rank[keep] - 1] = gains[items][keep]
        C = continuation(G, r, prm, spec.k)
        reach = np.ones_like(C)
        reach[:, 1:] = np.cumprod(C[:, :-1], axis=1)
        w1 = 1.0 / reach.sum(axis=1)
        W = np.concatenate((w1[:, None], reach[:, 1:] * w1[:, None]), axis=1)
        out[lo:hi] = np.einsum("ij,ij->i", W, G)
    return out


def _c_inst(G, r, prm, k):
    # cwl_inst.py: T_i = T - (gain to rank i); C(i) = ((i + T + T_i - 1) / (i + T + T_i))^2
    T = prm["T"]
    Ti = T - np.cumsum(G, axis=1)
    return ((r + T + Ti - 1.0) / (r + T + Ti)) ** 2.0


def _c_insq(G, r, prm, k):
    # cwl_insq.py: C(i) = ((i + 2T - 1) / (i + 2T))^2, whatever the gains
    T = prm["T"]
    return np.broadcast_to(((r + 2.0 * T - 1.0) / (r + 2.0 * T)) ** 2.0, G.shape)


def _c_bpm(G, r, prm, k):
    # cwl_bpm.py (static BPM): continue while the gain so far is below T and the cost so far (i
    # documents of cost 1) below K, the cutoff
    return ((np.cumsum(G, axis=1) < prm["T"]) & (r < k)).astype(np.float64)


def _c_sdcg(G, r, prm, k):
    # cwl_dcg.py (NDCGCWLMetric(k)): C(i) = log2(i + 1) / log2(i + 2) for i < k, else 0: W(i) is
    # 1 / log2(i + 1) over the first k ranks, divided by its sum
    ln2 = np.log(2.0)
    c = (np.log(r + 1.0) / ln2) / (np.log(r + 2.0) / ln2)
    return np.broadcast_to(np.where(r < k, c, 0.0), G.shape)


def _c_nerr8(G, r, prm, k):
    # cwl_nerr.py, Eq. 8: C(i) = 1 - g(i) for i < k, else 0
    return np.where(r < k, 1.0 - G, 0.0)


def _c_nerr9(G, r, prm, k):
    # Eq. 9: C(i) = i / (i + 1) (1 - g(i)) for i < k, else 0
    return np.where(r < k, (1.0 * r / (r + 1.0)) * (1.0 - G), 0.0)


def _c_nerr10(G, r, prm, k):
    # Eq. 10: C(i) = p (1 - g(i))
    return prm["p"] * (1.0 - G)


def _c_nerr11(G, r, prm, k):
    # Eq. 11: C(i) = ((i + 2T - 1) / (i + 2T))^2 (1 - g(i))
    T = prm["T"]
    return (((r + 2.0 * T - 1.0) / (r + 2.0 * T)) ** 2.0) * (1.0 - G)


def _cwl(continuation):
    def score(b, spec):
        return _expected_utility(b, spec, continuation)

    score.__doc__ = f"C/W/L expected utility per item with {continuation.__name__[3:].upper()}'s C vector."
    return score


_inst, _insq, _bpm, _sdcg = _cwl(_c_inst), _cwl(_c_insq), _cwl(_c_bpm), _cwl(_c_sdcg)
_nerr8, _nerr9, _nerr10, _nerr11 = _cwl(_c_nerr8), _cwl(_c_nerr9), _cwl(_c_nerr10), _cwl(_c_nerr11)


def _compat(b, spec):
    """ir_measures' Compat(p, normalize) (compat_provider.py): RBO(run, ideal, p, depth) with
    RBO = sum_{d=1..depth} p^(d-1) |run_d & ideal_d| / d / sum_{d=1..depth} p^(d-1), run_d the run's
    first d documents, ideal_d the ideal's, depth = max(ranked items, positive judgments); the ideal
    lists the positive judgments by decreasing grade, a grade's ranked documents first in their run
    order (ir_measures orders them by run score, the others as score 0.0: positive scores assumed);
    normalised by RBO(ideal, ideal) when that is positive."""
    prm = params_of(spec)
    p, normalize = prm["p"], prm["normalize"]
    # positive judgments per query, and per ranked item the positive judgments of a higher grade
    pos = b.hv > 0
    n_pos = b.per_list(np.bincount(b.hq, weights=b.hc * pos, minlength=b.ng))
    with np.errstate(invalid="ignore"):
        rel = b.g > 0  # NaN: False
    # judgments above grade g of the item's query (its histogram's values are in descending order)
    above = np.zeros(b.N)
    ridx = np.flatnonzero(rel)
    if len(ridx):
        hist = (b.gidx[b.qidx[ridx]] if b.gidx is not None else b.qidx[ridx]).astype(np.int64)
        uniq = np.unique(b.hv)
        top = len(uniq)
        entry_key = b.hq.astype(np.int64) * (top + 1) + (top - np.searchsorted(uniq, b.hv))
        item_key = hist * (top + 1) + (top - np.searchsorted(uniq, b.g[ridx]))
        at = np.searchsorted(entry_key, item_key)  # the item's grade is one of its histogram's values
        before = np.cumsum(b.hc) - b.hc  # judgments of the earlier entries, all histograms
        above[ridx] = before[at] - before[b.joff[hist]]
    # among the same query's ranked items of the same grade, how many come before this one
    same_before = np.zeros(b.N)
    if b.N:
        ridx = np.flatnonzero(rel)
        order = np.lexsort((b.rank[ridx], b.g[ridx], b.qidx[ridx]))
        sidx = ridx[order]
        key_q, key_g = b.qidx[sidx], b.g[sidx]
        new = np.ones(len(sidx), dtype=bool)
        new[1:] = (key_q[1:] != key_q[:-1]) | (key_g[1:] != key_g[:-1])
        grp_start = np.maximum.accumulate(np.where(new, np.arange(len(sidx)), 0))
        same_before[sidx] = np.arange(len(sidx)) - grp_start
    ideal_pos = above + same_before + 1.0
    # the depth each ranked document enters both prefixes
    depth = np.maximum(b.lengths.astype(np.int64), n_pos.astype(np.int64))
    enters = np.maximum(b.rank.astype(np.float64), ideal_pos).astype(np.int64)
    doff = np.zeros(b.n + 1, dtype=np.int64)
    np.cumsum(depth, out=doff[1:])
    total = int(doff[-1])
    out = np.zeros(b.n)
    if total == 0:
        return out
    dq = np.repeat(np.arange(b.n), depth)
    d = np.arange(1, total + 1, dtype=np.int64) - np.repeat(doff[:-1], depth)
    hits = np.bincount(doff[b.qidx[rel]] + enters[rel] - 1, minlength=total).astype(np.float64)
    overlap = np.cumsum(hits)
    overlap -= np.repeat(np.concatenate(([0.0], overlap))[doff[:-1]], depth)
    longest = int(depth.max())
    weight = np.cumprod(np.concatenate(([1.0], np.full(longest - 1, p))))[d - 1]  # weight *= p, as rbo()
    norm = np.bincount(dq, weights=weight, minlength=b.n)
    score = np.zeros(b.n)
    np.divide(np.bincount(dq, weights=weight * overlap / d, minlength=b.n), norm, out=score, where=norm > 0)
    if not normalize:
        return score
    ideal_overlap = np.minimum(d, np.repeat(n_pos, depth))
    best = np.zeros(b.n)
    np.divide(np.bincount(dq, weights=weight * ideal_overlap / d, minlength=b.n), norm, out=best, where=norm > 0)
    np.divide(score, best, out=out, where=best > 0)
    return np.where(best > 0, out, score)


def _accuracy(b, spec):
    """ir_measures' Accuracy(rel=r)@k (accuracy_provider.py) per ranked list: over the first k ranked
    documents (all without a cutoff), a document with a grade of at least r is relevant, any other
    (unjudged included) is not; with R relevant and N non-relevant ones there, 1 - (sum over the relevant
    ones of the non-relevant ones above it) / (N R). Where ir_measures gives no value: 1.0 when R > 0 and
    N = 0 (no non-relevant document above any relevant one; ir_measures raises ZeroDivisionError), 0.0
    when R = 0 (ir_measures leaves the query out of its mean; here it stays in, scored 0, as every
    measure's query without a relevant document retrieved)."""
    top = b.rank <= spec.k if spec.k is not None else np.ones(b.N, dtype=bool)
    rel = b.rel & top
    non = ~b.rel & top
    cum = np.cumsum(non, dtype=np.int64)
    before = np.concatenate(([0], cum))[b.off[:-1]]  # non-relevant ones before each list
    above = (cum - np.repeat(before, b.lengths)).astype(np.float64)  # within the list, up to each item
    n_rel = b.segsum(rel)
    n_non = b.segsum(non)
    pairs = n_rel * n_non
    total = b.segsum(np.where(rel, above, 0.0))
    out = np.where(n_rel > 0, 1.0, 0.0)
    np.subtract(1.0, total / np.where(pairs > 0, pairs, 1.0), out=out, where=pairs > 0)
    return out


FUNCS = {
    "INST": _inst,
    "INSQ": _insq,
    "BPM": _bpm,
    "SDCG": _sdcg,
    "NERR8": _nerr8,
    "NERR9": _nerr9,
    "NERR10": _nerr10,
    "NERR11": _nerr11,
    "Compat": _compat,
    "Accuracy": _accuracy,
}
