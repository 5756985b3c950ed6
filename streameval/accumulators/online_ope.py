"""Mergeable state of the off-policy estimators with a reward model: DM, DR, SNDR and Switch-DR
(:func:`streameval.metrics.online_ope.dr_family_from_sums`). No Beam.

:class:`DrOps` state: ``[n, [partials] * (9 + 3 * len(taus))]``, Shewchuk partials of the sums
of d, d^2, w, w^2, u, u^2, u w, d u, d w and, per switch threshold tau, of s, s^2, d s, where per
round d = sum_a pi_e(a|x) q_hat(x, a) (``dm_value``), w = pi_e / pi_b, u = w (r - q_hat(x, a_logged))
(the double, as numpy computes it) and s = u when w <= tau, else 0. The squares and products are
added exactly (:mod:`.moments`, as :class:`~.online.OpeOps`), so every value and standard error is
the exact statistic of the rounds' (d, w, u) correctly rounded, whatever the split and merge order."""

from __future__ import annotations

import math

from ..metrics import online_ope as mo
from .online import check_probabilities
from .moments import exact_sum, partials_add, partials_add_product, partials_add_square, partials_merge

__all__ = ["DrOps"]


class DrOps:
    """``DrOps(taus)``: create / add / merge / extract (see the module docstring). ``taus``: the
    Switch-DR thresholds (each >= 0), kept in the given order, duplicates dropped."""

    def __init__(self, taus=(mo.DEFAULT_SWITCH_TAU,)):
        out: list = []
        for t in taus:
            t = mo.check_tau(t)
            if t not in out:
                out.append(t)
        self.taus = tuple(out)
        self.width = 9 + 3 * len(self.taus)

    def create(self) -> list:
        return [0, [[] for _ in range(self.width)]]

    def add(self, state: list, reward, target_prob, logging_prob, reward_hat, dm_value) -> list:
        """Add one round. Raises ValueError (nothing added) when the logging probability is not in
        (0, 1], the target probability not in [0, 1], or the reward, reward model values or the
        weighted residual are not finite numbers."""
        pb, pe = check_probabilities(logging_prob, target_prob)
        r, q, d = float(reward), float(reward_hat), float(dm_value)
        if not (math.isfinite(r) and math.isfinite(q) and math.isfinite(d)):
            raise ValueError(f"reward {reward!r}, reward_hat {reward_hat!r} and dm_value {dm_value!r} must be finite")
        w = pe / pb
        u = w * (r - q)
        if not (math.isfinite(w) and math.isfinite(u)):
            raise ValueError(f"importance weight {pe!r} / {pb!r} times residual {r - q!r} is not a finite number")
        state[0] += 1
        p = state[1]
        partials_add(p[0], d)
        partials_add_square(p[1], d)
        partials_add(p[2], w)
        partials_add_square(p[3], w)
        partials_add(p[4], u)
        partials_add_square(p[5], u)
        partials_add_product(p[6], u, w)
        partials_add_product(p[7], d, u)
        partials_add_product(p[8], d, w)
        for j, t in enumerate(self.taus):
            if w <= t:
                k = 9 + 3 * j
                partials_add(p[k], u)
                partials_add_square(p[k + 1], u)
                partials_add_product(p[k + 2], d, u)
        return state

    def merge(self, states) -> list:
        out = self.create()
        for s in states:
            out[0] += s[0]
            for j in range(self.width):
                partials_merge(out[1][j], s[1][j])
        return out

    def extract(self, state: list) -> dict:
        """``{"dm": (V, n, se), "dr": ..., "sndr": ..., ("switch_dr", tau): ...}``; NaN with n = 0
        when empty."""
        n = state[0]
        res = mo.dr_family_from_sums(n, [exact_sum(p) for p in state[1]], self.taus)
        return {k: (v, n, se) for k, (v, se) in res.items()}
