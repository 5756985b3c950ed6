"""Mergeable state of the slate off-policy estimators (slate IPS, IIPS, RIPS, pseudo-inverse:
:mod:`streameval.metrics.online_slate`, whose docstring gives the formulas and sources). No Beam.

Two stages, as the job runs them:

* :class:`SlateRequestOps`: one request's impressions gathered into a slate (:class:`SlateRequest`:
  the earliest timestamp, the slicing attributes, the impressions); merging concatenates, and the
  slate's terms (:meth:`SlateRequestOps.terms`) are computed from the impressions sorted by position,
  so they do not depend on the order the impressions arrived or merged in. RIPS's cumulative products
  are taken there, within the slate.
* :class:`SlateOpeOps`: the slates' terms summed (:class:`SlateOpeState`: counts and Shewchuk
  partials of, per estimator, the per-slate values y, y^2 and the weights u, u^2, the squares added
  exactly as :class:`~streameval.accumulators.online.OpeOps` does), so every value, standard error and
  effective sample size is the exact statistic of the slates' terms, correctly rounded, in any split
  and merge order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..metrics import online_slate as ms
from .moments import exact_sum, partials_add, partials_add_square, partials_merge
from .online import _merge_attrs

__all__ = ["SlateImpression", "SlateRequest", "SlateRequestOps", "SlateOpeState", "SlateOpeOps"]


class SlateImpression(NamedTuple):
    """One impression of a slate: ``position``, ``reward`` (clicked: 1.0 / 0.0), ``target_prob`` and
    ``logging_prob`` (marginal probabilities of the item at the position), ``target_cond`` and
    ``logging_cond`` (given the items above; None: the marginals)."""

    position: int
    reward: float
    target_prob: float
    logging_prob: float
    target_cond: float | None = None
    logging_cond: float | None = None


@dataclass
class SlateRequest:
    """One request's slate as gathered: ``timestamp`` the earliest of its impressions' (None when none
    has one), ``attributes`` the union of their attributes (of two values for a key the smaller),
    ``impressions`` a list of :class:`SlateImpression` in arrival order."""

    timestamp: int | None = None
    attributes: dict = field(default_factory=dict)
    impressions: list = field(default_factory=list)


class SlateRequestOps:
    """create / add / merge of :class:`SlateRequest`; :meth:`terms` the slate's
    :class:`~streameval.metrics.online_slate.SlateTerms`. ``attribute_keys``: the attributes kept
    (the slicing attributes; None: all)."""

    def __init__(self, attribute_keys=None):
        self.attribute_keys = None if attribute_keys is None else frozenset(attribute_keys)

    @staticmethod
    def create() -> SlateRequest:
        return SlateRequest()

    def add(self, state: SlateRequest, impression: SlateImpression, timestamp=None, attributes=None) -> SlateRequest:
        if timestamp is not None and (state.timestamp is None or timestamp < state.timestamp):
            state.timestamp = int(timestamp)
        if attributes:
            if self.attribute_keys is not None:
                attributes = {k: v for k, v in attributes.items() if k in self.attribute_keys}
            _merge_attrs(state.attributes, attributes)
        state.impressions.append(SlateImpression(*impression))
        return state

    def merge(self, states) -> SlateRequest:
        out = self.create()
        for s in states:
            if s.timestamp is not None and (out.timestamp is None or s.timestamp < out.timestamp):
                out.timestamp = s.timestamp
            _merge_attrs(out.attributes, s.attributes)
            out.impressions.extend(s.impressions)
        return out

    @staticmethod
    def terms(state: SlateRequest) -> ms.SlateTerms:
        """The slate's terms (:func:`~streameval.metrics.online_slate.slate_terms`) from its impressions
        sorted by position. Raises ValueError as that function does (two impressions at one position,
        a probability out of range, a weight that is not a finite number, no impression), and when some
        impressions have conditional probabilities and others not."""
        imps = sorted(state.impressions, key=lambda i: i[:4])  # a repeated position: refused below
        if not imps:
            raise ValueError("a slate needs at least one impression")
        cols = dict(zip(SlateImpression._fields, zip(*imps)))  # {field: its column}
        conds = []
        for name in ("target_cond", "logging_cond"):
            col = cols[name]
            given = sum(x is not None for x in col)
            if 0 < given < len(col):
                raise ValueError(f"{name} given for {given} of the slate's {len(col)} impressions")
            conds.append(col if given else None)
        return ms.slate_terms(list(cols["position"]), cols["reward"], cols["target_prob"], cols["logging_prob"], *conds)


#: partial lists per estimator: sum y, sum y^2, sum u, sum u^2
_PER_ESTIMATOR = 4


@dataclass
class SlateOpeState:
    """Sums over slates: ``slates`` (n), ``weights`` (per estimator of
    :data:`~streameval.metrics.online_slate.SLATE_ESTIMATORS`, how many weights were added) and
    ``partials`` (per estimator four lists of Shewchuk partials: sum y, sum y^2, sum u, sum u^2)."""

    slates: int = 0
    weights: list = field(default_factory=lambda: [0] * len(ms.SLATE_ESTIMATORS))
    partials: list = field(default_factory=lambda: [[] for _ in range(_PER_ESTIMATOR * len(ms.SLATE_ESTIMATORS))])


class SlateOpeOps:
    """create / add (one slate's terms) / merge / extract of :class:`SlateOpeState` (see the module
    docstring)."""

    @staticmethod
    def create() -> SlateOpeState:
        return SlateOpeState()

    @staticmethod
    def add(state: SlateOpeState, terms: ms.SlateTerms) -> SlateOpeState:
        state.slates += 1
        p = state.partials
        for j, (y, us) in enumerate(zip(terms.values, terms.weights)):
            k = _PER_ESTIMATOR * j
            partials_add(p[k], y)
            partials_add_square(p[k + 1], y)
            for u in us:
                partials_add(p[k + 2], u)
                partials_add_square(p[k + 3], u)
            state.weights[j] += len(us)
        return state

    @staticmethod
    def merge(states) -> SlateOpeState:
        out = SlateOpeState()
        for s in states:
            out.slates += s.slates
            out.weights = [a + b for a, b in zip(out.weights, s.weights)]
            for into, other in zip(out.partials, s.partials):
                partials_merge(into, other)
        return out

    @staticmethod
    def extract(state: SlateOpeState) -> dict:
        """``{estimator: SlateEstimate}`` for each of
        :data:`~streameval.metrics.online_slate.SLATE_ESTIMATORS`; NaN values with 0 slates when empty."""
        out = {}
        for j, name in enumerate(ms.SLATE_ESTIMATORS):
            sy, sy2, su, su2 = (exact_sum(p) for p in state.partials[_PER_ESTIMATOR * j:_PER_ESTIMATOR * (j + 1)])
            out[name] = ms.slate_estimate_from_sums(state.slates, sy, sy2, state.weights[j], su, su2)
        return out
