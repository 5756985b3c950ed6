"""CUPED (``--covariate attr:NAME`` with ``--cluster request|user``): the batch job's
``ctr[cluster=C,cuped=NAME]`` rows (definitions: :mod:`streameval.metrics.cuped`).

The unit is the cluster of ``--cluster`` (:func:`streameval.beam.clusters.cluster_id`). Its covariate
is the impression attribute NAME read as a number (the unit's pre-period value, written on its
impressions by whoever prepared the log); when a unit's impressions disagree, the smallest value is
taken (a rule that merges in any order); a value that is not a finite number counts as absent, and a
unit without one gets the pooled mean of the others (:func:`streameval.metrics.cuped.cuped_from_sums`).

Stages: per (window, slice, system, unit) the integer impressions and clicks and the smallest
covariate are combined; then per (window, slice) one state per system
(:mod:`streameval.accumulators.cuped`, exact), since theta is pooled over the systems; then the rows.
"""

from __future__ import annotations

import math
import typing

import apache_beam as beam
import numpy as np

from ..accumulators.cuped import cuped_add_unit, cuped_create, cuped_exact, cuped_merge
from ..io.selection import closest_present
from ..metrics.cuped import cuped_name, cuped_rows
from .clusters import cluster_id
from .keys import parse_slices, slice_labels, slide_keys, window_bounds

__all__ = ["COVARIATE_PREFIX", "parse_covariate", "covariate_value", "covariate_column", "impression_cuped_keys",
           "cuped_ctr_rows", "records_cuped_keys", "unit_sum", "covariate_absent", "covariate_attribute_error",
           "LOG_COVARIATE", "pre_period_clicks"]

#: ``--covariate``'s form: ``attr:NAME``
COVARIATE_PREFIX = "attr:"
#: the covariate's name in the rows with ``--covariate-log``: each unit's clicks in that log
LOG_COVARIATE = "log_clicks"


def pre_period_clicks(paths, cluster: str) -> dict:
    """``{unit: clicks}`` of a pre-period impression log (``--covariate-log``): per unit of
    :func:`~streameval.beam.clusters.cluster_id` the impressions whose ``clicked`` is true, over
    the impressions whose clicks are logged (a unit with only unlogged clicks is absent). Read whole
    on the launcher (one int per unit); the records are not cleaned (a replayed record counts again)."""
    from ..io.avro import read_records

    out: dict = {}
    for rec in read_records(list(paths), "impression"):
        clicked = rec.get("clicked")
        if clicked is None:
            continue
        cid = cluster_id(cluster, rec["request_id"], rec.get("user_id"))
        out[cid] = out.get(cid, 0) + (1 if clicked else 0)
    return {k: float(v) for k, v in out.items()}


def parse_covariate(text: str) -> str:
    """The attribute name of ``--covariate attr:NAME``; ValueError in one line otherwise."""
    if not isinstance(text, str) or not text.startswith(COVARIATE_PREFIX) or not text[len(COVARIATE_PREFIX):].strip():
        raise ValueError(f"--covariate wants attr:NAME (an impression attribute holding the unit's pre-period "
                         f"value), got {text!r}")
    name = text[len(COVARIATE_PREFIX):].strip()
    if any(ch in name for ch in ",[]="):
        raise ValueError(f"--covariate: an attribute name without ',', '[', ']' or '=', got {name!r}")
    return name


def covariate_value(text):
    """A finite float of an attribute's text, else None (absent, not a number, infinite or NaN)."""
    if text is None:
        return None
    try:
        x = float(text)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def covariate_column(col, n: int) -> np.ndarray:
    """float64 values of an Arrow string column (None: the attribute is absent), NaN where
    :func:`covariate_value` gives None."""
    if col is None:
        return np.full(n, np.nan)
    vals = [covariate_value(v) for v in col.to_pylist()]
    return np.array([np.nan if v is None else v for v in vals], dtype=np.float64)


def impression_cuped_keys(rec, window_micros, slice_specs, cluster, attribute, values=None):
    """``((ws, we, slice, system, unit), (1, clicked, x))`` of one impression dict whose clicks are
    logged (none otherwise); x from the attribute, or ``values[unit]`` when ``values`` is given."""
    clicked = rec.get("clicked")
    if clicked is None:
        return
    ws, we = window_bounds(rec.get("timestamp"), window_micros)
    cid = cluster_id(cluster, rec["request_id"], rec.get("user_id"))
    x = values.get(cid) if values is not None else covariate_value((rec.get("attributes") or {}).get(attribute))
    for label in slice_labels(rec.get("attributes"), slice_specs):
        yield ((ws, we, label, rec["system_id"], cid), (1, 1 if clicked else 0, x))


def unit_sum(items):
    """(impressions, clicks, smallest covariate or None) of a unit's parts."""
    n = y = 0
    x = None
    for a, b, c in items:
        n += a
        y += b
        if c is not None and (x is None or c < x):
            x = c
    return (n, y, x)


class _CupedCombine(beam.CombineFn):
    """``{system: state}`` (:mod:`streameval.accumulators.cuped`) of ``(system, n, y, x)`` units."""

    def create_accumulator(self):
        return {}

    def add_input(self, acc, unit):
        s, n, y, x = unit
        cuped_add_unit(acc.setdefault(s, cuped_create()), n, y, x)
        return acc

    def merge_accumulators(self, accs):
        out: dict = {}
        for a in accs:
            for s, st in a.items():
                out[s] = cuped_merge([out[s], st]) if s in out else cuped_merge([st])
        return out

    def extract_output(self, acc):
        return acc


def _rows(kv, cluster, covariate, level):
    (ws, we, label), states = kv
    return cuped_rows(ws, we, label, {s: cuped_exact(st) for s, st in states.items()}, cluster, covariate, level)


def cuped_ctr_rows(keyed, cluster: str, covariate: str, level: float, slide=None, label: str = "Cuped"):
    """Rows (:func:`streameval.metrics.cuped.cuped_rows`) from ``((ws, we, slice, system, unit), (n, y,
    x))`` parts (any number per unit); ``slide``: sliding windows (sub-window keys in)."""
    if slide is not None:
        keyed = keyed | f"{label}Sliding" >> beam.FlatMap(slide_keys, slide)
    return (keyed
            | f"{label}PerUnit" >> beam.CombinePerKey(unit_sum)
            | f"{label}Units" >> beam.Map(lambda kv: (kv[0][:3], (kv[0][3], *kv[1])))
            .with_output_types(typing.Tuple[typing.Any, typing.Any])
            | f"{label}Sums" >> beam.CombinePerKey(_CupedCombine())
            | f"{label}Rows" >> beam.FlatMap(_rows, cluster, covariate, level))


def records_cuped_keys(impressions, window_micros, slice_specs, cluster: str, attribute: str, values=None,
                       label: str = "Cuped"):
    """The per-impression keys of :func:`cuped_ctr_rows` from impression dicts (``values``:
    :func:`pre_period_clicks`, or None for the attribute)."""
    specs = parse_slices(slice_specs)
    return impressions | f"{label}Keys" >> beam.FlatMap(impression_cuped_keys, window_micros, specs, cluster,
                                                        attribute, values) \
        .with_output_types(typing.Tuple[typing.Any, typing.Any])


def covariate_absent(rows, cluster: str, attribute: str) -> bool:
    """True when the job's rows show that no unit had the covariate: in slice ``all`` of every window
    with a ``:theta`` row, every unit was imputed (``:imputed_units`` equal to the units)."""
    name = cuped_name(cluster, attribute)
    theta = {(r["window_start"], r["window_end"]): r["num_queries"] for r in rows
             if r["slice"] == "all" and r["metric"] == f"{name}:theta"}
    imputed = {(r["window_start"], r["window_end"]): r["num_queries"] for r in rows
               if r["slice"] == "all" and r["metric"] == f"{name}:imputed_units"}
    return bool(theta) and all(imputed.get(k) == v for k, v in theta.items())


def covariate_attribute_error(attribute: str, have) -> str:
    """The one-line usage error of a covariate attribute no impression has (a typo), with the three
    closest attribute names the first records have."""
    picks = closest_present(attribute, have)
    tail = (f"; closest attributes the first records have: {', '.join(picks)}" if picks
            else "; the records have no attributes")
    return (f"--covariate attr:{attribute}: no impression has the attribute {attribute!r} as a number (every "
            f"unit got the pooled mean: no adjustment){tail}")
