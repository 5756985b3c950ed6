"""Mergeable state of the off-policy estimators with a reward model: DM, DR, SNDR and Switch-DR
(:func:`streameval.metrics.online_ope.dr_family_from_sums`). No Beam.

:class:`DrOps` state: the list of a :class:`DrState`'s fields ``(n, sums)``, ``sums`` the Shewchuk
partials of the sums of d, d^2, w, w^2, u, u^2, u w, d u, d w (:class:`DrSums`) and, per switch
threshold tau, of s, s^2, d s (:class:`SwitchSums`), ``9 + 3 * len(taus)`` lists, where per
round d = sum_a pi_e(a|x) q_hat(x, a) (``dm_value``), w = pi_e / pi_b, u = w (r - q_hat(x, a_logged))
(the double, as numpy computes it) and s = u when w <= tau, else 0. The squares and products are
added exactly (:mod:`.moments`, as :class:`~.online.OpeOps`), so every value and standard error is
the exact statistic of the rounds' (d, w, u) correctly rounded, whatever the split and merge order."""

from __future__ import annotations

import math
from typing import NamedTuple

from ..metrics import online_ope as mo
from .online import check_probabilities, merge_counted_sums
from .moments import exact_sum, partials_add, partials_add_product, partials_add_square

__all__ = ["DrOps", "DrState", "DrSums", "SwitchSums"]


class DrState(NamedTuple):
    """A :class:`DrOps` state's fields: ``n`` rounds, ``sums`` the lists of partials (a
    :class:`DrSums`' then a :class:`SwitchSums`' per threshold). The state: their list."""

    n: int
    sums: list


class DrSums(NamedTuple):
    """The first sums of a :class:`DrState` (partials each): of d, d^2, w, w^2, u, u^2, u w, d u, d w."""

    d: list
    dd: list
    w: list
    ww: list
    u: list
    uu: list
    uw: list
    du: list
    dw: list


class SwitchSums(NamedTuple):
    """The sums of one Switch-DR threshold in a :class:`DrState` (partials each): of s, s^2, d s."""

    s: list
    ss: list
    ds: list


#: DrState's positions in a state, for the updates in place (one a round)
_N, _SUMS = (DrState._fields.index(f) for f in ("n", "sums"))
_FIXED, _PER_TAU = len(DrSums._fields), len(SwitchSums._fields)


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
        self.width = _FIXED + _PER_TAU * len(self.taus)

    def create(self) -> list:
        return list(DrState(0, [[] for _ in range(self.width)]))

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
        state[_N] += 1
        p = state[_SUMS]
        sd, sdd, sw, sww, su, suu, suw, sdu, sdw = p[:_FIXED]  # a DrSums' fields
        partials_add(sd, d)
        partials_add_square(sdd, d)
        partials_add(sw, w)
        partials_add_square(sww, w)
        partials_add(su, u)
        partials_add_square(suu, u)
        partials_add_product(suw, u, w)
        partials_add_product(sdu, d, u)
        partials_add_product(sdw, d, w)
        for j, t in enumerate(self.taus):
            if w <= t:
                k = _FIXED + _PER_TAU * j
                ss, sss, sds = p[k : k + _PER_TAU]  # a SwitchSums' fields
                partials_add(ss, u)
                partials_add_square(sss, u)
                partials_add_product(sds, d, u)
        return state

    def merge(self, states) -> list:
        return merge_counted_sums(DrState._make(self.create()), states)

    def extract(self, state: list) -> dict:
        """``{"dm": (V, n, se), "dr": ..., "sndr": ..., ("switch_dr", tau): ...}``; NaN with n = 0
        when empty."""
        s = DrState._make(state)
        res = mo.dr_family_from_sums(s.n, [exact_sum(p) for p in s.sums], self.taus)
        return {k: (v, s.n, se) for k, (v, se) in res.items()}
