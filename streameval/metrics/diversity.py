"""Diversity measures over subtopic (intent) judgments, as ndeval computes them.

A diversity judgment is ``(query, subtopic, document, grade)``: the document is relevant to that
subtopic of the query when ``grade >= rel`` (default 1; ndeval clips grades to 0/1, which is the same
for non-negative integer grades). Intent weights are uniform over the query's subtopics that have at
least one relevant document (ndeval's ``actualSubtopics``, written S below); a subtopic without a
relevant document is ignored.

Definitions (ndeval.c, version 4.5, TREC Web track 2009-2014; ``pyndeval`` 0.0.8 bundles it). For a
ranking, the gain of the document at rank r (1-based) is
``G(r) = sum over subtopics s it is relevant to of (1 - alpha) ** c_s(r)``, where ``c_s(r)`` is the
number of documents above rank r relevant to s (Clarke et al., SIGIR 2008). With ``D(r) = 1 / log2(r + 1)``:

=================  =================================================================================
measure            value at cutoff k (ranks past the end of the ranking contribute 0)
=================  =================================================================================
``alpha-DCG@k``    ``sum_{r<=k} G(r) D(r) / sum_{r<=k} S (1-alpha)^(r-1) D(r)`` (ndeval's "ideal ideal"
                   normalisation; at k = 1 ndeval leaves it unnormalised: ``G(1)``)
``alpha-nDCG@k``   ``alpha-DCG@k`` of the ranking / ``alpha-DCG@k`` of the ideal ranking (0 when the
                   ranking's is 0); Clarke et al. 2008
``ERR-IA@k``       as alpha-DCG with ``D(r) = 1 / r``: ``sum G(r) / r / sum S (1-alpha)^(r-1) / r``
                   (unnormalised at k = 1); Chapelle et al., CIKM 2009, with binary grades
``nERR-IA@k``      ``ERR-IA@k`` / the ideal ranking's (0 when the ranking's alpha-DCG@k is 0)
``NRBP``           ``(1 - (1-alpha) beta) / S * sum_r G(r) beta^(r-1)`` over the whole ranking;
                   Clarke et al., ICTIR 2009
``nNRBP``          NRBP / the ideal ranking's NRBP (NaN when S = 0: ndeval's 0 / 0)
``MAP-IA``         mean over the S subtopics of average precision with that subtopic's judgments
                   (whole ranking; divided by the subtopic's relevant documents)
``P-IA@k``         (relevant (document, subtopic) pairs in the top k) / (k S)
``strec@k``        subtopics with a relevant document in the top k / S (subtopic recall)
=================  =================================================================================

The ideal ranking is ndeval's greedy one (``idealResult``): at each rank the judged document with the
largest gain given the documents already placed, ties to the larger docno (byte order). A query with
S = 0 scores 0 on every measure but nNRBP. ndeval computes the cutoff measures to depth 20 only
(its ``DEPTH``); the formulas here hold for any k.

Inputs are numpy arrays: a query's ranking as a boolean matrix ``rel`` of shape (n ranked documents,
S) in rank order (row r: the subtopics the document at rank r + 1 is relevant to; unjudged rows all
False), and its judged relevant documents as a boolean matrix of shape (m, S), rows in docno order.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .errors import MetricNameError

__all__ = ["DiversitySpec", "MEASURES", "NDEVAL_COLUMNS", "parse_diversity", "is_diversity_name",
           "ranking_gains", "ideal_gains", "query_values", "evaluate_lists", "request_values",
           "batch_values", "spec_of", "DIVERSITY_ACCEPTED"]

#: ndeval's measures, in the order of its output columns
MEASURES = ("ERR-IA", "nERR-IA", "alpha-DCG", "alpha-nDCG", "NRBP", "nNRBP", "MAP-IA", "P-IA", "strec")
#: the measures without a cutoff
_NO_CUTOFF = {"NRBP", "nNRBP", "MAP-IA"}
#: ndeval's output columns (measure, cutoff), in its order
NDEVAL_COLUMNS = tuple((m, k) for m in MEASURES[:4] for k in (5, 10, 20)) + (
    ("NRBP", None), ("nNRBP", None), ("MAP-IA", None)) + tuple((m, k) for m in ("P-IA", "strec") for k in (5, 10, 20))
_USES_ALPHA = {"ERR-IA", "nERR-IA", "alpha-DCG", "alpha-nDCG", "NRBP", "nNRBP"}

# spelling (lower case, '-' and '_' alike) -> measure; ir_measures' names, ndeval's, and S_recall
_SPELLINGS = {
    "alpha_ndcg": "alpha-nDCG", "α_ndcg": "alpha-nDCG", "alpha_dcg": "alpha-DCG", "α_dcg": "alpha-DCG",
    "err_ia": "ERR-IA", "nerr_ia": "nERR-IA", "nrbp": "NRBP", "nnrbp": "nNRBP",
    "ap_ia": "MAP-IA", "map_ia": "MAP-IA", "p_ia": "P-IA",
    "strec": "strec", "strecall": "strec", "s_recall": "strec", "subtopic_recall": "strec",
}
_FORM = re.compile(r"^(?P<name>[^\W\d][\w\-]*)\s*(?:\((?P<params>.*)\))?\s*(?:@\s*(?P<k>\S+))?$")
DIVERSITY_ACCEPTED = ("diversity (subtopic qrels): alpha_nDCG(alpha=a,rel=r)@k alpha_DCG@k ERR_IA@k nERR_IA@k "
                      "NRBP(alpha=a,beta=b) nNRBP AP_IA (MAP-IA) P_IA@k StRecall@k (S_recall@k, strec@k); "
                      "ndeval's spellings alpha-nDCG@k ERR-IA@k MAP-IA strec@k also work")


def _error(message):
    return MetricNameError(message)


@dataclass(frozen=True)
class DiversitySpec:
    """One diversity measure: ``measure`` (one of :data:`MEASURES`), cutoff ``k`` (None for NRBP,
    nNRBP, MAP-IA), ``alpha`` (redundancy penalty, default 0.5), ``beta`` (NRBP's patience, default
    0.5), ``rel`` (the grade from which a judgment is relevant; None: the caller's relevance level,
    default 1) and ``label`` (the name as
    the user wrote it; the result's key)."""

    measure: str
    k: int | None = None
    alpha: float = 0.5
    beta: float = 0.5
    rel: float | None = None
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or (self.measure if self.k is None else f"{self.measure}@{self.k}")


def _base(raw: str) -> str | None:
    m = _FORM.match(raw.strip())
    if not m:
        return None
    return _SPELLINGS.get(m.group("name").lower().replace("-", "_"))


def is_diversity_name(raw) -> bool:
    """True when ``raw`` names a diversity measure (any accepted spelling, valid or not)."""
    return isinstance(raw, str) and _base(raw) is not None


def _number(raw, key, text):
    try:
        v = float(text.strip().strip("'\""))
    except ValueError:
        raise _error(f"metric {raw!r}: parameter {key}={text.strip()!r} is not a number") from None
    if not math.isfinite(v):
        raise _error(f"metric {raw!r}: parameter {key}={text.strip()!r} is not finite")
    return v


def parse_diversity(raw: str) -> DiversitySpec | None:
    """The :class:`DiversitySpec` of a diversity measure name, or None when ``raw`` is not one.

    Forms: ``alpha_nDCG@20``, ``alpha_nDCG(alpha=0.5)@20``, ``ERR_IA@20``, ``NRBP(alpha=0.5,beta=0.5)``,
    ``nNRBP``, ``AP_IA`` / ``MAP-IA``, ``P_IA@10``, ``StRecall@20`` / ``S_recall@20`` / ``strec@20``,
    and ndeval's spellings (``alpha-nDCG@20``); names are case-insensitive. Parameters: ``alpha`` in
    [0, 1] (the alpha-DCG, ERR-IA and NRBP families), ``beta`` in [0, 1] (NRBP, nNRBP), ``rel``
    (all), ``cutoff``; ``judged_only=False`` is accepted. Raises MetricNameError (one line) for a
    missing or unexpected cutoff or parameter."""
    if not isinstance(raw, str):
        return None
    name = raw.strip()
    m = _FORM.match(name)
    if not m:
        return None
    measure = _SPELLINGS.get(m.group("name").lower().replace("-", "_"))
    if measure is None:
        return None
    params = {}
    text = (m.group("params") or "").strip()
    for part in text.split(",") if text else ():
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise _error(f"metric {name!r}: parameters are name=value pairs, e.g. alpha_nDCG(alpha=0.5)@20")
        if key == "judged_only":
            if value.strip() in ("True", "true", "1"):
                raise _error(f"metric {name!r}: judged_only=True is not implemented for diversity measures")
            continue
        allowed = {"rel", "cutoff"} | ({"alpha"} if measure in _USES_ALPHA else set()) | (
            {"beta"} if measure in ("NRBP", "nNRBP") else set())
        if key not in allowed:
            raise _error(f"metric {name!r}: {measure} takes no parameter {key!r} (parameters: "
                         f"{', '.join(sorted(allowed - {'cutoff'}))})")
        if key in params:
            raise _error(f"metric {name!r}: parameter {key!r} given twice")
        params[key] = _number(name, key, value)
    k = params.pop("cutoff", None)
    if m.group("k") is not None:
        if k is not None:
            raise _error(f"metric {name!r}: cutoff given twice")
        k = _number(name, "@", m.group("k"))
    if measure in _NO_CUTOFF:
        if k is not None:
            raise _error(f"metric {name!r}: {measure} takes no cutoff (it scores the whole ranking)")
    else:
        if k is None:
            raise _error(f"metric {name!r}: {measure} needs a cutoff, e.g. {m.group('name')}@20 "
                         "(ndeval reports @5, @10, @20)")
        if k != int(k) or not 1 <= k <= 2**31 - 1:
            raise _error(f"metric {name!r}: cutoff {k!r} must be a positive integer")
        k = int(k)
    for key in ("alpha", "beta"):
        if key in params and not 0.0 <= params[key] <= 1.0:
            raise _error(f"metric {name!r}: {key} must be between 0 and 1, got {params[key]!r}")
    return DiversitySpec(measure, k, params.get("alpha", 0.5), params.get("beta", 0.5), params.get("rel"),
                         label=name)


# --------------------------------------------------------------------------
# one query


def _row_sums(weights: np.ndarray) -> np.ndarray:
    """Sum over columns in column order (ndeval adds the subtopics' gains one after the other)."""
    out = np.zeros(weights.shape[0], dtype=np.float64)
    for j in range(weights.shape[1]):
        out += weights[:, j]
    return out


def ranking_gains(rel: np.ndarray, alpha: float) -> np.ndarray:
    """``G(r)`` of each rank: ``rel`` bool (n, S) in rank order -> float64 (n,).

    ``G(r) = sum_s rel[r, s] (1 - alpha) ** (relevant to s above r)`` (ndeval.c computeDCG)."""
    rel = np.asarray(rel, dtype=bool)
    if rel.size == 0:
        return np.zeros(rel.shape[0], dtype=np.float64)
    before = np.cumsum(rel, axis=0, dtype=np.int64) - rel
    return _row_sums(np.where(rel, _powers(1.0 - alpha, rel.shape[0])[before], 0.0))


def _powers(x: float, n: int, first: float = 1.0) -> np.ndarray:
    """``first * x ** i`` for i < n by repeated multiplication, as ndeval.c's ``gain *= (1 - alpha)``."""
    steps = np.full(max(n, 1), x, dtype=np.float64)
    steps[0] = first
    return np.multiply.accumulate(steps)[:n] if n else steps[:0]


def ideal_gains(judged: np.ndarray, alpha: float) -> np.ndarray:
    """Gains of ndeval's greedy ideal ranking: ``judged`` bool (m, S), rows in docno order (byte
    order) -> float64 (p,), the positive gains in ideal rank order (the rest of the ideal ranking
    gains 0). Each step takes the document with the largest gain given those placed, ties to the
    larger docno (the later row), as ndeval.c's ``idealResult``.

    Documents relevant to the same subtopics always gain the same, so the steps compare one
    candidate per such group (its largest docno left); a gain is summed over the subtopics in
    column order, as ndeval sums it, so equal gains tie exactly as in ndeval."""
    judged = np.asarray(judged, dtype=bool)
    rows = np.flatnonzero(judged.any(axis=1))
    by_key: dict = {}
    for row, key in zip(rows.tolist(), (r.tobytes() for r in judged[rows])):
        by_key.setdefault(key, []).append(row)  # rows ascending: the last is the largest docno
    groups = {tuple(np.flatnonzero(np.frombuffer(k, dtype=bool)).tolist()): v for k, v in by_key.items()}
    gain = [1.0] * judged.shape[1]
    keep = 1.0 - alpha

    def gain_of(subs):
        score = 0.0
        for j in subs:
            score += gain[j]
        return score

    scores = {subs: gain_of(subs) for subs in groups}
    out = []
    while groups:
        best = max(groups, key=lambda g: (scores[g], groups[g][-1]))
        if scores[best] <= 0.0:
            break
        out.append(scores[best])
        groups[best].pop()
        if not groups[best]:
            del groups[best]
        for j in best:
            gain[j] *= keep
        changed = set(best)
        for g in groups:
            if not changed.isdisjoint(g):
                scores[g] = gain_of(g)
    return np.asarray(out, dtype=np.float64)


def _discounts(n: int) -> np.ndarray:
    # ndeval.c discount(i) = log(2) / log(i + 2) for 0-based rank i
    return math.log(2.0) / np.log(np.arange(n, dtype=np.float64) + 2.0)


def _normalised(gains: np.ndarray, s: int, alpha: float, err: bool) -> np.ndarray:
    """Cumulative ``gains * D`` divided from the second rank on by the "ideal ideal"
    ``s (1-alpha)^i D`` (ndeval.c computeDCG; computeERR divides by the rank instead: ``err``), with
    ndeval's operations (products, quotients and sums in its order)."""
    n = len(gains)
    ideal = _powers(1.0 - alpha, n, float(s))
    if err:
        rank = np.arange(1, n + 1, dtype=np.float64)
        cum, ideal = np.cumsum(gains / rank), np.cumsum(ideal / rank)
    else:
        disc = _discounts(n)
        cum, ideal = np.cumsum(gains * disc), np.cumsum(ideal * disc)
    cum[1:] = cum[1:] / ideal[1:]
    return cum


def query_values(rel: np.ndarray, judged: np.ndarray, specs, n_rel_sub: np.ndarray | None = None,
                 ideal: np.ndarray | None = None) -> np.ndarray:
    """The values of ``specs`` (DiversitySpec) for one query -> float64 (len(specs),).

    ``rel``: bool (n, S) the ranking in rank order (unjudged rows False); ``judged``: bool (m, S) the
    judged documents (rows in docno order); ``n_rel_sub``: int (S,) relevant documents per subtopic
    (default: ``judged``'s column sums); ``ideal``: :func:`ideal_gains` of ``judged`` at the specs'
    alpha, when the caller has it (many rankings of one query). Columns are the subtopics with a relevant document; S = 0
    gives 0 for every measure but nNRBP (NaN, ndeval's 0 / 0). All specs must share alpha and beta
    (:func:`evaluate_lists` groups them).

    This is the per-query specification: the library and the jobs score through the batched
    :func:`batch_values`, which tests/test_diversity_batch.py checks against it bit for bit."""
    rel = np.asarray(rel, dtype=bool)
    judged = np.asarray(judged, dtype=bool)
    s = judged.shape[1]
    out = np.zeros(len(specs), dtype=np.float64)
    if s == 0:
        for i, sp in enumerate(specs):
            if sp.measure == "nNRBP":
                out[i] = math.nan
        return out
    alpha, beta = specs[0].alpha, specs[0].beta
    n = rel.shape[0]
    cuts = [sp.k for sp in specs if sp.k is not None]
    depth = max(cuts) if cuts else 0
    g = ranking_gains(rel, alpha)
    gi = ideal_gains(judged, alpha) if ideal is None else ideal
    cache = {}

    def at_depth(gains):
        v = np.zeros(depth, dtype=np.float64)
        v[:min(depth, len(gains))] = gains[:depth]
        return v

    def cumulative():
        if "cum" not in cache and depth:
            run, ideal = at_depth(g), at_depth(gi)
            cache["cum"] = (_normalised(run, s, alpha, False), _normalised(ideal, s, alpha, False),
                            _normalised(run, s, alpha, True), _normalised(ideal, s, alpha, True))
        return cache["cum"]

    def nrbp(gains):
        decay = _powers(beta, len(gains))
        total = float(np.add.accumulate(gains * decay)[-1]) if len(gains) else 0.0
        return total * ((1.0 - (1.0 - alpha) * beta) / s)  # ndeval: nrbp *= (1 - (1 - alpha) beta) / S

    for i, sp in enumerate(specs):
        k = sp.k
        if sp.measure in ("alpha-DCG", "alpha-nDCG", "ERR-IA", "nERR-IA"):
            dcg, idcg, err, ierr = cumulative()
            d = dcg[k - 1]
            if sp.measure == "alpha-DCG":
                out[i] = d
            elif sp.measure == "ERR-IA":
                out[i] = err[k - 1]
            elif d != 0.0:
                out[i] = d / idcg[k - 1] if sp.measure == "alpha-nDCG" else err[k - 1] / ierr[k - 1]
        elif sp.measure == "NRBP":
            out[i] = nrbp(g)
        elif sp.measure == "nNRBP":
            ideal = nrbp(gi)
            out[i] = nrbp(g) / ideal if ideal else math.nan
        elif sp.measure == "MAP-IA":
            nrs = judged.sum(axis=0) if n_rel_sub is None else np.asarray(n_rel_sub)
            if n:
                prec = np.cumsum(rel, axis=0) / np.arange(1, n + 1, dtype=np.float64)[:, None]
                ap = np.add.accumulate(np.where(rel, prec, 0.0), axis=0)[-1] / nrs  # rank order, as ndeval
                out[i] = float(np.add.accumulate(ap)[-1]) / s
        elif sp.measure == "P-IA":
            out[i] = int(rel[:k].sum()) / (k * s)
        elif sp.measure == "strec":
            out[i] = int(rel[:k].any(axis=0).sum()) / s
    return out


# --------------------------------------------------------------------------
# many queries


def evaluate_lists(jq, js, jd, jg, rq, rd, specs, *, qids=None, relevance_level: float = 1
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per-query values of ``specs`` over flat arrays.

    Judgments: ``jq``, ``js``, ``jd`` (query, subtopic, docno: str arrays) and ``jg`` (grades), one row
    per (query, subtopic, docno) (the readers refuse repeats). Run: ``rq``, ``rd`` (query, docno), rows
    of a query in rank order (order and depth are the caller's: :func:`streameval.api` or
    ``streameval ndeval``), no docno twice per query. ``relevance_level``: the ``rel`` of specs
    without their own (a judgment is relevant from that grade on). ``qids``: the queries to score (default: those
    in both, in byte order); a query without results scores as an empty ranking (0; nNRBP 0 as well,
    as ndeval's ``-c`` adds nothing for it); a query of ``qids`` without judgments scores 0 too.

    Returns ``(qids, values)``: str (q,) and float64 (len(specs), q). Each query's ranking is one
    ranking of the batched kernel that :func:`request_values` uses (values bit for bit those of
    :func:`query_values`); specs with different (alpha, beta, rel) are computed in separate passes.
    """
    jq, js, jd = (np.asarray(a).astype(str) for a in (jq, js, jd))
    jg = np.asarray(jg, dtype=np.float64)
    rq, rd = np.asarray(rq).astype(str), np.asarray(rd).astype(str)
    if qids is None:
        qids = np.intersect1d(np.unique(jq), np.unique(rq))
    qids = np.asarray(qids).astype(str)
    values = np.zeros((len(specs), len(qids)), dtype=np.float64)
    keep = np.isin(rq, qids)
    rq, rd = rq[keep], rd[keep]
    if not len(rq) or not len(specs):
        return qids, values
    rorder = np.argsort(rq, kind="stable")  # keeps rank order inside a query
    rq, rd = rq[rorder], rd[rorder]
    run_q, first = np.unique(rq, return_index=True)
    offsets = np.append(first, len(rq)).astype(np.int64)
    scored = _ranked_values(specs, run_q, np.arange(len(run_q)), offsets, rd, jq, js, jd, jg, relevance_level)
    pos = np.minimum(np.searchsorted(run_q, qids), len(run_q) - 1)
    found = run_q[pos] == qids
    values[:, found] = scored[:, pos[found]]
    return qids, values


# --------------------------------------------------------------------------
# many rankings at once: the kernel of evaluate_lists and request_values
#
# The rankings of one batch share S (their queries' subtopic count) and are laid out as a bool tensor
# (rankings, depth L, S), padded with rows relevant to nothing. Every value is computed with the
# operations of query_values (the per-query specification) in the same order per element: running
# sums along the rank axis (np.cumsum / np.add.accumulate, sequential for each row), sums over the
# subtopics column after column, the same quotients. A padding rank gains exactly 0.0, and adding
# 0.0 to a non-negative running sum leaves it unchanged, so a shorter ranking scores as it would
# alone; tests/test_diversity_batch.py checks the values against query_values bit for bit.

#: bool elements of one batch's (rankings, depth, S) tensor (its float intermediates are 8 x that)
_BATCH_ELEMENTS = 1 << 20
#: queries with more relevant documents take ideal_gains (per query, steps over groups of documents
#: relevant to the same subtopics) rather than _ideal_gains_rows (steps over documents, M^2 work);
#: so do batches of fewer queries (about 0.5 ms of numpy calls a batch; ideal_gains takes 0.1 ms a
#: query of 30 relevant documents and 2-4 subtopics)
_GREEDY_ROWS = 256
_GREEDY_QUERIES = 8


def _gains_rows(rel: np.ndarray, alpha: float) -> np.ndarray:
    """:func:`ranking_gains` of each ranking of ``rel`` bool (R, L, S) -> float64 (R, L)."""
    r, n, s = rel.shape
    out = np.zeros((r, n), dtype=np.float64)
    if not rel.size:
        return out
    before = np.cumsum(rel, axis=1, dtype=np.int64) - rel
    weights = np.where(rel, _powers(1.0 - alpha, n)[before], 0.0)
    for j in range(s):  # column order, as _row_sums
        out += weights[:, :, j]
    return out


def _nrbp_rows(gains: np.ndarray, s: int, alpha: float, beta: float) -> np.ndarray:
    """NRBP of each row of ``gains`` float64 (R, L) (zero-padded): query_values' ``nrbp``."""
    if not gains.shape[1]:
        return np.zeros(gains.shape[0], dtype=np.float64)
    total = np.add.accumulate(gains * _powers(beta, gains.shape[1]), axis=1)[:, -1]
    return total * ((1.0 - (1.0 - alpha) * beta) / s)


class _Cumulative(NamedTuple):
    """Running alpha-DCG and ERR-IA sums of rankings, before the "ideal ideal" normalisation:
    ``dcg``, ``err`` float64 (R, W) (W = min(depth, ranking length): ranks past W add 0.0), and the
    normalisers ``norm_dcg``, ``norm_err`` float64 (depth,) of S and alpha."""

    dcg: np.ndarray
    err: np.ndarray
    norm_dcg: np.ndarray
    norm_err: np.ndarray

    def at(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(alpha-DCG@k, ERR-IA@k) float64 (R,): as :func:`_normalised` at rank k."""
        w = min(k, self.dcg.shape[1]) - 1
        dcg, err = self.dcg[:, w], self.err[:, w]
        if k == 1:
            return dcg.copy(), err.copy()
        return dcg / self.norm_dcg[k - 1], err / self.norm_err[k - 1]


def _cumulative(gains: np.ndarray, s: int, alpha: float, depth: int) -> _Cumulative:
    """:class:`_Cumulative` of ``gains`` float64 (R, L) to ``depth`` (query_values' ``cumulative``)."""
    w = min(depth, gains.shape[1])
    disc = _discounts(depth)
    rank = np.arange(1, depth + 1, dtype=np.float64)
    ideal = _powers(1.0 - alpha, depth, float(s))
    g = gains[:, :w]
    return _Cumulative(np.cumsum(g * disc[:w], axis=1), np.cumsum(g / rank[:w], axis=1),
                       np.cumsum(ideal * disc), np.cumsum(ideal / rank))


class _Ideal(NamedTuple):
    """Per-ranking values of its query's ideal ranking: ``nrbp`` float64 (R,) and ``cut`` {k:
    (alpha-DCG@k, ERR-IA@k)} float64 (R,) each."""

    nrbp: np.ndarray
    cut: dict


def _ideal_of(gains: np.ndarray, s: int, alpha: float, beta: float, cuts) -> _Ideal:
    """:class:`_Ideal` of queries with S = ``s`` from their ideal gains float64 (Q, P) (zero-padded,
    :func:`_ideal_gains_rows`)."""
    cut = {}
    if cuts and gains.shape[1]:
        cum = _cumulative(gains, s, alpha, max(cuts))
        cut = {k: cum.at(k) for k in cuts}
    elif cuts:  # pragma: no cover - S > 0 has a relevant document: its ideal gain is >= 1
        cut = {k: (np.zeros(len(gains)), np.zeros(len(gains))) for k in cuts}
    return _Ideal(_nrbp_rows(gains, s, alpha, beta), cut)


def _ideal_gains_rows(rel: np.ndarray, alpha: float) -> np.ndarray:
    """:func:`ideal_gains` of several queries at once, bit for bit: ``rel`` bool (Q, M, S), each
    query's relevant documents in docno order (padding rows all False) -> float64 (Q, M), row q
    :func:`ideal_gains` of ``rel[q]`` followed by zeros.

    The same greedy, one step for every query at a time: a document's gain is summed over the
    subtopics in column order (adding 0.0 for the others changes nothing), the largest gain wins,
    ties to the later row (the larger docno, as ndeval's ``idealResult``), and a query stops at
    its first gain <= 0 or when its documents run out."""
    nq, m, s = rel.shape
    out = np.zeros((nq, m), dtype=np.float64)
    keep = 1.0 - alpha
    left = np.arange(nq)  # the queries still placing documents
    gain = np.ones((nq, s), dtype=np.float64)
    alive = rel.any(axis=2)
    for t in range(m):
        score = np.zeros(alive.shape, dtype=np.float64)
        for j in range(s):
            score += np.where(rel[:, :, j], gain[:, j:j + 1], 0.0)
        score = np.where(alive, score, -np.inf)
        pick = m - 1 - np.argmax(score[:, ::-1], axis=1)  # the last of the largest
        best = score[np.arange(len(pick)), pick]
        go = best > 0.0
        out[left[go], t] = best[go]
        if not go.all():
            left, rel, gain, alive, pick = left[go], rel[go], gain[go], alive[go], pick[go]
            if not len(left):
                break
        at = np.arange(len(left))
        alive[at, pick] = False
        gain = np.where(rel[at, pick], gain * keep, gain)
    return out


def _budget(sizes: np.ndarray, s: int):
    """(start, stop) batches of items sorted by ``sizes`` (ascending), each batch's (items x its
    largest size x s) at most :data:`_BATCH_ELEMENTS` (one item at least)."""
    start = 0
    while start < len(sizes):  # by size: a batch's largest is its last
        stop = min(len(sizes), start + max(1, _BATCH_ELEMENTS // (max(int(sizes[start]), 1) * s)))
        while stop - start > 1 and int(sizes[stop - 1]) * s * (stop - start) > _BATCH_ELEMENTS:
            stop = start + (stop - start) // 2
        yield start, stop
        start = stop


def _padded(table: np.ndarray, row: np.ndarray, first: np.ndarray, sizes: np.ndarray, s: int) -> np.ndarray:
    """bool (len(first), max(sizes), s): item i holds ``table[row[first[i] + j], :s]`` for j < sizes[i],
    then the all-False last row of ``table``."""
    depth = int(sizes.max())
    pad = np.arange(depth) >= sizes[:, None]
    at = np.where(pad, 0, first[:, None] + np.arange(depth))
    return table[:, :s][np.where(pad, len(table) - 1, row[at])]


def _query_tables(subt, queries: np.ndarray, s: int, alpha: float, beta: float, cuts) -> tuple:
    """(:class:`_Ideal`, relevant documents per subtopic int (Q, s)) of ``queries`` (codes into
    ``subt``: :class:`_Subtopics`, each with S = ``s``): the ideal gains by
    :func:`_ideal_gains_rows` in batches of queries with about as many relevant documents (by
    :func:`ideal_gains` for a query with more than :data:`_GREEDY_ROWS` and in batches of fewer than
    :data:`_GREEDY_QUERIES` queries)."""
    nq = len(queries)
    docs = subt.row_start[queries + 1] - subt.row_start[queries]
    order = np.argsort(docs, kind="stable")
    nrbp, nrs = np.zeros(nq), np.zeros((nq, s), dtype=np.int64)
    cut = {k: (np.zeros(nq), np.zeros(nq)) for k in cuts}
    every_row = np.arange(len(subt.rows))
    for a, b in _budget(docs[order], s):
        part = order[a:b]
        rel = _padded(subt.rows, every_row, subt.row_start[queries[part]], docs[part], s)
        nrs[part] = rel.sum(axis=1)
        if rel.shape[1] <= _GREEDY_ROWS and len(part) >= _GREEDY_QUERIES:
            gains = _ideal_gains_rows(rel, alpha)
        else:
            gains = np.zeros(rel.shape[:2])
            for i, one in enumerate(rel):
                g = ideal_gains(one, alpha)
                gains[i, :len(g)] = g
        ideal = _ideal_of(gains, s, alpha, beta, cuts)
        nrbp[part] = ideal.nrbp
        for k, (d, e) in ideal.cut.items():
            cut[k][0][part], cut[k][1][part] = d, e
    return _Ideal(nrbp, cut), nrs


def batch_values(rel: np.ndarray, s: int, specs, n_rel_sub: np.ndarray, ideal: _Ideal) -> np.ndarray:
    """The values of ``specs`` for R rankings whose queries have S = ``s`` > 0 subtopics -> float64
    (len(specs), R), each as :func:`query_values` computes it (bit for bit).

    ``rel``: bool (R, L, s), ranking r's documents in rank order (padding and unjudged ranks all
    False; every ranking non-empty); ``n_rel_sub``: int (R, s) the relevant documents per subtopic of
    each ranking's query; ``ideal``: its query's ideal values (:func:`_ideal_of`, with the specs'
    cutoffs). All specs share alpha and beta."""
    alpha, beta = specs[0].alpha, specs[0].beta
    r, n, _ = rel.shape
    out = np.zeros((len(specs), r), dtype=np.float64)
    cuts = sorted({sp.k for sp in specs if sp.k is not None})
    cache: dict = {}

    def gains():
        if "g" not in cache:
            cache["g"] = _gains_rows(rel, alpha)
        return cache["g"]

    def at(k):
        if "cum" not in cache:
            cache["cum"] = _cumulative(gains(), s, alpha, cuts[-1])
        return cache["cum"].at(k)

    def nrbp():
        if "nrbp" not in cache:
            cache["nrbp"] = _nrbp_rows(gains(), s, alpha, beta)
        return cache["nrbp"]

    def counts():  # relevant (document, subtopic) pairs down to each rank
        if "counts" not in cache:
            cache["counts"] = np.cumsum(rel.sum(axis=2, dtype=np.int64), axis=1)
        return cache["counts"]

    with np.errstate(divide="ignore", invalid="ignore"):
        for i, sp in enumerate(specs):
            k = sp.k
            if sp.measure in ("alpha-DCG", "alpha-nDCG", "ERR-IA", "nERR-IA"):
                d, e = at(k)
                if sp.measure == "alpha-DCG":
                    out[i] = d
                elif sp.measure == "ERR-IA":
                    out[i] = e
                else:
                    idcg, ierr = ideal.cut[k]
                    q = d / idcg if sp.measure == "alpha-nDCG" else e / ierr
                    out[i] = np.where(d != 0.0, q, 0.0)
            elif sp.measure == "NRBP":
                out[i] = nrbp()
            elif sp.measure == "nNRBP":
                out[i] = np.where(ideal.nrbp != 0.0, nrbp() / ideal.nrbp, math.nan)
            elif sp.measure == "MAP-IA":
                prec = np.cumsum(rel, axis=1) / np.arange(1, n + 1, dtype=np.float64)[None, :, None]
                ap = np.add.accumulate(np.where(rel, prec, 0.0), axis=1)[:, -1] / n_rel_sub
                out[i] = np.add.accumulate(ap, axis=1)[:, -1] / s
            elif sp.measure == "P-IA":
                out[i] = counts()[:, min(k, n) - 1] / (k * s)
            elif sp.measure == "strec":
                out[i] = rel[:, :k].any(axis=1).sum(axis=1) / s
    return out


class _Subtopics(NamedTuple):
    """One relevance level's subtopic judgments of the queries ``qids`` (sorted), for lookups:
    ``judged`` bool (Q,) the query has a judgment; ``n_sub`` int (Q,) its S (subtopics with a
    relevant document); ``rows`` bool (U + 1, max S) the subtopics of each relevant (query, docno),
    grouped by query, docno order inside, columns in subtopic order, the last row all False;
    ``row_start`` int (Q + 1,); ``keys`` int64 (U,) sorted ``query * len(docs) + docno code`` of the
    rows; ``docs`` str, the relevant docnos, sorted."""

    judged: np.ndarray
    n_sub: np.ndarray
    rows: np.ndarray
    row_start: np.ndarray
    keys: np.ndarray
    docs: np.ndarray

    def lookup(self, item_query: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Row of ``rows`` of each ranked item (query codes ``item_query``, docnos ``items``):
        int64, U (all False) for one not relevant to any subtopic of its query."""
        u = len(self.keys)
        out = np.full(len(items), u, dtype=np.int64)
        if not u or not len(items):
            return out
        pos = np.minimum(np.searchsorted(self.docs, items), len(self.docs) - 1)
        hit = np.flatnonzero(self.docs[pos] == items)
        key = item_query[hit] * len(self.docs) + pos[hit]
        at = np.minimum(np.searchsorted(self.keys, key), u - 1)
        found = self.keys[at] == key
        out[hit[found]] = at[found]
        return out


def _subtopics(qids, jq, js, jd, relevant) -> _Subtopics:
    """:class:`_Subtopics` of judgments ``jq``, ``js``, ``jd`` (str) for the queries ``qids`` (str,
    sorted, unique); ``relevant`` bool per judgment."""
    nq = len(qids)
    code = np.searchsorted(qids, jq)
    ok = np.zeros(len(jq), dtype=bool)
    if nq and len(jq):
        ok = qids[np.minimum(code, nq - 1)] == jq
    judged = np.zeros(nq, dtype=bool)
    judged[code[ok]] = True
    keep = ok & relevant
    q, subs, docs = code[keep].astype(np.int64), js[keep], jd[keep]
    subs_u, sub_code = np.unique(subs, return_inverse=True)
    docs_u, doc_code = np.unique(docs, return_inverse=True)
    # columns: a query's subtopics with a relevant document, in subtopic order (as _judged_matrix)
    pairs, pair_of = np.unique(q * max(len(subs_u), 1) + sub_code.reshape(-1), return_inverse=True)
    pair_query = pairs // max(len(subs_u), 1)
    n_sub = np.bincount(pair_query, minlength=nq).astype(np.int64)
    col = np.arange(len(pairs)) - np.searchsorted(pair_query, pair_query)
    keys, row_of = np.unique(q * max(len(docs_u), 1) + doc_code.reshape(-1), return_inverse=True)
    rows = np.zeros((len(keys) + 1, int(n_sub.max()) if nq else 0), dtype=bool)
    rows[row_of.reshape(-1), col[pair_of.reshape(-1)]] = True
    row_start = np.searchsorted(keys // max(len(docs_u), 1), np.arange(nq + 1))
    return _Subtopics(judged, n_sub, rows, row_start, keys, docs_u)


def _ranked_values(specs, qids, request_code, offsets, ranked, jq, js, jd, jg, relevance_level) -> np.ndarray:
    """(len(specs), n) values of n rankings (requests): ``request_code`` int (n,) the index in
    ``qids`` (str, sorted, unique) of each ranking's query, ``offsets`` int (n + 1,) into ``ranked``
    (docnos in rank order); judgments ``jq``, ``js``, ``jd`` (str), ``jg`` (float) in any order. The
    one kernel of :func:`evaluate_lists` and :func:`request_values`: per (alpha, rel) the judgments
    laid out once (:func:`_subtopics`), per query its ideal values (:func:`_query_tables`), the
    rankings in batches of equal S by :func:`batch_values`."""
    n = len(request_code)
    values = np.zeros((len(specs), n), dtype=np.float64)
    lengths = np.diff(offsets)
    item_query = np.repeat(request_code, lengths)
    groups: dict = {}
    for i, sp in enumerate(specs):
        groups.setdefault((sp.alpha, sp.beta, relevance_level if sp.rel is None else sp.rel), []).append(i)
    levels: dict = {}
    for (alpha, beta, level), rows in groups.items():
        sub = [specs[i] for i in rows]
        if level not in levels:
            subt = _subtopics(qids, jq, js, jd, jg >= level)
            levels[level] = (subt, subt.lookup(item_query, ranked[offsets[0]:offsets[-1]]) if n else None)
        subt, item_row = levels[level]
        live = (lengths > 0) & subt.judged[request_code]  # the others score 0 (ndeval adds nothing)
        s_of = subt.n_sub[request_code]
        nnrbp = [i for i, sp in zip(rows, sub) if sp.measure == "nNRBP"]
        if nnrbp:
            values[np.ix_(nnrbp, np.flatnonzero(live & (s_of == 0)))] = math.nan  # ndeval's 0 / 0
        cuts = sorted({sp.k for sp in sub if sp.k is not None})
        for s in np.unique(s_of[live & (s_of > 0)]).tolist():
            reqs = np.flatnonzero(live & (s_of == s))
            reqs = reqs[np.argsort(lengths[reqs], kind="stable")]
            queries = np.unique(request_code[reqs])
            ideal, nrs = _query_tables(subt, queries, s, alpha, beta, cuts)
            for a, b in _budget(lengths[reqs], s):
                batch = reqs[a:b]
                qi = np.searchsorted(queries, request_code[batch])
                per_request = _Ideal(ideal.nrbp[qi], {k: (d[qi], e[qi]) for k, (d, e) in ideal.cut.items()})
                rel = _padded(subt.rows, item_row, offsets[batch] - offsets[0], lengths[batch], s)
                values[np.ix_(rows, batch)] = batch_values(rel, s, sub, nrs[qi], per_request)
    return values


def spec_of(metric_spec) -> DiversitySpec:
    """The :class:`DiversitySpec` of a :class:`~streameval.metrics.names.MetricSpec` whose family is
    one of :data:`MEASURES` (its ``label`` is the name as written)."""
    spec = parse_diversity(metric_spec.label)
    if spec is None or spec.measure != metric_spec.family:
        raise ValueError(f"{metric_spec!r} is not a diversity measure")
    return spec


def _str_array(a) -> np.ndarray:
    """A numpy str array of a sequence of str or an Arrow string array (no nulls)."""
    if hasattr(a, "to_pylist"):
        a = a.to_pylist()
    return np.asarray(a, dtype=str) if len(a) else np.zeros(0, dtype=str)


def request_values(specs, request_query, offsets, ranked, jq, js, jd, jg, *, relevance_level: float = 1
                   ) -> np.ndarray:
    """Diversity values of many rankings (requests) over their queries' subtopic judgments: the
    Beam jobs' per-request scores, each request scored as :func:`evaluate_lists` scores a query.

    ``specs``: DiversitySpecs. Requests: ``request_query`` (str (n,), the query of each request),
    ``offsets`` (int (n + 1,)) into ``ranked`` (str, the docnos of every request in rank order, a
    docno at most once per request). Judgments: ``jq``, ``js``, ``jd`` (query, subtopic, docno: str)
    and ``jg`` (grades), one row per (query, subtopic, docno). A request with an empty ranking or
    whose query has no subtopic judgment scores 0 on every measure (as :func:`evaluate_lists`);
    a query with judgments but no relevant subtopic scores 0 but nNRBP (NaN, ndeval's 0 / 0).

    Returns float64 (len(specs), n), bit for bit :func:`query_values` of each request. Judgment
    matrices and ideal gains are built once per query and (alpha, rel); the requests are scored in
    batches of equal S by :func:`batch_values`, the kernel :func:`evaluate_lists` uses too."""
    request_query, ranked = _str_array(request_query), _str_array(ranked)
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(request_query)
    if not n or not len(specs):
        return np.zeros((len(specs), n), dtype=np.float64)
    jq, js, jd = (_str_array(a) for a in (jq, js, jd))
    jg = np.asarray(jg, dtype=np.float64)
    qids, code = np.unique(request_query, return_inverse=True)
    return _ranked_values(specs, qids, code.reshape(-1), offsets, ranked, jq, js, jd, jg, relevance_level)
