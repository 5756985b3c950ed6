"""AUC, histogram AUC and group AUC (GAUC) (:mod:`streameval.metrics.online`, whose docstring gives
the conventions and sources)."""

from __future__ import annotations

import math

import numpy as np

from .online_names import DEFAULT_GAUC_WEIGHTING, GAUC_WEIGHTINGS
from .online_sums import ratio_and_se

# --------------------------------------------------------------------------------------------
# AUC

def _labels01(labels, n: int) -> np.ndarray:
    y = np.asarray(labels)
    if y.shape != (n,):
        raise ValueError(f"labels have shape {y.shape}, scores ({n},)")
    if y.dtype == bool:
        return y
    if y.dtype.kind in "iuf":
        ok = (y == 0) | (y == 1)
        if not ok.all():
            raise ValueError(f"labels must be 0/1 or booleans, got {y[~ok][0]!r}")
        return y == 1
    raise ValueError(f"labels must be 0/1 or booleans, got dtype {y.dtype}")


def _scores(scores) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1:
        raise ValueError(f"scores must be one-dimensional, got shape {s.shape}")
    if not np.isfinite(s).all():
        raise ValueError(f"scores must be finite, got {s[~np.isfinite(s)][0]!r}")
    return s


def auc_counts(scores, labels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values, pos, neg)``: the distinct scores ascending and how many positives and negatives
    have each. ``scores``: shape (n,), finite; ``labels``: shape (n,), booleans or 0/1.
    Raises ValueError on a non-finite score or a label other than 0/1."""
    s = _scores(scores)
    y = _labels01(labels, len(s))
    values, inv = np.unique(s, return_inverse=True)
    pos = np.bincount(inv, weights=y, minlength=len(values)).astype(np.int64)
    tot = np.bincount(inv, minlength=len(values)).astype(np.int64)
    return values, pos, tot - pos


def _ints(a, narrow: bool = False) -> np.ndarray:
    """Counts as int64; with ``narrow``, unsigned counts narrower than 64 bits are kept as they are
    (for :func:`_u2` and :func:`_delong`, which sum and convert them explicitly)."""
    a = np.asarray(a)
    if narrow and a.dtype.kind == "u" and a.itemsize < 8:
        return a
    if a.dtype.kind not in "iu" and len(a):
        if not np.all(a == np.floor(a)):
            raise ValueError("counts must be integers")
    return a.astype(np.int64, copy=False)


def _u2(pos: np.ndarray, neg: np.ndarray, P: int, N: int) -> int:
    """Twice the Mann-Whitney U (an exact integer): sum over values of pos_v (2 neg_below_v + neg_v).
    ``pos``, ``neg``: int64 counts or narrower unsigned ones."""
    if 2 * P * N < 2**62:  # no int64 overflow anywhere below
        neg_below = np.cumsum(neg, dtype=np.int64)
        neg_below -= neg
        neg_below *= 2
        neg_below += neg
        return int(np.dot(pos, neg_below))
    total, below = 0, 0
    for p, n in zip(pos.tolist(), neg.tolist()):
        total += p * (2 * below + n)
        below += n
    return total


def auc_from_counts(pos, neg) -> tuple[float, int, int]:
    """``(auc, P, N)`` from per-score-value counts in ascending score order (or any monotone
    binning of the scores: then same-bin pairs count one half, see :func:`hist_auc_max_error`).

    AUC = (number of (positive, negative) pairs with the positive scored higher + half the tied
    pairs) / (P N), computed exactly in integers and correctly rounded. NaN when P or N is 0.
    Equal to scikit-learn's ``roc_auc_score`` (which integrates the ROC curve by trapezoids: ties
    form a diagonal segment, worth one half)."""
    pos, neg = _ints(pos), _ints(neg)
    P, N = int(pos.sum()), int(neg.sum())
    if P == 0 or N == 0:
        return (math.nan, P, N)
    return (_u2(pos, neg, P, N) / (2 * P * N), P, N)


def auc_delong_stderr(pos, neg) -> float:
    """DeLong's standard error of the AUC from per-score-value counts (ascending score order).

    DeLong, DeLong and Clarke-Pearson, Biometrics 44 (1988): with placement values
    V10(x) = (negatives below x + half the tied negatives) / N for each positive and
    V01(y) = (positives above y + half the tied positives) / P for each negative,
    Var = S10 / P + S01 / N, S10 and S01 their sample variances. Observations sharing a score share
    a placement value, so the counts suffice. NaN when P < 2 or N < 2."""
    pos, neg = _ints(pos), _ints(neg)
    P, N = int(pos.sum()), int(neg.sum())
    if P < 2 or N < 2:
        return math.nan
    return _delong(pos, neg, P, N, _u2(pos, neg, P, N) / (2 * P * N))


def _cumulative(counts: np.ndarray, fcounts: np.ndarray, total: int, exclusive: bool) -> np.ndarray:
    """The cumulative counts up to each value (``exclusive``: before it) as float64, a new array:
    summed in float64, exact while ``total`` (their sum) is below 2**53, else in int64."""
    if total < 2**53:
        out = np.cumsum(fcounts)
        if exclusive:
            out -= fcounts
        return out
    out = np.cumsum(counts, dtype=np.int64)
    if exclusive:
        out -= counts
    return out.astype(np.float64)


def _delong(pos: np.ndarray, neg: np.ndarray, P: int, N: int, auc: float) -> float:
    """:func:`auc_delong_stderr` of counts (int64 or narrower unsigned) with ``P``, ``N`` >= 2 and
    their ``auc``: the same float operations as ``v10 = (neg_below + 0.5 neg) / N``,
    ``s10 = dot(pos, (v10 - auc) ** 2) / (P - 1)`` (and v01, s01), done in place on three arrays
    (each new array of millions of values costs its page faults and memory), so the same bits:
    the cumulative counts are exact integers either way, and halving an integer count and doubling
    it back are exact."""
    fpos = pos.astype(np.float64)
    fneg = neg.astype(np.float64)
    v10 = _cumulative(neg, fneg, N, exclusive=True)  # neg_below
    fneg *= 0.5
    v10 += fneg  # neg_below + 0.5 neg (IEEE addition commutes)
    fneg *= 2.0
    v10 /= N
    v10 -= auc
    np.square(v10, out=v10)
    s10 = float(np.dot(fpos, v10)) / (P - 1)
    del v10
    v01 = _cumulative(pos, fpos, P, exclusive=False)  # positives at or below
    np.subtract(P, v01, out=v01)  # pos_above
    fpos *= 0.5
    v01 += fpos
    v01 /= P
    v01 -= auc
    np.square(v01, out=v01)
    s01 = float(np.dot(fneg, v01)) / (N - 1)
    return math.sqrt(s10 / P + s01 / N)


def auc_and_stderr(pos, neg) -> tuple[float, int, int, float]:
    """``(auc, P, N, DeLong stderr)``: :func:`auc_from_counts` and :func:`auc_delong_stderr` of the
    same counts, the counts converted and twice the U computed once (unsigned counts narrower than
    64 bits, as a held state's, are read as they are)."""
    pos, neg = _ints(pos, narrow=True), _ints(neg, narrow=True)
    P, N = int(pos.sum()), int(neg.sum())
    if P == 0 or N == 0:
        return (math.nan, P, N, math.nan)
    auc = _u2(pos, neg, P, N) / (2 * P * N)
    return (auc, P, N, _delong(pos, neg, P, N, auc) if P >= 2 and N >= 2 else math.nan)


def auc_score(scores, labels) -> float:
    """Exact AUC of ``scores`` (shape (n,)) against binary ``labels`` (shape (n,)); ties one half.
    NaN when a class is absent.

    The same integer as :func:`auc_from_counts` (twice the Mann-Whitney U), found without
    counting each distinct score: the positives' and the negatives' scores are sorted apart and
    each member of the smaller class is located among the other class by binary search (below:
    ``left``, below or tied: ``right``), 2U = sum(left + right) over the positives."""
    s = _scores(scores)
    y = _labels01(labels, len(s))
    P = int(np.count_nonzero(y))
    N = len(s) - P
    if P == 0 or N == 0:
        return math.nan
    if 2 * P * N >= 2**62:  # beyond int64 sums: the exact counting path
        _, pos, neg = auc_counts(s, y)
        return auc_from_counts(pos, neg)[0]
    ps, ns = s[y], s[~y]
    ps.sort()
    ns.sort()
    needles, hay = (ps, ns) if P <= N else (ns, ps)
    left = np.searchsorted(hay, needles, "left")
    lr = 2 * int(left.sum())
    tied = np.flatnonzero(hay[np.minimum(left, len(hay) - 1)] == needles)
    if len(tied):  # right - left: the other class's scores tied with the needle
        lr += int((np.searchsorted(hay, needles[tied], "right") - left[tied]).sum())
    # a positive wins 2 per negative below it and 1 per tie; a negative loses 2 per positive above
    # it and 1 per tie (2 (P - right) + (right - left) = 2 P - left - right)
    u2 = lr if P <= N else 2 * P * N - lr
    return u2 / (2 * P * N)


def hist_bin_index(scores, lo: float = 0.0, hi: float = 1.0, bins: int = 1000) -> np.ndarray:
    """Bin of each score: ``floor((s - lo) / (hi - lo) * bins)`` clipped to ``[0, bins - 1]``
    (scores below ``lo`` fall in the first bin, at or above ``hi`` in the last). Every step is a
    correctly rounded monotone operation, so the binning is monotone (s <= t implies
    bin(s) <= bin(t)), which is what the histogram AUC's error bound needs. Scalars give a 0-d
    array. Raises ValueError on bad bounds or a non-finite score."""
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"histogram range must be finite with lo < hi, got ({lo}, {hi})")
    if int(bins) != bins or bins < 1:
        raise ValueError(f"bins must be a positive integer, got {bins!r}")
    s = np.asarray(scores, dtype=np.float64)
    if not np.isfinite(s).all():
        raise ValueError("scores must be finite")
    x = np.floor((s - lo) / (hi - lo) * int(bins))
    return np.clip(x, 0, int(bins) - 1).astype(np.int64)


def hist_auc_max_error(pos, neg) -> float:
    """Bound on |histogram AUC - exact AUC|: the share of (positive, negative) pairs that fall in
    the same bin, times one half: ``sum_b pos_b neg_b / (2 P N)`` (per-bin counts). Pairs in
    different bins are ordered correctly by a monotone binning; a same-bin pair counts 1/2 where
    the truth is 0, 1/2 or 1. NaN when P or N is 0."""
    pos, neg = _ints(pos), _ints(neg)
    P, N = int(pos.sum()), int(neg.sum())
    if P == 0 or N == 0:
        return math.nan
    same = int(np.dot(pos, neg)) if P * N < 2**62 else sum(p * n for p, n in zip(pos.tolist(), neg.tolist()))
    return same / (2 * P * N)


# --------------------------------------------------------------------------------------------
# GAUC

def group_auc(groups, scores, labels) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """AUC of every group, vectorised.

    ``groups``: shape (n,), any hashable ids (or int codes); ``scores``, ``labels`` as
    :func:`auc_counts`. Returns ``(group_ids, auc, n_pos, n_neg)``, one entry per distinct group
    (sorted ids); ``auc`` is NaN for a group with a single class. Each group's AUC equals
    :func:`auc_score` on that group's rows.

    Speed: each row gets a 64-bit key (group code, then an order-preserving integer code of its
    score, :func:`_score_codes`); the positives' and the negatives' keys are sorted apart and each
    member of the smaller class is located among the other class by binary search, as
    :func:`auc_score` does, group by group. When the score code had to be shortened to fit beside
    the group's and some distinct scores share a code (checked on the sorted scores), the pairs
    of those scores are counted again exactly and the counts corrected. Too many groups for the
    key: ``np.lexsort``. All paths count the same integers."""
    s = _scores(scores)
    y = _labels01(labels, len(s))
    gids, g = _group_codes(np.asarray(groups))
    if len(g) != len(s):
        raise ValueError("groups, scores and labels must have the same length")
    G = len(gids)
    if len(s) == 0:
        return gids, np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64)
    counts = _u2_by_search(g, s, y, G)
    if counts is None:
        counts = _u2_of_blocks(*_lexsort_blocks(g, s, y.astype(np.int64)), G)
    u2, n_pos, n_neg = counts
    denom = 2 * n_pos * n_neg
    auc = np.full(G, math.nan)
    ok = denom > 0
    if len(denom) and denom.max() < 2**53:  # exact floats: the division is correctly rounded
        auc[ok] = u2[ok] / denom[ok]
    else:
        auc[ok] = [int(a) / int(b) for a, b in zip(u2[ok], denom[ok])]
    return gids, auc, n_pos, n_neg


def _group_codes(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct ids, code of each row) as ``np.unique(groups, return_inverse=True)``;
    integer ids over a range not much wider than the rows are coded by a table, in O(n)."""
    if groups.ndim == 1 and groups.dtype.kind in "iu" and len(groups):
        lo, hi = int(groups.min()), int(groups.max())
        if hi - lo <= 4 * len(groups) + (1 << 20):
            if lo == 0 and groups.dtype == np.int64:
                rel = groups
            elif groups.dtype.kind == "u":
                rel = groups - groups.dtype.type(lo)
            else:
                rel = groups.astype(np.int64) - lo
            present = np.zeros(hi - lo + 1, dtype=bool)
            present[rel] = True
            gids = (np.flatnonzero(present) + lo).astype(groups.dtype)
            if len(gids) == hi - lo + 1:  # every id in the range occurs: the code is the offset
                return gids, rel.astype(np.int64, copy=rel is groups)
            code = np.cumsum(present, dtype=np.int64) - 1
            return gids, code[rel]
    gids, g = np.unique(groups, return_inverse=True)
    return gids, g.reshape(-1)


_SIGN_OFF = np.int64(0x7FFFFFFFFFFFFFFF)


def _score_codes(s: np.ndarray, bits: int):
    """(code, shift): an order-preserving integer code of each float64 score, below ``2**bits``:
    the score's bits read as an integer (the magnitude bits of negatives flipped; +0.0 added
    first, so -0.0 and 0.0 share a code), minus the smallest, shifted right by ``shift`` to fit.
    s <= t implies code(s) <= code(t); distinct scores may share a code only when ``shift`` > 0."""
    lo, hi = float(s.min()) + 0.0, float(s.max()) + 0.0

    def ordered(x):  # the int64 that orders as the float
        k = int(np.float64(x).view(np.int64))
        return k ^ 0x7FFFFFFFFFFFFFFF if k < 0 else k

    base = ordered(lo)
    shift = max((ordered(hi) - base).bit_length() - bits, 0)
    code = (s + 0.0).view(np.uint64)
    if lo < 0:  # negatives: flip their magnitude bits (as int64: order-preserving)
        k = code.view(np.int64)
        flip = k >> 63
        flip &= _SIGN_OFF
        k ^= flip
        del flip
    code -= np.uint64(base & 0xFFFFFFFFFFFFFFFF)  # modulo 2**64: 0 .. max - min
    if shift:
        code >>= np.uint64(shift)
    return code, shift


def _u2_by_search(g: np.ndarray, s: np.ndarray, y: np.ndarray, G: int):
    """(u2, n_pos, n_neg) per group, int64, u2 twice the Mann-Whitney U (see
    :func:`group_auc`); None when the group code leaves fewer than 24 bits for the scores."""
    n = len(s)
    bg = max(int(G - 1).bit_length(), 1)
    bs = 64 - bg  # uint64 key: group | score code
    if bs < 24 or n >= 2**31:
        return None
    code, shift = _score_codes(s, bs)
    key = np.left_shift(g.astype(np.uint64, copy=False), np.uint64(bs))
    key |= code
    del code
    n_all = np.bincount(g, minlength=G)
    P = int(np.count_nonzero(y))
    N = n - P
    # needles: the smaller class, sorted; hay: the other class, sorted
    needles, hay = (key[y], key[~y]) if P <= N else (key[~y], key[y])
    needles.sort()
    hay.sort()
    B = np.uint64(bs)
    ng = (needles >> B).astype(np.intp)
    n_needles = np.bincount(ng, minlength=G).astype(np.int64)
    n_hay = n_all - n_needles
    n_pos, n_neg = (n_needles, n_hay) if P <= N else (n_hay, n_needles)
    u2 = np.zeros(G, dtype=np.int64)
    tied_cells = np.zeros(0, dtype=np.uint64)
    if len(needles) and len(hay):
        # each needle: the other class's keys below it (left) and below or tied (right); the
        # other class's rows in earlier groups are taken off by group below
        left = np.searchsorted(hay, needles, "left")
        tied = hay[np.minimum(left, len(hay) - 1)] == needles
        tied_at = np.flatnonzero(tied)
        lr = 2 * left
        if len(tied_at):
            lr[tied_at] += np.searchsorted(hay, needles[tied_at], "right") - left[tied_at]
            tied_cells = np.unique(needles[tied_at])
        del left, tied
        first = np.flatnonzero(np.concatenate(([True], ng[1:] != ng[:-1])))
        sums = np.zeros(G, dtype=np.int64)
        sums[ng[first]] = np.add.reduceat(lr, first)
        if P <= N:  # a positive wins 2 per negative of its group below it, 1 per tie
            u2 = sums - 2 * n_pos * (np.cumsum(n_neg) - n_neg)
        else:  # a negative loses 2 per positive of its group above it, 1 per tie
            u2 = 2 * n_pos * n_neg + 2 * n_neg * (np.cumsum(n_pos) - n_pos) - sums
    del needles, hay, ng
    if shift and len(tied_cells):
        # a shortened code may tie distinct scores: count the tied (group, code) cells exactly
        _correct_cells(u2, tied_cells, key, s, y, bs)
    return u2, n_pos, n_neg


def _correct_cells(u2, cells, key, s, y, bs) -> None:
    """The keys ``cells`` (sorted distinct (group, score code) keys holding both classes) were
    counted as ties, 1 per positive-negative pair: count those pairs exactly (their scores may
    differ below the code's resolution) and add the difference to ``u2``."""
    at = np.minimum(np.searchsorted(cells, key), len(cells) - 1)
    rows = np.flatnonzero(cells[at] == key)
    exact, cp, cn = _u2_of_blocks(*_lexsort_blocks(at[rows], s[rows], y[rows].astype(np.int64)), len(cells))
    fix = exact - cp * cn
    nz = np.flatnonzero(fix)
    np.add.at(u2, (cells[nz] >> np.uint64(bs)).astype(np.intp), fix[nz])


def _lexsort_blocks(g: np.ndarray, s: np.ndarray, y: np.ndarray):
    """Blocks of rows sharing (group, score), in (group, score) order, by ``np.lexsort``:
    (positives per block, negatives per block, group of each block)."""
    order = np.lexsort((s, g))
    g, s, y = g[order], s[order], y[order]
    new_block = np.ones(len(s), dtype=bool)
    new_block[1:] = (g[1:] != g[:-1]) | (s[1:] != s[:-1])
    bstart = np.flatnonzero(new_block)
    bpos = np.add.reduceat(y, bstart)
    bneg = np.add.reduceat(1 - y, bstart)
    return bpos, bneg, g[bstart]


def _u2_of_blocks(bpos, bneg, bg, G: int):
    """(u2, n_pos, n_neg) per group from the (group, score) blocks in order (every group has
    rows): u2 = sum over blocks of positives x (2 negatives below + negatives tied)."""
    new_group = np.ones(len(bg), dtype=bool)
    new_group[1:] = bg[1:] != bg[:-1]
    gstart = np.flatnonzero(new_group)
    cneg = np.cumsum(bneg)
    before_group = (cneg - bneg)[gstart]
    neg_below = cneg - bneg - np.repeat(before_group, np.diff(np.append(gstart, len(bg))))
    u2 = np.add.reduceat(bpos * (2 * neg_below + bneg), gstart)
    n_pos = np.add.reduceat(bpos, gstart)
    n_neg = np.add.reduceat(bneg, gstart)
    return u2, n_pos, n_neg


def gauc_weights(n_pos, n_neg, weighting: str = DEFAULT_GAUC_WEIGHTING) -> np.ndarray:
    """Weight of each group's AUC: ``"impressions"`` n_pos + n_neg (Zhou et al. 2018),
    ``"clicks"`` n_pos (positives), ``"unweighted"`` 1. Raises ValueError on another weighting."""
    n_pos = np.asarray(n_pos, dtype=np.float64)
    n_neg = np.asarray(n_neg, dtype=np.float64)
    if weighting == "impressions":
        return n_pos + n_neg
    if weighting == "clicks":
        return n_pos
    if weighting == "unweighted":
        return np.ones_like(n_pos)
    raise ValueError(f"weighting must be one of {GAUC_WEIGHTINGS}, got {weighting!r}")


def gauc(groups, scores, labels, weighting: str = DEFAULT_GAUC_WEIGHTING) -> tuple[float, int, int, float]:
    """``(gauc, groups_used, groups_excluded, stderr)``: the weighted mean of the groups' AUCs
    over the groups with both classes (the others are excluded and counted). Standard error of
    the ratio estimator (see :func:`ratio_from_sums`; residuals in a second pass, :func:`ratio_and_se`).
    NaN with 0 groups when none qualifies."""
    _, auc, n_pos, n_neg = group_auc(groups, scores, labels)
    ok = ~np.isnan(auc)
    w = gauc_weights(n_pos[ok], n_neg[ok], weighting)
    a = auc[ok]
    value, se = ratio_and_se(w, w * a)
    return value, int(ok.sum()), int((~ok).sum()), se
