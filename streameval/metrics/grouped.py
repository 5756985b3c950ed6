"""Fast path of :func:`~streameval.metrics.prepare.prepare` for the usual layout of a run: each
query's rows contiguous (any query order, any row order inside a query), as TREC run files and most
in-memory runs are. Same result as the general path, bit for bit (a property test checks it).

How: query ids are coded by run-length blocks (O(N), no sort of the run); integer docnos are used as
they are (strings are factorised); each query becomes one row of a padded 2-D array and is sorted on
its own (``argsort(axis=1)`` on short rows is far faster than one global sort); score ties are
resolved by docno on the few rows that have any; the join with the qrels uses needles already sorted
by (query, docno), so ``searchsorted`` walks memory in order.

Returns None when the layout does not fit (a query split in several blocks, or rows so unequal that
padding would more than double the memory); the caller then takes the general path.
"""

from __future__ import annotations

import numpy as np

from .kernel import RankedLists

__all__ = ["prepare_grouped"]

_MAX_KEY = 2**62


def _blocks(a: np.ndarray):
    """Run-length blocks of a 1-D array: (values, lengths, starts)."""
    n = len(a)
    if n == 0:
        return a[:0], np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.concatenate(([0], np.flatnonzero(a[1:] != a[:-1]) + 1)).astype(np.int64)
    return a[starts], np.diff(np.append(starts, n)), starts


def prepare_grouped(rq, rd, score, jq, jd, jgrade, *, depth, complete, score_precision, as_key_array,
                    factorize, judgment_histogram, prepared_cls):
    """See the module docstring. Arguments as :func:`prepare` (already validated), plus the
    helpers it shares (to keep one definition of each step)."""
    rq, jq = as_key_array(rq), as_key_array(jq)
    if len(rq) and len(jq) and rq.dtype.kind != jq.dtype.kind:
        rq, jq = rq.astype(str), jq.astype(str)
    rbv, rbl, _ = _blocks(rq)
    jbv, jbl, _ = _blocks(jq)
    qvocab = np.unique(np.concatenate((rbv, jbv)))
    rbc = np.searchsorted(qvocab, rbv).astype(np.int64)  # query code of each run block
    if len(np.unique(rbc)) != len(rbc):
        return None  # a query's rows are not contiguous
    jbc = np.searchsorted(qvocab, jbv).astype(np.int64)
    jqc = np.repeat(jbc, jbl)
    nq = max(len(qvocab), 1)

    # -- docno codes: integers as they are, strings factorised
    rd, jd = as_key_array(rd), as_key_array(jd)
    if rd.dtype.kind in "iu" and jd.dtype.kind in "iu" and (len(rd) or len(jd)):
        both = [a for a in (rd, jd) if len(a)]
        dmin = min(int(a.min()) for a in both)
        dmax = max(int(a.max()) for a in both)
        nd = dmax - dmin + 1
        if nq * nd >= _MAX_KEY:
            return None
        rdc, jdc = rd.astype(np.int64) - dmin, jd.astype(np.int64) - dmin

        def docno_of(code):
            return code + dmin
    else:
        dvocab, (rdc, jdc) = factorize(rd, jd)
        nd = max(len(dvocab), 1)

        def docno_of(code):
            return dvocab[code]

    # -- which queries are evaluated
    judged_queries = np.unique(jbc)
    run_queries = np.sort(rbc)
    unjudged = np.setdiff1d(run_queries, judged_queries, assume_unique=True)
    evaluated = judged_queries if complete else np.intersect1d(run_queries, judged_queries, assume_unique=True)
    missing = np.setdiff1d(judged_queries, run_queries, assume_unique=True)
    eval_pos = np.full(len(qvocab), -1, dtype=np.int64)
    eval_pos[evaluated] = np.arange(len(evaluated))

    # -- qrels sorted by (query, docno); duplicates refused
    jkey = jqc * nd + jdc
    jorder = np.argsort(jkey)
    jkey_s = jkey[jorder]
    jgrade_s = np.asarray(jgrade, dtype=np.float64)[jorder]
    if len(jkey_s):
        dup = np.flatnonzero(jkey_s[1:] == jkey_s[:-1])
        if len(dup):
            key = jkey_s[dup[0]]
            raise ValueError(f"qrels judge docno {str(docno_of(key % nd))!r} twice for query {str(qvocab[key // nd])!r} "
                             "(evaluate(..., judgment_conflicts='latest' or 'max') to resolve)")

    # -- the run's blocks of evaluated queries, one padded row each
    kept_blocks = eval_pos[rbc] >= 0
    lens = rbl[kept_blocks]
    qrow = rbc[kept_blocks]
    nb = len(lens)
    L = int(lens.max()) if nb else 0
    n_kept = int(lens.sum())
    if nb == 0 or nb * L > 2 * n_kept + 4096:
        return None
    if kept_blocks.all():
        s_k, d_k = score, rdc
    else:
        el = np.repeat(kept_blocks, rbl)
        s_k, d_k = score[el], rdc[el]
    dtype = np.float32 if score_precision == "float32" else np.float64
    neg = -np.asarray(s_k, dtype=np.float64).astype(dtype)
    if n_kept == nb * L:  # every query has L rows (a run cut at a fixed depth): plain reshapes
        S = neg.reshape(nb, L)
        D = np.asarray(d_k, dtype=np.int64).reshape(nb, L)
    else:
        # flat position of each row in the padded array: block b starts at b*L
        flat = np.arange(n_kept) + np.repeat(np.arange(nb) * L - (np.cumsum(lens) - lens), lens)
        S = np.full(nb * L, np.inf, dtype=dtype)
        S[flat] = neg
        S = S.reshape(nb, L)
        D = np.full(nb * L, -1, dtype=np.int64)
        D[flat] = d_k
        D = D.reshape(nb, L)
        del flat
    del neg

    # rank order: score descending; ties (rare) by docno descending on the rows that have them
    perm_s = np.argsort(S, axis=1)  # ties are put in docno order below
    Ss = np.take_along_axis(S, perm_s, axis=1)
    tied = ((Ss[:, 1:] == Ss[:, :-1]) & np.isfinite(Ss[:, 1:])).any(axis=1)
    del Ss
    rows_t = np.flatnonzero(tied)
    if len(rows_t):
        sub = np.lexsort((-D[rows_t].ravel(), S[rows_t].ravel(), np.repeat(np.arange(len(rows_t)), L)))
        perm_s[rows_t] = (sub % L).reshape(len(rows_t), L)
    del S

    # docno order inside each row: duplicate check and sorted join needles
    perm_d = np.argsort(D, axis=1)
    Ds = np.take_along_axis(D, perm_d, axis=1)
    del D
    dupmask = (Ds[:, 1:] == Ds[:, :-1]) & (Ds[:, 1:] >= 0)
    if dupmask.any():
        r, c = np.argwhere(dupmask)[0]
        raise ValueError(f"run ranks docno {str(docno_of(Ds[r, c]))!r} twice for query {str(qvocab[qrow[r]])!r}")
    rowperm = np.argsort(qrow)
    Ds = Ds[rowperm]
    valid = Ds >= 0
    needles = (qrow[rowperm][:, None] * nd + Ds)[valid]
    del Ds
    if len(jkey_s):
        hit = np.minimum(np.searchsorted(jkey_s, needles), len(jkey_s) - 1)
        g = np.where(jkey_s[hit] == needles, jgrade_s[hit], np.nan)
        del hit
    else:
        g = np.full(len(needles), np.nan)
    del needles
    G = np.full((nb, L), np.nan)
    G[valid] = g  # rows in query order, columns in docno order
    del g, valid
    G_rows = np.empty_like(G)
    G_rows[rowperm] = G  # back to block order
    G_orig = np.empty_like(G)
    np.put_along_axis(G_orig, perm_d, G_rows, axis=1)  # back to original column order
    del G, G_rows, perm_d
    G_rank = np.take_along_axis(G_orig, perm_s, axis=1)[rowperm]  # rank order, rows by query
    del G_orig, perm_s

    # -- depth cut and flattening in evaluated-query order
    lens_sorted = lens[rowperm]
    if depth is not None:
        lens_sorted = np.minimum(lens_sorted, depth)
        G_rank = G_rank[:, : min(L, depth)]
    take = np.arange(G_rank.shape[1])[None, :] < lens_sorted[:, None]
    grades = G_rank[take]
    counts = np.zeros(len(evaluated), dtype=np.int64)
    counts[eval_pos[qrow[rowperm]]] = lens_sorted
    offsets = np.zeros(len(evaluated) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])

    joff, hvals, hcounts = judgment_histogram(eval_pos[jkey_s // nd], jgrade_s, len(evaluated))
    return prepared_cls(
        qids=qvocab[evaluated],
        lists=RankedLists(offsets, grades, joff, hvals, hcounts),
        unjudged_qids=qvocab[unjudged],
        missing_qids=qvocab[missing],
    )
