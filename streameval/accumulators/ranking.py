"""Per-request ranking state: the served items of one request and the judgments of its query.

Impressions and judgments may arrive in any order and in any number of pieces; states merge by
union, so any split and merge order gives the same state. The state is a plain list (Beam's
FastPrimitivesCoder encodes it without pickling), the fields of a :class:`RankingState`::

    [served, judged, conflicts, min_timestamp]
    served:   {item_id: ServedItem list [score or None, position, clicked (None: clicks not logged)]}
    judged:   {item_id: grade}
    conflicts: int, how many times an item came twice with different data (the larger record is
               kept, so the result does not depend on arrival order)
    min_timestamp: int microseconds or None, the request's earliest impression

Bounded memory: when every requested metric has a cutoff, pass ``keep=K`` (the largest cutoff) and
the served items are pruned to the top K in rank order whenever they exceed 2K; the top K of a
union equals the top K of the union of the parts' top K, so pruning never changes a score. The
judgments are kept whole (an item served later may need its grade); their memory is the query's
judgment count, a fixed property of the qrels. Metrics without a cutoff (map, bpref, Rprec, ndcg,
recip_rank, num_*: their family's ``state`` in :mod:`streameval.metrics.registry`) need every
served item, and so does ``ideal="served"`` (the ideal DCG is built
from every served item's grade): then ``keep`` is None (:func:`keep_for`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..metrics import registry
from ..metrics.kernel import MetricOptions, RankedLists
from ..metrics.prepare import DEFAULT_SCORE_PRECISION, judgment_histogram, rank_order

__all__ = ["RankingOps", "RankingState", "ServedItem", "RankingSetup", "keep_for", "ranking_setup"]


class RankingState(NamedTuple):
    """A :class:`RankingOps` state's fields (see the module docstring): ``served`` ``{item_id:
    ServedItem list}``, ``judged`` ``{item_id: grade}``, ``conflicts``, ``min_timestamp``. The state:
    their list."""

    served: dict
    judged: dict
    conflicts: int
    min_timestamp: int | None


class ServedItem(NamedTuple):
    """A served item of a :class:`RankingState`: ``score`` (None: not logged), ``position``,
    ``clicked`` (None: clicks not logged). In a state: their list."""

    score: float | None
    position: int
    clicked: bool | None


#: RankingState's positions in a state, for the updates in place (one an impression)
_SERVED, _JUDGED, _CONFLICTS, _MIN_TIMESTAMP = (
    RankingState._fields.index(f) for f in ("served", "judged", "conflicts", "min_timestamp"))


def keep_for(specs, ideal: str = "judgments") -> int | None:
    """The top-K a set of metric specs needs, or None (keep every served item) when one reads every
    served item (its family's state in the registry, or no cutoff) or when ``ideal="served"``: the
    ideal DCG then comes from the grades of every served item, not only of the top K. Derived from
    :func:`streameval.metrics.registry.keep_for`."""
    return registry.keep_for(specs, ideal)


def _order_key(rec, item, order, tie_break, score_precision):
    """Python sort key equal to :func:`rank_order` (ascending key = better rank)."""
    score, pos, _clicked = rec  # a ServedItem's fields
    if order == "score" and score_precision == "float32":
        score = float(np.float32(score))
    if order == "position":
        return (pos, _Desc(item))
    if tie_break == "docno":
        return (-score, _Desc(item))
    return (-score, pos, _Desc(item))


class _Desc:
    """Wraps a string so that sorting ascending orders it descending."""

    __slots__ = ("s",)

    def __init__(self, s):
        self.s = s

    def __lt__(self, other):
        return self.s > other.s

    def __eq__(self, other):
        return self.s == other.s


class RankingOps:
    """create / add / merge / extract for :mod:`ranking` states.

    order, tie_break, score_precision: as :func:`streameval.metrics.prepare.rank_order`.
    keep: the top-K to keep (see module docstring), None to keep every served item.
    depth: trec_eval's ``-M``, the number of ranked items scored per request (None: all).
    """

    def __init__(self, order: str = "score", tie_break: str = "docno", keep: int | None = None,
                 depth: int | None = None, score_precision: str = DEFAULT_SCORE_PRECISION):
        self.order = order
        self.tie_break = tie_break
        self.score_precision = score_precision
        self.depth = depth
        k = [x for x in (keep, depth) if x is not None]
        self.keep = min(k) if k else None

    # -- building --------------------------------------------------------------------------
    @staticmethod
    def create() -> list:
        return list(RankingState({}, {}, 0, None))

    def add_impression(self, state: list, item: str, score, position: int, clicked,
                       timestamp: int | None = None) -> list:
        """Add one served item. ``score`` may be None (then the request can only be ranked with
        ``order="position"``: see :meth:`unrankable`); ``clicked`` None means clicks not logged."""
        if score is not None and not math.isfinite(score):
            raise ValueError(f"item {item!r}: score {score!r} is not finite")
        # a ServedItem's fields in its order (a list literal: this runs once an impression)
        rec = [None if score is None else float(score), int(position), None if clicked is None else bool(clicked)]
        state[_CONFLICTS] += _put(state[_SERVED], item, rec, _total)
        if timestamp is not None:
            first = state[_MIN_TIMESTAMP]
            if first is None or timestamp < first:
                state[_MIN_TIMESTAMP] = timestamp
        self._prune(state)
        return state

    @staticmethod
    def add_judgment(state: list, item: str, grade) -> list:
        state[_CONFLICTS] += _put(state[_JUDGED], item, float(grade), None)
        return state

    def merge(self, states) -> list:
        served: dict = {}
        judged: dict = {}
        conflicts, first = 0, None
        for s in map(RankingState._make, states):
            for item, rec in s.served.items():
                conflicts += _put(served, item, list(rec), _total)
            for item, g in s.judged.items():
                conflicts += _put(judged, item, g, None)
            conflicts += s.conflicts
            if s.min_timestamp is not None and (first is None or s.min_timestamp < first):
                first = s.min_timestamp
        merged = list(RankingState(served, judged, conflicts, first))
        self._prune(merged)
        return merged

    def unrankable(self, state: list) -> int:
        """How many served items lack the score ``order="score"`` needs (0 when rankable)."""
        if self.order != "score":
            return 0
        return sum(1 for score, _position, _clicked in state[_SERVED].values() if score is None)

    def _prune(self, state: list) -> None:
        k = self.keep
        served = state[_SERVED]
        if k is None or len(served) <= 2 * k or self.unrankable(state):
            return
        def key(entry):
            item, rec = entry
            return _order_key(rec, item, self.order, self.tie_break, self.score_precision)

        ranked = sorted(served.items(), key=key)
        state[_SERVED] = dict(ranked[:k])

    # -- scoring ---------------------------------------------------------------------------
    def ranked(self, state: list) -> tuple[list[str], np.ndarray]:
        """(item ids in rank order, their clicked flags (None: not logged), cut at ``depth``. Uses
        the same ordering function as the library (:func:`rank_order`). Raises ValueError when
        ``order="score"`` and an item has no score."""
        served = RankingState._make(state).served
        items = list(served)
        if not items:
            return [], np.zeros(0, dtype=object)
        missing = self.unrankable(state)
        if missing:
            raise ValueError(f"{missing} served items have no score: order='score' cannot rank them")
        recs = list(served.values())  # ServedItem lists (unpacked in its order: one a served item)
        vocab, codes = np.unique(np.asarray(items, dtype=str), return_inverse=True)
        scores = np.array([math.nan if score is None else score for score, _pos, _clicked in recs], dtype=np.float64)
        pos = np.array([position for _score, position, _clicked in recs], dtype=np.float64)
        clicked = [c for _score, _pos, c in recs]
        perm = rank_order(np.zeros(len(items), np.int64), scores, codes, pos,
                          order=self.order, tie_break=self.tie_break, score_precision=self.score_precision)
        if self.depth is not None:
            perm = perm[: self.depth]
        clicks = np.array([clicked[i] for i in perm], dtype=object)
        return [items[i] for i in perm], clicks

    def to_lists(self, states: list) -> RankedLists:
        """Lay out many states (one per request) as :class:`RankedLists` for the kernel."""
        offsets = np.zeros(len(states) + 1, dtype=np.int64)
        grades: list = []
        jq: list = []
        jg: list = []
        for i, st in enumerate(states):
            items, _ = self.ranked(st)
            judged = RankingState._make(st).judged
            grades.extend(judged.get(it, math.nan) for it in items)
            offsets[i + 1] = offsets[i] + len(items)
            jq.extend([i] * len(judged))
            jg.extend(judged.values())
        joff, hvals, hcounts = judgment_histogram(np.asarray(jq, dtype=np.int64), np.asarray(jg, dtype=np.float64),
                                                  len(states))
        return RankedLists(offsets=offsets, grades=np.asarray(grades, dtype=np.float64), judged_offsets=joff,
                           judged_values=hvals, judged_counts=hcounts)


def _put(d: dict, item, value, key) -> int:
    """Put ``value`` under ``item``; a different value already there is a conflict (returns 1) and
    the larger of the two is kept (by ``key``), so the outcome does not depend on arrival order."""
    old = d.get(item)
    if old is None:
        d[item] = value
        return 0
    if old == value:
        return 0
    d[item] = max(old, value, key=key)
    return 1


def _total(rec):
    """A total order on served records (None score sorts lowest) for deterministic conflicts."""
    score, position, clicked = rec  # a ServedItem's fields
    return (-math.inf if score is None else score, position, -1 if clicked is None else int(clicked))


@dataclass(frozen=True)
class RankingSetup:
    """The ranking part of an evaluation, built and checked once (:func:`ranking_setup`): the
    metric specs (``metrics.names.MetricSpec``), the kernel's options and the operations on request
    states (which keep the top K the specs need)."""

    specs: tuple
    options: MetricOptions
    ops: RankingOps


def ranking_setup(metrics, *, relevance_level=1, gain="linear", ideal="judgments", err_max_grade=4,
                  order="score", tie_break="docno", depth=None, score_precision=DEFAULT_SCORE_PRECISION,
                  arithmetic: str = "the Beam jobs") -> RankingSetup:
    """:class:`RankingSetup` of metric names (``metrics``: as :func:`streameval.metrics.names.
    parse_metrics` takes them, diversity measures included; ``arithmetic``: the consumer that
    aggregates arithmetic means only) and the ranking options (trec_eval's conventions by default:
    docs/metrics.md). Raises :class:`~streameval.metrics.names.MetricNameError` for an unknown name,
    ValueError for an option out of its range (:func:`streameval.metrics.prepare.check_ranking_options`,
    :class:`~streameval.metrics.kernel.MetricOptions`)."""
    from ..metrics.names import parse_metrics
    from ..metrics.prepare import check_ranking_options

    specs = tuple(parse_metrics(metrics, arithmetic=arithmetic, diversity=True))
    options = MetricOptions(relevance_level=relevance_level, gain=gain, ideal=ideal, err_max_grade=err_max_grade)
    check_ranking_options(depth=depth, score_precision=score_precision, tie_break=tie_break, order=order)
    ops = RankingOps(order=order, tie_break=tie_break, keep=keep_for(specs, ideal), depth=depth,
                     score_precision=score_precision)
    return RankingSetup(specs, options, ops)
