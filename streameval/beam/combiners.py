"""Beam ``CombineFn`` wrappers around the layer-2 accumulators (no metric logic of their own).

Every accumulator is a plain list / dict of Python primitives, encoded with Beam's
:class:`~apache_beam.coders.FastPrimitivesCoder` (never pickled objects). ``merge_accumulators([])``
returns a fresh accumulator; extracting an empty accumulator gives NaN with count 0.

* :class:`RankingStateCombineFn` - one request's served items (inputs: impression dicts).
* :class:`MeanCombineFn` - exact mean / count / stderr of per-query metric vectors.
* :class:`CtrCombineFn` - click-through rate (inputs: clicked bools).
* :class:`CtrByPositionCombineFn` - CTR by position (inputs: ``(position, clicked)``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.coders import FastPrimitivesCoder

from ..accumulators import clicks
from ..accumulators.moments import MeanMoments, MomentsState, partials_value
from ..accumulators.ranking import RankingOps, RankingState

__all__ = [
    "OpsCombineFn",
    "BatchedStatesMixin",
    "RankingStateCombineFn",
    "RequestAccumulator",
    "MeanCombineFn",
    "MeanStatesCombineFn",
    "CtrCombineFn",
    "CtrByPositionCombineFn",
    "request_query_id",
    "request_attributes",
    "request_state",
    "request_min_timestamp",
    "request_records",
]


# --------------------------------------------------------------------------------------------
# per request ranking state

def _merge_attrs(into: dict, other: dict) -> None:
    """Union of attribute maps; on a conflict the smaller value wins (order independent)."""
    for k, v in other.items():
        old = into.get(k)
        if old is None or v < old:
            into[k] = v


class OpsCombineFn(beam.CombineFn):
    """A CombineFn over an ops object of :mod:`streameval.accumulators` (``create``, ``merge``,
    ``extract``): each input is a state of ``ops`` (a partial state, e.g. one shard's) and is merged;
    subclasses whose inputs are raw values override :meth:`add_input`. The states are primitives
    (Beam's FastPrimitivesCoder)."""

    def __init__(self, ops):
        self.ops = ops

    def create_accumulator(self):
        return self.ops.create()

    def add_input(self, acc, state):
        return self.ops.merge([acc, state])

    def merge_accumulators(self, accumulators):
        return self.ops.merge(accumulators)

    def compact(self, acc):
        return acc

    def extract_output(self, acc):
        return self.ops.extract(acc)

    def get_accumulator_coder(self):
        return FastPrimitivesCoder()


class BatchedStatesMixin:
    """CombineFn mixin for inputs that are states (one shard's partial state) of ``self.states_ops``
    (an object with ``merge`` and ``compact``, e.g. a PoissonBootstrap): the accumulator is a list of
    states merged :attr:`BATCH` at a time (a state of replicate or sign-flip sums holds rows of R
    integers per metric: merging two at a time would rebuild every row for each input), and
    ``extract_output`` hands the merged state to the CombineFn it is mixed into."""

    BATCH = 16

    def create_accumulator(self):
        return []

    def add_input(self, acc, state):
        acc.append(state)
        if len(acc) >= self.BATCH:
            acc[:] = [self.states_ops.merge(acc)]
        return acc

    def merge_accumulators(self, accumulators):
        return [self.states_ops.merge([s for a in accumulators for s in a])]

    def compact(self, acc):
        return [self.states_ops.compact(self.states_ops.merge(acc))]

    def extract_output(self, acc):
        return super().extract_output(self.states_ops.merge(acc))


class RequestAccumulator(NamedTuple):
    """A :class:`RankingStateCombineFn` accumulator's fields (see there). The accumulator: their
    list."""

    ranking_state: list
    query_id: str | None
    attributes: dict
    records: int


#: RequestAccumulator's positions in an accumulator, for the updates in place (one an impression)
_STATE, _QUERY_ID, _ATTRIBUTES, _RECORDS = (
    RequestAccumulator._fields.index(f) for f in ("ranking_state", "query_id", "attributes", "records"))


class RankingStateCombineFn(beam.CombineFn):
    """Combines the impression dicts of one request into its ranking state.

    Accumulator (a plain list, the fields of a :class:`RequestAccumulator`)::

        [ranking_state, query_id, attributes, records]

    ``ranking_state`` is :mod:`streameval.accumulators.ranking`'s
    :class:`~streameval.accumulators.ranking.RankingState` ``[served, judged, conflicts,
    min_timestamp]`` (``judged`` stays empty here; judgments are attached when the request is
    scored); ``query_id`` is the request's query (the smallest one seen if impressions disagree,
    so the result does not depend on arrival order); ``attributes`` is the union of the
    impressions' attribute maps (restricted to ``attribute_keys`` when given; on a conflict the
    smallest value is kept); ``records`` is the number of impression records added (for the jobs'
    accounting; a record added twice counts twice).

    ``extract_output`` returns the accumulator itself (use :func:`request_state` and friends).
    Impressions with a missing score under ``order="score"`` raise ``ValueError`` (filter them
    first, as :class:`~streameval.beam.transforms.ScoreRankings` does).
    """

    def __init__(self, ops: RankingOps, attribute_keys=None):
        self.ops = ops
        self.attribute_keys = None if attribute_keys is None else frozenset(attribute_keys)

    def create_accumulator(self):
        return list(RequestAccumulator(self.ops.create(), None, {}, 0))

    def add_input(self, acc, imp):
        self.ops.add_impression(acc[_STATE], imp["item_id"], imp.get("score"), imp["position"],
                                imp.get("clicked"), imp.get("timestamp"))
        q = imp.get("query_id")  # as add_query, inline (one an impression)
        if q is not None and (acc[_QUERY_ID] is None or q < acc[_QUERY_ID]):
            acc[_QUERY_ID] = q
        attrs = imp.get("attributes") or {}
        if attrs:
            if self.attribute_keys is not None:
                attrs = {k: v for k, v in attrs.items() if k in self.attribute_keys}
            _merge_attrs(acc[_ATTRIBUTES], attrs)
        acc[_RECORDS] += 1
        return acc

    @staticmethod
    def add_query(acc, query_id) -> None:
        """Note an impression's query id (the smallest one seen is kept; None: none)."""
        if query_id is not None:
            q = acc[_QUERY_ID]
            if q is None or query_id < q:
                acc[_QUERY_ID] = query_id

    @staticmethod
    def set_min_timestamp(acc, timestamp) -> None:
        """Set the request's earliest time (its ranking state's ``min_timestamp``) to ``timestamp``."""
        st = acc[_STATE]
        st[:] = RankingState._make(st)._replace(min_timestamp=timestamp)

    def merge_accumulators(self, accumulators):
        accs = [RequestAccumulator._make(a) for a in accumulators]
        if not accs:
            return self.create_accumulator()
        state = self.ops.merge([a.ranking_state for a in accs])
        qid = None
        attrs: dict = {}
        for a in accs:
            if a.query_id is not None and (qid is None or a.query_id < qid):
                qid = a.query_id
            _merge_attrs(attrs, a.attributes)
        return list(RequestAccumulator(state, qid, attrs, sum(a.records for a in accs)))

    def compact(self, acc):
        return acc

    def extract_output(self, acc):
        return acc

    def get_accumulator_coder(self):
        return FastPrimitivesCoder()


def request_state(acc) -> list:
    """The :class:`RankingOps` state of a :class:`RankingStateCombineFn` accumulator."""
    return acc[_STATE]


def request_query_id(acc):
    return acc[_QUERY_ID]


def request_attributes(acc) -> dict:
    return acc[_ATTRIBUTES]


def request_min_timestamp(acc):
    return RankingState._make(acc[_STATE]).min_timestamp


def request_records(acc) -> int:
    """How many impression records a :class:`RankingStateCombineFn` accumulator took in."""
    return acc[_RECORDS]


# --------------------------------------------------------------------------------------------
# means

#: the position of MeanCombineFn's pending inputs in its accumulator: after a MomentsState's fields
_PENDING = len(MomentsState._fields)


class MeanCombineFn(beam.CombineFn):
    """Exact mean of per-query metric vectors (:class:`MeanMoments`).

    Inputs: a list / array of ``n_metrics`` floats (one query's scores; NaN skips a metric).
    Output: one tuple ``(value, count, stderr)`` per metric, where value is the mean, or the total
    (``math.fsum`` of the values, stderr ``None``) for the metrics flagged in ``totals`` (trec_eval's
    num_ret / num_rel / num_rel_ret). Empty: ``(NaN, 0, NaN)``.

    Accumulator: a :class:`MeanMoments` state with a fourth element, the inputs not yet added
    (``[counts, sums, squares, pending]``: a
    :class:`~streameval.accumulators.moments.MomentsState`'s fields, then the pending inputs):
    inputs are buffered and added :data:`BUFFER` at a time with the vectorised exact
    :meth:`MeanMoments.add_many` (about 20 x faster than one by one, the same exact sums).
    ``compact`` (before an accumulator is encoded), ``merge_accumulators`` and ``extract_output``
    add the pending inputs first; ``extract_output`` also takes a bare
    three-element :class:`MeanMoments` state.
    """

    BUFFER = 256

    def __init__(self, n_metrics: int, totals=None):
        self.n_metrics = int(n_metrics)
        self.totals = [bool(t) for t in totals] if totals is not None else [False] * self.n_metrics
        if len(self.totals) != self.n_metrics:
            raise ValueError("totals needs one flag per metric")
        self._mm = MeanMoments(self.n_metrics)

    def create_accumulator(self):
        return self._mm.create() + [[]]

    def _flush(self, acc):
        if len(acc) > _PENDING and acc[_PENDING]:
            self._mm.add_many(acc, np.asarray(acc[_PENDING], dtype=np.float64).T)
            acc[_PENDING] = []
        return acc

    def add_input(self, acc, values):
        if len(values) != self.n_metrics:
            raise ValueError(f"expected {self.n_metrics} values, got {len(values)}")
        row = [float(v) for v in values]
        for v in row:
            if math.isinf(v):
                raise ValueError(f"metric value {v} is not finite")
        pending = acc[_PENDING]
        pending.append(row)
        if len(pending) >= self.BUFFER:
            self._flush(acc)
        return acc

    def add_inputs(self, acc, elements):
        for v in elements:
            acc = self.add_input(acc, v)
        return acc

    def merge_accumulators(self, accumulators):
        accs = [self._flush(a) for a in accumulators]
        return self._mm.merge([MomentsState.of(a) for a in accs]) + [[]]

    def compact(self, acc):
        return self._flush(acc)

    def extract_output(self, acc):
        moments = MomentsState.of(self._flush(acc))
        out = self._mm.extract(list(moments))
        res = []
        for m, (mean, n, se) in enumerate(out):
            if self.totals[m]:
                res.append((partials_value(moments.sums[m]) if n else math.nan, n, None if n else math.nan))
            else:
                res.append((mean, n, se))
        return res

    def get_accumulator_coder(self):
        return FastPrimitivesCoder()


# --------------------------------------------------------------------------------------------
# clicks

class MeanStatesCombineFn(MeanCombineFn):
    """:class:`MeanCombineFn` whose inputs are MeanMoments states already summed over a shard's
    queries (the columnar engine's shards), not one query's values."""

    def add_input(self, acc, state):
        return self.merge_accumulators([acc, list(state) + [[]]])


class CtrCombineFn(beam.CombineFn):
    """Click-through rate. Inputs: clicked flags. Output: ``(ctr, impressions, stderr)``."""

    def create_accumulator(self):
        return clicks.ctr_create()

    def add_input(self, acc, clicked):
        return clicks.ctr_add(acc, bool(clicked))

    def merge_accumulators(self, accumulators):
        return clicks.ctr_merge(accumulators)

    def extract_output(self, acc):
        return clicks.ctr_extract(acc)

    def get_accumulator_coder(self):
        return FastPrimitivesCoder()


class CtrByPositionCombineFn(beam.CombineFn):
    """CTR by position. Inputs: ``(position, clicked)``. Output: ``{position: (ctr, impressions,
    stderr)}`` (positions ascending; empty dict when there was no input). With ``overall=True`` the
    output is ``(overall (ctr, impressions, stderr), by_position dict)``, the overall rate being the
    exact integer sum of the positions' counts."""

    def __init__(self, overall: bool = False):
        self.overall = overall

    def create_accumulator(self):
        return clicks.ctr_pos_create()

    def add_input(self, acc, element):
        position, clicked = element
        return clicks.ctr_pos_add(acc, int(position), bool(clicked))

    def merge_accumulators(self, accumulators):
        return clicks.ctr_pos_merge(accumulators)

    def extract_output(self, acc):
        by_pos = clicks.ctr_pos_extract(acc)
        if not self.overall:
            return by_pos
        return clicks.ctr_extract(clicks.ctr_merge(acc.values())), by_pos

    def get_accumulator_coder(self):
        return FastPrimitivesCoder()
