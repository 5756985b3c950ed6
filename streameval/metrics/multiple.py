"""Multiple comparisons: adjusted p-values for a family of tests and Tukey's HSD over all pairs of
systems. Pure numpy / scipy, no state, no Beam.

* :func:`holm` - Holm's step-down adjustment (Holm 1979), controls the family-wise error rate.
* :func:`benjamini_hochberg` - the Benjamini-Hochberg step-up adjustment (Benjamini and Hochberg
  1995), controls the false discovery rate for independent or positively dependent tests.
* :func:`bonferroni` - Bonferroni's single-step adjustment, ``min(1, m p)``: the family-wise error
  rate under any dependence, never smaller than Holm's.
* :func:`adjust_pvalues` - any of them (or none) by name, :data:`ADJUST_METHODS`.
* :func:`tukey_hsd` - Tukey's honestly significant difference test of all pairs of group means
  (Tukey 1949; Kramer 1956 for unequal group sizes), the one-way form of
  ``statsmodels.stats.multicomp.pairwise_tukeyhsd`` and ``scipy.stats.tukey_hsd``.

In ``streameval compare`` a family is one metric's comparisons of every other system with the
baseline, and Tukey's test takes the per-query scores of every system (as groups) on the queries
all systems scored. This is what ranx does (``ranx.compare(..., stat_test="tukey")`` calls
``scipy.stats.tukey_hsd`` on the per-query scores): the one-way test ignores that the scores are
paired by query, so the between-query variance goes into its error term and it is conservative
compared with a repeated-measures (two-way) analysis; it needs no model beyond equal variances.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["ADJUST_METHODS", "holm", "benjamini_hochberg", "bonferroni", "adjust_pvalues", "TukeyHSD", "tukey_hsd"]

#: the names :func:`adjust_pvalues` takes: no adjustment, Holm, Benjamini-Hochberg, Bonferroni
ADJUST_METHODS = ("none", "holm", "bh", "bonferroni")


def _pvalues(pvalues) -> tuple[np.ndarray, np.ndarray]:
    p = np.array(pvalues, dtype=np.float64)  # a copy
    bad = ~np.isnan(p) & ((p < 0.0) | (p > 1.0))
    if bad.any():
        raise ValueError(f"p-values must be in [0, 1], got {p[bad].ravel()[0]!r}")
    return p, ~np.isnan(p)


def holm(pvalues) -> np.ndarray:
    """Holm-adjusted p-values (Holm, "A simple sequentially rejective multiple test procedure",
    Scandinavian Journal of Statistics 1979): with the ``m`` p-values sorted, ``p_(1) <= ... <=
    p_(m)``, ``adj_(i) = min(1, max_{j <= i} (m - j + 1) p_(j))``. Rejecting where ``adj <= alpha``
    keeps the family-wise error rate at ``alpha`` under any dependence. Equal p-values get equal
    adjusted values, whatever their order.

    ``pvalues``: array-like of any shape; returns float64 of the same shape. NaN entries are not
    tests: they stay NaN and do not count in ``m`` (as R's ``p.adjust``). ValueError when a value
    is outside [0, 1]. Same as ``statsmodels.stats.multitest.multipletests(p, method="holm")[1]``."""
    p, ok = _pvalues(pvalues)
    s = p[ok]
    m = s.size
    if m:
        order = np.argsort(s, kind="stable")
        adj = np.maximum.accumulate((m - np.arange(m)) * s[order])
        out = np.empty(m)
        out[order] = np.minimum(adj, 1.0)
        p[ok] = out
    return p


def benjamini_hochberg(pvalues) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (Benjamini and Hochberg, "Controlling the false
    discovery rate", Journal of the Royal Statistical Society B 1995): with the ``m`` p-values
    sorted, ``adj_(i) = min(1, min_{j >= i} m p_(j) / j)``. Rejecting where ``adj <= alpha`` keeps
    the false discovery rate at ``alpha`` for independent (or positively dependent) tests. Equal
    p-values get equal adjusted values.

    ``pvalues``: array-like of any shape; returns float64 of the same shape; NaN entries stay NaN
    and do not count in ``m``. ValueError when a value is outside [0, 1]. Same as
    ``multipletests(p, method="fdr_bh")[1]`` and ``scipy.stats.false_discovery_control(p)``."""
    p, ok = _pvalues(pvalues)
    s = p[ok]
    m = s.size
    if m:
        order = np.argsort(s, kind="stable")
        adj = s[order] * m / np.arange(1, m + 1)
        adj = np.minimum.accumulate(adj[::-1])[::-1]
        out = np.empty(m)
        out[order] = np.minimum(adj, 1.0)
        p[ok] = out
    return p


def bonferroni(pvalues) -> np.ndarray:
    """Bonferroni-adjusted p-values: ``min(1, m p)`` for the ``m`` p-values that are not NaN (NaN
    entries stay NaN and do not count in ``m``). Rejecting where ``adj <= alpha`` keeps the
    family-wise error rate at ``alpha`` under any dependence; Holm's adjustment is never larger.
    Same as ``multipletests(p, method="bonferroni")[1]``. ValueError when a value is outside [0, 1]."""
    p, ok = _pvalues(pvalues)
    p[ok] = np.minimum(p[ok] * int(ok.sum()), 1.0)
    return p


def adjust_pvalues(pvalues, method: str) -> np.ndarray:
    """``pvalues`` adjusted as one family by ``method``: ``"none"`` (a float64 copy), ``"holm"``
    (:func:`holm`), ``"bh"`` (:func:`benjamini_hochberg`) or ``"bonferroni"`` (:func:`bonferroni`).
    ValueError for another method or a value outside [0, 1]."""
    if method == "none":
        return _pvalues(pvalues)[0]
    if method == "bonferroni":
        return bonferroni(pvalues)
    if method == "holm":
        return holm(pvalues)
    if method == "bh":
        return benjamini_hochberg(pvalues)
    raise ValueError(f"adjustment method must be one of {', '.join(ADJUST_METHODS)}, got {method!r}")


@dataclass(frozen=True)
class TukeyHSD:
    """Result of :func:`tukey_hsd` for ``k`` groups; the ``P = k (k - 1) / 2`` pairs ``(i, j)``,
    ``i < j``, in the order of ``numpy.triu_indices(k, 1)`` (0-1, 0-2, ..., 1-2, ...).

    ``means``, ``nobs``: (k,) group means and sizes; ``pairs``: (P, 2) int, the indices ``i, j``;
    ``diff``: (P,) ``means[j] - means[i]``; ``stderr``: (P,) ``sqrt(mse / 2 * (1 / n_i + 1 / n_j))``;
    ``q``: (P,) the studentized range statistic ``abs(diff) / stderr``; ``pvalue``: (P,) the
    adjusted p-value ``P(Q_{k, df} >= q)``; ``low``, ``high``: (P,) the simultaneous interval
    ``diff -/+ q_crit * stderr``; ``reject``: (P,) bool, ``q > q_crit`` (the interval excludes 0);
    ``mse``: pooled within-group variance, ``df``: its degrees of freedom ``N - k``;
    ``q_crit``: the ``level`` quantile of the studentized range with ``k`` and ``df``; ``level``."""

    means: np.ndarray
    nobs: np.ndarray
    pairs: np.ndarray
    diff: np.ndarray
    stderr: np.ndarray
    q: np.ndarray
    pvalue: np.ndarray
    low: np.ndarray
    high: np.ndarray
    reject: np.ndarray
    mse: float
    df: int
    q_crit: float
    level: float


@functools.lru_cache(maxsize=64)
def _q_crit(k: int, df: int, level: float) -> float:
    from scipy.stats import studentized_range

    return float(studentized_range.ppf(level, k, df))  # about 0.2 s: cached per (k, df, level)


def tukey_hsd(groups, level: float = 0.95) -> TukeyHSD:
    """Tukey's HSD test of all pairs of ``k >= 2`` group means, one way (Tukey, "Comparing
    individual means in the analysis of variance", Biometrics 1949; the Tukey-Kramer form for
    unequal sizes, Kramer 1956). ``mse = sum_g sum_x (x - mean_g)^2 / (N - k)`` pools the groups'
    variances (equal variances assumed), ``q = abs(mean_j - mean_i) / sqrt(mse / 2 * (1 / n_i +
    1 / n_j))`` and the p-value is the studentized range survival function with ``k`` and ``N - k``
    degrees of freedom (``scipy.stats.studentized_range``); p-values and intervals hold for all
    pairs at once (family-wise, ``1 - level``). The numbers of
    ``statsmodels.stats.multicomp.pairwise_tukeyhsd(x, g, alpha=1 - level)`` and
    ``scipy.stats.tukey_hsd(*groups)``.

    ``groups``: sequence of ``k`` 1-D array-likes of finite scores (sizes may differ); ``level``:
    confidence level of the intervals in (0, 1). Returns :class:`TukeyHSD`. ValueError for fewer
    than two groups, an empty group, a value that is not finite, or no degrees of freedom (``N <=
    k``). When ``mse`` is 0 a nonzero difference gets ``q = inf``, p = 0 and a zero-width interval,
    a zero one ``q = NaN``, p = NaN."""
    from scipy.stats import studentized_range

    from .stats import check_level

    level = check_level(level)
    gs = [np.asarray(g, dtype=np.float64).ravel() for g in groups]
    k = len(gs)
    if k < 2:
        raise ValueError(f"Tukey's HSD needs at least two groups, got {k}")
    nobs = np.array([g.size for g in gs], dtype=np.int64)
    if (nobs == 0).any():
        raise ValueError(f"Tukey's HSD: group {int(np.argmin(nobs))} is empty")
    for i, g in enumerate(gs):
        if not np.isfinite(g).all():
            raise ValueError(f"Tukey's HSD: group {i} has a value that is not finite")
    df = int(nobs.sum()) - k
    if df < 1:
        raise ValueError(f"Tukey's HSD needs more observations than groups, got {int(nobs.sum())} for {k} groups")
    means = np.array([math.fsum(g.tolist()) / g.size for g in gs])
    mse = math.fsum(math.fsum(((g - m) ** 2).tolist()) for g, m in zip(gs, means)) / df
    i, j = np.triu_indices(k, 1)
    diff = means[j] - means[i]
    stderr = np.sqrt(mse / 2.0 * (1.0 / nobs[i] + 1.0 / nobs[j]))
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(stderr > 0, np.abs(diff) / stderr, np.where(diff != 0, np.inf, np.nan))
    finite = np.isfinite(q)
    pvalue = np.where(finite, studentized_range.sf(np.where(finite, q, 0.0), k, df), np.where(np.isinf(q), 0.0, np.nan))
    q_crit = _q_crit(k, df, level)
    half = q_crit * stderr
    reject = ~np.isnan(q) & (np.nan_to_num(q, nan=0.0) > q_crit)
    return TukeyHSD(means=means, nobs=nobs, pairs=np.column_stack([i, j]), diff=diff, stderr=stderr, q=q,
                    pvalue=pvalue, low=diff - half, high=diff + half, reject=reject, mse=float(mse), df=df,
                    q_crit=q_crit, level=level)
