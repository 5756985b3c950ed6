"""Rank fusion: several runs of the same queries combined into one, pure numpy.

The methods and score normalisations of ranx 0.3.21 (``ranx.fuse``; Bassani and Romelli, "ranx.fuse:
A Python Library for Metasearch", CIKM 2022), with ranx's definitions:

* ``rrf`` (k=60): sum over runs of 1 / (k + rank), rank counted from 1;
* ``isr``: sum of 1 / rank^2 times the number of runs that returned the document; ``log_isr``: times
  log(that number); ``logn_isr`` (sigma=0.01): times log(that number + sigma);
* ``combsum``, ``combmnz`` (sum times the number of runs that returned the document), ``combmax``,
  ``combmin``, ``combmed`` (median), ``combanz`` (sum / number), ``combgmnz`` (gamma: sum times
  number^gamma): over the runs that returned the document (Fox and Shaw 1993; Lee 1997);
* ``wsum`` (weights: sum of weight x score, 0 where absent), ``wmnz`` (weights: the sum of the scores
  times the sum of the weights of the runs that returned the document);
* ``bordafuse``: per run, with n candidates (documents any run returned for the query), the document
  at rank r gets n - r + 1 points and every candidate the run did not return (n - m + 1) / 2, m the
  run's length; the points are summed; ``w_bordafuse`` (weights): weighted by run;
* ``rbc`` (phi): rank-biased centroids, the sum over runs of (1 - phi) phi^(r - 1) (Bailey et al. 2017);
* ``posfuse`` (probs), ``probfuse`` (probs): the sum over runs of the probability, learnt from
  judgments (:func:`train_columns`), that the document's rank (posfuse) holds a relevant document, or
  that its segment does, over the segment's number (probfuse; Lillis et al. 2006);
* ``condorcet``, ``w_condorcet`` (weights): Condorcet-fuse (Montague and Aslam, "Condorcet fusion for
  improved retrieval", CIKM 2002): the candidates sorted (Python's sort) by pairwise votes, x before y
  when the runs (weighted) ranking x above y weigh at least as much as the others, a run that returned
  neither voting for the second of the pair, one that returned one of them for it; the scores n, n - 1,
  ..., 1 down that order. The votes need not order the candidates consistently (a cycle, or documents
  a run returned neither of); then the order depends on the one the sort starts from: ranx's is a
  Python set's (it changes between processes), here the candidates in docno order;
* ``mapfuse`` (map_scores: one per run, its MAP on training queries; Lillis et al., "Estimating
  probabilities for effective data fusion", SIGIR 2010): the sum over runs of MAP / rank;
* ``segfuse`` (probs; Shokouhi, "Segmentation of search engine results for effective data-fusion",
  ECIR 2007): the sum over runs of the learnt probability of the rank's segment (ranks 1-5, 6-15,
  16-35, ...: segment k ends at 10 x 2^(k-1) - 5, ten segments) times (normalised score + 1);
* ``slidefuse`` (probs, w; Lillis et al., "Extending probabilistic data fusion using sliding
  windows", ECIR 2008): the sum over runs of the mean of posfuse's probabilities over the ranks
  r - w .. r + w within the run's length (0 past the learnt ones);
* ``bayesfuse`` (log_odds; Aslam and Montague, "Models for metasearch", SIGIR 2001): the sum over
  runs of the learnt log odds of relevance of the rank's segment (ranks 1-5, 6-10, 11-15, 16-20,
  21-30, 31-100, 101-200, 201-500, 501-1000), log(0.001 / 0.999) for a run that did not return the
  document (nor past its learnt ranks);
* ``mixed`` (weights; Wu and Crestani, "Data fusion with estimated weights", CIKM 2002): the sum of
  weight x score over the runs that returned the document times the square root of their number.

Normalisations, per run and query, applied before the method: ``min-max`` ((s - min) / (max - min)),
``min-max-inverted`` ((max - s) / (max - min), the run re-ranked), ``max`` (s / max), ``sum``
((s - min) / (sum - n min)), ``zmuv`` ((s - mean) / population standard deviation), ``rank``
(1 - (r - 1) / m), ``borda`` (over the candidates: 1 - (r - 1) / n for a returned document,
1/2 - (m - 1) / (2 n) for the others, which then belong to every run), ``none``; every denominator
is at least 1e-9, as in ranx.

Ranks: a run's documents in score order, ties by docno descending (trec_eval's order, which
:func:`streameval.metrics.prepare.rank_order` uses too); ranx orders tied scores by numba's unstable
sort instead. The fused run: queries in id order, documents by fused score descending, ties by
docno descending. A query absent from some runs is fused from the runs that have it (ranx refuses
runs whose queries differ).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from .names import closest

__all__ = ["METHODS", "NORMS", "TRAINED", "FusionNameError", "FusedColumns", "fuse_columns", "train_columns",
           "method_name", "norm_name", "check_params"]


class FusionNameError(ValueError):
    """An unknown fusion method, normalisation or parameter (the message names the closest ones)."""


class Method(NamedTuple):
    """A fusion method: its parameters with their defaults (``None``: required)."""
    params: dict


#: the methods by their canonical names; the parameters each takes, None where ranx has no default
METHODS = {
    "rrf": Method({"k": 60}),
    "isr": Method({}),
    "log_isr": Method({}),
    "logn_isr": Method({"sigma": 0.01}),
    "combsum": Method({}),
    "combmnz": Method({}),
    "combmax": Method({}),
    "combmin": Method({}),
    "combmed": Method({}),
    "combanz": Method({}),
    "combgmnz": Method({"gamma": None}),
    "wsum": Method({"weights": None}),
    "wmnz": Method({"weights": None}),
    "bordafuse": Method({}),
    "w_bordafuse": Method({"weights": None}),
    "rbc": Method({"phi": None}),
    "posfuse": Method({"probs": None}),
    "probfuse": Method({"probs": None}),
    "condorcet": Method({}),
    "w_condorcet": Method({"weights": None}),
    "mapfuse": Method({"map_scores": None}),
    "segfuse": Method({"probs": None}),
    "slidefuse": Method({"probs": None, "w": None}),
    "bayesfuse": Method({"log_odds": None}),
    "mixed": Method({"weights": None}),
}
#: the methods whose parameters are learnt from judgments (:func:`train_columns`; slidefuse's w is given)
TRAINED = ("posfuse", "probfuse", "mapfuse", "segfuse", "slidefuse", "bayesfuse")
#: other spellings: ranx.fuse's method names (``sum``, ``mnz``, ...), its function names (``comb_sum``)
METHOD_ALIASES = {
    **{f"comb{x}": f"comb{x}" for x in ("sum", "mnz", "max", "min", "med", "anz", "gmnz")},
    **{x: f"comb{x}" for x in ("sum", "mnz", "max", "min", "med", "anz", "gmnz")},
    **{f"comb_{x}": f"comb{x}" for x in ("sum", "mnz", "max", "min", "med", "anz", "gmnz")},
    "borda": "bordafuse", "borda_fuse": "bordafuse", "weighted_sum": "wsum", "logisr": "log_isr",
    "weighted_bordafuse": "w_bordafuse", "wbordafuse": "w_bordafuse",
    "weighted_condorcet": "w_condorcet", "wcondorcet": "w_condorcet",
}
#: the normalisations by their canonical names (ranx's spellings)
NORMS = ("min-max", "min-max-inverted", "max", "sum", "zmuv", "rank", "borda", "none")
NORM_ALIASES = {"min_max": "min-max", "minmax": "min-max", "min_max_inverted": "min-max-inverted"}
_EPS = 1e-9  # ranx's floor of every denominator
_SEG_ENDS = np.array([0] + [10 * 2 ** (k - 1) - 5 for k in range(1, 11)])  # segfuse's segments
_BAYES_ENDS = np.array([0, 5, 10, 15, 20, 30, 100, 200, 500, 1000])  # bayesfuse's
_MIN_ODD = math.log(0.001 / 0.999)  # bayesfuse's log odds of a document a run did not return
_ABSENT = 1_000_000  # condorcet: ranx's rank of a document a run did not return


def _lookup(raw, names, aliases, what):
    key = str(raw).strip().lower()
    if key in names:
        return key
    if key in aliases:
        return aliases[key]
    vocabulary = list(names) + list(aliases)
    canon = (lambda c: c if c in names else aliases.get(c))
    picks = list(dict.fromkeys(canon(c) for c in closest(raw, vocabulary, canon)))  # spelled canonically
    raise FusionNameError(f"unknown fusion {what} {raw!r}; closest: {', '.join(picks)} "
                          f"(every {what}: {', '.join(names)})")


def method_name(raw) -> str:
    """The canonical name of a fusion method (``"sum"`` -> ``"combsum"``); FusionNameError if unknown."""
    return _lookup(raw, METHODS, METHOD_ALIASES, "method")


def norm_name(raw) -> str:
    """The canonical name of a normalisation (None -> ``"none"``); FusionNameError if unknown."""
    return "none" if raw is None else _lookup(raw, NORMS, NORM_ALIASES, "normalisation")


def check_params(method: str, params: dict, n_runs: int) -> dict:
    """``params`` checked against ``method``'s (canonical name) and completed with its defaults."""
    accepted = METHODS[method].params
    for key in params:
        if key not in accepted:
            near = closest(key, list(accepted), lambda c: c) if accepted else []
            hint = f"; closest: {', '.join(near)}" if near else ""
            raise FusionNameError(f"{method} takes no parameter {key!r} (its parameters: "
                                  f"{', '.join(accepted) or 'none'}){hint}")
    out = {}
    for key, default in accepted.items():
        value = params.get(key, default)
        if value is None:
            raise ValueError(f"{method} needs the parameter {key} (ranx has no default for it)")
        if key in ("weights", "map_scores"):
            try:
                value = np.asarray(value, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                raise ValueError(f"{method}: weights must be numbers, got {value!r}") from None
            if len(value) != n_runs:
                raise ValueError(f"{method}: {len(value)} {key} for {n_runs} runs (one per run)")
            if not np.isfinite(value).all():
                raise ValueError(f"{method}: {key} must be finite, got {value.tolist()}")
        elif key in ("probs", "log_odds"):
            value = _per_run_lists(method, key, value, n_runs)
        elif key == "w":
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            elif isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{method}: w (the window's half width) must be a whole number of at least 0, "
                                 f"got {value!r}")
            value = int(value)
        else:
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{method}: {key} must be a number, got {value!r}") from None
            if not math.isfinite(value):
                raise ValueError(f"{method}: {key} must be finite, got {value}")
            if key in ("sigma", "phi") and not 0 <= value <= 1:
                raise ValueError(f"{method}: {key} must be in [0, 1], got {value}")
            if key == "k" and value < 0:
                raise ValueError(f"{method}: k must be at least 0, got {value}")
        out[key] = value
    return out


def _per_run_lists(method: str, key: str, value, n_runs: int) -> list:
    """``probs`` / ``log_odds``: one array of numbers per run, checked."""
    try:
        value = [np.asarray(p, dtype=np.float64).reshape(-1) for p in value]
    except (TypeError, ValueError):
        raise ValueError(f"{method}: {key} is one list of numbers per run (from streameval.fusion.train), "
                         f"got {value!r}") from None
    if len(value) != n_runs:
        raise ValueError(f"{method}: {len(value)} lists of {key} for {n_runs} runs (one per run)")
    if method == "probfuse" and any(len(p) == 0 for p in value):
        raise ValueError(f"{method}: {key} has an empty list (one probability per segment)")
    if method == "segfuse" and any(len(p) > len(_SEG_ENDS) - 1 for p in value):
        raise ValueError(f"{method}: {key} has a list longer than segfuse's {len(_SEG_ENDS) - 1} segments")
    if not all(np.isfinite(p).all() for p in value):
        raise ValueError(f"{method}: {key} must be finite numbers")
    return value


class FusedColumns(NamedTuple):
    """A fused run as parallel arrays: queries in id order, documents by score descending (ties:
    docno descending); ``rank`` counts from 1 within each query."""
    qid: np.ndarray
    docno: np.ndarray
    score: np.ndarray
    rank: np.ndarray


class _Ranked(NamedTuple):
    """One run's rows as codes, sorted by query then rank (0-based)."""
    q: np.ndarray      # query code (int64)
    d: np.ndarray      # document code (int64)
    v: np.ndarray      # score (float64)
    rank: np.ndarray   # 0-based position within the query


def _starts(sorted_keys: np.ndarray) -> np.ndarray:
    """The first index of each run of equal values in ``sorted_keys``."""
    if len(sorted_keys) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])


def _group_index(starts: np.ndarray, n: int) -> np.ndarray:
    """Each row's group (0-based) given the groups' first rows."""
    g = np.zeros(n, dtype=np.int64)
    if len(starts) > 1:
        g[starts[1:]] = 1
    return np.cumsum(g)


def _rank(q, d, v) -> _Ranked:
    """Rows sorted by query, score descending, docno (code) descending, with their 0-based ranks."""
    order = np.lexsort((-d, -v, q))
    q, d, v = q[order], d[order], v[order]
    starts = _starts(q)
    g = _group_index(starts, len(q))
    rank = np.arange(len(q), dtype=np.int64) - starts[g] if len(q) else np.zeros(0, dtype=np.int64)
    return _Ranked(q, d, v, rank)


def _normalise(run: _Ranked, norm: str) -> _Ranked:
    """ranx's per-query normalisations (all but borda, which needs every run: :func:`_borda_norm`)."""
    if norm == "none" or len(run.q) == 0:
        return run
    v = run.v
    starts = _starts(run.q)
    g = _group_index(starts, len(v))
    n = np.diff(np.r_[starts, len(v)])[g].astype(np.float64)
    if norm == "rank":
        return run._replace(v=1 - run.rank / n)
    mn = np.minimum.reduceat(v, starts)[g]
    mx = np.maximum.reduceat(v, starts)[g]
    if norm in ("min-max", "min-max-inverted"):
        den = np.maximum(mx - mn, _EPS)
        if norm == "min-max":
            return run._replace(v=(v - mn) / den)
        return _rank(run.q, run.d, (mx - v) / den)  # ranx sorts the inverted run again
    if norm == "max":
        return run._replace(v=v / np.maximum(mx, _EPS))
    total = np.add.reduceat(v, starts)[g]
    if norm == "sum":
        return run._replace(v=(v - mn) / np.maximum(total - mn * n, _EPS))
    if norm == "zmuv":
        mean = total / n
        dev = (v - mean) ** 2
        std = np.sqrt(np.add.reduceat(dev, starts)[g] / n)
        return run._replace(v=(v - mean) / np.maximum(std, _EPS))
    raise AssertionError(norm)


def _candidates(runs, n_docs: int):
    """Every (query, document) any run returned: pair keys (sorted) and the count per query code."""
    keys = np.unique(np.concatenate([r.q * n_docs + r.d for r in runs]))
    return keys


def _per_query_counts(q: np.ndarray, n_queries: int) -> np.ndarray:
    return np.bincount(q, minlength=n_queries).astype(np.float64)


def _borda_norm(runs, n_queries: int, n_docs: int) -> list:
    """ranx's borda normalisation: every run extended to all candidates of its queries."""
    cand = _candidates(runs, n_docs)
    cq, cd = cand // n_docs, cand % n_docs
    n_cand = _per_query_counts(cq, n_queries)
    out = []
    for r in runs:
        m = _per_query_counts(r.q, n_queries)
        v = 0.5 - (m[cq] - 1) / (2 * n_cand[cq])
        pos = np.searchsorted(cand, r.q * n_docs + r.d)
        v[pos] = 1 - r.rank / n_cand[r.q]
        out.append(_rank(cq, cd, v))  # returned documents keep their order; the others follow, tied
    return out


def _fuse(runs, method: str, params: dict, n_queries: int, n_docs: int):
    """(pair keys, fused scores) of the normalised runs."""
    keys = np.concatenate([r.q * n_docs + r.d for r in runs])
    pairs, pk = np.unique(keys, return_inverse=True)
    n_pairs = len(pairs)
    rank1 = np.concatenate([r.rank for r in runs]).astype(np.float64) + 1
    v = np.concatenate([r.v for r in runs])
    who = np.concatenate([np.full(len(r.q), i, dtype=np.int64) for i, r in enumerate(runs)])
    count = np.bincount(pk, minlength=n_pairs).astype(np.float64)

    def total(x):
        return np.bincount(pk, weights=x, minlength=n_pairs)

    if method == "rrf":
        return pairs, total(1 / (params["k"] + rank1))
    if method in ("isr", "log_isr", "logn_isr"):
        s = total(1 / rank1 ** 2)
        if method == "isr":
            return pairs, s * count
        return pairs, s * np.log(count + (params["sigma"] if method == "logn_isr" else 0.0))
    if method == "combsum":
        return pairs, total(v)
    if method == "combmnz":
        return pairs, total(v) * count
    if method == "combanz":
        return pairs, total(v) / count
    if method == "combgmnz":
        return pairs, total(v) * count ** params["gamma"]
    if method == "wsum":
        return pairs, total(params["weights"][who] * v)
    if method == "wmnz":
        return pairs, total(v) * total(params["weights"][who])
    if method in ("combmax", "combmin", "combmed"):
        order = np.lexsort((v, pk))
        sv = v[order]
        starts = _starts(pk[order])
        if method == "combmax":
            return pairs, np.maximum.reduceat(sv, starts)
        if method == "combmin":
            return pairs, np.minimum.reduceat(sv, starts)
        c = count.astype(np.int64)
        return pairs, (sv[starts + (c - 1) // 2] + sv[starts + c // 2]) / 2
    if method == "rbc":
        return pairs, total((1 - params["phi"]) * params["phi"] ** (rank1 - 1))
    if method == "mixed":
        return pairs, total(params["weights"][who] * v) * np.sqrt(count)
    if method in ("posfuse", "probfuse", "mapfuse", "segfuse", "slidefuse"):
        return pairs, total(np.concatenate([_rank_scores(r, i, method, params) for i, r in enumerate(runs)]))
    if method == "bayesfuse":  # every run that has the query and did not return the document: min odds
        has = np.zeros((len(runs), n_queries), dtype=bool)
        for i, r in enumerate(runs):
            has[i, r.q] = True
        absent = has.sum(axis=0)[pairs // n_docs] - count
        return pairs, total(np.concatenate([_rank_scores(r, i, method, params) for i, r in enumerate(runs)])) \
            + _MIN_ODD * absent
    if method in ("condorcet", "w_condorcet"):
        w = params["weights"] if method == "w_condorcet" else np.ones(len(runs))
        return pairs, _condorcet(pairs, pk, runs, w.tolist(), n_docs)
    if method in ("bordafuse", "w_bordafuse"):
        # per run, every candidate's points (n - r + 1 where returned, (n - m + 1) / 2 elsewhere),
        # weighted and added run after run, in ranx's order of operations
        w = params["weights"] if method == "w_bordafuse" else None
        pq = pairs // n_docs
        n_cand = _per_query_counts(pq, n_queries)  # every pair is a candidate of its query
        out = np.zeros(n_pairs)
        lo = 0
        for i, r in enumerate(runs):
            points = ((n_cand - _per_query_counts(r.q, n_queries) + 1) / 2)[pq]
            rows = pk[lo:lo + len(r.q)]
            points[rows] = n_cand[r.q] - rank1[lo:lo + len(r.q)] + 1
            lo += len(r.q)
            out += points if w is None else w[i] * points
        return pairs, out
    raise AssertionError(method)


def _rank_scores(r: _Ranked, i: int, method: str, params: dict) -> np.ndarray:
    """Run ``i``'s score of each of its rows by rank, for the methods trained per rank."""
    rank = r.rank
    if method == "mapfuse":  # the run's MAP over the rank (from 1)
        return params["map_scores"][i] / (rank + 1.0)
    probs = params["log_odds" if method == "bayesfuse" else "probs"][i]
    if method in ("posfuse", "bayesfuse"):  # the rank's own value (0, or the least odds, past them)
        c = np.full(len(rank), 0.0 if method == "posfuse" else _MIN_ODD)
        inside = rank < len(probs)
        c[inside] = probs[rank[inside]]
        return c
    if method == "probfuse":  # the probability of the rank's segment over the segment's number
        seg = _segments(r, len(probs))
        return probs[seg] / (seg + 1)
    if method == "segfuse":  # the probability of the rank's segment times (score + 1)
        seg = np.searchsorted(_SEG_ENDS, rank, side="right") - 1
        c = np.zeros(len(rank))
        inside = seg < len(probs)
        c[inside] = probs[seg[inside]]
        return c * (r.v + 1)
    # slidefuse: the mean of the probabilities over the ranks r - w .. r + w within the run's length
    w = params["w"]
    starts = _starts(r.q)
    last = (np.diff(np.r_[starts, len(r.q)]) - 1)[_group_index(starts, len(r.q))]
    a, b = np.maximum(rank - w, 0), np.minimum(rank + w, last)
    cum = np.r_[0.0, np.cumsum(probs)]
    return (cum[np.minimum(b + 1, len(probs))] - cum[np.minimum(a, len(probs))]) / (b - a + 1)


def _condorcet(pairs: np.ndarray, pk: np.ndarray, runs, weights: list, n_docs: int) -> np.ndarray:
    """ranx's Condorcet-fuse: per query, the candidates (in docno order) sorted by weighted pairwise
    votes with Python's sort; the scores n, n - 1, ..., 1 down that order."""
    at = np.full((len(runs), len(pairs)), _ABSENT, dtype=np.int64)
    lo = 0
    for i, r in enumerate(runs):
        at[i, pk[lo:lo + len(r.q)]] = r.rank
        lo += len(r.q)
    out = np.zeros(len(pairs))
    starts = _starts(pairs // n_docs)
    for s, e in zip(starts.tolist(), np.r_[starts[1:], len(pairs)].tolist()):
        ranks = at[:, s:e].T.tolist()  # per candidate, its rank in each run

        def compare(x, y, ranks=ranks):
            x_votes = y_votes = 0.0
            for w, rx, ry in zip(weights, ranks[x], ranks[y]):
                if rx < ry:
                    x_votes += w
                else:
                    y_votes += w
            return -1 if x_votes >= y_votes else 1

        order = sorted(range(e - s), key=functools.cmp_to_key(compare))
        out[s + np.asarray(order, dtype=np.int64)] = np.arange(e - s, 0, -1, dtype=np.float64)
    return out


def _lookup_codes(ids: np.ndarray, values: np.ndarray):
    """The codes of ``values`` in the sorted unique ``ids`` and which of them are there."""
    if len(ids) == 0:
        return np.zeros(len(values), dtype=np.int64), np.zeros(len(values), dtype=bool)
    idx = np.minimum(np.searchsorted(ids, values), len(ids) - 1)
    return idx.astype(np.int64), ids[idx] == values


def _segments(run: _Ranked, n_segments: int) -> np.ndarray:
    """probfuse's segment of each row: ceil(m / n_segments) ranks each, m the query's length."""
    starts = _starts(run.q)
    g = _group_index(starts, len(run.q))
    m = np.diff(np.r_[starts, len(run.q)])[g]
    return run.rank // -(-m // n_segments)


def train_columns(qrels, runs, method: str, norm: str | None = "min-max", *, n_segments: int | None = None,
                  relevance_level: float = 1) -> dict:
    """The parameters of a trained method (:data:`TRAINED`) learnt from ``qrels`` ((qid, docno,
    grade) arrays) and ``runs`` ((qid, docno, score) arrays each), normalised by ``norm`` as they will
    be fused, as ranx's ``*_train`` functions (``optimize_fusion``): one entry per run, in the order of
    the runs. A document is relevant with a grade of at least ``relevance_level``; only the run queries
    with a judgment count. ``posfuse`` and ``slidefuse`` (``{"probs"}``): per rank, the share of those
    queries whose document at that rank is relevant (of the queries that have that rank); ``probfuse``
    (``n_segments``; ``{"probs"}``): per segment, the mean over the queries of the share of relevant
    documents in that segment of the query's ranking; ``segfuse`` (``{"probs"}``): per segment of
    segfuse's, the sum over the queries of the relevant documents in it over the segment's size, over
    the number of queries; ``bayesfuse`` (``{"log_odds"}``, one per rank up to 1000): per segment of
    bayesfuse's, p the mean over the queries of the segment's precision (its relevant documents over
    its size; 0.001 where 0), log(p / (1 - p)) (1 - p at least 0.001); ``mapfuse``
    (``{"map_scores"}``): the run's mean average precision over the queries (an average precision over
    the query's relevant documents, 0 without any)."""
    method = method_name(method)
    if method not in TRAINED:
        raise FusionNameError(f"{method} learns nothing (trained methods: {', '.join(TRAINED)})")
    if method == "probfuse":
        if n_segments is None or int(n_segments) != n_segments or n_segments < 1:
            raise ValueError(f"probfuse needs n_segments, a whole number of at least 1, got {n_segments!r}")
        n_segments = int(n_segments)
    elif n_segments is not None:
        raise ValueError(f"n_segments is probfuse's; {method} does not take it")
    uq, ud, ranked = _prepare(list(runs), norm_name(norm))
    n_docs = max(len(ud), 1)
    jq = np.asarray(qrels[0]).astype(str)
    jd = np.asarray(qrels[1]).astype(str)
    jg = np.asarray(qrels[2], dtype=np.float64)
    qi, q_found = _lookup_codes(uq, jq)
    di, d_found = _lookup_codes(ud, jd)
    judged = np.zeros(len(uq), dtype=bool)
    judged[qi[q_found]] = True
    rel = jg >= relevance_level
    n_rel = np.bincount(qi[q_found & rel], minlength=len(uq)).astype(np.float64)  # mapfuse's recall base
    rel &= q_found & d_found
    relevant = np.unique(qi[rel] * n_docs + di[rel])
    out = []
    for r in ranked:
        keep = judged[r.q]
        hit = np.isin(r.q * n_docs + r.d, relevant)[keep].astype(np.float64)
        out.append(_learn(_Ranked(r.q[keep], r.d[keep], r.v[keep], r.rank[keep]), hit, method, n_segments, n_rel))
    return {{"mapfuse": "map_scores", "bayesfuse": "log_odds"}.get(method, "probs"): out}


def _learn(kept: _Ranked, hit: np.ndarray, method: str, n_segments, n_rel: np.ndarray):
    """One run's learnt parameter from its judged rows (``hit``: 1 where relevant)."""
    rank = kept.rank
    n_q = len(np.unique(kept.q))
    if method in ("posfuse", "slidefuse"):
        den = np.bincount(rank).astype(np.float64)
        return np.bincount(rank, weights=hit) / np.maximum(den, 1) if len(rank) else np.zeros(0)
    if method == "mapfuse":
        starts = _starts(kept.q)
        g = _group_index(starts, len(rank))
        cum = np.cumsum(hit)
        seen = cum - (cum[starts] - hit[starts])[g]  # relevant documents up to the row, within its query
        ap = np.bincount(g, weights=hit * seen / (rank + 1.0), minlength=len(starts))
        base = n_rel[kept.q[starts]]
        return float(np.mean(np.where(base > 0, ap / np.maximum(base, 1), 0.0))) if n_q else 0.0
    if method in ("segfuse", "bayesfuse"):
        ends = _SEG_ENDS if method == "segfuse" else _BAYES_ENDS
        seg = np.searchsorted(ends, rank, side="right") - 1
        inside = seg < len(ends) - 1
        sizes = np.diff(ends).astype(np.float64)
        p = np.bincount(seg[inside], weights=hit[inside], minlength=len(sizes)) / sizes / max(n_q, 1)
        if method == "segfuse":
            return p
        p = np.where(p == 0, 0.001, p)
        odds = np.log(p / np.where(1 - p == 0, 0.001, 1 - p))
        return np.repeat(odds, np.diff(ends))
    seg = _segments(kept, n_segments)  # probfuse
    cell = kept.q * n_segments + seg  # (query, segment): the share of relevant documents in it
    cells, ci = np.unique(cell, return_inverse=True)
    share = np.bincount(ci, weights=hit) / np.bincount(ci)
    return np.bincount(cells % n_segments, weights=share, minlength=n_segments) / max(n_q, 1)


def _prepare(runs, norm: str):
    """The runs as codes, ranked and normalised: (query ids, document ids, normalised runs)."""
    qs = [np.asarray(r[0]).astype(str) for r in runs]
    ds = [np.asarray(r[1]).astype(str) for r in runs]
    vs = [np.asarray(r[2], dtype=np.float64) for r in runs]
    for i, (q, d, v) in enumerate(zip(qs, ds, vs)):
        if not (len(q) == len(d) == len(v)):
            raise ValueError(f"run {i}: qid, docno and score arrays differ in length ({len(q)}, {len(d)}, {len(v)})")
        bad = ~np.isfinite(v)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise ValueError(f"run {i}: score {v[j]} of query {str(q[j])!r}, document {str(d[j])!r} "
                             "is not a finite number")
    uq, q_codes = np.unique(np.concatenate(qs), return_inverse=True)
    ud, d_codes = np.unique(np.concatenate(ds), return_inverse=True)
    n_queries, n_docs = len(uq), max(len(ud), 1)
    ranked, lo = [], 0
    for i, v in enumerate(vs):
        q, d = q_codes[lo:lo + len(v)].astype(np.int64), d_codes[lo:lo + len(v)].astype(np.int64)
        lo += len(v)
        key = np.sort(q * n_docs + d)
        dup = np.flatnonzero(key[1:] == key[:-1])
        if len(dup):
            k = key[dup[0]]
            raise ValueError(f"run {i}: query {str(uq[k // n_docs])!r} has document {str(ud[k % n_docs])!r} "
                             "more than once")
        ranked.append(_rank(q, d, v))
    if norm == "borda":
        ranked = _borda_norm(ranked, n_queries, n_docs)
    else:
        ranked = [_normalise(r, norm) for r in ranked]
    return uq, ud, ranked


def fuse_columns(runs, method: str = "rrf", norm: str | None = "min-max", params: dict | None = None) -> FusedColumns:
    """Fuse ``runs``, each a (qid, docno, score) triple of arrays, with ``method`` after ``norm``
    (names as :func:`method_name` and :func:`norm_name` accept them) and ``params`` (:data:`METHODS`).
    Raises FusionNameError for unknown names or parameters, ValueError for fewer than two runs, a
    repeated (query, document) within a run, or a score that is not finite."""
    method = method_name(method)
    norm = norm_name(norm)
    runs = list(runs)
    params = check_params(method, dict(params or {}), len(runs))
    if len(runs) < 2:
        raise ValueError(f"fusion needs at least two runs, got {len(runs)}")
    uq, ud, ranked = _prepare(runs, norm)
    n_queries, n_docs = len(uq), max(len(ud), 1)
    pairs, score = _fuse(ranked, method, params, n_queries, n_docs)
    out = _rank(pairs // n_docs, pairs % n_docs, score)
    return FusedColumns(uq[out.q], ud[out.d], out.v, out.rank + 1)
