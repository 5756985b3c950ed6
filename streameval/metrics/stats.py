"""Statistics over per-query scores: confidence intervals, paired tests, and the stable random
weights of the mergeable bootstrap and randomization test. Pure numpy / scipy, no state.

Intervals (``level`` is the confidence level, default 0.95):

* :func:`t_interval` - Student t on the per-query scores: ``mean -/+ t_{n-1,(1+level)/2} * stderr``.
* :func:`wilson_interval` - Wilson score interval of a binomial proportion (CTR rows).
* :func:`normal_interval` - ``mean -/+ z_{(1+level)/2} * stderr`` (the Wald interval for a proportion).
* :func:`logit_interval` - the t interval of ``logit(mean)`` (delta method: standard error
  ``stderr / (mean (1 - mean))``) mapped back by the logistic function: inside (0, 1) always. The
  logit-transformed interval of a proportion or a bounded mean of Stata's ``proportion`` (its
  default) and R survey's ``svyciprop(method = "logit")`` (Korn and Graubard, Analysis of Health
  Surveys, 1999, 5.2), and of an AUC (Pepe, The Statistical Evaluation of Medical Tests, 2003, 5.2.3).
* :func:`row_interval` - the interval fields of a metric_result row (Wilson for CTR, t otherwise,
  logit for a metric bounded in [0, 1] whose t interval leaves it; with ``kind="anytime"`` the
  confidence sequences below).

Confidence sequences (anytime-valid: with probability ``level`` they hold at every look at once, so
someone who watches every early pane and stops at the first exclusion keeps the error rate):

* :func:`normal_mixture_cs` - the asymptotic confidence sequence of a mean (Waudby-Smith, Arbour,
  Sinha, Kennedy and Ramdas, "Time-uniform central limit theory and asymptotic confidence
  sequences", Annals of Statistics 2024, the two-sided normal-mixture boundary).
* :func:`beta_binomial_cs` - the beta-binomial mixture confidence sequence of a proportion (Howard,
  Ramdas, McAuliffe and Sekhon, "Time-uniform, nonparametric, nonasymptotic confidence sequences",
  Annals of Statistics 2021, the conjugate-mixture method with Ville's inequality); exact.
* :func:`msprt_cs` - the always-valid confidence sequence of a difference that :func:`msprt_pvalue`
  inverts (below).
* :func:`percentile_interval` - the ``(1-level)/2`` and ``(1+level)/2`` quantiles of bootstrap
  replicates, as the ``(R+1) alpha``-th order statistics (Hyndman and Fan type 6, interpolated;
  Davison and Hinkley 1997, section 5.2). numpy's default (type 7) puts the ends of a 95% interval
  from 200 replicates at about the 3.0% and 97.0% points, and the interval covers about 94%.

Tests of a paired difference (``d_q = b_q - a_q`` per query):

* :func:`t_test` - the paired t-test from the mean, count and standard error of the differences
  (what :func:`scipy.stats.ttest_rel` computes from the two samples).
* :func:`sign_flip_pvalue_exact` - the exact two-sided randomization (sign-flip, Fisher) test of
  the mean difference: the share of the ``2**n`` sign patterns whose sum is at least as far from 0
  as the observed one, counted exactly (integer arithmetic, meet in the middle).
* :func:`sign_flip_pvalue_mc` - the Monte Carlo version from replicate sums,
  ``(1 + #{|T_r| >= |T|}) / (R + 1)`` (Phipson and Smyth 2010; never 0).

Always-valid p-value of a change (mSPRT; Johari, Pekelis and Walsh, "Always valid inference:
continuous monitoring of A/B tests", Operations Research 2022, arXiv:1512.04922, 2015/2017; Johari,
Koomen, Pekelis and Walsh, "Peeking at A/B tests", KDD 2017):

* :func:`msprt_lambda` - the normal-mixture likelihood ratio ``Lambda_n`` of ``theta = theta0``
  for an estimate ``d_n ~ N(theta, V_n)`` of a difference of two means, mixture ``theta ~ N(theta0,
  tau^2)``;
* :func:`msprt_pvalue` - ``p_n = min(1, min_{k <= n} 1 / Lambda_k)``, the running minimum over the
  looks: pass the previous look's ``p`` as ``p_prev`` (mergeable along panes: one float of state).

Sample-ratio mismatch (an experiment's arms did not get the units its split declared):

* :func:`srm_test` - Pearson's chi-square goodness-of-fit test of the units per arm against the
  declared split (what :func:`scipy.stats.chisquare` computes with ``f_exp`` = the expected counts);
  Kohavi, Tang and Xu, Trustworthy Online Controlled Experiments, 2020, chapter 21; Fabijan et al.,
  "Diagnosing sample ratio mismatch in online controlled experiments", KDD 2019.
* :func:`parse_expected_split` - ``"A=50,B=50"`` -> ``{"A": 0.5, "B": 0.5}``.

Stable randomness: the weight of a query in replicate ``r`` is a function of the query's key, ``r``,
a stream name and a user seed only, so the same query gets the same weights in the library, the
batch job and the streaming job, on any worker, in any merge order:

``query_seeds``: ``seed64 = BLAKE2b(key bytes, digest_size=8, key=seed as 8 little-endian bytes,
person=stream)`` read as a little-endian unsigned 64-bit integer (never Python's salted ``hash()``);
``replicate_bits``: ``z_r = splitmix64 output r`` of that seed, i.e. ``mix(seed64 + (r + 1) *
0x9E3779B97F4A7C15 mod 2**64)`` with Steele, Lea and Flood's finaliser;
``poisson_weights``: Poisson(1) by inversion of the top 53 bits ``U = z_r >> 11``, the weight being
the number of thresholds ``T_j = round(F(j) * 2**53)`` (``F`` the Poisson(1) CDF, computed exactly
in rational arithmetic) that ``U`` reaches; ``sign_flips``: replicate ``r``'s sign is ``-1`` when
bit ``r mod 64`` (least significant first) of splitmix64 output ``r // 64 + 1`` is set, else ``+1``
(stream ``b"streameval-flip"``, independent of the bootstrap's ``b"streameval-boot"``).
"""

from __future__ import annotations

import bisect
import hashlib
import math
from fractions import Fraction

import numpy as np

__all__ = [
    "DEFAULT_LEVEL",
    "t_interval",
    "normal_interval",
    "logit_interval",
    "BOUNDED_METHODS",
    "parse_expected_split",
    "srm_test",
    "wilson_interval",
    "percentile_interval",
    "t_test",
    "paired_t_test",
    "sign_flip_pvalue_exact",
    "sign_flip_pvalue_mc",
    "stable_key",
    "query_seeds",
    "replicate_bits",
    "poisson_weights",
    "sign_flips",
    "BOOTSTRAP_STREAM",
    "FLIP_STREAM",
    "POISSON_THRESHOLDS",
    "is_binomial_metric",
    "row_interval",
    "check_level",
    "normal_mixture_cs",
    "beta_binomial_cs",
    "CS_TARGET_N",
    "INTERVAL_KINDS",
    "MSPRT_TAU",
    "msprt_lambda",
    "msprt_pvalue",
    "msprt_cs",
]

DEFAULT_LEVEL = 0.95
BOOTSTRAP_STREAM = b"streameval-boot"
FLIP_STREAM = b"streameval-flip"


def check_level(level: float, name: str = "confidence level") -> float:
    """``level`` as a float; ValueError unless it is in (0, 1) (NaN is not). ``name``: the option or
    parameter as the caller knows it (``--ci-level``)."""
    level = float(level)
    if not 0.0 < level < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {level:g}")
    return level


def check_bounded(method: str, name: str = "ci_bounded") -> str:
    """``method`` when it is one of :data:`BOUNDED_METHODS` (the interval of a metric bounded in
    [0, 1]); else ValueError naming the choices. The one check for the API, both jobs' transforms
    and :func:`row_interval`."""
    if method not in BOUNDED_METHODS:
        raise ValueError(f"{name} must be one of {', '.join(BOUNDED_METHODS)}, got {method!r}")
    return method


_check_level = check_level


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


# --------------------------------------------------------------------------------------------
# intervals

def t_interval(mean: float, n: int, stderr: float, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Student t interval of a mean from ``n`` scores with standard error ``stderr`` (sample
    standard deviation / sqrt(n)): ``mean -/+ t.ppf((1 + level) / 2, n - 1) * stderr``.
    ``(NaN, NaN)`` when ``n < 2`` or the mean or stderr is not finite. (``scipy.special.stdtrit``,
    which ``scipy.stats.t.ppf`` calls: the same numbers without importing scipy.stats, about half a
    second per process.)"""
    from scipy import special

    level = _check_level(level)
    if n is None or n < 2 or not _finite(mean) or not _finite(stderr):
        return (math.nan, math.nan)
    half = float(special.stdtrit(n - 1, (1.0 + level) / 2.0)) * stderr
    return (mean - half, mean + half)


def logit_interval(mean: float, n: int, stderr: float, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Logit-transformed t interval of a mean of values in [0, 1]:
    ``expit(logit(mean) -/+ t.ppf((1 + level) / 2, n - 1) * stderr / (mean (1 - mean)))``, the
    standard error of ``logit(mean)`` by the delta method. Always inside (0, 1), asymmetric near the
    ends. ``(NaN, NaN)`` when ``n < 2``, the mean is not in (0, 1) or the stderr is not finite and
    positive (Korn and Graubard 1999; Stata's ``proportion``, R survey's ``svyciprop(method =
    "logit")``, which takes the degrees of freedom of the design as here ``n - 1``)."""
    from scipy import special

    level = _check_level(level)
    if n is None or n < 2 or not _finite(mean) or not _finite(stderr) or not 0.0 < mean < 1.0 or stderr <= 0:
        return (math.nan, math.nan)
    q = float(special.stdtrit(n - 1, (1.0 + level) / 2.0))
    centre = math.log(mean) - math.log1p(-mean)
    half = q * stderr / (mean * (1.0 - mean))
    return (float(special.expit(centre - half)), float(special.expit(centre + half)))


def parse_expected_split(text: str) -> dict:
    """The declared split of an experiment, ``"SYSTEM=WEIGHT,..."`` (weights positive numbers, any
    scale: ``A=50,B=50``, ``A=1,B=1`` and ``A=0.5,B=0.5`` are one split) -> ``{system: share}``, the
    shares summing to 1. At least two systems, each once. Raises ValueError (one line) otherwise."""
    out: dict = {}
    for part in str(text).split(","):
        name, eq, w = part.strip().rpartition("=")
        name = name.strip()
        if not eq or not name:
            raise ValueError(f"--expected-split wants SYSTEM=WEIGHT,SYSTEM=WEIGHT,..., got {part.strip()!r} in {text!r}")
        try:
            weight = float(w)
        except ValueError:
            raise ValueError(f"--expected-split: the weight of {name!r} is not a number: {w.strip()!r}") from None
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"--expected-split: the weight of {name!r} must be a positive number, got {w.strip()!r}")
        if name in out:
            raise ValueError(f"--expected-split names {name!r} twice")
        out[name] = weight
    if len(out) < 2:
        raise ValueError(f"--expected-split needs two systems or more, got {text!r}")
    total = math.fsum(out.values())
    return {k: v / total for k, v in out.items()}


def srm_test(observed, shares) -> tuple[float, float]:
    """``(chi2, p)``: Pearson's chi-square test of the counts ``observed`` (units per arm) against the
    expected shares ``shares`` (same order, summing to 1): ``chi2 = sum (o - N s)^2 / (N s)``, ``N =
    sum o``, ``p`` its upper tail with ``k - 1`` degrees of freedom (``scipy.special.chdtrc``; as
    :func:`scipy.stats.chisquare` with ``f_exp = N s``). ``(NaN, NaN)`` when ``N = 0``."""
    from scipy import special

    o = np.asarray(observed, dtype=np.float64)
    s = np.asarray(shares, dtype=np.float64)
    if o.shape != s.shape or o.ndim != 1 or len(o) < 2:
        raise ValueError("observed and shares must be vectors of one length, two or more")
    n = float(o.sum())
    if n <= 0:
        return (math.nan, math.nan)
    e = n * s
    chi2 = float(np.sum((o - e) ** 2 / e))
    return chi2, float(special.chdtrc(len(o) - 1, chi2))


def normal_interval(mean: float, stderr: float, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """``mean -/+ z * stderr`` with ``z = norm.ppf((1 + level) / 2)`` (``scipy.special.ndtri``);
    NaN when not finite."""
    from scipy import special

    level = _check_level(level)
    if not _finite(mean) or not _finite(stderr):
        return (math.nan, math.nan)
    half = float(special.ndtri((1.0 + level) / 2.0)) * stderr
    return (mean - half, mean + half)


def wilson_interval(successes, trials, level: float = DEFAULT_LEVEL):
    """Wilson score interval of the proportion ``successes / trials`` (Wilson 1927; Agresti and
    Coull 1998): the ``p`` with ``|p_hat - p| <= z sqrt(p (1 - p) / n)``, i.e.

        (p_hat + z^2/(2n) -/+ z sqrt(p_hat (1 - p_hat)/n + z^2/(4 n^2))) / (1 + z^2/n)

    with ``z = norm.ppf((1 + level) / 2)``; the same as scipy's
    ``binomtest(k, n).proportion_ci(level, method="wilson")``. Works on scalars or arrays;
    ``trials == 0`` gives NaN. Unlike the Wald interval it stays inside [0, 1] and is not empty
    when no impression was clicked."""
    from scipy import special

    level = _check_level(level)
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    z = float(special.ndtri((1.0 + level) / 2.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        p = k / n
        denom = 1.0 + z * z / n
        center = (p + z * z / (2.0 * n)) / denom
        half = z * np.sqrt(p * (1.0 - p) / n + z * z / (4.0 * n * n)) / denom
        low = np.where(n > 0, np.clip(center - half, 0.0, 1.0), np.nan)
        high = np.where(n > 0, np.clip(center + half, 0.0, 1.0), np.nan)
    if low.ndim == 0:
        return (float(low), float(high))
    return low, high


def percentile_interval(replicates, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval: the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of
    the finite replicate values, type 6 (``numpy.quantile(..., method="weibull")``: the
    ``(R + 1) p``-th order statistic, interpolated, clamped to the extremes). NaN when fewer than
    two replicates are finite."""
    level = _check_level(level)
    r = np.asarray(replicates, dtype=np.float64)
    r = r[np.isfinite(r)]
    if r.size < 2:
        return (math.nan, math.nan)
    lo, hi = np.quantile(r, [(1.0 - level) / 2.0, (1.0 + level) / 2.0], method="weibull")
    return (float(lo), float(hi))


# --------------------------------------------------------------------------------------------
# paired tests

def t_test(mean: float, n: int, stderr: float) -> tuple[float, float]:
    """One-sample t-test of ``mean == 0`` from ``n`` values with standard error ``stderr``:
    ``(t, two-sided p)`` with ``t = mean / stderr`` and ``n - 1`` degrees of freedom. Applied to
    paired differences it is the paired t-test. ``(NaN, NaN)`` for ``n < 2``; zero stderr gives
    ``t = +-inf, p = 0`` (NaN, NaN when the mean is 0 too), as scipy does."""
    from scipy import special

    if n is None or n < 2 or not _finite(mean) or stderr is None or not math.isfinite(stderr):
        return (math.nan, math.nan)
    if stderr == 0.0:
        if mean == 0.0:
            return (math.nan, math.nan)
        return (math.copysign(math.inf, mean), 0.0)
    t = mean / stderr
    # scipy.stats.t.sf(x, df) is special.stdtr(df, -x) (t_gen._sf; loc 0, scale 1): the same double,
    # without importing scipy.stats (about 0.5 s of CPU per process)
    return (t, float(2.0 * special.stdtr(n - 1, -abs(t))))


def paired_t_test(a, b) -> tuple[float, float]:
    """Paired t-test of ``b - a`` on two aligned arrays (NaN pairs dropped): ``(t, p)``."""
    d = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    d = d[np.isfinite(d)]
    n = d.size
    if n < 2:
        return (math.nan, math.nan)
    mean = math.fsum(d.tolist()) / n
    return t_test(mean, n, float(np.std(d, ddof=1)) / math.sqrt(n))


def _exact_int(x: float) -> int:
    """``x * 2**1074`` as an exact integer (``x`` finite; every double is a multiple of 2**-1074)."""
    m, e = math.frexp(x)
    mant, shift = int(m * (1 << 53)), e + 1021  # x = mant * 2**(e - 53)
    return mant << shift if shift >= 0 else mant >> -shift


def _half_sums(values: list[int]) -> list[int]:
    sums = [0]
    for v in values:
        sums = [s + v for s in sums] + [s - v for s in sums]
    return sums


def sign_flip_pvalue_exact(diffs) -> float:
    """Exact two-sided sign-flip randomization test of the mean of paired differences:
    ``#{s in {-1,+1}^n : |sum s_q d_q| >= |sum d_q|} / 2**n`` (NaN differences dropped; the
    identity pattern counts, so p >= 2 / 2**n for n >= 1). Sums are compared exactly (the
    differences as integers in units of 2**-1074), so ties are ties. Meet in the middle:
    O(2**(n/2) log) time, fine up to n of about 30. No differences: NaN."""
    d = [float(x) for x in np.asarray(diffs, dtype=np.float64).ravel() if math.isfinite(x)]
    n = len(d)
    if n == 0:
        return math.nan
    ints = [_exact_int(x) for x in d]
    t = abs(sum(ints))
    if t == 0:
        return 1.0
    h = n // 2
    left, right = _half_sums(ints[:h]), sorted(_half_sums(ints[h:]))
    m = len(right)
    count = 0
    for a in left:
        # |a + b| >= t  <=>  b >= t - a  or  b <= -t - a (disjoint as t > 0)
        count += m - bisect.bisect_left(right, t - a)
        count += bisect.bisect_right(right, -t - a)
    return count / (len(left) * m)


def sign_flip_pvalue_mc(observed: float, replicate_sums) -> float:
    """Monte Carlo two-sided sign-flip p-value: ``(1 + #{r : |T_r| >= |T|}) / (R + 1)`` with ``T``
    the observed sum (or mean) of the differences and ``T_r`` the same statistic under replicate
    ``r``'s random signs. NaN without replicates or a finite observed value."""
    reps = np.asarray(replicate_sums, dtype=np.float64)
    if reps.size == 0 or not _finite(observed):
        return math.nan
    return float((1 + np.count_nonzero(np.abs(reps) >= abs(observed))) / (reps.size + 1))


# --------------------------------------------------------------------------------------------
# stable per-query randomness

def stable_key(key) -> str:
    """The text a query key is hashed as: a str as is, bytes decoded as UTF-8, an int in decimal,
    a tuple or list as its parts' texts joined by U+001F (unit separator)."""
    if isinstance(key, str):
        return key
    if isinstance(key, (bytes, bytearray)):
        return bytes(key).decode("utf-8")
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return str(int(key))
    if isinstance(key, (tuple, list)):
        return "\x1f".join(stable_key(k) for k in key)
    raise TypeError(f"query key must be str, bytes, int or a tuple of them, got {type(key).__name__}")


def query_seeds(keys, stream: bytes = BOOTSTRAP_STREAM, seed: int = 0) -> np.ndarray:
    """uint64 seed of each key: BLAKE2b-64 of the key's UTF-8 text (:func:`stable_key`), keyed
    with ``seed`` (8 bytes, little endian) and personalised with ``stream``."""
    seed_bytes = int(seed).to_bytes(8, "little", signed=False)
    out = np.empty(len(keys), dtype=np.uint64)
    for i, k in enumerate(keys):
        h = hashlib.blake2b(stable_key(k).encode("utf-8"), digest_size=8, key=seed_bytes, person=stream)
        out[i] = int.from_bytes(h.digest(), "little")
    return out


_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def replicate_bits(seeds, replicates: int, start: int = 0) -> np.ndarray:
    """uint64 array (len(seeds), replicates): splitmix64 outputs ``start + 1 ... start + replicates``
    of each seed (output ``r + 1`` is replicate ``r``'s bits)."""
    s = np.asarray(seeds, dtype=np.uint64).reshape(-1, 1)
    r = np.arange(start + 1, start + replicates + 1, dtype=np.uint64).reshape(1, -1)
    z = s + r * _GAMMA  # wraps modulo 2**64
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _poisson1_thresholds() -> np.ndarray:
    # e^-1 by its alternating series in exact rationals (error < 1/41! ~ 3e-50), then
    # T_j = round(F(j) * 2**53) until it reaches 2**53.
    e_inv = sum((Fraction((-1) ** k, math.factorial(k)) for k in range(41)), Fraction(0))
    out, cdf, j = [], Fraction(0), 0
    while True:
        cdf += e_inv / math.factorial(j)
        t = round(cdf * (1 << 53))
        out.append(min(t, 1 << 53))
        if t >= 1 << 53:
            break
        j += 1
    return np.array(out, dtype=np.uint64)


#: ``T_j``: a replicate's weight is the number of thresholds its 53 uniform bits reach
POISSON_THRESHOLDS = _poisson1_thresholds()


def poisson_weights(seeds, replicates: int, start: int = 0) -> np.ndarray:
    """Poisson(1) weights, int64 array (len(seeds), replicates), by inversion of 53 bits of
    :func:`replicate_bits` (exact integer comparisons, so identical on every platform)."""
    u = replicate_bits(seeds, replicates, start) >> np.uint64(11)
    return np.searchsorted(POISSON_THRESHOLDS, u, side="right").astype(np.int64)


def sign_flips(seeds, replicates: int, start: int = 0, dtype=np.int64) -> np.ndarray:
    """Random signs, array (len(seeds), replicates) of +1 / -1 (``dtype``, int64 by default):
    replicate ``r``'s sign is bit ``r % 64`` (least significant first) of splitmix64 output
    ``r // 64 + 1`` (1 = minus)."""
    if start % 64:
        raise ValueError("start must be a multiple of 64")
    words = replicate_bits(seeds, -(-replicates // 64), start // 64)  # (n, ceil(R / 64))
    # the words' bytes little endian, each byte's bits least significant first: bit r % 64 of word r // 64
    octets = np.ascontiguousarray(words, dtype="<u8").view(np.uint8).reshape(words.shape[0], 8 * words.shape[1])
    bits = np.unpackbits(octets, axis=1, bitorder="little")[:, :replicates]
    out = np.empty(bits.shape, dtype=dtype)  # 1 - 2 bit, two passes (a gather of [1, -1] is slower)
    np.multiply(bits, np.array(-2, dtype=dtype), out=out)
    out += 1
    return out


# --------------------------------------------------------------------------------------------
# always-valid p-value of a change (mSPRT)

#: the default mixture scale ``tau`` of :func:`msprt_pvalue` in the metric's units: changes of a few
#: points of a ranking metric in [0, 1] (nDCG, MAP, recall); set it per rule for other scales (CTR)
MSPRT_TAU = 0.05


def _msprt_log_lambda(diff, var, tau, theta0):
    d = np.asarray(diff, dtype=np.float64) - float(theta0)
    v = np.asarray(var, dtype=np.float64)
    t2 = float(tau) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 0.5 * np.log(v / (v + t2)) + t2 * d * d / (2.0 * v * (v + t2))
    return np.where((v > 0) & np.isfinite(v) & np.isfinite(d), out, np.nan)


def msprt_lambda(diff, var, tau: float = MSPRT_TAU, theta0: float = 0.0):
    """The mSPRT mixture likelihood ratio of ``theta = theta0`` after a look at ``diff``, an estimate
    of a difference of two means ``theta`` (system minus baseline) with variance ``var`` (``V_n =
    se_a^2 + se_b^2`` for two independent means; ``2 sigma^2 / n`` for ``n`` pairs of common variance
    ``sigma^2``), under a normal mixture ``theta ~ N(theta0, tau^2)``::

        Lambda_n = int phi_{V_n}(d_n - theta) phi_{tau^2}(theta - theta0) dtheta / phi_{V_n}(d_n - theta0)
                 = sqrt(V_n / (V_n + tau^2)) * exp(tau^2 (d_n - theta0)^2 / (2 V_n (V_n + tau^2)))

    (the ratio of the marginal N(theta0, V_n + tau^2) density of ``d_n`` to its N(theta0, V_n)
    density). With ``V_n = 2 sigma^2 / n`` it is Johari et al.'s two-sample formula
    ``sqrt(2 sigma^2 / (2 sigma^2 + n tau^2)) exp(n^2 tau^2 (Ybar - Xbar - theta0)^2 / (4 sigma^2
    (2 sigma^2 + n tau^2)))`` (Always valid inference, section 4; KDD 2017, section 3.2). Under
    ``theta = theta0`` it is a martingale of mean 1 in the looks (exactly for Gaussian data of
    known variance, asymptotically with the plug-in standard errors of the rows), so by Ville's
    inequality ``P(sup_n Lambda_n >= 1 / alpha) <= alpha``. Scalars or arrays; NaN where ``var`` is
    not positive and finite."""
    out = np.exp(_msprt_log_lambda(diff, var, tau, theta0))
    return float(out) if out.ndim == 0 else out


def msprt_pvalue(diff, var, tau: float = MSPRT_TAU, theta0: float = 0.0, p_prev=1.0):
    """The always-valid p-value of ``theta = theta0`` after this look: ``p_n = min(p_prev, 1 /
    Lambda_n)`` (:func:`msprt_lambda`), ``p_prev`` the previous look's ``p`` (1 at the first look).
    ``P(p_n <= alpha at some n) <= alpha`` under the null, whatever the looks and the stopping
    rule, so it can be watched at every pane. The state carried between looks is the one float
    ``p_prev``; the running minimum is order-free (``min``), and a look with no estimate (NaN)
    leaves it as it was.

    ``tau`` (the mixture's standard deviation, in the metric's units) does not affect validity, only
    power: the test detects effects near ``tau`` soonest. Johari et al. choose ``tau^2`` from the
    spread of the effects of earlier experiments (fit a N(0, tau^2) to past measured changes); a
    ``tau`` far above the effects of interest makes the test slow, far below them (``tau^2 << V_n``)
    makes ``Lambda_n`` stay near 1 until ``V_n`` shrinks to ``tau^2``. Default :data:`MSPRT_TAU`."""
    log_lam = _msprt_log_lambda(diff, var, tau, theta0)
    with np.errstate(over="ignore"):
        p = np.where(np.isnan(log_lam), 1.0, np.minimum(1.0, np.exp(-log_lam)))
    out = np.minimum(np.asarray(p_prev, dtype=np.float64), p)
    return float(out) if out.ndim == 0 else out


def msprt_cs(diff, var, tau: float = MSPRT_TAU, level: float = DEFAULT_LEVEL):
    """The always-valid confidence sequence of the difference that inverts :func:`msprt_lambda`: the
    ``theta0`` with ``Lambda_n(theta0) < 1 / alpha``, ``d_n -/+ sqrt(V_n (V_n + tau^2) / tau^2 *
    (2 log(1 / alpha) + log((V_n + tau^2) / V_n)))``, ``alpha = 1 - level`` (Johari et al., section
    5). ``theta0`` lies outside it exactly when ``msprt_pvalue(..., theta0)`` of this look is below
    ``alpha``."""
    alpha = 1.0 - _check_level(level)
    v = np.asarray(var, dtype=np.float64)
    t2 = float(tau) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        half = np.sqrt(v * (v + t2) / t2 * (2.0 * math.log(1.0 / alpha) + np.log((v + t2) / v)))
        half = np.where(v > 0, half, np.nan)
    d = np.asarray(diff, dtype=np.float64)
    lo, hi = d - half, d + half
    return (float(lo), float(hi)) if lo.ndim == 0 else (lo, hi)


# --------------------------------------------------------------------------------------------
# the interval of a metric row

def is_binomial_metric(metric: str) -> bool:
    """True for click-through rates (``ctr``, ``ctr@pos{p}``): ratios of clicks to impressions; and
    for ``precision[t=T]`` (tp over tp + fp) and ``recall[t=T]`` (tp over tp + fn), binomial
    proportions too (their rows' ``num_queries`` is the denominator)."""
    return metric == "ctr" or metric.startswith(("ctr@", "precision[t=", "recall[t="))


#: the number of observations at which :func:`normal_mixture_cs` is tightest by default
CS_TARGET_N = 1000
#: ``row_interval``'s kinds: fixed-sample intervals, or confidence sequences valid at every look
INTERVAL_KINDS = ("fixed", "anytime")
#: ``row_interval``'s methods for a metric bounded in [0, 1] whose t interval leaves [0, 1]:
#: ``logit`` (:func:`logit_interval`, the default) or ``t`` (the t interval as it is)
BOUNDED_METHODS = ("logit", "t")


def normal_mixture_cs(mean, n, stderr, level: float = DEFAULT_LEVEL, target_n: float = CS_TARGET_N):
    """Asymptotic confidence sequence of a mean after ``n`` observations (Waudby-Smith et al. 2024,
    two-sided normal mixture): ``mean -/+ sigma * sqrt(2 (n rho^2 + 1) / (n^2 rho^2) *
    log(sqrt(n rho^2 + 1) / alpha))`` with ``sigma = stderr * sqrt(n)`` (the sample standard
    deviation), ``alpha = 1 - level`` and ``rho^2 = (-2 log alpha + log(1 - 2 log alpha)) /
    target_n``, which makes it tightest near ``n = target_n``. Valid at every ``n`` at once (as
    ``n`` grows); wider than the t interval at any one ``n``. Scalars or arrays; NaN where ``n < 2``
    or the standard error is missing."""
    level = _check_level(level)
    alpha = 1.0 - level
    rho2 = (-2.0 * math.log(alpha) + math.log(1.0 - 2.0 * math.log(alpha))) / float(target_n)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        sigma = np.asarray(stderr, dtype=np.float64) * np.sqrt(n)
        half = sigma * np.sqrt(2.0 * (n * rho2 + 1.0) / (n * n * rho2) * np.log(np.sqrt(n * rho2 + 1.0) / alpha))
        half = np.where(n >= 2, half, np.nan)
    mean = np.asarray(mean, dtype=np.float64)
    lo, hi = mean - half, mean + half
    return (float(lo), float(hi)) if lo.ndim == 0 else (lo, hi)


def beta_binomial_cs(successes: int, trials: int, level: float = DEFAULT_LEVEL, a: float = 1.0, b: float = 1.0):
    """Confidence sequence of a proportion after ``successes`` in ``trials`` Bernoulli draws (Howard
    et al. 2021, conjugate beta-binomial mixture): the ``p`` whose mixture martingale
    ``M(p) = B(a + k, b + n - k) / B(a, b) / (p^k (1 - p)^(n - k))`` stays below ``1 / (1 - level)``;
    by Ville's inequality the true ``p`` leaves it at some ``n`` with probability at most
    ``1 - level``. ``(a, b)`` is the Beta prior of the mixture (uniform by default). The set is an
    interval around ``k / n`` (``log M`` is convex in ``p`` and at most 0 at ``k / n``); its ends are
    found by Brent's method. ``trials == 0`` gives ``(0, 1)``."""
    from scipy import optimize, special

    level = _check_level(level)
    k, n = int(successes), int(trials)
    if not 0 <= k <= n:
        raise ValueError(f"successes must be in 0..trials, got {k} of {n}")
    if n == 0:
        return 0.0, 1.0
    bound = math.log(1.0 / (1.0 - level))
    c = float(special.betaln(a + k, b + n - k) - special.betaln(a, b))

    def excess(p):  # log M(p) - log(1 / alpha)
        return c - (k * math.log(p) if k else 0.0) - ((n - k) * math.log1p(-p) if n - k else 0.0) - bound

    phat = k / n
    tiny = 1e-300
    lo = 0.0 if k == 0 else optimize.brentq(excess, tiny, phat, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    hi = 1.0 if k == n else optimize.brentq(excess, phat, 1.0 - 1e-16, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    return lo, hi


def row_interval(metric: str, value, num_queries, stderr, level: float = DEFAULT_LEVEL, kind: str = "fixed",
                 bounded: str = "logit") -> dict:
    """The ``ci_low``, ``ci_high``, ``ci_level``, ``ci_method`` fields of a metric_result row from
    its value, count and standard error: Wilson for a click-through rate (clicks recovered as
    ``round(value * num_queries)``), Student t otherwise; all None when no interval can be made
    (no value, fewer than two queries, no standard error, e.g. the num_* totals). ``kind="anytime"``:
    the confidence sequences instead, valid at every pane at once (``cs-beta-binomial`` for CTR,
    :func:`beta_binomial_cs`; ``cs-normal-mixture`` otherwise, :func:`normal_mixture_cs`, cut to
    [0, 1] for a metric in [0, 1]: the intersection of a sequence with a set that holds the true
    value is a sequence at the same level).

    ``bounded`` (:data:`BOUNDED_METHODS`): for a metric whose values lie in [0, 1]
    (:func:`~streameval.metrics.bounds.is_unit_metric`: nDCG, AP, AUC, ...) with a value in (0, 1)
    whose t interval reaches below 0 or above 1, ``"logit"`` gives :func:`logit_interval` instead
    (``ci_method`` ``"logit"``), ``"t"`` keeps the t interval."""
    if kind not in INTERVAL_KINDS:
        raise ValueError(f"kind must be one of {INTERVAL_KINDS}, got {kind!r}")
    check_bounded(bounded, "bounded")
    none = {"ci_low": None, "ci_high": None, "ci_level": None, "ci_method": None}
    if value is None or num_queries is None or not math.isfinite(value) or num_queries < 1:
        return none
    if is_binomial_metric(metric) and kind == "anytime":
        lo, hi = beta_binomial_cs(min(max(round(value * num_queries), 0), num_queries), num_queries, level)
        method = "cs-beta-binomial"
    elif is_binomial_metric(metric):
        lo, hi = wilson_interval(round(value * num_queries), num_queries, level)
        method = "wilson"
    elif kind == "anytime":
        if stderr is None or num_queries < 2:
            return none
        lo, hi = normal_mixture_cs(value, num_queries, stderr, level)
        method = "cs-normal-mixture"
        from .bounds import is_unit_metric

        if is_unit_metric(metric):  # the sequence cut to the metric's range: it still holds the value
            lo, hi = max(lo, 0.0), min(hi, 1.0)
    else:
        lo, hi = t_interval(value, num_queries, stderr, level)
        method = "t"
        if bounded == "logit" and (lo < 0.0 or hi > 1.0) and 0.0 < value < 1.0:
            from .bounds import is_unit_metric

            if is_unit_metric(metric):
                lo, hi = logit_interval(value, num_queries, stderr, level)
                method = "logit"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return none
    return {"ci_low": lo, "ci_high": hi, "ci_level": float(level), "ci_method": method}
