"""``alerts = rows | EvaluateAlerts(rules)``: the alert rules of :mod:`streameval.alerts` over a job's
metric rows, in Beam. Every rule compares rows of one metric and one slice (a row with its threshold,
with another system's row of the same window, or with the earlier windows of its series), so the
rows are grouped by (metric, slice): as many keys as the rules' metrics times the slices, each holding
the rows of one table column, never the records. Counter ``alerts_fired``."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from .. import alerts as alert_rules
from .transforms import NAMESPACE

__all__ = ["EvaluateAlerts", "ALERTS_FIRED"]

#: the counter of alerts raised (the batch job's exit status 4 when it is not 0)
ALERTS_FIRED = "alerts_fired"


class _Evaluate(beam.DoFn):
    def __init__(self, rules):
        self.rules = list(rules)
        self.fired = Metrics.counter(NAMESPACE, ALERTS_FIRED)

    def process(self, element):
        (metric, _), rows = element
        out = alert_rules.evaluate([r for r in self.rules if r.metric == metric], list(rows))
        self.fired.inc(len(out))
        yield from out


class EvaluateAlerts(beam.PTransform):
    """Metric rows (metric_result dicts) -> alert records (schema ``alert``) of ``rules``
    (:class:`streameval.alerts.Rule`, e.g. from :func:`streameval.alerts.load_rules`)."""

    def __init__(self, rules, label=None):
        super().__init__(label)
        self.rules = list(rules)
        if not self.rules:
            raise ValueError("no alert rules")

    def expand(self, rows):
        metrics = {r.metric for r in self.rules}
        return (rows
                | "RuleMetrics" >> beam.Filter(lambda r: r["metric"] in metrics)
                | "ByMetricSlice" >> beam.Map(lambda r: ((r["metric"], r["slice"]), r))
                | "Group" >> beam.GroupByKey()
                | "Evaluate" >> beam.ParDo(_Evaluate(self.rules)))
