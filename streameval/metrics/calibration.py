"""Calibration of predicted click probabilities: log loss, Brier score, calibration ratio and the
expected calibration error (ECE) over fixed-width bins, with the bins of a reliability diagram.

Pure numpy (no Beam, no I/O); the names are parsed by
:func:`streameval.metrics.online.parse_online_metric`, the mergeable state is
:class:`streameval.accumulators.online.CalibrationOps`. Conventions and sources are in
``docs/metrics.md`` (section "Calibration").

The predicted probability of an impression is its ``score`` when the score is in [0, 1]; the
label is the impression's label (``clicked`` with labels from clicks). Impressions whose score is
outside [0, 1] are left out of these metrics and counted (``online:score_not_probability``).

Log loss
    mean of ``-log(q)`` with ``q = clip(p, EPS, 1 - EPS)`` for a click and
    ``q = clip(1 - p, EPS, 1 - EPS)`` for a non-click; ``EPS`` the float64 machine epsilon
    (2.22e-16), scikit-learn's clipping (``log_loss``, 1.5 and later), so a confident mistake costs
    at most ``-log(EPS) = 36.04``.
Brier score
    mean of ``(p - y)^2`` (Brier, Monthly Weather Review 1950; scikit-learn's ``brier_score_loss``).
Calibration ratio
    sum of predicted probabilities / number of clicks (predicted over observed clicks; 1 when
    calibrated in the large), standard error by linearisation of the ratio.
ECE
    ``sum_b (n_b / n) |mean p_b - click rate_b|`` over ``B`` fixed-width bins of ``[0, 1]``
    (Naeini, Cooper and Hauskrecht, AAAI 2015; Guo et al., ICML 2017). Bin ``b`` (0-based) holds
    ``edges[b] < p <= edges[b + 1]`` (bin 0 also holds 0) with ``edges = numpy.linspace(0, 1, B + 1)``:
    exactly scikit-learn's ``calibration_curve(strategy="uniform")``. Mergeable exactly (per-bin
    counts, clicks and sums of p). Quantile bins are not exactly mergeable and are not offered.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .online_sums import ratio_from_sums

__all__ = ["EPS", "MAX_BINS", "DEFAULT_BINS", "CALIBRATION_FAMILIES", "probability_mask", "example_terms",
           "bin_index", "logloss", "brier", "calibration_ratio", "ece", "reliability_bins", "ratio_result",
           "ece_from_bins"]

#: the clipping of log loss: float64 machine epsilon, as scikit-learn
EPS = float(np.finfo(np.float64).eps)
#: the largest number of ECE bins accepted
MAX_BINS = 10_000
#: bins of ``ece`` without a parameter
DEFAULT_BINS = 10
#: the online-metric families of this module
CALIBRATION_FAMILIES = ("logloss", "brier", "calibration", "ece")


def probability_mask(scores) -> np.ndarray:
    """True where a score can be a predicted probability: in [0, 1] (NaN: False)."""
    s = np.asarray(scores, dtype=np.float64)
    return (s >= 0.0) & (s <= 1.0)


def _check(p, y) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(p, dtype=np.float64)
    y = np.asarray(y)
    if p.ndim != 1 or y.shape != p.shape:
        raise ValueError(f"probabilities and labels must be one-dimensional of one length, got {p.shape}, {y.shape}")
    if not probability_mask(p).all():
        raise ValueError(f"probabilities must be in [0, 1], got {p[~probability_mask(p)][0]!r}")
    if y.dtype != bool:
        if not ((y == 0) | (y == 1)).all():
            raise ValueError("labels must be 0/1 or booleans")
        y = y == 1
    return p, y


def example_terms(p, y) -> tuple[np.ndarray, np.ndarray]:
    """``(log loss term, Brier term)`` of each example: shape (n,) each. ``p`` probabilities in
    [0, 1], ``y`` booleans or 0/1. The one definition both engines use (numpy's log, so the
    per-record and the columnar engine add the same floats)."""
    p, y = _check(p, y)
    q = np.clip(np.where(y, p, 1.0 - p), EPS, 1.0 - EPS)
    d = p - y
    return -np.log(q), d * d


def bin_index(p, bins: int) -> np.ndarray:
    """The fixed-width bin (0-based) of each probability: ``searchsorted(linspace(0, 1, bins + 1)[1:-1],
    p, "left")``, scikit-learn's ``calibration_curve`` binning (right-closed bins, 0 in bin 0)."""
    check_bins(bins)
    edges = np.linspace(0.0, 1.0, int(bins) + 1)
    return np.searchsorted(edges[1:-1], np.asarray(p, dtype=np.float64), "left").astype(np.int64)


def check_bins(bins) -> int:
    """``bins`` as an int in 1..MAX_BINS; ValueError otherwise."""
    if isinstance(bins, bool) or int(bins) != bins or not 1 <= bins <= MAX_BINS:
        raise ValueError(f"bins must be an integer from 1 to {MAX_BINS}, got {bins!r}")
    return int(bins)


def _fsum_mean(x: np.ndarray) -> float:
    return math.fsum(x.tolist()) / len(x) if len(x) else math.nan


def logloss(p, y) -> float:
    """Mean log loss (see module docstring); NaN without examples."""
    return _fsum_mean(example_terms(p, y)[0])


def brier(p, y) -> float:
    """Brier score: mean of (p - y)^2; NaN without examples."""
    return _fsum_mean(example_terms(p, y)[1])


def ratio_result(n: int, clicks: int, sp, sp2, spy) -> tuple[float, float]:
    """``(R, stderr)`` of the calibration ratio R = sum p / clicks over ``n`` examples from
    ``sp`` = sum p, ``sp2`` = sum p^2 and ``spy`` = sum of p over the clicks (floats or exact
    Fractions). Linearisation (Cochran 1977, 6.4) with a_i = p_i, b_i = y_i:
    se^2 = n / (n - 1) * sum (a_i - R b_i)^2 / (sum b_i)^2. NaN without clicks; stderr NaN for n < 2."""
    if n == 0 or clicks == 0:
        return (math.nan, math.nan)
    return ratio_from_sums(n, clicks, sp, clicks, spy, sp2)


def calibration_ratio(p, y) -> float:
    """Sum of predicted probabilities over the number of clicks; NaN without clicks."""
    p, y = _check(p, y)
    c = int(y.sum())
    return math.fsum(p.tolist()) / c if c else math.nan


def reliability_bins(p, y, bins: int = DEFAULT_BINS) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(bin, count, clicks, sum p)`` of the non-empty bins, bins ascending (shape (m,) each)."""
    p, y = _check(p, y)
    b = bin_index(p, bins)
    count = np.bincount(b, minlength=bins)
    clicks = np.bincount(b, weights=y, minlength=bins).astype(np.int64)
    keep = np.flatnonzero(count)
    sums = np.array([math.fsum(p[b == k].tolist()) for k in keep.tolist()], dtype=np.float64)
    return keep, count[keep], clicks[keep], sums


def ece_from_bins(n: int, clicks, sums) -> float:
    """ECE from per-bin clicks and sums of p (Fractions or floats taken exactly) over ``n``
    examples: ``sum_b |sum p_b - clicks_b| / n``, computed exactly and correctly rounded. NaN for n = 0."""
    if n == 0:
        return math.nan
    total = sum((abs(Fraction(s) - int(c)) for s, c in zip(sums, clicks)), Fraction(0))
    return float(total / n)


def ece(p, y, bins: int = DEFAULT_BINS) -> float:
    """Expected calibration error over ``bins`` fixed-width bins (see module docstring)."""
    p, y = _check(p, y)
    _, count, clicks, _ = reliability_bins(p, y, bins)
    b = bin_index(p, bins)
    sums = [sum((Fraction(x) for x in p[b == k].tolist()), Fraction(0)) for k in np.flatnonzero(
        np.bincount(b, minlength=bins)).tolist()]
    return ece_from_bins(len(p), clicks.tolist(), sums)
