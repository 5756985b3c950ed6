"""Online-metric definitions: AUC, group AUC (GAUC), click metrics per request, off-policy CTR.

The one place these metrics are defined (pure numpy and Python: no Beam, no I/O). The accumulators
(:mod:`streameval.accumulators.online`) and the Beam combiners (:mod:`streameval.beam.online`) keep
mergeable sums and counts and call the functions here to turn them into values. Conventions and
sources are in ``docs/metrics.md`` (section "Online metrics").

AUC
    The Mann-Whitney statistic: the probability that a random positive scores above a random
    negative, ties counted one half (Hanley and McNeil, Radiology 1982; identical to
    scikit-learn's ``roc_auc_score``). Computed exactly from integer counts per distinct score
    (:func:`auc_from_counts`), standard error by DeLong et al. (Biometrics 1988).
Histogram AUC
    The same statistic over score bins (:func:`hist_bin_index`): pairs in the same bin count one
    half. Binning is monotone, so pairs in different bins are ordered as their scores are and only
    same-bin pairs can be wrong, each by at most 1/2: ``|AUC_hist - AUC| <= max_error =
    sum_b pos_b * neg_b / (2 P N)`` (:func:`hist_auc_max_error`), computed from the histogram.
GAUC
    AUC per group (user, query or request), averaged with weights (impressions: Zhou et al., "Deep
    Interest Network", KDD 2018; clicks; or unweighted). Groups with a single class have no AUC and
    are excluded and counted (:func:`group_auc`, :func:`gauc`).
Click metrics per request
    clicks@k, reciprocal rank of the first (highest-ranked) click, abandonment
    (:func:`click_request_terms`; Radlinski, Kurup and Joachims, CIKM 2008).
Dwell metrics per request
    mean dwell, satisfied-click rate (dwell >= T, Fox et al., ACM TOIS 2005), long-click CTR and
    last-click CTR from the clicks' ``dwell_ms``, defined in :mod:`streameval.metrics.dwell` and
    computed with the click metrics (:func:`click_request_terms`); clicks without a dwell are
    excluded from them (the engines count them).
Off-policy CTR
    IPS (Horvitz and Thompson 1952; Precup et al. 2000) and self-normalised IPS (Swaminathan and
    Joachims, NeurIPS 2015) with standard errors (:func:`ips_from_sums`, :func:`snips_from_sums`).
Calibration
    log loss, Brier score, calibration ratio, ECE: parsed here, defined in
    :mod:`streameval.metrics.calibration`.
Interleaving
    team-draft credit per interleaved request, preference, sign test: parsed here, defined in
    :mod:`streameval.metrics.interleaving`.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .dwell import DEFAULT_SAT_SECONDS, DWELL_FAMILIES, dwell_request_terms, seconds_text, threshold_ms
from .names import MetricNameError

__all__ = [
    "OnlineSpec",
    "parse_online_metric",
    "parse_online_metrics",
    "is_online_metric",
    "GAUC_GROUPS",
    "GAUC_WEIGHTINGS",
    "auc_counts",
    "auc_from_counts",
    "auc_delong_stderr",
    "auc_score",
    "hist_bin_index",
    "hist_auc_max_error",
    "group_auc",
    "gauc_weights",
    "gauc",
    "mean_from_sums",
    "ratio_from_sums",
    "click_request_terms",
    "DWELL_FAMILIES",
    "DEFAULT_SAT_SECONDS",
    "ips_from_sums",
    "snips_from_sums",
    "ess_from_sums",
    "ope_sums",
    "ips",
    "snips",
    "UniformTarget",
    "TableTarget",
    "LoggedPropensityTarget",
    "bts_action_probabilities",
]

# --------------------------------------------------------------------------------------------
# names

#: GAUC group -> the impression field that identifies the group
GAUC_GROUPS = {"user": "user_id", "query": "query_id", "request": "request_id"}
#: GAUC weighting -> what weighs a group's AUC
GAUC_WEIGHTINGS = ("impressions", "clicks", "unweighted")
_GROUP_ALIASES = {"user": "user", "users": "user", "user_id": "user", "query": "query", "queries": "query",
                  "query_id": "query", "request": "request", "requests": "request", "request_id": "request",
                  "session": "request"}
_WEIGHT_ALIASES = {"impressions": "impressions", "impression": "impressions", "imps": "impressions",
                   "views": "impressions", "clicks": "clicks", "click": "clicks", "positives": "clicks",
                   "unweighted": "unweighted", "uniform": "unweighted", "none": "unweighted",
                   "equal": "unweighted", "mean": "unweighted"}
DEFAULT_GAUC_GROUP = "user"
DEFAULT_GAUC_WEIGHTING = "impressions"

_FAMILIES = ("auc", "auc_hist", "gauc", "ctr", "clicks", "rr_first_click", "abandonment", "logloss", "brier",
             "calibration", "ece", "interleaving", *DWELL_FAMILIES)


@dataclass(frozen=True)
class OnlineSpec:
    """One online metric. ``family`` one of auc, auc_hist, gauc, ctr, clicks, rr_first_click,
    abandonment, logloss, brier, calibration, ece (:mod:`streameval.metrics.calibration`),
    interleaving (:mod:`streameval.metrics.interleaving`); ``k`` the
    cutoff of clicks@k, the position of ctr@pos{k} or the bins of ece; ``group`` and
    ``weighting`` of GAUC; ``clicked_only`` for ``rr_first_click[clicked]``; ``threshold_ms`` the
    dwell threshold T (milliseconds) of ``sat_click_rate``, ``long_click_ctr`` and ``last_click_ctr``
    (families in :data:`DWELL_FAMILIES`, with ``mean_dwell``)."""

    family: str
    k: int | None = None
    group: str | None = None
    weighting: str | None = None
    clicked_only: bool = False
    threshold_ms: int | None = None

    @property
    def name(self) -> str:
        """Canonical name used in result rows: ``auc``, ``auc_hist``, ``gauc[user,impressions]``,
        ``ctr``, ``ctr@pos2``, ``clicks@3``, ``clicks``, ``rr_first_click``,
        ``rr_first_click[clicked]``, ``abandonment``, ``logloss``, ``brier``, ``calibration``,
        ``ece[bins=10]``, ``mean_dwell``, ``sat_click_rate[t=30s]``, ``long_click_ctr[t=30s]``,
        ``last_click_ctr[t=30s]``."""
        f = self.family
        if f in DWELL_FAMILIES and f != "mean_dwell":
            return f"{f}[t={seconds_text(self.threshold_ms)}s]"
        if f == "ece":
            return f"ece[bins={self.k}]"
        if f == "gauc":
            return f"gauc[{self.group},{self.weighting}]"
        if f == "ctr":
            return "ctr" if self.k is None else f"ctr@pos{self.k}"
        if f == "clicks":
            return "clicks" if self.k is None else f"clicks@{self.k}"
        if f == "rr_first_click":
            return "rr_first_click[clicked]" if self.clicked_only else "rr_first_click"
        return f

    @property
    def needs_scores(self) -> bool:
        """True for the score-based metrics (auc, auc_hist, gauc and the calibration metrics)."""
        return self.family in ("auc", "auc_hist", "gauc", "logloss", "brier", "calibration", "ece")

    @property
    def calibration(self) -> bool:
        """True for the calibration metrics (logloss, brier, calibration, ece): score as probability."""
        return self.family in ("logloss", "brier", "calibration", "ece")

    @property
    def per_request(self) -> bool:
        """True for the metrics averaged over requests (clicks, rr_first_click, abandonment and the
        dwell metrics)."""
        return self.family in ("clicks", "rr_first_click", "abandonment", *DWELL_FAMILIES)

    @property
    def dwell(self) -> bool:
        """True for the dwell metrics (:data:`DWELL_FAMILIES`: they read the clicks' ``dwell_ms``)."""
        return self.family in DWELL_FAMILIES

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.name


_ACCEPTED = ("auc, auc_hist, gauc, gauc[GROUP] or gauc[GROUP,WEIGHTING] (GROUP user/query/request, "
             "WEIGHTING impressions/clicks/unweighted), ctr, ctr@pos{p}, clicks, clicks@k, rr_first_click, "
             "rr_first_click[clicked], abandonment, logloss, brier, calibration, ece or ece[bins=B] (fixed-width "
             "bins, B from 1 to 10000, default 10), interleaving or interleaving[team_draft] (team-draft credit "
             "from the impressions' attributes[\"team\"]), mean_dwell, sat_click_rate[t=T], "
             "long_click_ctr[t=T], last_click_ctr[t=T] (dwell threshold T in seconds, e.g. t=30s or t=1.5s, or "
             "t=500ms; default 30s)")


def parse_online_metric(name: str) -> OnlineSpec:
    """Parse one online metric name (forms in :data:`_ACCEPTED`; case-insensitive).

    Raises :class:`~streameval.metrics.names.MetricNameError` listing the accepted forms."""
    text = str(name).strip()
    low = text.lower().replace(" ", "")
    if low in ("auc", "roc_auc", "auc_exact"):
        return OnlineSpec("auc")
    if low in ("auc_hist", "auc[hist]", "auc_histogram"):
        return OnlineSpec("auc_hist")
    m = re.fullmatch(r"gauc(?:\[([a-z_]+)(?:,([a-z_]+))?\])?", low)
    if m:
        group = _GROUP_ALIASES.get(m.group(1) or DEFAULT_GAUC_GROUP)
        weighting = _WEIGHT_ALIASES.get(m.group(2) or DEFAULT_GAUC_WEIGHTING)
        if group is None or weighting is None:
            raise MetricNameError(f"bad GAUC name {name!r}: group one of {sorted(GAUC_GROUPS)}, weighting one "
                                  f"of {list(GAUC_WEIGHTINGS)}; accepted: {_ACCEPTED}")
        return OnlineSpec("gauc", group=group, weighting=weighting)
    if low == "ctr":
        return OnlineSpec("ctr")
    m = re.fullmatch(r"ctr@pos(\d+)", low)
    if m and int(m.group(1)) >= 1:
        return OnlineSpec("ctr", k=int(m.group(1)))
    if low in ("clicks", "clicks_per_request"):
        return OnlineSpec("clicks")
    m = re.fullmatch(r"clicks@(\d+)", low)
    if m and int(m.group(1)) >= 1:
        return OnlineSpec("clicks", k=int(m.group(1)))
    m = re.fullmatch(r"(?:rr_first_click|rr_click|mrr_click|first_click_rr)(\[clicked\])?", low)
    if m:
        return OnlineSpec("rr_first_click", clicked_only=bool(m.group(1)))
    if low in ("abandonment", "abandonment_rate"):
        return OnlineSpec("abandonment")
    if low in ("mean_dwell", "dwell", "avg_dwell", "mean_dwell_time"):
        return OnlineSpec("mean_dwell")
    m = re.fullmatch(r"(sat_click_rate|sat_clicks|satisfied_click_rate|long_click_ctr|long_ctr|last_click_ctr)"
                     r"(?:\[(.*)\])?", low)
    if m:
        family = {"sat_clicks": "sat_click_rate", "satisfied_click_rate": "sat_click_rate",
                  "long_ctr": "long_click_ctr"}.get(m.group(1), m.group(1))
        return OnlineSpec(family, threshold_ms=threshold_ms(name, m.group(2)))
    if low in ("logloss", "log_loss", "cross_entropy"):
        return OnlineSpec("logloss")
    if low in ("brier", "brier_score", "brier_score_loss"):
        return OnlineSpec("brier")
    if low in ("calibration", "calibration_ratio"):
        return OnlineSpec("calibration")
    if low in ("interleaving", "interleaving[team_draft]", "team_draft"):
        return OnlineSpec("interleaving")
    m = re.fullmatch(r"ece(?:\[(.*)\])?", low)
    if m:
        return OnlineSpec("ece", k=_ece_bins(name, m.group(1)))
    raise MetricNameError(f"unknown online metric {name!r}; accepted: {_ACCEPTED}")


def _ece_bins(name, params) -> int:
    """The bins of ``ece[...]``: none (10), ``B`` or ``bins=B``; quantile bins are refused."""
    from .calibration import DEFAULT_BINS, MAX_BINS

    if params is None:
        return DEFAULT_BINS
    parts = params.split(",")
    if any(p in ("quantile", "strategy=quantile") for p in parts):
        raise MetricNameError(f"bad ECE name {name!r}: quantile bins are not exactly mergeable and are not offered; "
                              f"use fixed-width bins ece[bins=B]")
    m = re.fullmatch(r"(?:bins=)?(\d+)(?:,(?:uniform|strategy=uniform))?", params)
    if not m or not 1 <= int(m.group(1)) <= MAX_BINS:
        raise MetricNameError(f"bad ECE name {name!r}: expected ece, ece[bins=B] or ece[B] with B an integer from 1 "
                              f"to {MAX_BINS}")
    return int(m.group(1))


def parse_online_metrics(names) -> list[OnlineSpec]:
    """Parse a name or a list of names (a comma list is split, except inside brackets); duplicates
    are dropped, order kept."""
    if isinstance(names, str):
        names = _split_names(names)
    out: list[OnlineSpec] = []
    for n in names:
        s = parse_online_metric(n)
        if s not in out:
            out.append(s)
    return out


def _split_names(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def is_online_metric(name: str) -> bool:
    """True when ``name`` parses as an online metric (see :func:`parse_online_metric`)."""
    try:
        parse_online_metric(name)
    except MetricNameError:
        return False
    return True


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


def _ints(a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind not in "iu" and len(a):
        if not np.all(a == np.floor(a)):
            raise ValueError("counts must be integers")
    return a.astype(np.int64)


def _u2(pos: np.ndarray, neg: np.ndarray, P: int, N: int) -> int:
    """Twice the Mann-Whitney U (an exact integer): sum over values of pos_v (2 neg_below_v + neg_v)."""
    if 2 * P * N < 2**62:  # no int64 overflow anywhere below
        neg_below = np.cumsum(neg) - neg
        return int(np.dot(pos, 2 * neg_below + neg))
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
    auc = _u2(pos, neg, P, N) / (2 * P * N)
    neg_below = (np.cumsum(neg) - neg).astype(np.float64)
    pos_above = (P - np.cumsum(pos)).astype(np.float64)
    v10 = (neg_below + 0.5 * neg) / N
    v01 = (pos_above + 0.5 * pos) / P
    s10 = float(np.dot(pos, (v10 - auc) ** 2)) / (P - 1)
    s01 = float(np.dot(neg, (v01 - auc) ** 2)) / (N - 1)
    return math.sqrt(s10 / P + s01 / N)


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
    the ratio estimator (see :func:`ratio_from_sums`). NaN with 0 groups when none qualifies."""
    _, auc, n_pos, n_neg = group_auc(groups, scores, labels)
    ok = ~np.isnan(auc)
    w = gauc_weights(n_pos[ok], n_neg[ok], weighting)
    a = auc[ok]
    sums = [math.fsum(w.tolist()), math.fsum((w * a).tolist()), math.fsum((w * w).tolist()),
            math.fsum((w * w * a).tolist()), math.fsum((w * w * a * a).tolist())]
    value, se = ratio_from_sums(int(ok.sum()), *sums)
    return value, int(ok.sum()), int((~ok).sum()), se


# --------------------------------------------------------------------------------------------
# means and ratios from sums (shared by GAUC, the click metrics and off-policy estimates)

def _num(x):
    return x if isinstance(x, Fraction) else float(x)


def mean_from_sums(n: int, s, s2) -> tuple[float, float]:
    """``(mean, stderr)`` of n values from their sum ``s`` and sum of squares ``s2``: the sample
    standard deviation over sqrt(n). Floats or exact Fractions (then the variance is exact).
    ``(NaN, NaN)`` for n = 0; stderr NaN for n = 1."""
    if n == 0:
        return (math.nan, math.nan)
    mean = float(s) / n if not isinstance(s, Fraction) else float(s / n)
    if n < 2:
        return (mean, math.nan)
    m2 = _num(s2) - _num(s) * _num(s) / n
    var = max(float(m2), 0.0) / (n - 1)
    return (mean, math.sqrt(var / n))


def ratio_from_sums(n: int, sw, swy, sw2, sw2y, sw2y2) -> tuple[float, float]:
    """``(R, stderr)`` of the ratio estimator R = sum(w y) / sum(w) over n units from five sums
    (of w, w y, w^2, w^2 y, w^2 y^2).

    Standard error by linearisation (Cochran, Sampling Techniques, 1977, section 6.4):
    se^2 = n / (n - 1) * sum w_i^2 (y_i - R)^2 / (sum w_i)^2, with
    sum w^2 (y - R)^2 = sum w^2 y^2 - 2 R sum w^2 y + R^2 sum w^2. With w = 1 this is the usual
    standard error of a mean. Used for GAUC (units: groups, y: AUC) and SNIPS (units: impressions,
    y: reward). Floats or exact Fractions. ``(NaN, NaN)`` when n = 0 or sum(w) = 0; stderr NaN when
    n = 1."""
    if n == 0 or sw == 0:
        return (math.nan, math.nan)
    sw, swy, sw2, sw2y, sw2y2 = (_num(x) for x in (sw, swy, sw2, sw2y, sw2y2))
    r = swy / sw
    if n < 2:
        return (float(r), math.nan)
    ss = sw2y2 - 2 * r * sw2y + r * r * sw2
    var = max(float(ss / (sw * sw)), 0.0) * n / (n - 1)
    return (float(r), math.sqrt(var))


# --------------------------------------------------------------------------------------------
# click metrics per request

def click_request_terms(specs, request_index, click_positions, n_requests: int, click_dwell_ms=None) -> np.ndarray:
    """Per-request values of the click and dwell metrics, shape (len(specs), n_requests).

    ``request_index``, ``click_positions``: shape (c,), one entry per clicked impression (its
    request's index in 0..n_requests-1 and its 1-based position). Requests absent from
    ``request_index`` had no click. ``click_dwell_ms``: shape (c,), each click's dwell in
    milliseconds (integers >= 0 as floats), NaN when unknown; None: every dwell unknown. ``specs``:
    :class:`OnlineSpec` of the per-request families:

    * ``clicks@k``: clicked impressions at positions <= k (``clicks``: all positions);
    * ``rr_first_click``: 1 / position of the highest-ranked click, 0 without a click
      (``[clicked]``: NaN without a click, so the mean is over requests with a click);
    * ``abandonment``: 1 when the request has no click, else 0;
    * ``mean_dwell``: the mean dwell in seconds of the request's clicks with a known dwell; NaN
      (request left out of the mean) when it has none;
    * ``sat_click_rate[t=T]``: the share of those clicks with dwell >= T (satisfied clicks, Fox et
      al., "Evaluating implicit measures to improve web search", ACM TOIS 23(2), 2005: T = 30 s);
      NaN when the request has no click with a known dwell;
    * ``long_click_ctr[t=T]``: 1 when the request has a click with dwell >= T (a long click), 0 when
      it has none and every click's dwell is known (or no click); NaN (left out) when no known
      dwell reaches T and some click's dwell is unknown;
    * ``last_click_ctr[t=T]``: the same on the request's last click only, the clicked impression
      ranked lowest (largest position: the schema records whether, not when, an item was clicked);
      0 without a click.

    Raises ValueError on an index out of range, a position < 1, a negative dwell or mismatched
    shapes."""
    req = np.asarray(request_index, dtype=np.int64)
    pos = np.asarray(click_positions, dtype=np.int64)
    if req.shape != pos.shape:
        raise ValueError("request_index and click_positions must have the same shape")
    if len(req) and (req.min() < 0 or req.max() >= n_requests):
        raise ValueError("request_index out of range")
    if len(pos) and pos.min() < 1:
        raise ValueError("positions are 1-based")
    out = np.zeros((len(specs), n_requests))
    first = np.full(n_requests, np.inf)
    np.minimum.at(first, req, pos.astype(np.float64))
    clicked = np.isfinite(first)
    dwell = [s for s in specs if s.dwell]
    if dwell:
        dwell = dict(zip(dwell, dwell_request_terms(dwell, req, pos, n_requests, click_dwell_ms)))
    for i, s in enumerate(specs):
        if s.family == "clicks":
            sel = req if s.k is None else req[pos <= s.k]
            out[i] = np.bincount(sel, minlength=n_requests)
        elif s.family == "rr_first_click":
            rr = np.where(clicked, 1.0 / first, math.nan if s.clicked_only else 0.0)
            out[i] = rr
        elif s.family == "abandonment":
            out[i] = (~clicked).astype(np.float64)
        elif s.dwell:
            out[i] = dwell[s]
        else:
            raise ValueError(f"{s.name} is not a per-request click metric")
    return out


# --------------------------------------------------------------------------------------------
# off-policy estimates of the CTR (reward: click) of a target policy from logged propensities

def ope_sums(rewards, target_prob, logging_prob) -> tuple[int, list[float]]:
    """``(n, [sum w, sum w^2, sum w r, sum w^2 r, sum w^2 r^2])`` with importance weights
    w = target_prob / logging_prob (each array shape (n,)). Raises ValueError when a logging
    probability is not in (0, 1] or a target probability not in [0, 1]."""
    r = np.asarray(rewards, dtype=np.float64)
    pe = np.asarray(target_prob, dtype=np.float64)
    pb = np.asarray(logging_prob, dtype=np.float64)
    if not (r.shape == pe.shape == pb.shape):
        raise ValueError("rewards, target_prob and logging_prob must have the same shape")
    if not ((pb > 0) & (pb <= 1)).all():
        raise ValueError("logging probabilities (propensities) must be in (0, 1]")
    if not ((pe >= 0) & (pe <= 1)).all():
        raise ValueError("target probabilities must be in [0, 1]")
    w = pe / pb
    terms = [w, w * w, w * r, w * w * r, w * w * r * r]
    return len(r), [math.fsum(t.tolist()) for t in terms]


def ips_from_sums(n: int, sw, sw2, swr, sw2r, sw2r2) -> tuple[float, float]:
    """IPS: ``(V, stderr)`` with V = (1/n) sum w_i r_i, the mean of the weighted rewards
    (Horvitz-Thompson; unbiased when the logging policy gives every action the target can take a
    positive probability), stderr their sample standard deviation over sqrt(n). Arguments as
    returned by :func:`ope_sums` (sum w r^2 w = sum w^2 r^2 is the sum of squares of w r)."""
    return mean_from_sums(n, swr, sw2r2)


def snips_from_sums(n: int, sw, sw2, swr, sw2r, sw2r2) -> tuple[float, float]:
    """Self-normalised IPS: ``(V, stderr)`` with V = sum w_i r_i / sum w_i (Swaminathan and
    Joachims 2015), stderr by the delta method (:func:`ratio_from_sums` with y = r)."""
    return ratio_from_sums(n, sw, swr, sw2, sw2r, sw2r2)


def ess_from_sums(n: int, sw, sw2, *_rest) -> tuple[float, float]:
    """``(mean weight, effective sample size)``: sum(w)/n (1 in expectation when the target's
    actions are covered) and Kong's ESS (sum w)^2 / sum w^2. NaN when n = 0."""
    if n == 0 or not sw2:
        return (math.nan, math.nan)
    sw, sw2 = _num(sw), _num(sw2)
    return (float(sw / n) if isinstance(sw, Fraction) else sw / n, float(sw * sw / sw2))


def ips(rewards, target_prob, logging_prob) -> tuple[float, float]:
    """``(IPS estimate, stderr)`` from arrays (see :func:`ips_from_sums`)."""
    n, sums = ope_sums(rewards, target_prob, logging_prob)
    return ips_from_sums(n, *sums)


def snips(rewards, target_prob, logging_prob) -> tuple[float, float]:
    """``(SNIPS estimate, stderr)`` from arrays (see :func:`snips_from_sums`)."""
    n, sums = ope_sums(rewards, target_prob, logging_prob)
    return snips_from_sums(n, *sums)


# --------------------------------------------------------------------------------------------
# target policies: probability that the target policy shows an impression's item at its position

def _attr(rec: dict, attribute: str | None):
    if attribute is None:
        return None
    return (rec.get("attributes") or {}).get(attribute)


class UniformTarget:
    """The uniform random policy: every item of the catalogue equally likely at every position,
    probability 1 / n_items (a slate of distinct items drawn uniformly at random puts a given item
    at a given position with probability 1 / n_items).

    ``n_items``: an int, or a dict {attribute value: int} when catalogues differ by slice (e.g.
    Open Bandit campaigns: ``{"all": 80, "men": 34, "women": 46}``, ``attribute="campaign"``).
    Calling it on an impression dict gives the probability, or None when the impression's slice is
    not in the dict."""

    def __init__(self, n_items, attribute: str | None = None):
        if isinstance(n_items, dict):
            if attribute is None:
                raise ValueError("a per-slice n_items needs the attribute that names the slice")
            if any(int(v) < 1 for v in n_items.values()):
                raise ValueError("n_items must be positive")
            self.n_items = {str(k): int(v) for k, v in n_items.items()}
        else:
            if int(n_items) < 1:
                raise ValueError("n_items must be positive")
            self.n_items = int(n_items)
        self.attribute = attribute

    def __call__(self, rec: dict):
        if isinstance(self.n_items, int):
            return 1.0 / self.n_items
        n = self.n_items.get(_attr(rec, self.attribute))
        return None if n is None else 1.0 / n


class TableTarget:
    """A context-free policy given as a table {(slice value, item_id, position): probability}
    (slice value None when ``attribute`` is None). Missing keys give None (unknown)."""

    def __init__(self, table: dict, attribute: str | None = None):
        self.table = {(None if a is None else str(a), str(i), int(p)): float(v) for (a, i, p), v in table.items()}
        bad = [v for v in self.table.values() if not 0.0 <= v <= 1.0]
        if bad:
            raise ValueError(f"probabilities must be in [0, 1], got {bad[0]}")
        self.attribute = attribute

    def __call__(self, rec: dict):
        return self.table.get((_attr(rec, self.attribute), str(rec["item_id"]), int(rec["position"])))


class LoggedPropensityTarget:
    """A context-free but time-varying policy known from its own logs: the probability of
    (slice value, item, position) at time t is the propensity logged for that same (slice value,
    item, position) at the nearest logged time (ties: the earlier). Valid for policies whose action
    distribution does not depend on the user (e.g. Bernoulli Thompson Sampling between updates);
    None when the (slice value, item, position) was never logged.

    ``records``: iterable of (slice value, item_id, position, timestamp, propensity)."""

    def __init__(self, records, attribute: str | None = None):
        table: dict = {}
        for a, item, pos, ts, p in records:
            table.setdefault((None if a is None else str(a), str(item), int(pos)), []).append((int(ts), float(p)))
        self.times = {}
        self.probs = {}
        for k, v in table.items():
            v.sort()
            self.times[k] = [t for t, _ in v]
            self.probs[k] = [p for _, p in v]
        self.attribute = attribute

    def __call__(self, rec: dict):
        key = (_attr(rec, self.attribute), str(rec["item_id"]), int(rec["position"]))
        times = self.times.get(key)
        if not times:
            return None
        t = int(rec["timestamp"])
        i = bisect_left(times, t)
        if i == len(times) or (i > 0 and t - times[i - 1] <= times[i] - t):
            i -= 1
        return self.probs[key][i]


def bts_action_probabilities(alpha, beta, len_list: int = 3, n_sim: int = 100_000, seed: int = 12345,
                             chunk: int = 10_000) -> np.ndarray:
    """Action distribution of Bernoulli Thompson Sampling with Beta(alpha, beta) posteriors that
    shows the ``len_list`` items with the largest sampled click rates, by Monte Carlo: shape
    (n_items, len_list), entry [a, k] the share of ``n_sim`` simulated slates with item a at
    position k + 1.

    Reproduces ``obp.policy.BernoulliTS(..., random_state=seed).compute_batch_action_dist(
    n_sim=n_sim)`` of obp 0.4.1 (Saito et al., Open Bandit Pipeline) draw for draw: one
    ``RandomState(seed).beta(alpha, beta)`` vector per simulation, items ordered by
    ``argsort()[::-1]``. Monte Carlo error of an entry p: sqrt(p (1 - p) / n_sim)."""
    a = np.asarray(alpha, dtype=np.float64)
    b = np.asarray(beta, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("alpha and beta must be vectors of the same length")
    if len_list > len(a):
        raise ValueError("len_list is larger than the number of items")
    rng = np.random.RandomState(seed)
    counts = np.zeros((len(a), len_list), dtype=np.int64)
    done = 0
    while done < n_sim:
        m = min(chunk, n_sim - done)
        draws = rng.beta(a, b, size=(m, len(a)))  # the same stream as m calls of beta(a, b)
        top = np.argsort(draws, axis=1)[:, ::-1][:, :len_list]
        for k in range(len_list):
            counts[:, k] += np.bincount(top[:, k], minlength=len(a))
        done += m
    return counts / n_sim
