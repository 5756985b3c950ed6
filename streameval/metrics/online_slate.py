"""Slate off-policy estimators of a target policy's clicks per request (pure numpy): standard slate
IPS, independent IPS (IIPS), reward-interaction IPS (RIPS) and the pseudo-inverse estimator (PI),
each with its standard error and the effective sample size of its weights. The mergeable state is
:class:`streameval.accumulators.online_slate.SlateOpeOps`; ``docs/metrics.md`` ("Slate estimators")
has the table.

A slate is one request's impressions, at distinct positions k (sorted; usually 1..L). For slate i
and its impression at position k (the item a_ik shown there):

* ``r_ik``: the reward (``clicked``: 0 or 1; any finite number here);
* ``p_ik = pi_b(a_ik at k | x_i)`` and ``e_ik = pi_e(a_ik at k | x_i)``: the logging and target
  policies' *marginal* probabilities of that item at that position (an impression's ``propensity``,
  and the target's probability the ``streameval ope`` job computes); ``w_ik = e_ik / p_ik``;
* ``c_ik = pi_b(a_ik at k | x_i, a_i1 .. a_i(k-1))`` and ``d_ik`` the same for the target: the
  *conditional* probabilities of the item given the items above it, ``v_ik = d_ik / c_ik``; by the
  chain rule the product of a slate's v is the ratio of the two policies' joint slate probabilities.
  When they are not given they are the marginals (``c = p``, ``d = e``): exact when each policy
  fills its positions independently of each other (a product distribution over positions, e.g.
  obp's ``is_factorizable=True`` policies); for policies that draw a slate of distinct items (the
  Open Bandit policies) the product of the marginal ratios is an approximation of the joint ratio.

Per slate (``R_i = sum_k r_ik``, ``W_ik = prod_{j <= k} v_ij`` over the slate's positions in order,
``W_i`` the product over all of them, ``L_i`` the slate's impressions):

=========== ================================================ =========================================
estimator   per-slate value y_i                              weights (for the effective sample size)
=========== ================================================ =========================================
slate_ips   W_i R_i                                          W_i, one per slate
iips        sum_k w_ik r_ik                                  w_ik, one per impression
rips        sum_k W_ik r_ik                                  W_ik, one per impression
pi          (sum_k w_ik - (L_i - 1)) R_i                     sum_k w_ik - (L_i - 1), one per slate
=========== ================================================ =========================================

The estimate is V = (1/n) sum_i y_i over the n slates (the expected clicks per request under the
target), its standard error the sample standard deviation of the y_i over sqrt(n) (obp gives a
bootstrap interval of the same per-slate sums' mean instead), the effective sample size Kong's
(sum u)^2 / sum u^2 over the weights u.

Sources. slate_ips: importance sampling of whole slates (Li, Kim and Zitouni, WSDM 2015; obp 0.4.1's
``SlateStandardIPS``, McInerney et al. 2020), unbiased with no assumption on the reward. iips: Li,
Abbasi-Yadkori, Kveton, Muthukrishnan, Vinay and Wen, KDD 2018 (obp ``SlateIndependentIPS``),
unbiased when a position's click depends on its own item only (the item-position model). rips:
McInerney, Brost, Chandar, Mehrotra and Carterette, KDD 2020 (obp ``SlateRewardInteractionIPS``),
unbiased when a position's click depends on the items at and above it (the cascade model). pi:
Swaminathan, Krishnamurthy, Agarwal, Dudik, Langford, Jose and Zitouni, "Off-policy evaluation for
slate recommendation", NeurIPS 2017: V = (1/n) sum_i R_i q_e(x_i)^T Gamma_b(x_i)^+ 1_{s_i} with
1_s the slate's (position, item) indicator vector, q_e(x) = E_e[1_s | x] the target's marginals and
Gamma_b(x) = E_b[1_s 1_s^T | x] (``^+``: Moore-Penrose pseudo-inverse). It assumes the slate's
reward is additive over positions (E[R | x, s] = sum_k phi_x(s_k, k): true of the summed clicks
when each position's click depends on its own item and position only). Implemented for a logging
policy that is a product distribution over positions, the setting the marginal propensities
describe, where q_e^T Gamma_b^+ 1_s = sum_k w_k - (L - 1) (the paper's closed form for a product
logging policy; ``tests/test_ope_slate.py`` checks it against ``numpy.linalg.pinv``). The target
may be any policy (only its marginals enter). For a logging policy that draws distinct items (the
Open Bandit policies) Gamma_b is not that of a product and this is not the pseudo-inverse estimator
(for the uniform policy over ordered slates of distinct items it also needs the target's
probabilities of the logged items at the other positions).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from .online_sums import _num, mean_and_se, mean_from_sums

__all__ = ["SLATE_ESTIMATORS", "SlateTerms", "SlateEstimate", "slate_terms", "slate_estimates",
           "slate_estimate_from_sums", "conditional_from_cascade"]

#: the slate estimators, in the order of the rows
SLATE_ESTIMATORS = ("slate_ips", "iips", "rips", "pi")


class SlateTerms(NamedTuple):
    """One slate's terms (see the module docstring): ``values`` the per-slate y of each estimator
    of :data:`SLATE_ESTIMATORS` (in that order), ``weights`` each estimator's weights (a tuple:
    one for slate_ips and pi, one per impression for iips and rips), ``impressions`` L."""

    values: tuple
    weights: tuple
    impressions: int


class SlateEstimate(NamedTuple):
    """An estimator's result: ``value`` (expected clicks per slate), ``stderr`` (of the per-slate
    values' mean; NaN for fewer than 2 slates), ``slates`` (n), ``ess`` (Kong's effective sample
    size of its weights; NaN without weights or when they are all 0) and ``weights`` (how many)."""

    value: float
    stderr: float
    slates: int
    ess: float
    weights: int


def _probabilities(name: str, x, n: int, low_open: bool) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {a.shape}")
    ok = (a > 0) & (a <= 1) if low_open else (a >= 0) & (a <= 1)
    if not ok.all():
        raise ValueError(f"{name} must be in {'(0, 1]' if low_open else '[0, 1]'}")
    return a


def slate_terms(position, reward, target_prob, logging_prob, target_cond=None, logging_cond=None) -> SlateTerms:
    """The terms of one slate from its impressions' arrays, each shape (L,) in any order (sorted here
    by position): ``position`` distinct integers, ``reward`` finite, ``target_prob`` e in [0, 1] and
    ``logging_prob`` p in (0, 1] (marginal), ``target_cond`` d in [0, 1] and ``logging_cond`` c in
    (0, 1] (conditional on the items above; default: the marginals). The products are taken in
    position order (so the terms do not depend on the order given). Raises ValueError on a
    repeated position, a probability out of range, a non-finite reward or weight, or L = 0."""
    pos = np.asarray(position)
    n = pos.shape[0] if pos.ndim == 1 else -1
    if n < 1 or not np.issubdtype(pos.dtype, np.integer):
        raise ValueError("a slate needs at least one impression; position must be a vector of integers")
    if len(np.unique(pos)) != n:
        raise ValueError(f"a slate's positions must be distinct, got {sorted(pos.tolist())}")
    r = np.asarray(reward, dtype=np.float64)
    if r.shape != (n,) or not np.isfinite(r).all():
        raise ValueError(f"reward must be {n} finite numbers")
    e = _probabilities("target_prob", target_prob, n, False)
    p = _probabilities("logging_prob", logging_prob, n, True)
    d = e if target_cond is None else _probabilities("target_cond", target_cond, n, False)
    c = p if logging_cond is None else _probabilities("logging_cond", logging_cond, n, True)
    order = np.argsort(pos, kind="stable")
    r, w, v = r[order], (e / p)[order], (d / c)[order]
    cascade = np.cumprod(v)
    if not (np.isfinite(w).all() and np.isfinite(cascade).all()):
        raise ValueError("an importance weight is not a finite number")
    rr = math.fsum(r.tolist())
    big_w = float(cascade[-1])
    pi_w = math.fsum(w.tolist()) - (n - 1)
    values = (big_w * rr, math.fsum((w * r).tolist()), math.fsum((cascade * r).tolist()), pi_w * rr)
    if not all(math.isfinite(y) for y in values):
        raise ValueError("a weighted reward is not a finite number")
    return SlateTerms(values, ((big_w,), tuple(w.tolist()), tuple(cascade.tolist()), (pi_w,)), n)


def _ess(weights: np.ndarray) -> float:
    s2 = math.fsum((weights * weights).tolist())
    if len(weights) == 0 or s2 == 0:
        return math.nan
    s = math.fsum(weights.tolist())
    return s * s / s2


def slate_estimates(slate_id, position, reward, target_prob, logging_prob, target_cond=None,
                    logging_cond=None) -> dict:
    """``{estimator: SlateEstimate}`` for each of :data:`SLATE_ESTIMATORS` from per-impression arrays,
    each shape (n_impressions,) (obp's flat layout): ``slate_id`` any hashable ids (the impressions of
    a slate share one), the others as :func:`slate_terms`. The standard error is taken from the
    per-slate values in two passes (:func:`~streameval.metrics.online_sums.mean_and_se`). Raises
    ValueError as :func:`slate_terms`, or when the arrays' lengths differ."""
    ids = np.asarray(slate_id)
    n = len(ids)
    cols = [np.asarray(x) if x is not None else None
            for x in (position, reward, target_prob, logging_prob, target_cond, logging_cond)]
    if any(x is not None and x.shape != (n,) for x in cols):
        raise ValueError(f"every array must have slate_id's shape ({n},)")
    _, inverse = np.unique(ids, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.flatnonzero(np.diff(inverse[order])) + 1
    terms = [slate_terms(*(None if x is None else x[idx] for x in cols))
             for idx in np.split(order, bounds) if len(idx)]
    out = {}
    for j, name in enumerate(SLATE_ESTIMATORS):
        v, se = mean_and_se(np.array([t.values[j] for t in terms], dtype=np.float64))
        u = np.array([x for t in terms for x in t.weights[j]], dtype=np.float64)
        out[name] = SlateEstimate(v, se, len(terms), _ess(u), len(u))
    return out


def slate_estimate_from_sums(n: int, sy, sy2, n_weights: int, su, su2) -> SlateEstimate:
    """A :class:`SlateEstimate` from sums over n slates (floats or exact Fractions): ``sy``, ``sy2``
    of the per-slate values and their squares, ``su``, ``su2`` of the ``n_weights`` weights and their
    squares. With exact sums the standard error is the exact sample statistic, correctly rounded."""
    v, se = mean_from_sums(n, sy, sy2)
    if n_weights == 0 or not su2:
        ess = math.nan
    else:
        su, su2 = _num(su), _num(su2)
        ess = float(su * su / su2) if isinstance(su2, Fraction) else float(su) ** 2 / float(su2)
    return SlateEstimate(v, se, n, ess, n_weights)


def conditional_from_cascade(slate_id, position, pscore_cascade) -> np.ndarray:
    """obp's ``pscore_cascade`` (the probability of a slate's items at positions 1..k, per
    impression) -> the conditional probability of each impression's item given the items above it
    (``pscore_cascade`` at k over that at the slate's previous position; at the first position
    itself), shape (n_impressions,), for :func:`slate_estimates`'s ``target_cond`` / ``logging_cond``.
    Raises ValueError when a cascade probability is not in (0, 1]."""
    ids, pos = np.asarray(slate_id), np.asarray(position)
    pc = _probabilities("pscore_cascade", pscore_cascade, len(ids), True)
    order = np.lexsort((pos, ids))
    prev = np.ones(len(ids))
    same = ids[order][1:] == ids[order][:-1]
    prev[order[1:][same]] = pc[order[:-1][same]]
    return pc / prev
