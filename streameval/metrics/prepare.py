"""From columnar run and qrels arrays to :class:`~streameval.metrics.kernel.RankedLists`.

Pure numpy. The ordering is trec_eval's (``form_res_rels.c``): score descending, ties broken by
docno descending in plain byte order (``strcmp``); the run's rank column is ignored. With
``tie_break="position"`` ties are broken by the logged position (ascending) instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .errors import judged_twice, ranked_twice
from .kernel import RankedLists
from .names import MAX_CUTOFF as MAX_RANK

__all__ = ["Prepared", "prepare", "factorize", "rank_order", "ranking_scores", "text_keys", "TextKeys", "ORDERS",
           "TIE_BREAKS", "SCORE_PRECISIONS", "DEFAULT_SCORE_PRECISION"]

ORDERS = ("score", "position")
TIE_BREAKS = ("docno", "position")
#: SCORE_PRECISIONS and DEFAULT_SCORE_PRECISION (scores compared as doubles unless told otherwise):
#: streameval.metrics.choices, numpy-free for the command lines
from .choices import DEFAULT_SCORE_PRECISION, SCORE_PRECISIONS  # noqa: E402


def check_ranking_options(*, depth=None, score_precision=DEFAULT_SCORE_PRECISION, tie_break="docno", order="score",
                          complete=False) -> None:
    """Checks the ranking options every engine takes, naming the argument: ``depth`` None or a
    positive int (trec_eval ``-M``), ``score_precision`` in :data:`SCORE_PRECISIONS`, ``tie_break``
    in :data:`TIE_BREAKS`, ``order`` in :data:`ORDERS`, ``complete`` a bool. Raises ``TypeError``
    for a value of the wrong type (``depth=1.5``, ``complete="yes"``), ``ValueError`` for one out
    of range."""
    if depth is not None:
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)):
            raise TypeError(f"depth must be a positive int or None, got {depth!r}")
        if not 1 <= depth <= MAX_RANK:
            raise ValueError(f"depth must be between 1 and {MAX_RANK} (the largest position), got {depth}")
    if score_precision not in SCORE_PRECISIONS:
        raise ValueError(f"score_precision must be one of {SCORE_PRECISIONS}, got {score_precision!r}")
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if not isinstance(complete, (bool, np.bool_)):
        raise TypeError(f"complete must be a bool, got {complete!r}")


def ranking_scores(scores, score_precision: str = DEFAULT_SCORE_PRECISION) -> np.ndarray:
    """Scores as the ranking compares them. ``"float64"`` (default): as given, as trec_eval 10
    compares them (``double sim`` in trec_format.h). ``"float32"``: rounded to single precision, as
    trec_eval 9 and pytrec_eval keep a run's score (a C ``float``), so two scores equal in single
    precision tie and fall to the docno tie-break (beyond float32's range: +-inf)."""
    if score_precision not in SCORE_PRECISIONS:
        raise ValueError(f"score_precision must be one of {SCORE_PRECISIONS}, got {score_precision!r}")
    s = np.asarray(scores, dtype=np.float64)
    if score_precision != "float32":
        return s
    with np.errstate(over="ignore"):  # beyond float32's range: +-inf, as C's float conversion gives
        return s.astype(np.float32)


def rank_order(query_codes, scores, item_codes, positions=None, *, order: str = "score",
               tie_break: str = "docno", score_precision: str = DEFAULT_SCORE_PRECISION) -> np.ndarray:
    """The permutation that lays items out query by query, each query in rank order.

    ``order="score"``: score descending, ties broken by ``tie_break``: ``"docno"`` (item code
    descending, trec_eval's ``comp_sim_docno``) or ``"position"`` (logged position ascending).
    ``order="position"``: logged position ascending (impression logs without scores). Remaining
    ties always fall to item code descending, so the order is total. Scores are compared at
    ``score_precision`` (see :func:`ranking_scores`). ``item_codes`` must sort like the item ids (see :func:`factorize`).
    All arrays are 1-D of one length; raises ValueError when positions are needed and missing.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be one of {TIE_BREAKS}, got {tie_break!r}")
    q = np.asarray(query_codes)
    d = np.asarray(item_codes)
    if order == "score":
        s = ranking_scores(scores, score_precision)
    if order != "score" or tie_break != "docno":
        if positions is None:
            raise ValueError(f"order={order!r}, tie_break={tie_break!r} needs logged positions")
        pos = np.asarray(positions, dtype=np.float64)
    fast = _packed_rank_order(q, s if order == "score" else None, d, pos if order != "score" or tie_break != "docno"
                              else None)
    if fast is not None:
        return fast
    if order == "score" and tie_break == "docno":
        return np.lexsort((-d, -s, q))
    if order == "position":
        return np.lexsort((-d, pos, q))
    return np.lexsort((-d, pos, -s, q))


def _packed_rank_order(q, s, d, pos):
    """:func:`rank_order`'s permutation by one stable argsort of one int64 key, when the keys fit in
    63 bits: query code, then (if given) the score descending as the 32-bit order-preserving integer
    image of its float32 value (-0.0 as 0.0, so equal scores tie as in the float comparison), then
    (if given) position ascending, then item code descending. float64 scores: rounding a double to
    float32 is monotone, so a strict order of the float32 values is the doubles' order; only where
    one query's doubles differ but round to one float32 (scores closer than float32 resolves) is the
    order refined, those rows alone sorted again by the doubles (:func:`_refine_doubles`). None when
    the keys do not fit (NaN, negative codes, non-integral or negative positions, large codes): the
    caller sorts by ``np.lexsort``, which gives the same permutation (both sorts are stable)."""
    n = len(q)
    if n == 0 or q.dtype.kind not in "iu" or d.dtype.kind not in "iu":
        return None
    keys = [q.astype(np.int64, copy=False)]
    s64 = s32 = None
    if s is not None:
        if s.dtype == np.float64:
            with np.errstate(over="ignore"):  # beyond float32's range: +-inf, still in order
                s32 = s.astype(np.float32)
            if not bool((s32 == s).all()):  # (all exact in float32: the float32 order is the doubles')
                s64 = s
        elif s.dtype == np.float32:
            s32 = s
        else:
            return None
        if np.isnan(s32).any():
            return None
        b = (s32 + np.float32(0.0)).view(np.int32).astype(np.int64)
        keys.append((2**32 - 1) - np.where(b < 0, -1 - b, b + 2**31))  # descending
    if pos is not None:
        if not (pos >= 0).all() or not (pos == np.floor(pos)).all() or pos.max() >= 2**40:
            return None
        keys.append(pos.astype(np.int64))
    d = d.astype(np.int64, copy=False)
    dk = d.max() - d  # descending
    keys.append(dk)
    if q.min() < 0 or d.min() < 0:
        return None
    bits = [int(k.max()).bit_length() for k in keys]
    if sum(bits) > 63:
        return None
    key = keys[0].copy()
    for k, b in zip(keys[1:], bits[1:]):
        key <<= b
        key |= k
    perm = np.argsort(key, kind="stable")
    if s64 is not None:
        # the bits below (query, float32 image): position and item
        _refine_doubles(perm, key, sum(bits[2:]), s64)
    return perm


def _refine_doubles(perm, key, low_bits, s64) -> None:
    """In place: ``perm`` sorted by (query, float32 image of the score, position, item) becomes
    sorted by (query, double, position, item). Slots of one query whose scores round to one float32
    are contiguous (a run); where a run holds different doubles, its slots are sorted again by the
    double descending, stably (equal doubles keep their (position, item) order): one stable argsort
    of (run, the double's distance below the run's largest) when that fits in 63 bits, as it does
    unless the doubles of a run lie far apart (near 0, beyond float32's range), else ``np.lexsort``."""
    prefix = key[perm]
    prefix >>= low_bits  # (query, float32 image)
    same = prefix[1:] == prefix[:-1]
    del prefix
    if not same.any():
        return
    ss = s64[perm]
    bad = same & (ss[1:] != ss[:-1])
    del ss
    if not bad.any():
        return
    run = np.empty(len(perm), dtype=np.int64)  # run of (query, float32 image) of each slot
    run[0] = 0
    np.cumsum(~same, out=run[1:])
    del same
    flagged = np.zeros(int(run[-1]) + 1, dtype=bool)
    flagged[run[1:][bad]] = True
    slots = np.flatnonzero(flagged[run])
    rows = perm[slots]
    r = run[slots]
    del run, flagged
    r -= r[0]
    # the doubles' order-preserving int64 image (-0.0 as 0.0, as the float comparison ties them)
    b = (s64[rows] + 0.0).view(np.int64)
    img = np.where(b < 0, b ^ np.int64(2**63 - 1), b)
    starts = np.flatnonzero(np.concatenate(([True], r[1:] != r[:-1])))
    top = np.maximum.reduceat(img, starts)
    span = top - np.minimum.reduceat(img, starts)  # (a span past 2**63 wraps negative: refused below)
    if int(r[-1]) < 2**30 and bool(((span >= 0) & (span < 2**32)).all()):
        k = np.repeat(top, np.diff(np.append(starts, len(r))))
        k -= img  # distance below the run's largest: descending
        k |= r << 32
        order = np.argsort(k, kind="stable")
    else:
        order = np.lexsort((-s64[rows], r))
    perm[slots] = rows[order]


@dataclass
class Prepared:
    """A run joined to its qrels, ready for :func:`~streameval.metrics.kernel.compute`.

    qids: the evaluated query ids, in ``lists`` order (sorted).
    lists: the ranked lists.
    unjudged_qids: query ids of the run that have no judgment at all (left out of the averages).
    missing_qids: query ids with judgments but no ranked items (scored 0 when ``complete``,
        otherwise left out).
    """

    qids: np.ndarray
    lists: RankedLists
    unjudged_qids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    missing_qids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))


def refuse_nul(a) -> None:
    """ValueError when a sequence of ids holds a string with NUL: numpy's string arrays drop
    trailing NULs, which would make ``"d1\x00"`` the id ``"d1"`` (the jobs' record checks reject
    such ids as dead letters, :data:`streameval.io.records.ID_FIELDS`)."""
    try:
        joined = "".join(a)
    except TypeError:  # not all strings (ints, None)
        joined = "".join(x for x in a if isinstance(x, str))
    if "\x00" in joined:
        bad = next(x for x in a if isinstance(x, str) and "\x00" in x)
        raise ValueError(f"ids must not contain NUL characters, got {bad!r}")


_POW10 = 10 ** np.arange(19, dtype=np.int64)


class TextKeys(NamedTuple):
    """Integer keys of integer ids that order as the ids' decimal text (``str(id)``: trec_eval's
    ``strcmp``), made by arithmetic, without converting any id to text: ``"10" < "2"``,
    ``"-1" < "-10" < "-2" < "0"`` (``-`` sorts before the digits).

    An id of ``k`` digits (of magnitude ``m``) is its digits padded on the right to ``width``
    (``m * 10**(width - k)``), then its length: ``padded * (width + 1) + k`` (a prefix first, as
    ``strcmp``: ``"1" < "10"``). Negative ids take the keys below :attr:`span` (ordered by their
    magnitude's text), the others the keys from it. Every key is in ``[0, limit)``; :meth:`ids`
    gives the ids back."""

    width: int  # the most digits of any id
    negative: bool  # whether any id is negative

    @property
    def span(self) -> int:
        return 10**self.width * (self.width + 1)

    @property
    def limit(self) -> int:
        return self.span * (2 if self.negative else 1)

    def keys(self, ids) -> np.ndarray:
        a = np.asarray(ids).astype(np.int64, copy=False)
        w = self.width
        m = np.abs(a) if self.negative else a
        k = np.searchsorted(_POW10[1:w], m, side="right") + 1  # digits (0..9: 1)
        key = _POW10[w - k]
        key *= m
        key *= w + 1
        key += k
        if self.negative:
            key += np.where(a < 0, 0, self.span)
        return key

    def ids(self, keys) -> np.ndarray:
        key = np.asarray(keys, dtype=np.int64)
        w = self.width
        neg = key < self.span if self.negative else np.zeros(len(key), bool)
        if self.negative:
            key = np.where(neg, key, key - self.span)
        m = (key // (w + 1)) // _POW10[w - key % (w + 1)]
        return np.where(neg, -m, m)


def text_keys(*arrays) -> TextKeys | None:
    """The :class:`TextKeys` of integer id arrays (all of them keyed alike, so keys compare across
    the arrays), from their smallest and largest id; None when an id has 18 or more digits (the
    keys would not fit in 62 bits: convert those ids to text)."""
    lo, hi = 0, 0
    for a in arrays:
        if len(a):
            lo, hi = min(lo, int(a.min())), max(hi, int(a.max()))
    if lo < -(10**17) or hi >= 10**17:
        return None
    return TextKeys(width=len(str(max(-lo, hi))), negative=lo < 0)


def _as_key_array(a) -> np.ndarray:
    if isinstance(a, (list, tuple)) or (isinstance(a, np.ndarray) and a.dtype.kind == "O"):
        refuse_nul(a)
    a = np.asarray(a)
    if a.dtype.kind in "iu":
        return a
    if a.dtype.kind == "O":
        a = a.astype(str)
    if a.dtype.kind not in "US":
        a = a.astype(str)
    return a


def factorize(*arrays):
    """Encode several arrays of keys over one shared vocabulary.

    Returns (vocabulary sorted ascending, [codes per input array]). Ids sort as text: strings in
    code-point order, which for ASCII and UTF-8 ids is trec_eval's ``strcmp`` order, integer ids as
    their decimal text (``10`` before ``2``: :class:`TextKeys`; the vocabulary holds the integers).
    """
    arrays = [_as_key_array(a) for a in arrays]
    kinds = {a.dtype.kind for a in arrays if len(a)}
    if kinds and kinds <= set("iu"):
        tk = text_keys(*arrays)
        if tk is not None:
            keys = [tk.keys(a) if len(a) else np.zeros(0, np.int64) for a in arrays]
            s = _sorted_unique(np.concatenate(keys))
            return tk.ids(s), [np.searchsorted(s, k).astype(np.int64) for k in keys]
    if len(kinds) > 1 or kinds & set("iu"):  # mixed kinds, or integers too long for keys: as text
        arrays = [a.astype(str) for a in arrays]
    s = _sorted_unique(np.concatenate(arrays) if arrays else np.zeros(0))
    return s, [np.searchsorted(s, a).astype(np.int64) for a in arrays]


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)`` by a sort: numpy 2's hash-based np.unique is several times slower on ids."""
    s = np.sort(a, kind="stable" if a.dtype.kind in "US" else None)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if len(s) else s


def judgment_histogram(qpos: np.ndarray, grades: np.ndarray, n_queries: int):
    """Per query, its distinct non-negative judged grades (descending) and how many of each.

    qpos: int64 (M,), the query's position 0..n_queries-1 for each judgment, -1 to skip it;
    grades: float64 (M,). Returns (offsets (n_queries+1,), values (H,), counts (H,)) as
    :class:`~streameval.metrics.kernel.RankedLists` wants them. Small integer grades are counted
    with one bincount; others by a sort.
    """
    keep = (qpos >= 0) & (grades >= 0)
    hq, hg = (qpos, grades) if keep.all() else (qpos[keep], grades[keep])
    top = float(hg.max()) if len(hg) else 0.0
    hgi = hg.astype(np.int64) if len(hg) and top < 64 else None
    if hgi is not None and np.all(hgi == hg):
        width = int(top) + 1
        hgi += hq * width
        table = np.bincount(hgi, minlength=n_queries * width)
        table = table.reshape(n_queries, width)[:, ::-1]  # descending grades
        nz = table > 0
        hvals = np.broadcast_to(np.arange(width - 1, -1, -1, dtype=np.float64), table.shape)[nz]
        hcounts = table[nz]
        per_query = nz.sum(axis=1)
    else:
        order = np.lexsort((-hg, hq))
        hq, hg = hq[order], hg[order]
        if len(hq):
            new = np.concatenate(([True], (hq[1:] != hq[:-1]) | (hg[1:] != hg[:-1])))
            starts = np.flatnonzero(new)
            hvals = hg[starts]
            hcounts = np.diff(np.concatenate((starts, [len(hq)])))
            per_query = np.bincount(hq[starts], minlength=n_queries)
        else:
            hvals, hcounts, per_query = np.zeros(0), np.zeros(0, np.int64), np.zeros(n_queries, np.int64)
    joff = np.zeros(n_queries + 1, dtype=np.int64)
    np.cumsum(per_query, out=joff[1:])
    return joff, hvals.astype(np.float64), hcounts.astype(np.int64)


def prepare(
    run_qid,
    run_docno,
    run_score,
    qrels_qid,
    qrels_docno,
    qrels_grade,
    *,
    depth: int | None = None,
    complete: bool = False,
    tie_break: str = "docno",
    run_position=None,
    order: str = "score",
    score_precision: str = DEFAULT_SCORE_PRECISION,
    fast_path: bool = True,
) -> Prepared:
    """Join a run to its qrels and lay out each query's ranked grades.

    Arguments are 1-D arrays of equal length per side: run query ids, docnos and scores (float);
    qrels query ids, docnos and grades (numbers). ``depth`` keeps the top ``depth`` items of each
    query (trec_eval ``-M``). ``complete`` (trec_eval ``-c``) also evaluates queries with judgments
    but no ranked items (they score 0 on every measure but num_rel). ``tie_break`` is ``"docno"``
    (trec_eval) or ``"position"`` (ascending ``run_position``); ``order="position"`` ranks by
    ``run_position`` alone (see :func:`rank_order`).

    ``fast_path=False`` skips the grouped fast path (:mod:`.grouped`), which gives the same
    result when it applies; tests compare the two.

    Raises ValueError for mismatched lengths, non-finite scores, a docno ranked twice for one query,
    or a (query, docno) judged twice.
    """
    run_score = np.asarray(run_score, dtype=np.float64)
    qrels_grade = np.asarray(qrels_grade, dtype=np.float64)
    n_run, n_qrels = len(run_score), len(qrels_grade)
    if len(run_qid) != n_run or len(run_docno) != n_run:
        raise ValueError("run_qid, run_docno and run_score must have the same length")
    if len(qrels_qid) != n_qrels or len(qrels_docno) != n_qrels:
        raise ValueError("qrels_qid, qrels_docno and qrels_grade must have the same length")
    # a finite sum means finite scores (no temporary array); otherwise look row by row
    with np.errstate(over="ignore"):  # a sum of huge finite scores may overflow: then look row by row
        total = run_score.sum() if order == "score" and n_run else 0.0
    if order == "score" and n_run and not np.isfinite(total) and not np.all(np.isfinite(run_score)):
        bad = int(np.flatnonzero(~np.isfinite(run_score))[0])
        raise ValueError(f"run score at row {bad} is not finite ({run_score[bad]})")
    if n_qrels and not np.all(np.isfinite(qrels_grade)):
        raise ValueError("qrels grades must be finite numbers")

    check_ranking_options(depth=depth, score_precision=score_precision, tie_break=tie_break, order=order,
                          complete=complete)
    if fast_path and order == "score" and tie_break == "docno":
        from .grouped import prepare_grouped

        fast = prepare_grouped(run_qid, run_docno, run_score, qrels_qid, qrels_docno, qrels_grade, depth=depth,
                               complete=complete, score_precision=score_precision, as_key_array=_as_key_array,
                               factorize=factorize, judgment_histogram=judgment_histogram, prepared_cls=Prepared,
                               text_keys=text_keys)
        if fast is not None:
            return fast

    qvocab, (rq, jq) = factorize(run_qid, qrels_qid)
    dvocab, (rd, jd) = factorize(run_docno, qrels_docno)
    nd = max(len(dvocab), 1)

    # -- order the run: query, then trec_eval's order
    order = rank_order(rq, run_score, rd, run_position, order=order, tie_break=tie_break,
                       score_precision=score_precision)
    rq, rd = rq[order], rd[order]

    # -- duplicate docnos within a query (trec_eval refuses them)
    rkey = rq * nd + rd
    if n_run:
        sk = np.sort(rkey)
        dup = np.flatnonzero(sk[1:] == sk[:-1])
        if len(dup):
            key = sk[dup[0]]
            raise ranked_twice(dvocab[key % nd], qvocab[key // nd])

    # -- qrels sorted by key, duplicates refused
    jkey = jq * nd + jd
    jorder = np.argsort(jkey, kind="stable")
    jkey_s, jgrade_s = jkey[jorder], qrels_grade[jorder]
    if n_qrels:
        dup = np.flatnonzero(jkey_s[1:] == jkey_s[:-1])
        if len(dup):
            key = jkey_s[dup[0]]
            raise judged_twice(dvocab[key % nd], qvocab[key // nd])

    # -- which queries are evaluated
    run_queries = np.unique(rq)
    judged_queries = np.unique(jq)
    unjudged = np.setdiff1d(run_queries, judged_queries, assume_unique=True)
    evaluated = judged_queries if complete else np.intersect1d(run_queries, judged_queries, assume_unique=True)
    missing = np.setdiff1d(judged_queries, run_queries, assume_unique=True)

    # -- keep run rows of evaluated queries, cut at depth
    eval_pos = np.full(len(qvocab), -1, dtype=np.int64)
    eval_pos[evaluated] = np.arange(len(evaluated))
    qpos = eval_pos[rq]
    keep = qpos >= 0
    counts_all = np.bincount(qpos[keep], minlength=len(evaluated))
    if depth is not None:
        if depth < 1:
            raise ValueError("depth must be positive")
        starts = np.concatenate(([0], np.cumsum(counts_all)))[:-1]
        kq = qpos[keep]
        rank0 = np.arange(len(kq)) - np.repeat(starts, counts_all)
        sub = rank0 < depth
        idx = np.flatnonzero(keep)[sub]
        keep = np.zeros(n_run, bool)
        keep[idx] = True
    qk, keyk = qpos[keep], rkey[keep]
    counts = np.bincount(qk, minlength=len(evaluated))
    offsets = np.zeros(len(evaluated) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])

    # -- join grades
    if n_qrels and len(keyk):
        hit = np.searchsorted(jkey_s, keyk)
        hitc = np.minimum(hit, n_qrels - 1)
        found = jkey_s[hitc] == keyk
        grades = np.where(found, jgrade_s[hitc], np.nan)
    else:
        grades = np.full(len(keyk), np.nan)

    # -- judgment histogram of each evaluated query
    jpos = eval_pos[jkey_s // nd]
    joff, hvals, hcounts = judgment_histogram(jpos, jgrade_s, len(evaluated))

    lists = RankedLists(offsets, grades, joff, hvals.astype(np.float64), hcounts.astype(np.int64))
    return Prepared(
        qids=qvocab[evaluated],
        lists=lists,
        unjudged_qids=qvocab[unjudged],
        missing_qids=qvocab[missing],
    )


def judged_only(prep: Prepared) -> Prepared:
    """trec_eval ``-J`` (form_res_rels.c, judged_docs_only_flag): every ranked item without a
    judgment (not in the qrels: NaN grade; in the pool but unjudged: negative grade) removed from
    its list, the judged items keeping their order (ranks close up). Applied after the depth cut
    (trec_eval cuts at ``-M`` first). A query whose items are all removed stays, with an empty list
    (trec_eval evaluates it with no retrieved document). Returns a new :class:`Prepared`."""
    lists = prep.lists
    off = np.asarray(lists.offsets, dtype=np.int64)
    grades = np.asarray(lists.grades, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        keep = grades >= 0  # False for NaN
    owner = np.repeat(np.arange(len(off) - 1), np.diff(off))
    counts = np.bincount(owner[keep], minlength=len(off) - 1)
    new_off = np.zeros(len(off), dtype=np.int64)
    np.cumsum(counts, out=new_off[1:])
    new_lists = RankedLists(new_off, grades[keep], lists.judged_offsets, lists.judged_values,
                            lists.judged_counts, lists.judged_index)
    return Prepared(qids=prep.qids, lists=new_lists, unjudged_qids=prep.unjudged_qids,
                    missing_qids=prep.missing_qids)
