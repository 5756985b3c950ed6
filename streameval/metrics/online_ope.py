"""Off-policy estimates of the CTR (IPS, SNIPS, effective sample size) and the target policies
(:mod:`streameval.metrics.online`, whose docstring gives the sources)."""

from __future__ import annotations

import math
from bisect import bisect_left
from fractions import Fraction

import numpy as np

from .online_sums import _num, mean_and_se, mean_from_sums, ratio_and_se, ratio_from_sums

# --------------------------------------------------------------------------------------------
# off-policy estimates of the CTR (reward: click) of a target policy from logged propensities

def _check(r, pe, pb) -> None:
    if not (r.shape == pe.shape == pb.shape):
        raise ValueError("rewards, target_prob and logging_prob must have the same shape")
    if not ((pb > 0) & (pb <= 1)).all():
        raise ValueError("logging probabilities (propensities) must be in (0, 1]")
    if not ((pe >= 0) & (pe <= 1)).all():
        raise ValueError("target probabilities must be in [0, 1]")


def ope_sums(rewards, target_prob, logging_prob) -> tuple[int, list[float]]:
    """``(n, [sum w, sum w^2, sum w r, sum w^2 r, sum w^2 r^2])`` with importance weights
    w = target_prob / logging_prob (each array shape (n,)). Raises ValueError when a logging
    probability is not in (0, 1] or a target probability not in [0, 1]. The sums are of the
    rounded products (floats): :func:`ips` and :func:`snips` take their standard errors from the
    values instead, and the job's state (:class:`~streameval.accumulators.online.OpeOps`) keeps
    exact sums."""
    r = np.asarray(rewards, dtype=np.float64)
    pe = np.asarray(target_prob, dtype=np.float64)
    pb = np.asarray(logging_prob, dtype=np.float64)
    _check(r, pe, pb)
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


def _weighted(rewards, target_prob, logging_prob) -> tuple[np.ndarray, np.ndarray]:
    """``(w, w r)`` as :func:`ope_sums` checks and forms them."""
    r = np.asarray(rewards, dtype=np.float64)
    pe = np.asarray(target_prob, dtype=np.float64)
    pb = np.asarray(logging_prob, dtype=np.float64)
    _check(r, pe, pb)
    w = pe / pb
    return w, w * r


def ips(rewards, target_prob, logging_prob) -> tuple[float, float]:
    """``(IPS estimate, stderr)`` from arrays (see :func:`ips_from_sums`), the standard error from
    the deviations of the weighted rewards from their mean (:func:`mean_and_se`)."""
    _, y = _weighted(rewards, target_prob, logging_prob)
    return mean_and_se(y)


def snips(rewards, target_prob, logging_prob) -> tuple[float, float]:
    """``(SNIPS estimate, stderr)`` from arrays (see :func:`snips_from_sums`), the standard error
    from the residuals y - R w (:func:`ratio_and_se`)."""
    w, y = _weighted(rewards, target_prob, logging_prob)
    return ratio_and_se(w, y)


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
