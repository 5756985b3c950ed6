"""PR-AUC (average precision), precision / recall / F1 at a score threshold, and score drift (PSI,
Kolmogorov-Smirnov) from counts per distinct score (issue 43 item 7).

Every value here is a function of one state: the counts of positives and negatives per distinct
score, ascending (the exact ``auc`` state, :class:`~streameval.accumulators.online.AucOps` /
:class:`~streameval.accumulators.online.CountArrays`), so it is exactly mergeable and the same for
any split and merge order. Definitions (docs/metrics.md, "PR-AUC, threshold metrics and drift"):

* ``pr_auc``: average precision as scikit-learn's ``average_precision_score`` defines it,
  ``AP = sum_k (R_k - R_{k-1}) P_k`` over the distinct scores taken as thresholds in descending
  order (a step function: tied scores enter together, no interpolation; Davis & Goadrich 2006 on
  why the PR curve is not interpolated linearly). NaN when there is no positive.
* ``precision[t=T]``, ``recall[t=T]``, ``f1[t=T]``: a score >= T predicts a click; tp, fp, fn
  counted from the same state. ``num_queries``: the denominator (tp + fp, tp + fn, tp + fp + fn).
* ``psi[score]``: population stability index of the window's scores (actual) against a reference
  (expected) over the reference's deciles (:func:`decile_edges`), zero proportions replaced by
  :data:`PSI_EPSILON` (Siddiqi 2006; Yurdakul 2018).
* ``ks[score]``: the two-sample Kolmogorov-Smirnov statistic of the window's raw scores against the
  reference's, and its p-value as ``scipy.stats.ks_2samp`` (``method="auto"``) gives it.

Layer 1: numpy (scipy for the KS p-value, imported when needed).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["average_precision_from_counts", "threshold_counts", "threshold_result", "decile_edges", "psi",
           "ks_from_counts", "DriftReference", "PSI_EPSILON", "KS_EXACT_MAX_N", "score_count_results"]

#: a bin's proportion of 0 (in the window or the reference) is replaced by this in the PSI
PSI_EPSILON = 1e-4
#: scipy's ks_2samp(method="auto") computes the exact p-value up to this sample size, else Smirnov's
#: asymptotic one
KS_EXACT_MAX_N = 10000


def _int64(a) -> np.ndarray:
    return np.asarray(a).astype(np.int64, copy=False)


def average_precision_from_counts(pos, neg) -> tuple[float, int, int]:
    """``(ap, P, N)`` from counts of positives and negatives per distinct score, scores ascending.
    The same sum as scikit-learn's ``average_precision_score``: over the distinct scores from the
    highest, precision at that threshold times the recall it adds. NaN when P is 0."""
    pos, neg = _int64(pos), _int64(neg)
    P, N = int(pos.sum()), int(neg.sum())
    if P == 0:
        return (math.nan, P, N)
    p, n = pos[::-1], neg[::-1]
    tp = np.cumsum(p)
    fp = np.cumsum(n)
    keep = p > 0  # a threshold that adds no recall adds nothing
    precision = tp[keep] / (tp[keep] + fp[keep])
    recall = tp[keep] / P
    added = np.diff(np.concatenate(([0.0], recall)))
    return (float(np.sum(added * precision)), P, N)


def threshold_counts(values, pos, neg, threshold: float) -> tuple[int, int, int, int]:
    """``(tp, fp, fn, tn)`` of the prediction ``score >= threshold`` from counts per distinct score
    (``values`` ascending)."""
    values = np.asarray(values, dtype=np.float64)
    pos, neg = _int64(pos), _int64(neg)
    at = int(np.searchsorted(values, float(threshold), side="left"))  # values[at:] >= threshold
    tp, fp = int(pos[at:].sum()), int(neg[at:].sum())
    return tp, fp, int(pos[:at].sum()), int(neg[:at].sum())


def threshold_result(family: str, tp: int, fp: int, fn: int) -> tuple[float, int, float | None]:
    """``(value, n, stderr)`` of ``precision`` (tp / (tp + fp), n = tp + fp), ``recall`` (tp / (tp +
    fn), n = tp + fn) or ``f1`` (2 tp / (2 tp + fp + fn), n = tp + fp + fn, no standard error). The
    binomial standard error sqrt(v (1 - v) / n) of precision and recall (the rows' Wilson interval
    is computed from the value and n). NaN with the n when n is 0."""
    if family == "f1":
        n = tp + fp + fn
        return ((2 * tp / (2 * tp + fp + fn)) if n else math.nan, n, None)
    n = tp + fp if family == "precision" else tp + fn
    if n == 0:
        return (math.nan, 0, math.nan)
    v = tp / n
    return (v, n, math.sqrt(v * (1.0 - v) / n))


def decile_edges(reference: np.ndarray) -> np.ndarray:
    """The distinct inner edges of the reference's deciles: ``np.quantile(reference, [0.1, ...,
    0.9])`` (numpy's default, linear interpolation), duplicates dropped (ties give fewer bins). Bin
    ``i`` holds the scores x with ``edges[i-1] < x <= edges[i]`` (the first from -inf, the last to
    +inf)."""
    return np.unique(np.quantile(np.asarray(reference, dtype=np.float64), np.arange(1, 10) / 10.0))


def _bin_counts(values, counts, edges) -> np.ndarray:
    b = np.searchsorted(edges, np.asarray(values, dtype=np.float64), side="left")
    return np.bincount(b, weights=np.asarray(counts, dtype=np.float64), minlength=len(edges) + 1)


def psi(actual_values, actual_counts, expected_values, expected_counts, edges) -> float:
    """Population stability index ``sum_i (a_i - e_i) ln(a_i / e_i)`` over the bins of ``edges``
    (:func:`decile_edges`), a_i and e_i the proportions of the actual (window) and expected
    (reference) scores in bin i, each 0 replaced by :data:`PSI_EPSILON`. NaN when either is empty."""
    a = _bin_counts(actual_values, actual_counts, edges)
    e = _bin_counts(expected_values, expected_counts, edges)
    if a.sum() == 0 or e.sum() == 0:
        return math.nan
    a = a / a.sum()
    e = e / e.sum()
    a[a == 0] = PSI_EPSILON
    e[e == 0] = PSI_EPSILON
    return float(np.sum((a - e) * np.log(a / e)))


def ks_from_counts(values1, counts1, values2, counts2) -> tuple[float, float]:
    """``(statistic, p-value)`` of the two-sided two-sample KS test of two samples given as counts
    per distinct value (ascending): the statistic ``max |F1 - F2|`` over the values of both, with the
    same floats as ``scipy.stats.ks_2samp`` (cumulative counts over n), and its p-value as
    ``ks_2samp(method="auto")`` (exact up to :data:`KS_EXACT_MAX_N` observations: then scipy is
    called on the samples rebuilt from the counts; else ``kstwo.sf(d, round(n1 n2 / (n1 + n2)))``).
    NaN for an empty sample."""
    v1, v2 = np.asarray(values1, dtype=np.float64), np.asarray(values2, dtype=np.float64)
    c1, c2 = _int64(counts1), _int64(counts2)
    n1, n2 = int(c1.sum()), int(c2.sum())
    if n1 == 0 or n2 == 0:
        return (math.nan, math.nan)
    if max(n1, n2) <= KS_EXACT_MAX_N:
        from scipy.stats import ks_2samp

        r = ks_2samp(np.repeat(v1, c1), np.repeat(v2, c2), method="auto")
        return (float(r.statistic), float(r.pvalue))
    from scipy.stats import kstwo

    allv = np.union1d(v1, v2)
    cum1 = np.concatenate(([0], np.cumsum(c1)))[np.searchsorted(v1, allv, side="right")]
    cum2 = np.concatenate(([0], np.cumsum(c2)))[np.searchsorted(v2, allv, side="right")]
    diff = cum1 / n1 - cum2 / n2
    d = float(max(np.max(diff), np.clip(-np.min(diff), 0, 1)))
    m, n = sorted([float(n1), float(n2)], reverse=True)
    return (d, float(np.clip(kstwo.sf(d, np.round(m * n / (m + n))), 0, 1)))


class DriftReference:
    """The reference scores of ``psi[score]`` and ``ks[score]``: distinct values ascending, their
    counts, and the PSI's bin edges (:func:`decile_edges`). ``scores``: finite floats, at least one."""

    def __init__(self, scores, source: str = "reference"):
        s = np.asarray(scores, dtype=np.float64).reshape(-1)
        if not len(s):
            raise ValueError(f"drift reference {source}: no scores")
        if not np.isfinite(s).all():
            raise ValueError(f"drift reference {source}: a score is not finite ({s[~np.isfinite(s)][0]!r})")
        self.source = str(source)
        self.values, counts = np.unique(s + 0.0, return_counts=True)
        self.counts = counts.astype(np.int64)
        self.edges = decile_edges(s)

    @property
    def n(self) -> int:
        return int(self.counts.sum())


def score_count_results(specs, values, pos, neg, reference: DriftReference | None = None) -> list:
    """``[(row name, value, n, stderr), ...]`` of the specs (``pr_auc``, ``precision``, ``recall``,
    ``f1``, ``psi``, ``ks`` families of :class:`~streameval.metrics.online_names.OnlineSpec`) from
    counts per distinct score (``values`` ascending). ``ks[score]`` gives two rows: the statistic and
    ``ks[score]:p_value``. Raises ValueError for a drift metric without ``reference``."""
    values = np.asarray(values, dtype=np.float64)
    pos, neg = _int64(pos), _int64(neg)
    out = []
    total = None
    for s in specs:
        f = s.family
        if f == "pr_auc":
            ap, P, N = average_precision_from_counts(pos, neg)
            out.append((s.name, ap, P + N, None))
        elif f in ("precision", "recall", "f1"):
            tp, fp, fn, _ = threshold_counts(values, pos, neg, s.threshold)
            out.append((s.name, *threshold_result(f, tp, fp, fn)))
        elif f in ("psi", "ks"):
            if reference is None:
                raise ValueError(f"{s.name} needs a reference distribution (the batch job's --drift-reference PATH, "
                                 f"evaluate_log(reference=...))")
            if total is None:
                total = pos + neg
            n = int(total.sum())
            if f == "psi":
                out.append((s.name, psi(values, total, reference.values, reference.counts, reference.edges), n, None))
            else:
                d, p = ks_from_counts(values, total, reference.values, reference.counts)
                out.append((s.name, d, n, None))
                out.append((f"{s.name}:p_value", p, n, None))
        else:
            raise ValueError(f"not a score-count metric: {s.name}")
    return out
