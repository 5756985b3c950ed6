"""``alerts = rows | EvaluateAlerts(rules)``: the alert rules of :mod:`streameval.plan.alerts` over a job's
metric rows, in Beam. Every rule compares rows of one metric and one slice (a row with its threshold,
with another system's row of the same window, or with the earlier windows of its series), so the
rows are grouped by (metric, slice): as many keys as the rules' metrics times the slices, each holding
the rows of one table column, never the records. Counter ``alerts_fired``."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from ..plan import alerts as alert_rules
from ..io.counters import ALERTS_FIRED, NAMESPACE
from ..metrics.online_names import canonical_metric

__all__ = ["EvaluateAlerts", "StreamAlerts", "ALERTS_FIRED", "LOOKS"]

#: the tag of :class:`StreamAlerts`' looks of its mSPRT rules
LOOKS = "looks"

# ALERTS_FIRED (streameval.io.counters): the counter of alerts raised (the batch job's exit status 4 when
# it is not 0), re-exported here


class _Evaluate(beam.DoFn):
    def __init__(self, rules, count: bool = True):
        self.rules = list(rules)
        self.fired = Metrics.counter(NAMESPACE, ALERTS_FIRED) if count else None

    def process(self, element):
        (metric, _), rows = element
        out = alert_rules.evaluate([r for r in self.rules if canonical_metric(r.metric) == metric], list(rows))
        if self.fired is not None:
            self.fired.inc(len(out))
        yield from out


class _WithRules(beam.PTransform):
    """A transform of a non-empty list of alert rules."""

    def __init__(self, rules, label=None, count: bool = True):
        super().__init__(label)
        #: counts the alerts in the counter ``alerts_fired``; False: the job counts its output itself
        #: (as data: streameval.beam.counts_as_data.count_elements)
        self.count = bool(count)
        self.rules = list(rules)
        if not self.rules:
            raise ValueError("no alert rules")


class EvaluateAlerts(_WithRules):
    """Metric rows (metric_result dicts) -> alert records (schema ``alert``) of ``rules``
    (:class:`streameval.plan.alerts.Rule`, e.g. from :func:`streameval.plan.alerts.load_rules`)."""

    def expand(self, rows):
        metrics = {canonical_metric(r.metric) for r in self.rules}  # a rule's metric in any spelling
        return (rows
                | "RuleMetrics" >> beam.Filter(lambda r: canonical_metric(r["metric"]) in metrics)
                | "ByMetricSlice" >> beam.Map(lambda r: ((canonical_metric(r["metric"]), r["slice"]), r))
                | "Group" >> beam.GroupByKey()
                | "Evaluate" >> beam.ParDo(_Evaluate(self.rules, self.count)))


class _StreamAlertsFn(beam.DoFn):
    """Keyed by (metric, slice): keeps the latest pane row of each (system, window) of the key (the
    last ``keep`` windows of each system, and every window that started at most ``reach``
    microseconds before the system's newest one: the longest ``offset:`` baseline), counts for
    each (rule, system, window) the consecutive panes on which the rule holds, carries for each
    ``test = "msprt"`` rule the running minimum of its always-valid p-value over the window's
    panes, and emits an alert the first time the count reaches the rule's ``for_panes``: once per
    rule, window, slice and system. State per key: at most ``keep + reach / window length`` rows
    per system, and two numbers per (rule, system, window) of those rows."""

    STATE = ReadModifyWriteStateSpec("alerts", FastPrimitivesCoder())

    def __init__(self, rules):
        self.rules = list(rules)
        trailing = [r.baseline[1] for r in self.rules if r.baseline is not None and r.baseline[0] == "trailing"]
        self.keep = max(trailing, default=0) + 1
        self.reach = max((r.baseline[1] for r in self.rules if r.baseline is not None and r.baseline[0] == "offset"),
                         default=0)
        self.fired = Metrics.counter(NAMESPACE, ALERTS_FIRED)

    def process(self, kv, state=beam.DoFn.StateParam(STATE)):
        (metric, _), row = kv
        rows, holds, pmins = (*(state.read() or ({}, {})), {})[:3]  # a state of before the p-values: 2 items
        system, ws = row["system"], row["window_start"]
        rows[(system, ws)] = row
        others = list(rows.values())
        for rule in self.rules:
            if canonical_metric(rule.metric) != metric:
                continue
            key = (rule.name, system, ws)
            count = holds.get(key, 0)
            p_prev = pmins.get(key, 1.0)
            if rule.test == "msprt":  # every look is exported, also after the rule fired for the window
                look = alert_rules.change_look(rule, row, others, p_prev)
                if look is not None:
                    pmins[key] = look["p_value"]
                    yield beam.pvalue.TaggedOutput(LOOKS, look)
            if count < 0:  # fired for this window already
                continue
            alert = alert_rules.evaluate_row(rule, row, others, p_prev)
            count = count + 1 if alert else 0
            if alert and count >= rule.for_panes:
                self.fired.inc()
                yield alert
                count = -1
            holds[key] = count
        # keep the latest windows of each system (a trailing baseline's reach), the windows an offset
        # baseline reaches back to, and their counts and p-values
        by_system: dict = {}
        for s, w in rows:
            by_system.setdefault(s, []).append(w)
        for s, ws_list in by_system.items():
            ordered = sorted(ws_list, key=lambda w: (w is not None, w or 0))
            newest = ordered[-1]
            for w in ordered[:-self.keep]:
                if newest is None or w is None or w < newest - self.reach:
                    del rows[(s, w)]
        live = set(rows)
        holds = {k: v for k, v in holds.items() if (k[1], k[2]) in live}
        pmins = {k: v for k, v in pmins.items() if (k[1], k[2]) in live}
        state.write((rows, holds, pmins))


class StreamAlerts(_WithRules):
    """Pane rows (metric_result dicts with ``pane`` and ``pane_index``, or lists of them: the
    panes of :class:`~streameval.beam.streaming.StreamMetrics`) -> alert records, each with the
    pane that raised it. A rule fires once per window, slice and system, when it has held on
    ``for_panes`` consecutive panes of the window (:mod:`streameval.plan.alerts`). Keyed by (metric,
    slice), like :class:`EvaluateAlerts`. After it is applied, ``.looks`` holds every look of a
    ``test = "msprt"`` rule (:func:`streameval.plan.alerts.change_look`: the running always-valid
    p-value and the interval of the difference at each pane, fired or not), for monitoring."""

    def expand(self, panes):
        metrics = {canonical_metric(r.metric) for r in self.rules}  # a rule's metric in any spelling

        def rows_of(element):
            for r in (element if isinstance(element, list) else [element]):
                if canonical_metric(r["metric"]) in metrics:
                    yield (canonical_metric(r["metric"]), r["slice"]), r

        out = (panes
               | "RuleRows" >> beam.FlatMap(rows_of)
               | "Evaluate" >> beam.ParDo(_StreamAlertsFn(self.rules)).with_outputs(LOOKS, main="alerts"))
        self.looks = out[LOOKS]
        return out.alerts
