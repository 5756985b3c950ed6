"""Online-metric definitions: AUC, group AUC (GAUC), click metrics per request, off-policy CTR.

The one place these metrics are defined (pure numpy and Python: no Beam, no I/O). The accumulators
(:mod:`streameval.accumulators.online`) and the Beam combiners (:mod:`streameval.beam.online`) keep
mergeable sums and counts and call the functions here to turn them into values. Conventions and
sources are in ``docs/metrics.md`` (section "Online metrics").

AUC
    The Mann-Whitney statistic: the probability that a random positive scores above a random
    negative, ties counted one half (Hanley and McNeil, Radiology 1982; identical to
    scikit-learn's ``roc_auc_score``). Computed exactly from integer counts per distinct score
    (:func:`auc_from_counts`), standard error by DeLong et al. (Biometrics 1988).
Histogram AUC
    The same statistic over score bins (:func:`hist_bin_index`): pairs in the same bin count one
    half. Binning is monotone, so pairs in different bins are ordered as their scores are and only
    same-bin pairs can be wrong, each by at most 1/2: ``|AUC_hist - AUC| <= max_error =
    sum_b pos_b * neg_b / (2 P N)`` (:func:`hist_auc_max_error`), computed from the histogram.
GAUC
    AUC per group (user, query or request), averaged with weights (impressions: Zhou et al., "Deep
    Interest Network", KDD 2018; clicks; or unweighted). Groups with a single class have no AUC and
    are excluded and counted (:func:`group_auc`, :func:`gauc`).
Click metrics per request
    clicks@k, reciprocal rank of the first (highest-ranked) click, abandonment
    (:func:`click_request_terms`; Radlinski, Kurup and Joachims, CIKM 2008).
Dwell metrics per request
    mean dwell, satisfied-click rate (dwell >= T, Fox et al., ACM TOIS 2005), long-click CTR and
    last-click CTR from the clicks' ``dwell_ms``, defined in :mod:`streameval.metrics.dwell` and
    computed with the click metrics (:func:`click_request_terms`); clicks without a dwell are
    excluded from them (the engines count them).
Off-policy CTR
    IPS (Horvitz and Thompson 1952; Precup et al. 2000) and self-normalised IPS (Swaminathan and
    Joachims, NeurIPS 2015) with standard errors (:func:`ips_from_sums`, :func:`snips_from_sums`);
    over slates (a request's impressions), standard slate IPS, independent IPS, reward-interaction
    IPS and the pseudo-inverse estimator (:func:`slate_estimates`, :mod:`~streameval.metrics.online_slate`).
Calibration
    log loss, Brier score, calibration ratio, ECE: parsed here, defined in
    :mod:`streameval.metrics.calibration`.
Interleaving
    team-draft credit per interleaved request, preference, sign test: parsed here, defined in
    :mod:`streameval.metrics.interleaving`.

Modules: :mod:`~streameval.metrics.online_names` (names), :mod:`~streameval.metrics.online_auc` (AUC,
histogram AUC, GAUC), :mod:`~streameval.metrics.online_sums` (means and ratios from sums),
:mod:`~streameval.metrics.online_ope` (off-policy estimates, target policies),
:mod:`~streameval.metrics.online_slate` (slate off-policy estimators); this module: the click
metrics per request, and every public name of the others (import them from here).
"""

from __future__ import annotations

import math

import numpy as np

from .dwell import DEFAULT_SAT_SECONDS, DWELL_FAMILIES, dwell_request_terms
from .online_auc import (auc_counts, auc_delong_stderr, auc_from_counts, auc_score, gauc, gauc_weights, group_auc,
                         hist_auc_max_error, hist_bin_index)
from .online_names import (DEFAULT_GAUC_GROUP, DEFAULT_GAUC_WEIGHTING, GAUC_GROUPS, GAUC_WEIGHTINGS, OnlineSpec,
                           is_online_metric, parse_online_metric, parse_online_metrics)
from .online_ope import (DEFAULT_SWITCH_TAU, LoggedPropensityTarget, TableTarget, UniformTarget,
                         bts_action_probabilities, dm, dm_from_terms, dr, dr_family_from_sums, dr_from_terms,
                         ess_from_sums, ips, ips_from_sums, ope_sums, reward_model_terms, sndr, sndr_from_terms, snips,
                         snips_from_sums, switch_dr, switch_dr_from_terms)
from .online_slate import (SLATE_ESTIMATORS, SlateEstimate, SlateTerms, conditional_from_cascade,
                           slate_estimate_from_sums, slate_estimates, slate_terms)
from .online_sums import mean_from_sums, ratio_from_sums

__all__ = [
    "OnlineSpec",
    "parse_online_metric",
    "parse_online_metrics",
    "is_online_metric",
    "GAUC_GROUPS",
    "GAUC_WEIGHTINGS",
    "auc_counts",
    "auc_from_counts",
    "auc_delong_stderr",
    "auc_score",
    "hist_bin_index",
    "hist_auc_max_error",
    "group_auc",
    "gauc_weights",
    "gauc",
    "mean_from_sums",
    "ratio_from_sums",
    "click_request_terms",
    "DWELL_FAMILIES",
    "DEFAULT_SAT_SECONDS",
    "ips_from_sums",
    "snips_from_sums",
    "ess_from_sums",
    "ope_sums",
    "ips",
    "snips",
    "dm",
    "dr",
    "sndr",
    "switch_dr",
    "dm_from_terms",
    "dr_from_terms",
    "sndr_from_terms",
    "switch_dr_from_terms",
    "dr_family_from_sums",
    "reward_model_terms",
    "DEFAULT_SWITCH_TAU",
    "SLATE_ESTIMATORS",
    "SlateEstimate",
    "SlateTerms",
    "slate_terms",
    "slate_estimates",
    "slate_estimate_from_sums",
    "conditional_from_cascade",
    "UniformTarget",
    "TableTarget",
    "LoggedPropensityTarget",
    "bts_action_probabilities",
    "DEFAULT_GAUC_GROUP",
    "DEFAULT_GAUC_WEIGHTING",
]


# --------------------------------------------------------------------------------------------
# click metrics per request

def click_request_terms(specs, request_index, click_positions, n_requests: int, click_dwell_ms=None) -> np.ndarray:
    """Per-request values of the click and dwell metrics, shape (len(specs), n_requests).

    ``request_index``, ``click_positions``: shape (c,), one entry per clicked impression (its
    request's index in 0..n_requests-1 and its 1-based position). Requests absent from
    ``request_index`` had no click. ``click_dwell_ms``: shape (c,), each click's dwell in
    milliseconds (integers >= 0 as floats), NaN when unknown; None: every dwell unknown. ``specs``:
    :class:`OnlineSpec` of the per-request families:

    * ``clicks@k``: clicked impressions at positions <= k (``clicks``: all positions);
    * ``rr_first_click``: 1 / position of the highest-ranked click, 0 without a click
      (``[clicked]``: NaN without a click, so the mean is over requests with a click);
    * ``abandonment``: 1 when the request has no click, else 0;
    * ``mean_dwell``: the mean dwell in seconds of the request's clicks with a known dwell; NaN
      (request left out of the mean) when it has none;
    * ``sat_click_rate[t=T]``: the share of those clicks with dwell >= T (satisfied clicks, Fox et
      al., "Evaluating implicit measures to improve web search", ACM TOIS 23(2), 2005: T = 30 s);
      NaN when the request has no click with a known dwell;
    * ``long_click_ctr[t=T]``: 1 when the request has a click with dwell >= T (a long click), 0 when
      it has none and every click's dwell is known (or no click); NaN (left out) when no known
      dwell reaches T and some click's dwell is unknown;
    * ``last_click_ctr[t=T]``: the same on the request's last click only, the clicked impression
      ranked lowest (largest position: the schema records whether, not when, an item was clicked);
      0 without a click.

    Raises ValueError on an index out of range, a position < 1, a negative dwell or mismatched
    shapes."""
    req = np.asarray(request_index, dtype=np.int64)
    pos = np.asarray(click_positions, dtype=np.int64)
    if req.shape != pos.shape:
        raise ValueError("request_index and click_positions must have the same shape")
    if len(req) and (req.min() < 0 or req.max() >= n_requests):
        raise ValueError("request_index out of range")
    if len(pos) and pos.min() < 1:
        raise ValueError("positions are 1-based")
    out = np.zeros((len(specs), n_requests))
    first = np.full(n_requests, np.inf)
    np.minimum.at(first, req, pos.astype(np.float64))
    clicked = np.isfinite(first)
    dwell = [s for s in specs if s.dwell]
    if dwell:
        dwell = dict(zip(dwell, dwell_request_terms(dwell, req, pos, n_requests, click_dwell_ms)))
    for i, s in enumerate(specs):
        if s.family == "clicks":
            sel = req if s.k is None else req[pos <= s.k]
            out[i] = np.bincount(sel, minlength=n_requests)
        elif s.family == "rr_first_click":
            rr = np.where(clicked, 1.0 / first, math.nan if s.clicked_only else 0.0)
            out[i] = rr
        elif s.family == "abandonment":
            out[i] = (~clicked).astype(np.float64)
        elif s.dwell:
            out[i] = dwell[s]
        else:
            raise ValueError(f"{s.name} is not a per-request click metric")
    return out
