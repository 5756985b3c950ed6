"""Sample-ratio mismatch (SRM) rows of the batch job (``--expected-split``).

The unit is the request: each (system, request) counts once, in the window of its earliest
impression and in each slice its attributes give (a request's attribute: the smallest value its
impressions carry), the rule of the ranking and per-request click metrics. Per (window, slice) the
requests of the systems the split names are tested against the split
(:func:`~streameval.metrics.stats.srm_test`, Pearson's chi-square, as ``scipy.stats.chisquare``):

* ``srm`` (system ``*``): the p-value; ``num_queries`` the requests of the declared systems;
* ``srm:chi2`` (system ``*``): the statistic;
* ``srm:share`` (one per declared system, also a system with no request there): the system's
  observed share of those requests; ``num_queries`` its requests;
* ``srm:undeclared_requests`` (system ``*``, only when there are some): the requests of systems the
  split does not name, left out of the test and counted here, not dropped silently.

:func:`request_units` gives the per-request counts from impression dicts (the per-record engine);
the columnar engine's clean stage gives the same counts vectorised (tag ``"units"``);
:func:`srm_rows` turns either into rows.
"""

from __future__ import annotations

import typing

import apache_beam as beam

from ..accumulators.online import ClickRequestState
from ..metrics import stats
from .keys import parse_slices, slice_labels, window_bounds
from .online import ClickRequestCombineFn
from .transforms import metric_row

__all__ = ["SRM_SYSTEM", "SRM_METRICS", "request_units", "srm_rows", "rows_of_window"]

#: the system of the rows about the whole experiment
SRM_SYSTEM = "*"
#: the rows' metrics
SRM_METRICS = ("srm", "srm:chi2", "srm:share", "srm:undeclared_requests")


def request_units(impressions, window_micros, slice_specs, label: str = "SrmRequests"):
    """``((window_start, window_end, slice, system), 1)`` per request and slice, from cleaned
    impression dicts. ``slice_specs`` as ``--slices`` gives them (:func:`~.keys.parse_slices`)."""
    slice_specs = parse_slices(slice_specs)
    attr_keys = sorted({n for names in slice_specs for n in names})

    def keys(kv):
        (system, _), st = kv
        s = ClickRequestState._make(st)
        ws, we = window_bounds(s.min_timestamp, window_micros)
        for lab in slice_labels(s.attributes, slice_specs):
            yield ((ws, we, lab, system), 1)

    return (impressions
            | f"{label}Key" >> beam.Map(lambda r: ((r["system_id"], r["request_id"]), r))
            | f"{label}Combine" >> beam.CombinePerKey(ClickRequestCombineFn(attr_keys))
            | f"{label}Units" >> beam.FlatMap(keys).with_output_types(typing.Tuple[typing.Any, int]))


def rows_of_window(kv, split: dict):
    """The SRM rows of one (window, slice): ``kv`` = ``((ws, we, slice), [(system, requests), ...])``,
    ``split`` = ``{system: share}`` (:func:`~streameval.metrics.stats.parse_expected_split`)."""
    (ws, we, label), pairs = kv
    counts: dict = {}
    for system, n in pairs:
        counts[system] = counts.get(system, 0) + int(n)
    declared = list(split)
    observed = [counts.get(s, 0) for s in declared]
    total = sum(observed)
    chi2, p = stats.srm_test(observed, [split[s] for s in declared])
    yield metric_row(ws, we, label, SRM_SYSTEM, "srm", p, total, None)
    yield metric_row(ws, we, label, SRM_SYSTEM, "srm:chi2", chi2, total, None)
    for s, n in zip(declared, observed):
        yield metric_row(ws, we, label, s, "srm:share", n / total if total else float("nan"), n, None)
    other = sum(n for s, n in counts.items() if s not in split)
    if other:
        yield metric_row(ws, we, label, SRM_SYSTEM, "srm:undeclared_requests", other, other, None)


def srm_rows(units, split: dict, label: str = "Srm"):
    """Rows (:func:`rows_of_window`) from ``((ws, we, slice, system), count)`` pairs."""
    return (units
            | f"{label}Sum" >> beam.CombinePerKey(sum)
            | f"{label}ByWindow" >> beam.Map(lambda kv: (kv[0][:3], (kv[0][3], kv[1])))
            .with_output_types(typing.Tuple[typing.Any, typing.Any])  # not the key type Beam would infer
            | f"{label}Group" >> beam.GroupByKey()
            | f"{label}Rows" >> beam.FlatMap(rows_of_window, split))
