"""Off-policy estimates of the CTR (IPS, SNIPS, effective sample size; with a reward model DM, DR,
SNDR and Switch-DR) and the target policies
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
# estimators with a reward model: DM, DR, SNDR, Switch-DR (obp 0.4.1's obp/ope/estimators.py)
#
# Per round i: r_i the reward, w_i = pi_e(a_i|x_i) / pi_b(a_i|x_i), q_i = q_hat(x_i, a_i) the reward
# model's value for the logged action ("reward_hat") and d_i = sum_a pi_e(a|x_i) q_hat(x_i, a) the
# expected reward of the target under the model ("dm_value"); u_i = w_i (r_i - q_i).

#: obp's SwitchDoublyRobust default switching threshold (``tau: float = 1.0``)
DEFAULT_SWITCH_TAU = 1.0


def check_tau(tau) -> float:
    """The switch threshold as a float; ValueError when it is NaN or negative (as obp)."""
    t = float(tau)
    if math.isnan(t) or t < 0.0:
        raise ValueError(f"switch threshold tau must be a number >= 0, got {tau!r}")
    return t


def reward_model_terms(action, action_dist, estimated_rewards_by_reg_model, position=None):
    """obp's arrays -> ``(target_prob, reward_hat, dm_value)``, each shape (n_rounds,):
    pi_e(a_i|x_i) at the round's position, q_hat(x_i, a_i) and sum_a pi_e(a|x_i) q_hat(x_i, a).

    ``action_dist`` and ``estimated_rewards_by_reg_model``: shape (n_rounds, n_actions) or
    (n_rounds, n_actions, len_list), the same; ``action``: ints in [0, n_actions); ``position``:
    ints in [0, len_list) (default 0). The target's probabilities must sum to 1 over the actions
    at every (round, position) (as obp checks). Raises ValueError otherwise."""
    pi = np.asarray(action_dist, dtype=np.float64)
    q = np.asarray(estimated_rewards_by_reg_model, dtype=np.float64)
    if pi.ndim == 2:
        pi = pi[:, :, None]
    if q.ndim == 2:
        q = q[:, :, None]
    if pi.ndim != 3:
        raise ValueError(f"action_dist must have shape (n_rounds, n_actions[, len_list]), got {np.shape(action_dist)}")
    if q.shape != pi.shape:
        raise ValueError(f"estimated_rewards_by_reg_model must have action_dist's shape {np.shape(action_dist)}, "
                         f"got {np.shape(estimated_rewards_by_reg_model)}")
    n, n_actions, len_list = pi.shape
    a = np.asarray(action)
    pos = np.zeros(n, dtype=np.int64) if position is None else np.asarray(position)
    if a.shape != (n,) or pos.shape != (n,):
        raise ValueError(f"action and position must have shape ({n},) (the rounds of action_dist)")
    if not (np.issubdtype(a.dtype, np.integer) and np.issubdtype(pos.dtype, np.integer)):
        raise ValueError("action and position must be integer arrays")
    if ((a < 0) | (a >= n_actions)).any():
        raise ValueError(f"action must be in [0, {n_actions})")
    if ((pos < 0) | (pos >= len_list)).any():
        raise ValueError(f"position must be in [0, {len_list})")
    if not np.isfinite(q).all():
        raise ValueError("estimated_rewards_by_reg_model must be finite")
    if not ((pi >= 0) & (pi <= 1)).all():
        raise ValueError("action_dist must be in [0, 1]")
    if not np.allclose(pi.sum(axis=1), 1.0):
        raise ValueError("action_dist must sum to 1 over the actions at every round and position")
    rows = np.arange(n)
    pi_at, q_at = pi[rows, :, pos], q[rows, :, pos]
    return pi[rows, a, pos], q[rows, a, pos], (pi_at * q_at).sum(axis=1)


def _dr_arrays(rewards, target_prob, logging_prob, reward_hat, dm_value):
    """``(w, u, d)`` with the checks of :func:`ope_sums` and finite reward model values."""
    r = np.asarray(rewards, dtype=np.float64)
    pe = np.asarray(target_prob, dtype=np.float64)
    pb = np.asarray(logging_prob, dtype=np.float64)
    q = np.asarray(reward_hat, dtype=np.float64)
    d = np.asarray(dm_value, dtype=np.float64)
    _check(r, pe, pb)
    if not (q.shape == d.shape == r.shape):
        raise ValueError(f"reward_hat and dm_value must have the rewards' shape {r.shape}, got {q.shape} and {d.shape}")
    if not (np.isfinite(q).all() and np.isfinite(d).all() and np.isfinite(r).all()):
        raise ValueError("rewards, reward_hat and dm_value must be finite")
    w = pe / pb
    return w, w * (r - q), d


def dm_from_terms(dm_value) -> tuple[float, float]:
    """Direct method: ``(V, stderr)``, V = (1/n) sum d_i (Beygelzimer and Langford 2009; obp's
    DirectMethod), stderr the sample standard deviation of the d_i over sqrt(n)."""
    d = np.asarray(dm_value, dtype=np.float64)
    if d.ndim != 1 or not np.isfinite(d).all():
        raise ValueError("dm_value must be a finite vector")
    return mean_and_se(d)


def dr_from_terms(rewards, target_prob, logging_prob, reward_hat, dm_value) -> tuple[float, float]:
    """Doubly robust: ``(V, stderr)``, V = (1/n) sum (d_i + w_i (r_i - q_i)) (Dudik, Langford and
    Li 2011; obp's DoublyRobust), stderr the sample standard deviation of the per-round terms over
    sqrt(n)."""
    w, u, d = _dr_arrays(rewards, target_prob, logging_prob, reward_hat, dm_value)
    return mean_and_se(d + u)


def switch_dr_from_terms(rewards, target_prob, logging_prob, reward_hat, dm_value,
                         tau=DEFAULT_SWITCH_TAU) -> tuple[float, float]:
    """Switch-DR: ``(V, stderr)``, V = (1/n) sum (d_i + 1{w_i <= tau} w_i (r_i - q_i)) (Wang,
    Agarwal and Dudik 2017; obp's SwitchDoublyRobust, default tau = 1), stderr as :func:`dr`."""
    t = check_tau(tau)
    w, u, d = _dr_arrays(rewards, target_prob, logging_prob, reward_hat, dm_value)
    return mean_and_se(d + np.where(w <= t, u, 0.0))


def sndr_from_terms(rewards, target_prob, logging_prob, reward_hat, dm_value) -> tuple[float, float]:
    """Self-normalised DR: ``(V, stderr)``, V = (1/n) sum d_i + sum u_i / sum w_i (obp's
    SelfNormalizedDoublyRobust: d_i + u_i / mean(w), averaged; Kallus and Uehara 2019), stderr by
    the delta method: the sample standard deviation over sqrt(n) of the linearised terms
    z_i = d_i + (u_i - R w_i) / mean(w), R = sum u / sum w (with d = 0 SNIPS's)."""
    w, u, d = _dr_arrays(rewards, target_prob, logging_prob, reward_hat, dm_value)
    n = len(w)
    sw = math.fsum(w.tolist())
    if n == 0 or sw == 0:
        return (math.nan, math.nan)
    rr = math.fsum(u.tolist()) / sw
    dbar, _ = mean_and_se(d)
    v = dbar + rr
    if n < 2:
        return (v, math.nan)
    z = (d - dbar) + (u - rr * w) * (n / sw)
    return (v, math.sqrt(math.fsum((z * z).tolist()) / (n - 1) / n))


def dm(action_dist, estimated_rewards_by_reg_model, position=None) -> tuple[float, float]:
    """``(DM estimate, stderr)`` from obp's arrays (:func:`reward_model_terms`, :func:`dm_from_terms`):
    ``dm(action_dist, q_hat, position)`` as ``obp.ope.DirectMethod().estimate_policy_value(...)``."""
    n = np.shape(action_dist)[0] if np.ndim(action_dist) else 0
    _, _, d = reward_model_terms(np.zeros(n, dtype=np.int64), action_dist, estimated_rewards_by_reg_model, position)
    return dm_from_terms(d)


def dr(reward, action, pscore, action_dist, estimated_rewards_by_reg_model, position=None) -> tuple[float, float]:
    """``(DR estimate, stderr)`` from obp's arrays, arguments as obp's
    ``DoublyRobust().estimate_policy_value``; see :func:`dr_from_terms`."""
    pe, q, d = reward_model_terms(action, action_dist, estimated_rewards_by_reg_model, position)
    return dr_from_terms(reward, pe, pscore, q, d)


def sndr(reward, action, pscore, action_dist, estimated_rewards_by_reg_model, position=None) -> tuple[float, float]:
    """``(SNDR estimate, stderr)`` from obp's arrays (as ``SelfNormalizedDoublyRobust``); see
    :func:`sndr_from_terms`."""
    pe, q, d = reward_model_terms(action, action_dist, estimated_rewards_by_reg_model, position)
    return sndr_from_terms(reward, pe, pscore, q, d)


def switch_dr(reward, action, pscore, action_dist, estimated_rewards_by_reg_model, position=None,
              tau=DEFAULT_SWITCH_TAU) -> tuple[float, float]:
    """``(Switch-DR estimate, stderr)`` from obp's arrays (as ``SwitchDoublyRobust(tau=tau)``); see
    :func:`switch_dr_from_terms`."""
    pe, q, d = reward_model_terms(action, action_dist, estimated_rewards_by_reg_model, position)
    return switch_dr_from_terms(reward, pe, pscore, q, d, tau)


def dr_family_from_sums(n: int, sums, taus=()) -> dict:
    """``{"dm": (V, se), "dr": ..., "sndr": ..., ("switch_dr", tau): ...}`` from exact sums (Fractions)
    or floats: ``sums`` = [sum d, sum d^2, sum w, sum w^2, sum u, sum u^2, sum u w, sum d u,
    sum d w] then, per tau of ``taus``, [sum s, sum s^2, sum d s] with s = 1{w <= tau} u. The
    variances are the sample variances of the per-round terms (DR: d + u, Switch-DR: d + s, SNDR:
    the linearised z of :func:`sndr_from_terms`), exact when the sums are. NaN when n = 0."""
    nan2 = (math.nan, math.nan)
    if n == 0:
        out = {"dm": nan2, "dr": nan2, "sndr": nan2}
        out.update({("switch_dr", t): nan2 for t in taus})
        return out
    sd, sd2, sw, sw2, su, su2, suw, sdu, sdw = (_num(x) for x in sums[:9])
    out = {"dm": mean_from_sums(n, sd, sd2), "dr": mean_from_sums(n, sd + su, sd2 + 2 * sdu + su2)}
    for j, t in enumerate(taus):
        ss, ss2, sds = (_num(x) for x in sums[9 + 3 * j: 12 + 3 * j])
        out[("switch_dr", t)] = mean_from_sums(n, sd + ss, sd2 + 2 * sds + ss2)
    if sw == 0:
        out["sndr"] = nan2
    else:
        rr = su / sw
        v = float(sd / n + rr) if isinstance(sd, Fraction) else sd / n + float(rr)
        if n < 2:
            out["sndr"] = (v, math.nan)
        else:
            # z_i = (d_i - dbar) + b_i, b_i = (u_i - R w_i) n / sum w (sum b = 0)
            m2d = sd2 - sd * sd / n
            k = n / sw if isinstance(sw, Fraction) else n / float(sw)
            sdb = (sdu - rr * sdw) * k
            sbb = (su2 - 2 * rr * suw + rr * rr * sw2) * k * k
            m2 = m2d + 2 * sdb + sbb
            out["sndr"] = (v, math.sqrt(max(float(m2), 0.0) / (n - 1) / n))
    return out


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
