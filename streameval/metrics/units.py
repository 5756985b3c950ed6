"""What a metric row's count counts: :func:`count_unit` names the unit behind ``num_queries``
(the rows' ``n_unit``; docs/metrics.md, "Online metrics", "Names").

The vocabulary (:data:`COUNT_UNITS`), one plural noun per kind of thing counted; which of those
things a row counts (those with a label, with a click, with a known dwell...) is the metric's
definition, in docs/metrics.md:

* ``queries``: the rankings a ranking measure averages over (trec_eval, ir_measures, ranx names,
  the diversity measures): one per query, or per (system, request) in the jobs;
* ``impressions``: CTR, AUC and the other score and calibration metrics (labelled impressions),
  the threshold and drift metrics, the clustered and CUPED CTR, the per-impression off-policy
  estimates (logged impressions), the ``:ess`` rows of ``iips`` and ``rips``;
* ``requests``: the click metrics per request (``clicks@k``, ``rr_first_click``,
  ``abandonment``, the dwell metrics), interleaving, sample-ratio mismatch;
* ``groups``: GAUC's groups (users, queries or requests, by its GROUP);
* ``clusters``: the clusters of ``--cluster`` (``ctr[cluster=C]:clusters``, CUPED's units);
* ``slates``: the slate estimators' slates (a request's impressions), and the ``:ess`` rows of
  ``slate_ips`` and ``pi``;
* ``units``: the fallback, a name this module does not know (another tool's row, a metric added
  later): the count's unit is not known.

Layer 2 (metrics): pure Python; no Beam.
"""

from __future__ import annotations

import functools
import re

from .names import MetricNameError, as_name, parse_metric
from .online_names import match_online_metric

__all__ = ["COUNT_UNITS", "UNKNOWN_UNIT", "count_unit"]

#: every value :func:`count_unit` gives
COUNT_UNITS = ("queries", "impressions", "requests", "groups", "clusters", "slates", "units")
#: the unit of a name :func:`count_unit` does not know
UNKNOWN_UNIT = "units"

# rows named by a pattern rather than an online or ranking name (docs/metrics.md: clustered CTR,
# CUPED, sample-ratio mismatch, calibration bins, off-policy and slate estimates), first match wins
_PATTERNS = (
    (re.compile(r"ctr\[cluster=[^\]]*\]:clusters"), "clusters"),
    (re.compile(r"ctr\[cluster=[^\]]*,cuped=[^\]]*\]:(?:variance_reduction|theta|imputed_units)"), "clusters"),
    (re.compile(r"ctr\[cluster=[^\]]*\](?::design_effect)?"), "impressions"),
    (re.compile(r"srm(?::(?:chi2|share|undeclared_requests))?"), "requests"),
    (re.compile(r"calibration_bin\[[^\]]*\]:(?:predicted|observed)"), "impressions"),
    (re.compile(r"interleaving:[a-z_]+"), "requests"),
    (re.compile(r"gauc\[[^\]]*\]:excluded_groups"), "groups"),
    (re.compile(r"auc_hist:max_error|ks\[score\]:p_value"), "impressions"),
    (re.compile(r"(?:iips|rips)\[.*\]:ess"), "impressions"),
    (re.compile(r"(?:slate_ips|iips|rips|pi)\[.*\](?::ess)?"), "slates"),
    (re.compile(r"(?:ips|snips|dm|dr|sndr)\[.*\]|switch_dr\[.*,tau=[^\]]*\]|ope\[.*\]:(?:mean_weight|ess)"),
     "impressions"),
)


def count_unit(metric) -> str:
    """The unit behind a metric row's count (``num_queries``; the typed tables' ``n``) for the
    metric named ``metric`` in any spelling (``nDCG@10``, ``ndcg_cut_10``, ``GAUC``; an
    ir_measures Measure object), one of :data:`COUNT_UNITS`: ``"queries"`` for a ranking measure,
    ``"impressions"`` for ``ctr``, ``auc``, ``logloss``, ``ips[T]``..., ``"requests"`` for
    ``clicks@3``, ``rr_first_click``, ``interleaving:*``, ``srm``..., ``"groups"`` for GAUC,
    ``"clusters"``, ``"slates"`` (the table of docs/metrics.md, "Names", and the row tables of the
    clustered CTR, CUPED, SRM and off-policy sections). A name none of those is gives
    :data:`UNKNOWN_UNIT` (``"units"``); nothing is raised for any text."""
    return _count_unit(str(as_name(metric)).strip())


@functools.lru_cache(maxsize=4096)
def _count_unit(text: str) -> str:
    low = text.lower().replace(" ", "")
    for pattern, unit in _PATTERNS:
        if pattern.fullmatch(low):
            return unit
    try:
        spec = match_online_metric(text)
    except MetricNameError:  # an online metric's name with bad parameters
        return UNKNOWN_UNIT
    if spec is not None:
        if spec.family == "gauc":
            return "groups"
        return "requests" if spec.per_request or spec.family == "interleaving" else "impressions"
    try:
        parse_metric(text, diversity=True)
    except MetricNameError:
        return UNKNOWN_UNIT
    return "queries"
