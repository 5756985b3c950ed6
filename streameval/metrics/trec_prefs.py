"""trec_eval 10's preference measures (``prefs_*``, ``-R prefs`` / ``-R qrels_prefs``) and its
judgment-group measures (``map_avgjg``, ``P_avgjg``, ``Rprec_mult_avgjg``, ``-R qrels_jg``).

Preferences (form_prefs_counts.c).  A query's judgments are lines ``(jg, jsg, rel_level, docno)``:
within a judgment sub-group (JSG) a document with a higher rel_level is preferred to one with a
lower rel_level; a judgment group (JG) with one JSG is a set of equivalence classes (ECs, every
pair of classes compared), a JG with several JSGs a preference array closed under transitivity.
Documents are numbered by their "docid rank": the judged documents the run retrieved, in rank
order (0 .. num_judged_ret - 1), then the judged documents it did not retrieve, in docno order.  A
preference A > B is *fulfilled* when both are retrieved and A is ranked above B (``ret``),
*implied fulfilled* when only A is retrieved (``imp``), not fulfilled otherwise; a preference
whose two documents are not retrieved is ``notoccur``.  Each measure's arithmetic follows its
m_prefs_*.c file (same operations in the same order, so the same doubles); the pair counts are
numpy matrices (one JG: a (k, k) matrix over its k documents; the query: (num_judged, num_judged)
counts over all JGs, trec_eval's COUNTS_ARRAY; int32, 4 bytes a pair of judged documents).

Errors (ValueError, one line): a document in two ECs of one JSG, a document with rel_level 0 and
non-0 in one JG, or contradictory preferences in one JG (trec_eval aborts on the last).

Judgment groups (form_res_rels_jg.c, m_map_avgjg.c, m_P_avgjg.c, m_Rprec_mult_avgjg.c): qrels whose
second column names a judgment group (a user); each measure is computed per JG as its trec_eval
namesake on that JG's judgments, summed over the JGs and divided by their number when there are
more than one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["PREFS_MEASURES", "PREFS_COUNTS", "QueryPrefs", "query_prefs", "prefs_values",
           "jg_values", "P_AVGJG_DEFAULT", "RPREC_MULT_AVGJG_DEFAULT", "NONPOOL", "UNJUDGED"]

#: in trec_eval's order (measures.c, TREC_MEAS); all_prefs is all of them
PREFS_MEASURES = ("prefs_num_prefs_poss", "prefs_num_prefs_ful", "prefs_num_prefs_ful_ret", "prefs_simp",
                  "prefs_pair", "prefs_avgjg", "prefs_avgjg_Rnonrel", "prefs_simp_ret", "prefs_pair_ret",
                  "prefs_avgjg_ret", "prefs_avgjg_Rnonrel_ret", "prefs_simp_imp", "prefs_pair_imp",
                  "prefs_avgjg_imp")
#: the counts (printed %ld, summed over queries rather than averaged)
PREFS_COUNTS = frozenset(PREFS_MEASURES[:3])
#: m_P_avgjg.c and m_Rprec_mult_avgjg.c default parameters
P_AVGJG_DEFAULT = (5, 10, 15, 20, 30, 100, 200, 500, 1000)
RPREC_MULT_AVGJG_DEFAULT = (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0)
#: trec_eval.h: a ranked document not in the judgments, and one in the pool but unjudged (rel < 0)
NONPOOL, UNJUDGED = -1, -2


def _div(a, b) -> float:
    """C's double division: 0 / 0 is NaN (trec_eval then keeps NaN in its sums)."""
    if b:
        return a / b
    return float("nan") if a == 0 else float("inf") if a > 0 else float("-inf")


@dataclass
class _JG:
    """One judgment group of a query: its documents (docid ranks, ascending), their pair counts
    ``m`` (m[i, j] = times document i is preferred to document j), and trec_eval's JG counts."""
    ranks: np.ndarray
    m: np.ndarray
    ecs: list | None  # EC form: (rel_level, docid ranks ascending) per class, decreasing rel_level
    rel: np.ndarray | None  # prefs-array form: each document's rel_level
    counts: dict = field(default_factory=dict)


@dataclass
class QueryPrefs:
    """A query's preferences against a ranking (trec_format.h's RESULTS_PREFS)."""
    num_judged: int
    num_judged_ret: int
    jgs: list
    pair_counts: np.ndarray  # (num_judged, num_judged): JGs preferring i to j
    #: measures whose value here differs from trec_eval's, which reads memory it does not own for them
    notes: set = field(default_factory=set)


def _areas(m: np.ndarray, kr: int) -> dict:
    """The five areas of form_prefs_counts.c on a JG's matrix whose first ``kr`` documents are
    retrieved (documents in docid-rank order)."""
    top = m[:kr, :kr]
    ful_ret = int(np.triu(top, 1).sum())
    not_ret = int(np.tril(top, -1).sum())
    ful_imp = int(m[:kr, kr:].sum())
    not_imp = int(m[kr:, :kr].sum())
    notoccur = int(m[kr:, kr:].sum())
    return {"ful_ret": ful_ret, "poss_ret": not_ret + ful_ret, "ful_imp": ful_imp,
            "poss_imp": not_imp + ful_imp, "notoccur": notoccur}


def _closure(a: np.ndarray) -> np.ndarray:
    """form_prefs_counts.c add_transitives: the transitive closure of the preference array (boolean
    matrix products until nothing changes), the diagonal cleared."""
    k = len(a)
    c = a.astype(np.float32)
    np.fill_diagonal(c, 1.0)
    while True:
        nxt = ((c @ c) > 0).astype(np.float32)
        if np.array_equal(nxt, c):
            break
        c = nxt
    out = c > 0
    out[np.arange(k), np.arange(k)] = False
    return out


def query_prefs(jg, jsg, rel_level, docno, ranked_docnos) -> QueryPrefs:
    """trec_eval's form_prefs_counts for one query.

    ``jg``, ``jsg``, ``docno``: sequences of str (one per judgment line), ``rel_level``: floats;
    ``ranked_docnos``: the run's documents for the query in rank order (after -M), distinct.
    Raises ValueError (one line) on the inconsistencies trec_eval refuses."""
    rel_level = [float(x) for x in rel_level]
    judged = sorted(set(docno))
    pos = {d: i for i, d in enumerate(ranked_docnos)}
    judged_set = set(judged)
    ret = [d for d in ranked_docnos if d in judged_set]
    nr = len(ret)
    rank_of = {d: i for i, d in enumerate(ret)}
    nxt = nr
    for d in judged:
        if d not in pos:
            rank_of[d] = nxt
            nxt += 1
    n = len(judged)
    lines = sorted(zip(jg, jsg, rel_level, (rank_of[d] for d in docno), docno),
                   key=lambda t: (t[0], t[1], -t[2], t[3]))
    pair_counts = np.zeros((n, n), dtype=np.int32)  # trec_eval: unsigned short
    jgs = []
    start = 0
    while start < len(lines):
        stop = start
        while stop < len(lines) and lines[stop][0] == lines[start][0]:
            stop += 1
        group = lines[start:stop]
        start = stop
        ranks = np.array(sorted({t[3] for t in group}), dtype=np.int64)
        local = {r: i for i, r in enumerate(ranks.tolist())}
        k = len(ranks)
        kr = int(np.searchsorted(ranks, nr))
        if len({t[1] for t in group}) > 1:
            j = _prefs_array_jg(group, local, k)
        else:
            j = _ec_jg(group, local, k)
        j.ranks = ranks
        j.counts = _areas(j.m, kr)
        if j.ecs is not None:
            rel = nonrel = rel_ret = nonrel_ret = 0
            for level, r in j.ecs:
                got = int(np.searchsorted(r, nr))
                if level > 0.0:
                    rel, rel_ret = rel + len(r), rel_ret + got
                else:
                    nonrel, nonrel_ret = nonrel + len(r), nonrel_ret + got
        else:
            is_rel, is_non = j.rel > 0.0, j.rel == 0.0
            rel, nonrel = int(is_rel.sum()), int(is_non.sum())
            rel_ret, nonrel_ret = int(is_rel[:kr].sum()), int(is_non[:kr].sum())
        j.counts.update(num_rel=rel, num_nonrel=nonrel, num_rel_ret=rel_ret, num_nonrel_ret=nonrel_ret)
        pair_counts[np.ix_(ranks, ranks)] += j.m
        jgs.append(j)
    return QueryPrefs(n, nr, jgs, pair_counts)


def _ec_jg(group, local, k) -> _JG:
    """form_jg_ec / add_ec_pref_to_jg: equivalence classes of equal rel_level (one JSG); every
    document of a class is preferred to every document of each lower class (a document listed
    twice counts twice)."""
    ecs, levels, counts = [], [], []
    for _, _, level, r, d in group:
        if not levels or levels[-1] != level:
            levels.append(level)
            ecs.append([])
            counts.append(np.zeros(k, dtype=np.int64))
        ecs[-1].append(r)
        counts[-1][local[r]] += 1
    v = np.array(counts)
    below = np.cumsum(v[::-1], axis=0)[::-1]  # below[c] = documents of classes c, c+1, ...
    below = np.vstack([below[1:], np.zeros((1, k), dtype=np.int64)])
    m = (v.T @ below).astype(np.int32)
    if np.any(np.diagonal(m)):
        i = int(np.flatnonzero(np.diagonal(m))[0])
        doc = next(t[4] for t in group if local[t[3]] == i)
        raise ValueError(f"document {doc!r} has two different rel_levels in one judgment sub-group "
                         f"(judgment group {group[0][0]!r}; trec_eval: occurs with different rel_level in same jsg)")
    return _JG(np.empty(0), m, [(lv, np.array(sorted(e), dtype=np.int64)) for lv, e in zip(levels, ecs)], None)


def _prefs_array_jg(group, local, k) -> _JG:
    """form_jg_pa / add_transitives: several JSGs; a document preferred to every document of its
    JSG with a lower rel_level, then the transitive closure."""
    rel = np.full(k, -1.0)
    a = np.zeros((k, k), dtype=bool)
    for i, (g, s, level, r, d) in enumerate(group):
        li = local[r]
        if (rel[li] > 0.0 and level == 0.0) or (rel[li] == 0.0 and level > 0.0):
            raise ValueError(f"document {d!r} has both 0 and non-0 rel_level in judgment group {g!r}")
        rel[li] = level
        j = i + 1
        while j < len(group) and group[j][1] == s and group[j][2] == level:
            j += 1
        while j < len(group) and group[j][1] == s:
            a[li, local[group[j][3]]] = True
            j += 1
    c = _closure(a)
    if np.any(c & c.T):
        raise ValueError(f"contradictory preferences in judgment group {group[0][0]!r} (a document preferred "
                         f"to another and the other to it, after transitivity; trec_eval aborts)")
    return _JG(np.empty(0), c.astype(np.int32), None, rel)


def _pair_terms(c: np.ndarray, nr: int, with_imp: bool):
    """m_prefs_pair*.c: per document pair with a preference, the share of its preferences that the
    ranking fulfils, in trec_eval's loop order (both retrieved, then one retrieved), and the
    number of pairs with neither retrieved."""
    top = c[:nr, :nr]
    fwd, back = np.triu(top, 1), np.triu(top.T, 1)
    tot = fwd + back
    mask = tot > 0
    terms = [fwd[mask] / tot[mask]]
    npairs = int(mask.sum())
    if with_imp:
        fwd, back = c[:nr, nr:], c[nr:, :nr].T
        tot = fwd + back
        mask = tot > 0
        terms.append(fwd[mask] / tot[mask])
        npairs += int(mask.sum())
    return np.concatenate(terms), npairs


def _seq_sum(x: np.ndarray) -> float:
    """The values added one after the other (trec_eval's ``sum +=``)."""
    return float(np.cumsum(x)[-1]) if len(x) else 0.0


class _PastClassEnd(Exception):
    pass


def _recalc_ec(j: _JG, nr: int, ret_only: bool, clamp: bool = False):
    """m_prefs_avgjg_Rnonrel*.c ``recalculate`` for an EC JG: the last class cut to its first R
    documents (R = num_rel, or num_rel_ret for _ret), the pairs counted as trec_eval's loops
    count them (the last class itself compared with its cut copy too)."""
    ecs = j.ecs
    R = j.counts["num_rel_ret"] if ret_only else j.counts["num_rel"]
    if R > len(ecs[-1][1]) and not clamp:
        # several classes at rel_level <= 0 (negative levels) and fewer than R documents in the last:
        # trec_eval reads past that class's end (other memory); here the class stops at its end
        raise _PastClassEnd()
    new_nonrel = ecs[-1][1][:R]

    def count(a, b):
        if ret_only:
            a, b = a[a < nr], b[b < nr]
            ful = int(len(b) * len(a) - np.searchsorted(b, a, side="right").sum())
        else:
            aa = a[a < nr]
            ful = int(len(b) * len(aa) - np.searchsorted(b, aa, side="right").sum())
        return ful, len(a) * len(b) - ful

    ful = poss = 0
    K = len(ecs)
    for e1 in range(K):
        for e2 in range(e1 + 1, K - 1):
            f, p = count(ecs[e1][1], ecs[e2][1])
            ful, poss = ful + f, poss + p
    for e1 in range(K):
        f, p = count(ecs[e1][1], new_nonrel)
        ful, poss = ful + f, poss + p
    return ful, poss + ful


def _recalc_pa(j: _JG, nr: int, n: int, ret_only: bool):
    """m_prefs_avgjg_Rnonrel*.c ``recalculate`` for a prefs-array JG: non-relevant documents after
    the (num_rel + 1)-th one (docid-rank order; among the retrieved ones for _ret) left out."""
    rel = np.full(n, -1.0)
    rel[j.ranks] = j.rel
    limit = nr if ret_only else n
    nonrel_pos = np.flatnonzero(rel[:limit] == 0.0)
    R = j.counts["num_rel"]
    first_discarded = int(nonrel_pos[R]) if len(nonrel_pos) > R else limit
    keep = ~((np.arange(n) >= first_discarded) & (rel == 0.0))
    keep_local = keep[j.ranks]
    m = j.m[np.ix_(keep_local, keep_local)]
    kr = int((j.ranks[keep_local] < nr).sum())
    a = _areas(m, kr)
    if ret_only:
        return a["ful_ret"], a["poss_ret"]
    ful = a["ful_ret"] + a["ful_imp"]
    return ful, a["poss_ret"] + a["poss_imp"] + a["notoccur"]


def _rnonrel(q: QueryPrefs, ret_only: bool) -> float:
    total = 0.0
    for j in q.jgs:
        c = j.counts
        if ret_only:
            R, N = c["num_rel_ret"], c["num_nonrel_ret"]
        else:
            R, N = c["num_rel"], c["num_nonrel"]
        if R >= N:
            if ret_only:
                ful, poss = c["ful_ret"], c["poss_ret"]
            else:
                ful = c["ful_ret"] + c["ful_imp"]
                poss = c["poss_ret"] + c["poss_imp"] + c["notoccur"]
            ful += c["num_rel_ret"] * (R - N)
            poss += c["num_rel"] * (R - N)
        elif j.ecs is not None:
            try:
                ful, poss = _recalc_ec(j, q.num_judged_ret, ret_only)
            except _PastClassEnd:
                q.notes.add("prefs_avgjg_Rnonrel" + ("_ret" if ret_only else ""))
                ful, poss = _recalc_ec(j, q.num_judged_ret, ret_only, clamp=True)
        else:
            ful, poss = _recalc_pa(j, q.num_judged_ret, q.num_judged, ret_only)
        total += _div(ful, poss)
    return total / len(q.jgs) if total > 0.0 else 0.0


def prefs_values(q: QueryPrefs, wanted=PREFS_MEASURES) -> dict:
    """The values of the preference measures ``wanted`` (names of :data:`PREFS_MEASURES`) for one
    query, as trec_eval's m_prefs_*.c compute them (counts as int, the rest float; a ratio with
    nothing possible is 0)."""
    out = {}
    cs = [j.counts for j in q.jgs]
    ful_ret = sum(c["ful_ret"] for c in cs)
    ful_imp = sum(c["ful_imp"] for c in cs)
    poss_ret = sum(c["poss_ret"] for c in cs)
    poss_imp = sum(c["poss_imp"] for c in cs)
    notoccur = sum(c["notoccur"] for c in cs)
    nr = q.num_judged_ret
    for name in wanted:
        if name == "prefs_num_prefs_poss":
            v = poss_ret + poss_imp + notoccur
        elif name == "prefs_num_prefs_ful":
            v = ful_ret + ful_imp
        elif name == "prefs_num_prefs_ful_ret":
            v = ful_ret
        elif name in ("prefs_simp", "prefs_simp_ret", "prefs_simp_imp"):
            ful = ful_ret + (0 if name == "prefs_simp_ret" else ful_imp)
            poss = poss_ret + (0 if name == "prefs_simp_ret" else poss_imp) + (notoccur if name == "prefs_simp" else 0)
            v = ful / poss if poss else 0.0
        elif name in ("prefs_pair", "prefs_pair_ret", "prefs_pair_imp"):
            terms, npairs = _pair_terms(q.pair_counts, nr, name != "prefs_pair_ret")
            if name == "prefs_pair":
                rest = q.pair_counts[nr:, nr:]
                npairs += int((np.triu(rest, 1) + np.triu(rest.T, 1) > 0).sum())
            v = _seq_sum(terms) / npairs if npairs else 0.0
        elif name in ("prefs_avgjg", "prefs_avgjg_ret", "prefs_avgjg_imp"):
            total = 0.0
            for c in cs:
                ful = c["ful_ret"] + (0 if name == "prefs_avgjg_ret" else c["ful_imp"])
                poss = (c["poss_ret"] + (0 if name == "prefs_avgjg_ret" else c["poss_imp"])
                        + (c["notoccur"] if name == "prefs_avgjg" else 0))
                if poss:
                    total += ful / poss
            v = total / len(cs) if total > 0.0 else 0.0
        elif name == "prefs_avgjg_Rnonrel":
            v = _rnonrel(q, False)
        elif name == "prefs_avgjg_Rnonrel_ret":
            v = _rnonrel(q, True)
        else:
            raise ValueError(f"not a preference measure: {name!r}")
        out[name] = v
    return out


def jg_values(groups, *, level: float = 1, p_cutoffs=P_AVGJG_DEFAULT, rprec_mults=RPREC_MULT_AVGJG_DEFAULT,
              wanted=("map_avgjg", "P_avgjg", "Rprec_mult_avgjg")) -> dict:
    """map_avgjg, P_avgjg at ``p_cutoffs`` and Rprec_mult_avgjg at ``rprec_mults`` for one query.

    ``groups``: per judgment group (trec_eval's order, by JG id) a pair ``(ranked, grades)``:
    ``ranked`` the grades of the ranked documents in rank order (after -M and -J; NONPOOL for a
    document the JG did not judge, UNJUDGED for a negative grade), ``grades`` the JG's judged
    grades (all its qrels lines).  Relevant: grade >= ``level``.  Returns {"map_avgjg": float,
    "P_avgjg": [float per cutoff], "Rprec_mult_avgjg": [float per multiple]}."""
    n_jg = len(groups)
    amap = 0.0
    p = [0.0] * len(p_cutoffs)
    rp = [0.0] * len(rprec_mults)
    for ranked, grades in groups:
        ranked = np.asarray(ranked, dtype=np.float64)
        grades = np.asarray(grades, dtype=np.float64)
        rel = ranked >= level
        cum = np.cumsum(rel)
        num_ret = len(ranked)
        # form_res_rels_jg.c: num_rel counts the non-negative grades >= level
        num_rel = int(((grades >= 0) & (grades >= level)).sum())
        rel_ret = int(cum[-1]) if num_ret else 0
        if "map_avgjg" in wanted and rel_ret:
            ranks = np.flatnonzero(rel)
            s = _seq_sum(cum[ranks] / (ranks + 1.0))
            amap += s / num_rel
        for i, c in enumerate(p_cutoffs):
            top = int(cum[min(c, num_ret) - 1]) if min(c, num_ret) > 0 else 0
            p[i] += top / c
        for i, mult in enumerate(rprec_mults):
            cut = int(mult * num_rel + 0.9)
            if cut > num_ret:
                rp[i] += rel_ret / cut
            elif cut > 0:
                top = int(cum[cut - 1])
                if top:
                    rp[i] += top / cut
    if n_jg > 1:
        amap /= n_jg
        p = [x / n_jg for x in p]
        rp = [x / n_jg for x in rp]
    return {"map_avgjg": amap, "P_avgjg": p, "Rprec_mult_avgjg": rp}
