"""The slate off-policy estimators in Beam (``streameval ope --slate``): :func:`slate_rows` turns the
accepted impressions of :class:`~streameval.beam.online.OffPolicyCtr` into the rows ``slate_ips[T]``,
``iips[T]``, ``rips[T]``, ``pi[T]`` (expected clicks per request, ``num_queries``: slates) and each
one's ``:ess`` row (Kong's effective sample size of its weights, ``num_queries``: the weights: slates
for slate_ips and pi, impressions for iips and rips), per (window, slice, logging system).

A slate is the impressions of one (system_id, request_id) (:class:`SlateRequestCombineFn`); its
window is that of its earliest timestamp, its slices those of its impressions' attributes. A slate
with two impressions at one position is a dead letter (one per slate) and left out of the slate
rows. Counter ``ope:slates``: the slates estimated from. Formulas and sources:
:mod:`streameval.metrics.online_slate`; state: :mod:`streameval.accumulators.online_slate`.
"""

from __future__ import annotations

import typing

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.metrics import Metrics

from ..accumulators.online_slate import SlateImpression, SlateOpeOps, SlateRequestOps
from ..io import counters as cn
from ..metrics.online_slate import SLATE_ESTIMATORS
from ..metrics.rows import metric_row, with_interval
from .combiners import OpsCombineFn
from .keys import reason_key, slice_labels, window_bounds
from .transforms import NAMESPACE
from ..io.dead_letters import dead_letter

__all__ = ["SlateRequestCombineFn", "SlateOpeCombineFn", "slate_input", "slate_rows", "slate_row_names"]


def slate_input(rec: dict, reward: float, target_prob: float, logging_prob: float) -> tuple:
    """``((system_id, request_id), (timestamp, attributes, SlateImpression))``: what
    :func:`slate_rows` takes for one accepted impression."""
    imp = SlateImpression(int(rec["position"]), float(reward), float(target_prob), float(logging_prob))
    return ((rec["system_id"], rec["request_id"]), (rec.get("timestamp"), rec.get("attributes") or {}, imp))


class SlateRequestCombineFn(OpsCombineFn):
    """One request's :class:`~streameval.accumulators.online_slate.SlateRequest` from
    ``(timestamp, attributes, SlateImpression)`` inputs; ``extract_output`` returns the state."""

    def __init__(self, attribute_keys=None):
        super().__init__(SlateRequestOps(attribute_keys))

    def add_input(self, acc, element):
        timestamp, attributes, imp = element
        return self.ops.add(acc, imp, timestamp, attributes)

    def extract_output(self, acc):
        return acc


class SlateOpeCombineFn(OpsCombineFn):
    """The slate estimators' sums (:class:`~streameval.accumulators.online_slate.SlateOpeOps`). Inputs:
    one slate's :class:`~streameval.metrics.online_slate.SlateTerms`; output ``{estimator:
    SlateEstimate}``."""

    def __init__(self):
        super().__init__(SlateOpeOps())

    def add_input(self, acc, element):
        return self.ops.add(acc, element)


@beam.typehints.with_output_types(typing.Tuple[typing.Any, typing.Any])
class _SlateTerms(beam.DoFn):
    def __init__(self, window_micros, slice_specs):
        self.window_micros = window_micros
        self.slice_specs = slice_specs
        self.counted = Metrics.counter(NAMESPACE, cn.OPE_SLATES)

    def process(self, kv):
        (system, request), state = kv
        try:
            terms = SlateRequestOps.terms(state)
        except ValueError as e:
            reason = f"slate estimators: {e}"  # the request is in raw
            Metrics.counter(NAMESPACE, cn.rejected("slate", reason_key(reason))).inc()
            positions = sorted(i.position for i in state.impressions)
            raw = {"system_id": system, "request_id": request, "positions": positions}
            yield pvalue.TaggedOutput("rejected", dead_letter("OffPolicyCtr", raw, reason))
            return
        self.counted.inc()
        ws, we = window_bounds(state.timestamp, self.window_micros)
        for label in slice_labels(state.attributes, self.slice_specs):
            yield ((ws, we, label, system), terms)


def slate_row_names(target_name: str) -> list[str]:
    """The row names of :func:`slate_rows` for a target: each estimator's, then each one's ``:ess``."""
    return [f"{e}[{target_name}]" for e in SLATE_ESTIMATORS] + [f"{e}[{target_name}]:ess" for e in SLATE_ESTIMATORS]


def slate_rows(inputs, target_name: str, window_micros, slice_specs, ci_level: float):
    """``(rows, rejected)`` from the :func:`slate_input` pairs of the accepted impressions; rows with
    their t intervals at ``ci_level`` (``:ess`` rows: none)."""
    attr_keys = sorted({n for names in slice_specs for n in names})

    def rows(kv):
        (ws, we, label, system), res = kv
        for est in SLATE_ESTIMATORS:
            r = res[est]
            yield with_interval(metric_row(ws, we, label, system, f"{est}[{target_name}]", r.value, r.slates, r.stderr),
                                ci_level)
        for est in SLATE_ESTIMATORS:
            r = res[est]
            yield metric_row(ws, we, label, system, f"{est}[{target_name}]:ess", r.ess, r.weights, None)

    terms = (inputs
             | "SlateRequests" >> beam.CombinePerKey(SlateRequestCombineFn(attr_keys))
             | "SlateTerms" >> beam.ParDo(_SlateTerms(window_micros, slice_specs)).with_outputs("rejected",
                                                                                                main="terms"))
    out = (terms.terms
           | "SlateOpe" >> beam.CombinePerKey(SlateOpeCombineFn())
           | "SlateRows" >> beam.FlatMap(rows))
    return out, terms.rejected
