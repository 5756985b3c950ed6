"""Clustered standard error of CTR (``--cluster request|user``): the batch job's
``ctr[cluster=C]`` rows.

Impressions of one request, or of one user, are not independent: the binomial standard error of
``ctr`` (which treats every impression as its own sample) is too small when clicks are correlated
within them. Here the unit is the cluster: per (window, slice, system) the impressions n_c and clicks
y_c of each cluster are summed (an impression counts in the window of its own timestamp and the
slices of its own attributes, as for ``ctr``), and the rows give the delta method's standard error
over the clusters (:func:`~streameval.metrics.online_sums.clustered_ratio_from_sums`), equal to
the cluster-robust standard error of an OLS regression of the clicks on a constant. A cluster is
(system, request) for ``request``; (system, user) for ``user``, an impression without a user being
clustered by its request (``request:<id>``) instead.

Rows per (window, slice, system), ``C`` the clustering:

* ``ctr[cluster=C]``: the CTR, its clustered standard error, ``num_queries`` the impressions, and
  the normal interval ``ctr -/+ z se`` (``ci_method`` ``cluster-delta``), the logit-transformed one
  (``cluster-delta-logit``) when it leaves [0, 1] under ``--ci-bounded logit``;
* ``ctr[cluster=C]:clusters``: the number of clusters;
* ``ctr[cluster=C]:design_effect``: (clustered se / binomial se)^2, how much the correlation
  inflates the variance (Kish's design effect; 1 for independent impressions).

State: per (key, cluster) the integer pair (impressions, clicks), summed; then per key the integer
sums (clusters, n, y, n^2, n y, y^2): exact in any order.
"""

from __future__ import annotations

import math
import typing

import apache_beam as beam

from ..metrics import stats
from ..metrics.online_sums import clustered_ratio_from_sums
from .keys import parse_slices, slice_labels, slide_keys, window_bounds
from .transforms import metric_row

__all__ = ["CLUSTERS", "cluster_id", "impression_cluster_keys", "clustered_ctr_rows", "clustered_rows", "records_cluster_keys"]

#: ``--cluster``'s choices (``none``: no clustered rows)
CLUSTERS = ("none", "request", "user")


def cluster_id(cluster: str, request_id, user_id) -> str:
    """The cluster of an impression under ``cluster`` (``request`` or ``user``)."""
    if cluster == "user" and user_id is not None:
        return f"user:{user_id}"
    return f"request:{request_id}"


def impression_cluster_keys(rec, window_micros, slice_specs, cluster):
    """``((ws, we, slice, system, cluster id), (1, clicked))`` of one impression dict whose clicks
    are logged (none otherwise)."""
    clicked = rec.get("clicked")
    if clicked is None:
        return
    ws, we = window_bounds(rec.get("timestamp"), window_micros)
    cid = cluster_id(cluster, rec["request_id"], rec.get("user_id"))
    for label in slice_labels(rec.get("attributes"), slice_specs):
        yield ((ws, we, label, rec["system_id"], cid), (1, 1 if clicked else 0))


def _pair_sum(pairs):
    n = y = 0
    for a, b in pairs:
        n += a
        y += b
    return (n, y)


def cluster_terms(n: int, y: int) -> tuple:
    """One cluster's terms of the six sums (clusters, n, y, n^2, n y, y^2) from its impressions ``n``
    and clicks ``y``."""
    return (1, n, y, n * n, n * y, y * y)


def _six_sum(items):
    out = [0] * 6
    for it in items:
        for j, x in enumerate(it):
            out[j] += x
    return tuple(out)


def cluster_sums(pairs) -> tuple:
    """The six sums of :func:`clustered_rows` over clusters' ``(impressions, clicks)`` pairs."""
    return _six_sum(cluster_terms(n, y) for n, y in pairs)


def clustered_rows(kv, cluster: str, level: float, bounded: str = "logit"):
    """The rows of one (window, slice, system): ``kv`` = ``((ws, we, slice, system), (clusters, n,
    y, n^2, n y, y^2))``."""
    (ws, we, label, system), (g, sn, sy, snn, sny, syy) = kv
    name = f"ctr[cluster={cluster}]"
    r, se = clustered_ratio_from_sums(g, sn, sy, snn, sny, syy)
    extra = {}
    if math.isfinite(se) and sn:
        lo, hi = stats.normal_interval(r, se, level)
        method = "cluster-delta"
        if bounded == "logit" and (lo < 0 or hi > 1) and 0 < r < 1:
            from scipy import special

            z = float(special.ndtri((1.0 + level) / 2.0))
            c, h = math.log(r) - math.log1p(-r), z * se / (r * (1 - r))
            lo, hi = float(special.expit(c - h)), float(special.expit(c + h))
            method = "cluster-delta-logit"
        extra = {"ci_low": lo, "ci_high": hi, "ci_level": float(level), "ci_method": method}
    yield metric_row(ws, we, label, system, name, r, sn, se, **extra)
    yield metric_row(ws, we, label, system, f"{name}:clusters", g, g, None)
    binom = math.sqrt(r * (1 - r) / sn) if sn and math.isfinite(r) else math.nan
    deff = (se / binom) ** 2 if binom and math.isfinite(se) else math.nan
    yield metric_row(ws, we, label, system, f"{name}:design_effect", deff, sn, None)


def clustered_ctr_rows(keyed, cluster: str, level: float, bounded: str = "logit", slide=None, label: str = "Cluster"):
    """Rows (:func:`clustered_rows`) from ``((ws, we, slice, system, cluster id), (n, y))`` pairs
    (any number per cluster: they are summed); ``slide``: sliding windows (sub-window keys in)."""
    if slide is not None:
        keyed = keyed | f"{label}Sliding" >> beam.FlatMap(slide_keys, slide)
    return (keyed
            | f"{label}PerCluster" >> beam.CombinePerKey(_pair_sum)
            | f"{label}Terms" >> beam.Map(lambda kv: (kv[0][:4], cluster_terms(*kv[1])))
            .with_output_types(typing.Tuple[typing.Any, typing.Any])
            | f"{label}Sums" >> beam.CombinePerKey(_six_sum)
            | f"{label}Rows" >> beam.FlatMap(clustered_rows, cluster, level, bounded))


def records_cluster_keys(impressions, window_micros, slice_specs, cluster: str, label: str = "Cluster"):
    """The per-impression keys of :func:`clustered_ctr_rows` from impression dicts."""
    specs = parse_slices(slice_specs)
    return impressions | f"{label}Keys" >> beam.FlatMap(impression_cluster_keys, window_micros, specs, cluster) \
        .with_output_types(typing.Tuple[typing.Any, typing.Any])
