"""Per-request ranking state: the served items of one request and the judgments of its query.

Impressions and judgments may arrive in any order and in any number of pieces; states merge by
union, so any split and merge order gives the same state. The state is a plain list (Beam's
FastPrimitivesCoder encodes it without pickling)::

    [served, judged, conflicts, min_timestamp]
    served:   {item_id: [score or None, position, clicked (None: clicks not logged)]}
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

import numpy as np

from ..metrics import registry
from ..metrics.kernel import MetricOptions, RankedLists
from ..metrics.prepare import DEFAULT_SCORE_PRECISION, judgment_histogram, rank_order

__all__ = ["RankingOps", "RankingSetup", "keep_for", "ranking_setup"]


def keep_for(specs, ideal: str = "judgments") -> int | None:
    """The top-K a set of metric specs needs, or None (keep every served item) when one reads every
    served item (its family's state in the registry, or no cutoff) or when ``ideal="served"``: the
    ideal DCG then comes from the grades of every served item, not only of the top K. Derived from
    :func:`streameval.metrics.registry.keep_for`."""
    return registry.keep_for(specs, ideal)


def _order_key(rec, item, order, tie_break, score_precision):
    """Python sort key equal to :func:`rank_order` (ascending key = better rank)."""
    score, pos = rec[0], rec[1]
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
        return [{}, {}, 0, None]

    def add_impression(self, state: list, item: str, score, position: int, clicked,
                       timestamp: int | None = None) -> list:
        """Add one served item. ``score`` may be None (then the request can only be ranked with
        ``order="position"``: see :meth:`unrankable`); ``clicked`` None means clicks not logged."""
        if score is not None and not math.isfinite(score):
            raise ValueError(f"item {item!r}: score {score!r} is not finite")
        rec = [None if score is None else float(score), int(position), None if clicked is None else bool(clicked)]
        state[2] += _put(state[0], item, rec, _total)
        if timestamp is not None and (state[3] is None or timestamp < state[3]):
            state[3] = timestamp
        self._prune(state)
        return state

    @staticmethod
    def add_judgment(state: list, item: str, grade) -> list:
        state[2] += _put(state[1], item, float(grade), None)
        return state

    def merge(self, states) -> list:
        out = self.create()
        served, judged = out[0], out[1]
        for s in states:
            for item, rec in s[0].items():
                out[2] += _put(served, item, list(rec), _total)
            for item, g in s[1].items():
                out[2] += _put(judged, item, g, None)
            out[2] += s[2]
            if s[3] is not None and (out[3] is None or s[3] < out[3]):
                out[3] = s[3]
        self._prune(out)
        return out

    def unrankable(self, state: list) -> int:
        """How many served items lack the score ``order="score"`` needs (0 when rankable)."""
        if self.order != "score":
            return 0
        return sum(1 for r in state[0].values() if r[0] is None)

    def _prune(self, state: list) -> None:
        k = self.keep
        served = state[0]
        if k is None or len(served) <= 2 * k or self.unrankable(state):
            return
        ranked = sorted(served.items(), key=lambda kv: _order_key(kv[1], kv[0], self.order, self.tie_break,
                                                                   self.score_precision))
        state[0] = dict(ranked[:k])

    # -- scoring ---------------------------------------------------------------------------
    def ranked(self, state: list) -> tuple[list[str], np.ndarray]:
        """(item ids in rank order, their clicked flags (None: not logged), cut at ``depth``. Uses
        the same ordering function as the library (:func:`rank_order`). Raises ValueError when
        ``order="score"`` and an item has no score."""
        served = state[0]
        items = list(served)
        if not items:
            return [], np.zeros(0, dtype=object)
        missing = self.unrankable(state)
        if missing:
            raise ValueError(f"{missing} served items have no score: order='score' cannot rank them")
        recs = list(served.values())
        vocab, codes = np.unique(np.asarray(items, dtype=str), return_inverse=True)
        scores = np.array([math.nan if r[0] is None else r[0] for r in recs], dtype=np.float64)
        pos = np.array([r[1] for r in recs], dtype=np.float64)
        perm = rank_order(np.zeros(len(items), np.int64), scores, codes, pos,
                          order=self.order, tie_break=self.tie_break, score_precision=self.score_precision)
        if self.depth is not None:
            perm = perm[: self.depth]
        clicks = np.array([recs[i][2] for i in perm], dtype=object)
        return [items[i] for i in perm], clicks

    def to_lists(self, states: list) -> RankedLists:
        """Lay out many states (one per request) as :class:`RankedLists` for the kernel."""
        offsets = np.zeros(len(states) + 1, dtype=np.int64)
        grades: list = []
        jq: list = []
        jg: list = []
        for i, st in enumerate(states):
            items, _ = self.ranked(st)
            judged = st[1]
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
    return (-math.inf if rec[0] is None else rec[0], rec[1], -1 if rec[2] is None else int(rec[2]))


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
