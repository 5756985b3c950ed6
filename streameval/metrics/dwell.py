"""Dwell metrics per request: mean dwell, satisfied-click rate, long-click and last-click CTR.

Pure numpy. The names are parsed with the other online metrics
(:func:`streameval.metrics.online.parse_online_metric`) and the values computed with them by
:func:`streameval.metrics.online.click_request_terms`, which calls :func:`dwell_request_terms`.
Definitions and sources: ``docs/metrics.md``, "Dwell metrics".

A click's dwell is the impression's ``dwell_ms`` (milliseconds, an integer >= 0; NaN here when
unknown). T is a whole number of milliseconds > 0, 30 s by default (the satisfied click of Fox,
Karnawat, Mydland, Dumais and White, "Evaluating implicit measures to improve web search", ACM TOIS
23(2), 2005); a dwell >= T is long (satisfied).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np

from .errors import MetricNameError

__all__ = ["DWELL_FAMILIES", "DEFAULT_SAT_SECONDS", "seconds_text", "threshold_ms", "dwell_request_terms"]

#: the dwell metrics (per request, from the clicks' ``dwell_ms``)
DWELL_FAMILIES = ("mean_dwell", "sat_click_rate", "long_click_ctr", "last_click_ctr")
#: the default threshold T in seconds of the satisfied / long / last click (Fox et al. 2005)
DEFAULT_SAT_SECONDS = 30


def seconds_text(ms: int) -> str:
    """``30000`` -> ``"30"``, ``1500`` -> ``"1.5"``, ``250`` -> ``"0.25"`` (exact: ms is an integer)."""
    whole, frac = divmod(int(ms), 1000)
    return str(whole) if not frac else f"{whole}.{frac:03d}".rstrip("0")


def threshold_ms(name, params) -> int:
    """The threshold of ``family[...]`` in milliseconds: ``params`` None (30 s), ``t=30s``, ``30s``,
    ``t=30`` (seconds), ``t=1.5s`` or ``t=500ms`` (lower case, no spaces). Raises
    :class:`~streameval.metrics.names.MetricNameError` unless it is a whole number of milliseconds > 0."""
    if params is None:
        return DEFAULT_SAT_SECONDS * 1000
    m = re.fullmatch(r"(?:t=)?(\d+(?:\.\d+)?)(s|ms)?", params)
    if m:
        value = Fraction(m.group(1)) * (1 if m.group(2) == "ms" else 1000)
        if value.denominator == 1 and value > 0:
            return int(value)
    raise MetricNameError(f"bad dwell threshold in {name!r}: expected [t=T] with T > 0 in seconds (t=30s, t=1.5s, "
                          f"t=30) or milliseconds (t=500ms), a whole number of milliseconds")


def dwell_request_terms(specs, req: np.ndarray, pos: np.ndarray, n_requests: int, click_dwell_ms=None) -> np.ndarray:
    """Per-request values of the dwell metrics ``specs`` (OnlineSpec with ``dwell`` true), shape
    (len(specs), n_requests), NaN where a request is left out of the mean.

    ``req``, ``pos``: shape (c,), each click's request index (0..n_requests-1) and 1-based position
    (checked by the caller); ``click_dwell_ms``: shape (c,), each click's dwell in milliseconds, NaN
    when unknown (None: all unknown). Per request:

    * ``mean_dwell``: mean dwell in seconds of the clicks with a known dwell (none: NaN);
    * ``sat_click_rate[t=T]``: share of those clicks with dwell >= T (none: NaN);
    * ``long_click_ctr[t=T]``: 1 with a click of dwell >= T; else NaN when a click's dwell is
      unknown; else 0 (also without a click);
    * ``last_click_ctr[t=T]``: the same on the clicks at the request's largest clicked position (the
      last click when users read top down); 0 without a click.

    Raises ValueError on a negative dwell or a shape other than ``req``'s."""
    dwell = np.full(len(req), np.nan) if click_dwell_ms is None else np.asarray(click_dwell_ms, dtype=np.float64)
    if dwell.shape != req.shape:
        raise ValueError("click_dwell_ms must have the shape of request_index")
    if (dwell < 0).any():
        raise ValueError("dwell must be >= 0 milliseconds")
    known = ~np.isnan(dwell)
    n_known = np.bincount(req[known], minlength=n_requests)
    last = np.zeros(n_requests, dtype=np.int64)
    np.maximum.at(last, req, pos)
    at_last = pos == last[req]
    out = np.empty((len(specs), n_requests))
    with np.errstate(invalid="ignore", divide="ignore"):
        for i, s in enumerate(specs):
            if s.family == "mean_dwell":
                # integer milliseconds: the float sum is exact (below 2**53) whatever the order
                total = np.bincount(req[known], weights=dwell[known], minlength=n_requests)
                out[i] = np.where(n_known > 0, total / (1000.0 * n_known), math.nan)
                continue
            long = known & (dwell >= s.threshold_ms)
            if s.family == "sat_click_rate":
                out[i] = np.where(n_known > 0, np.bincount(req[long], minlength=n_requests) / n_known, math.nan)
            elif s.family in ("long_click_ctr", "last_click_ctr"):
                sel = at_last if s.family == "last_click_ctr" else np.ones(len(req), dtype=bool)
                has_long = np.bincount(req[sel & long], minlength=n_requests) > 0
                has_unknown = np.bincount(req[sel & ~known], minlength=n_requests) > 0
                out[i] = np.where(has_long, 1.0, np.where(has_unknown, math.nan, 0.0))
            else:
                raise ValueError(f"{s.name} is not a dwell metric")
    return out
