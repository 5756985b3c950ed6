"""Means and ratios from sums with their standard errors (:mod:`streameval.metrics.online`), shared by
GAUC, the click metrics and the off-policy estimates."""

from __future__ import annotations

import math
from fractions import Fraction



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
# the same from the values themselves (two passes: the deviations from the mean, no difference of sums)

def mean_and_se(x) -> tuple[float, float]:
    """``(mean, stderr)`` of the values ``x`` (shape (n,)): the mean is the correctly rounded sum
    over n, the standard error sqrt(sum (x - mean)^2 / (n - 1) / n) summed in a second pass over the
    deviations (as ``numpy.std(x, ddof=1) / sqrt(n)``; equal values give 0 exactly, where a
    difference of sums of squares leaves a residue of an ulp of the sum of squares).
    ``(NaN, NaN)`` for n = 0; stderr NaN for n = 1."""
    import numpy as np

    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    if n == 0:
        return (math.nan, math.nan)
    mean = math.fsum(x.tolist()) / n
    if n < 2:
        return (mean, math.nan)
    d = x - mean
    return (mean, math.sqrt(math.fsum((d * d).tolist()) / (n - 1) / n))


def ratio_and_se(w, y) -> tuple[float, float]:
    """``(R, stderr)`` of the ratio estimator R = sum y / sum w over units (w_i, y_i), standard error
    as :func:`ratio_from_sums` (se^2 = n / (n - 1) * sum (y_i - R w_i)^2 / (sum w)^2), the residuals
    taken in a second pass. ``(NaN, NaN)`` when n = 0 or sum w = 0; stderr NaN when n = 1."""
    import numpy as np

    w = np.asarray(w, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = len(w)
    sw = math.fsum(w.tolist())
    if n == 0 or sw == 0:
        return (math.nan, math.nan)
    r = math.fsum(y.tolist()) / sw
    if n < 2:
        return (r, math.nan)
    d = y - r * w
    return (r, math.sqrt(math.fsum((d * d).tolist()) * n / (n - 1)) / abs(sw))


# --------------------------------------------------------------------------------------------
# a ratio over clusters (clustered standard error of CTR)

def clustered_ratio_from_sums(g: int, sn, sy, snn, sny, syy) -> tuple[float, float]:
    """``(R, stderr)`` of R = sum y / sum n over ``g`` clusters (a cluster: a request's or a user's
    impressions n_c and clicks y_c) from the sums over clusters of n, y, n^2, n y and y^2 (ints, or
    exact Fractions). The delta method over per-cluster sums (the ratio estimator's linearisation;
    Deng, Lu and Litz, "Trustworthy analysis of online A/B tests", WSDM 2018, section 3):
    se^2 = g / (g - 1) * sum_c (y_c - R n_c)^2 / (sum n)^2, with sum (y - R n)^2 = sum y^2 -
    2 R sum n y + R^2 sum n^2 taken exactly. This is the cluster-robust (CR1) standard error of the
    intercept of an OLS regression of the click on a constant (statsmodels' ``cov_type="cluster"``).
    ``(NaN, NaN)`` when there is no impression; stderr NaN for one cluster."""
    if g == 0 or not sn:
        return (math.nan, math.nan)
    r = Fraction(sy) / Fraction(sn)
    if g < 2:
        return (float(r), math.nan)
    return (float(r), math.sqrt(float(clustered_ratio_variance(g, sn, sy, snn, sny, syy))))


def clustered_ratio_variance(g: int, sn, sy, snn, sny, syy) -> Fraction:
    """The exact variance (se^2) of :func:`clustered_ratio_from_sums`' ratio, as a Fraction:
    g / (g - 1) * max(sum_c (y_c - R n_c)^2, 0) / (sum n)^2. Needs g >= 2 and sum n > 0."""
    sn, sy, snn, sny, syy = (Fraction(x) for x in (sn, sy, snn, sny, syy))
    r = sy / sn
    ss = syy - 2 * r * sny + r * r * snn
    return Fraction(g, g - 1) * max(ss, Fraction(0)) / (sn * sn)
